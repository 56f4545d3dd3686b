// save_interval_policy and run_history (checkpoint/save_policy.hpp, issue 35 item 4): Young's and
// Daly's intervals against hand-computed values, the bounds and the copy's cost (fed from another
// thread, as the two-tier copier does; a bad sample ignored), determinism (a
// clock that throws when read), M learned from the prior and the job's history (noticed
// interruptions are exposure, unnoticed ones are interruptions), the history file's round
// trip, a missing, corrupt or unwritable file, real processes (a SIGKILLed incarnation and one
// that noted its notice) read by the next one, and save_when_due on a checkpoint_manager.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>  // std::nan: a bad sample
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <holdfast/checkpoint.hpp>
#include <holdfast/checkpoint/save_policy.hpp>
#include <holdfast/holdfast.hpp>  // the handler loop of docs/save-policy.md
#include <stdexcept>
#include <string>
#include <thread>  // record_copy from another thread (the two-tier copier's)
#include <vector>

#include "support/child.hpp"
#include "support/files.hpp"
#include "support/scoped_disposition.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using holdfast::save_interval_options;
using holdfast::save_seconds;
using namespace std::chrono_literals;

namespace {

// A clock that fails the test when the policy reads it: the policy takes every time from its
// caller.
struct throwing_clock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<throwing_clock>;
  static time_point now() { throw std::logic_error("the policy read the clock"); }
};

// A clock the test moves by hand (save_when_due reads it).
struct manual_clock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<manual_clock>;
  static time_point& current() {
    static time_point t{};
    return t;
  }
  static time_point now() { return current(); }
};

using tp = throwing_clock::time_point;
using policy_t = holdfast::basic_save_interval_policy<throwing_clock>;
const tp t0 = tp(std::chrono::hours(1000));

std::chrono::system_clock::time_point wall(std::int64_t s) {
  return std::chrono::system_clock::time_point(std::chrono::seconds(1'700'000'000 + s));
}

save_interval_options unbounded(save_seconds prior) {
  save_interval_options o;
  o.mtbi_prior = prior;
  o.min_interval = save_seconds(0);
  o.max_interval = std::chrono::hours(10'000);
  return o;
}

}  // namespace

TEST_CASE("save interval: Young's and Daly's formulas against hand-computed values") {
  CHECK(holdfast::young_interval(5s, 1h).count() == doctest::Approx(189.73665961010275));
  // sqrt(2*5*3600) (1 + sqrt(5/7200)/3 + 5/(18*3600)) - 5
  CHECK(holdfast::daly_interval(5s, 1h).count() == doctest::Approx(186.41796645112206));
  CHECK(holdfast::daly_interval(60s, 1h).count() == doctest::Approx(617.8756496256495));
  // C not small against M: the correction matters (Young would say 4647 s)
  CHECK(holdfast::daly_interval(3000s, 1h).count() == doctest::Approx(2862.7457569048684));
  CHECK(holdfast::daly_interval(7200s, 1h).count() == 3600);  // C >= 2M: T = M
  CHECK(holdfast::daly_interval(0s, 1h).count() == 0);
  CHECK(holdfast::young_interval(5s, 0s).count() == 0);
}

TEST_CASE("save interval: the policy's interval from C and M, the bounds, the copy's cost") {
  policy_t p(unbounded(1h));
  CHECK(p.save_cost().count() == 0);  // nothing measured: initial_save_cost
  p.start(t0);
  p.record_save(5s, t0);
  CHECK(p.mtbi(t0).count() == doctest::Approx(3600));
  CHECK(p.interval(t0).count() == doctest::Approx(186.41796645112206));
  // M grows with the run time survived: at t0 + 190 s, M = 3790 s and T = 191.36 s
  CHECK(p.mtbi(t0 + 190s).count() == doctest::Approx(3790));
  CHECK(p.interval(t0 + 190s).count() == doctest::Approx(191.36015849201053));
  CHECK(!p.should_save(t0 + 190s));
  CHECK(p.should_save(t0 + 192s));

  // C is an exponentially weighted mean: 5, then 20 with smoothing 0.3 -> 9.5
  p.record_save(20s, t0 + 200s);
  CHECK(p.save_cost().count() == doctest::Approx(9.5));
  CHECK(!p.should_save(t0 + 201s));  // measured from the last save

  save_interval_options o = unbounded(1h);
  o.min_interval = 300s;
  o.max_interval = 400s;
  policy_t lo(o);
  lo.start(t0);
  lo.record_save(5s, t0);  // Daly: 186 s
  CHECK(lo.interval(t0).count() == 300);
  lo.record_save(200s, t0);  // 5 + 0.3 * 195 = 63.5 s -> Daly ~ 640 s
  CHECK(lo.interval(t0).count() == 400);
  o.min_interval = 500s;  // crossed bounds: min_interval wins
  policy_t crossed(o);
  crossed.start(t0);
  crossed.record_save(1s, t0);
  CHECK(crossed.interval(t0).count() == 500);

  policy_t copy(unbounded(1h));
  copy.start(t0);
  copy.record_save(5s, t0);
  copy.record_copy(900s);  // saving more often than the copy takes would queue copies
  CHECK(copy.copy_cost().count() == 900);
  CHECK(copy.interval(t0).count() == 900);

  // The copy is averaged as C is, and the bounds apply to it too (max_interval caps it).
  copy.record_copy(100s);  // 900 + 0.3 * (100 - 900) = 660 s
  CHECK(copy.copy_cost().count() == doctest::Approx(660));
  CHECK(copy.interval(t0).count() == doctest::Approx(660));
  save_interval_options capped = unbounded(1h);
  capped.max_interval = 600s;
  policy_t cap(capped);
  cap.start(t0);
  cap.record_save(5s, t0);
  cap.record_copy(900s);
  CHECK(cap.interval(t0).count() == 600);
  policy_t copied = copy;  // a copy of the policy keeps the copies' mean
  CHECK(copied.copy_cost().count() == doctest::Approx(660));

  CHECK_THROWS_AS(policy_t([] {
                    save_interval_options b;
                    b.prior_weight = 0;
                    return b;
                  }()),
                  holdfast::error);
}

TEST_CASE("save interval: a copy's cost from another thread, a bad sample ignored") {
  // The two-tier copier calls record_copy on its own thread while the training thread asks the
  // policy (ThreadSanitizer checks the two); a negative or NaN sample is no cost.
  policy_t p(unbounded(1h));
  p.start(t0);
  p.record_save(1s, t0);  // Daly: ~84 s
  const double daly = p.interval(t0).count();
  p.record_copy(-5s);
  p.record_copy(save_seconds(std::nan("")));
  CHECK(p.copy_cost().count() == 0);
  CHECK(p.interval(t0).count() == daly);
  std::thread copier([&] {
    for (int i = 0; i < 2000; ++i) p.record_copy(save_seconds(200 + i % 3));
  });
  double longest = 0;
  for (int i = 0; i < 2000; ++i) longest = std::max(longest, p.interval(t0 + 1s).count());
  copier.join();
  CHECK(longest <= 202);
  CHECK(p.copy_cost().count() >= 200);
  CHECK(p.copy_cost().count() <= 202);
  CHECK(p.interval(t0).count() == doctest::Approx(p.copy_cost().count()));
}

TEST_CASE("save interval: deterministic given its inputs (no clock read, same answers)") {
  save_interval_options o = unbounded(2h);
  o.prior_weight = 3;
  policy_t a(o), b(o);
  for (policy_t* p : {&a, &b}) {
    p->observe(holdfast::run_counters{save_seconds(7h), 2, 5, 1, 8});
    p->start(t0);
    p->record_save(12s, t0 + 10s);
    p->record_save(30s, t0 + 400s);
    p->record_copy(40s);
  }
  // throwing_clock::now() throws: none of these read it
  for (int k = 0; k < 50; ++k) {
    const tp now = t0 + std::chrono::seconds(400 + 37 * k);
    CHECK(a.should_save(now) == b.should_save(now));
    CHECK(a.interval(now) == b.interval(now));
    CHECK(a.mtbi(now) == b.mtbi(now));
    CHECK(a.should_save(now) == a.should_save(now));  // asking does not change the answer
  }
  CHECK(a.last_save() == t0 + 400s);
}

TEST_CASE(
    "save interval: M learned from the prior and the history, notices being no interruptions") {
  save_interval_options o = unbounded(10h);
  o.prior_weight = 2;
  policy_t p(o);
  p.start(t0);
  CHECK(p.mtbi(t0).count() == doctest::Approx(36000));  // the prior alone
  // (2 * 10 h + 30 h) / (2 + 3) = 10 h, whatever the notices were
  p.observe(holdfast::run_counters{save_seconds(30h), 3, 0, 0, 3});
  CHECK(p.mtbi(t0).count() == doctest::Approx(36000));
  p.observe(holdfast::run_counters{save_seconds(30h), 3, 40, 0, 43});
  CHECK(p.mtbi(t0).count() == doctest::Approx(36000));
  p.record_save(7s, t0);
  CHECK(p.interval(t0).count() == doctest::Approx(705.2705762975987));
  // 30 h of noticed preemptions only: M = 50 h / 2
  p.observe(holdfast::run_counters{save_seconds(30h), 0, 3, 0, 3});
  CHECK(p.mtbi(t0).count() == doctest::Approx(25 * 3600.0));
  // frequent unnoticed ones pull M down towards the observed mean (1 h)
  p.observe(holdfast::run_counters{save_seconds(100h), 100, 0, 0, 100});
  CHECK(p.mtbi(t0).count() == doctest::Approx((20 + 100) * 3600.0 / 102));
}

TEST_CASE("run history: the file round trip, with killed, noticed and clean ends counted") {
  holdfast_test::temp_dir dir("hist");
  {
    holdfast::run_history h(dir.path());
    CHECK(h.begin(wall(0)));
    CHECK(h.counters().incarnations == 0);
    CHECK(h.note_notice(wall(100)));
  }
  CHECK(fs::exists(dir / "holdfast-run-history.json"));
  {
    holdfast::run_history h(dir.path());
    CHECK(h.begin(wall(130)));  // the previous one noted its notice at 100
    CHECK(h.counters().noticed == 1);
    CHECK(h.counters().unnoticed == 0);
    CHECK(h.counters().exposure.count() == doctest::Approx(100));
    CHECK(!h.save_cost());
    CHECK(h.note_save(wall(330), 42s));  // a save, then it is killed: nothing more noted
  }
  {
    holdfast::run_history h(dir.path());
    CHECK(h.begin(wall(1000)));  // killed: its run time ends at its last note_alive
    CHECK(h.counters().unnoticed == 1);
    CHECK(h.counters().exposure.count() == doctest::Approx(100 + 200));
    REQUIRE(h.save_cost());
    CHECK(h.save_cost()->count() == 42);
    CHECK(h.note_clean_end(wall(1050)));
  }
  {
    holdfast::run_history h(dir.path());
    CHECK(h.begin(wall(2000)));  // killed without note_alive: until this start
  }
  holdfast::run_history h(dir.path());
  CHECK(h.begin(wall(2500)));
  const holdfast::run_counters& c = h.counters();
  CHECK(c.incarnations == 4);
  CHECK(c.noticed == 1);
  CHECK(c.clean == 1);
  CHECK(c.unnoticed == 2);
  CHECK(c.exposure.count() == doctest::Approx(100 + 200 + 50 + 500));
  REQUIRE(h.incarnations().size() == 4);
  CHECK(h.incarnations()[0].end == holdfast::run_end::notice);
  CHECK(h.incarnations()[1].end == holdfast::run_end::killed);
  CHECK(h.incarnations()[2].end == holdfast::run_end::clean);
  CHECK(h.incarnations()[3].end == holdfast::run_end::killed);
  CHECK(h.incarnations()[3].start == wall(2000));
  REQUIRE(h.current());
  CHECK(h.current()->start == wall(2500));
  // the policy reads the counters: (1 x 1 h + 850 s) / (1 + 2), and starts from the last C
  policy_t p(unbounded(1h));
  p.observe(h);
  p.start(t0);
  CHECK(p.mtbi(t0).count() == doctest::Approx((3600 + 850) / 3.0));
  CHECK(p.save_cost().count() == 42);
  p.record_save(2s, t0);  // a measurement moves it as any other
  CHECK(p.save_cost().count() == doctest::Approx(42 - 0.3 * 40));
  p.seed_save_cost(1000s);  // a seed never overrides a measurement
  CHECK(p.save_cost().count() == doctest::Approx(30));
}

TEST_CASE("run history: the list is bounded, the totals exact") {
  holdfast_test::temp_dir dir("histmany");
  for (int k = 0; k < 80; ++k) {
    holdfast::run_history h(dir.path());
    CHECK(h.begin(wall(10 * k)));
  }
  holdfast::run_history h(dir.path());
  CHECK(h.begin(wall(800)));
  CHECK(h.counters().unnoticed == 80);
  CHECK(h.counters().exposure.count() == doctest::Approx(800));
  CHECK(h.incarnations().size() == 64);
  CHECK(h.incarnations().back().start == wall(790));
}

TEST_CASE("run history: a missing, corrupt or unwritable file starts from the prior, logged") {
  holdfast_test::temp_dir dir("histbad");
  std::vector<std::string> lines;
  holdfast::log_fn log = [&](std::string_view l) { lines.emplace_back(l); };
  const std::string file = dir / "holdfast-run-history.json";

  holdfast::run_history missing(dir.path(), log);
  CHECK(missing.begin(wall(0)));
  CHECK(lines.empty());  // a first start is no problem
  CHECK(missing.counters().incarnations == 0);

  for (const std::string& bad :
       {std::string("{\"format\": \"holdfast-run-history 1\", \"totals\""),  // truncated
        std::string("{\"format\": \"something else\"}"),
        std::string("{\"format\": \"holdfast-run-history 1\", \"totals\": {\"run_s\": 10, "
                    "\"killed\": -3, \"notice\": 0, \"clean\": 0}}"),
        std::string("\x01\x02 not json")}) {
    holdfast_test::write_plain(file, bad);
    lines.clear();
    holdfast::run_history h(dir.path(), log);
    CHECK(h.begin(wall(50)));
    CHECK(h.counters().incarnations == 0);  // the prior alone
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find(file) != std::string::npos);
    CHECK(lines[0].find("starting from the prior") != std::string::npos);
    // rewritten: the next start reads it without complaint
    lines.clear();
    holdfast::run_history next(dir.path(), log);
    CHECK(next.begin(wall(60)));
    CHECK(lines.empty());
    CHECK(next.counters().unnoticed == 1);
  }

  lines.clear();
  holdfast::run_history nowhere(dir / "no-such-dir", log);
  CHECK(!nowhere.begin(wall(0)));  // a failed write is reported, not thrown
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("run history not saved") != std::string::npos);
}

TEST_CASE("run history: a restarted process reads what the killed and the noticed ones left") {
  holdfast_test::temp_dir dir("histproc");
  // Incarnation 1 begins, notes it is alive, then is SIGKILLed while it trains.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  holdfast_test::child killed([&] {
    ::close(ready[0]);
    holdfast::run_history h(dir.path());
    CHILD_REQUIRE(h.begin(wall(0)));
    CHILD_REQUIRE(h.note_alive(wall(600)));
    char c = 'r';
    CHILD_REQUIRE(::write(ready[1], &c, 1) == 1);
    for (;;) ::pause();  // training, until killed
  });
  ::close(ready[1]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);  // it has written its history
  ::close(ready[0]);
  killed.kill(SIGKILL);
  holdfast_test::child_result r = killed.wait();
  CHECK(r.term_signal == SIGKILL);

  // Incarnation 2 reads it, then ends with a committed preemption save.
  holdfast_test::child noticed([&] {
    holdfast::run_history h(dir.path());
    CHILD_REQUIRE(h.begin(wall(700)));
    CHILD_REQUIRE(h.counters().unnoticed == 1);
    CHILD_REQUIRE(h.note_notice(wall(1900)));
  });
  r = noticed.wait();
  CHECK(r.ok());
  CHECK(r.failures == "");

  holdfast::run_history h(dir.path());
  CHECK(h.begin(wall(2000)));
  CHECK(h.counters().unnoticed == 1);
  CHECK(h.counters().noticed == 1);
  CHECK(h.counters().exposure.count() == doctest::Approx(600 + 1200));
  save_interval_options o = unbounded(1h);
  policy_t p(o);
  p.observe(h);
  p.start(t0);
  CHECK(p.mtbi(t0).count() == doctest::Approx((3600 + 1800) / 2.0));
}

TEST_CASE("save_when_due: saves through a checkpoint_manager when due, records the blocking time") {
  holdfast_test::temp_dir dir("due");
  holdfast::checkpoint_manager<> m(dir / "ck", holdfast::directory_commit::rename);
  struct timed {  // a Checkpointer whose save takes 7 s on the manual clock
    holdfast::checkpoint_manager<>& m;
    int saves = 0;
    void save(std::int64_t step) {
      m.save(step, [](const std::string& d) { holdfast_test::write_plain(d + "/state", "x"); });
      manual_clock::current() += 7s;
      ++saves;
    }
  } ck{m};
  holdfast::basic_save_interval_policy<manual_clock> p(unbounded(1h));
  manual_clock::current() = manual_clock::time_point(5h);
  p.start(manual_clock::now());
  // C = 0 before a measurement: T clamps to min_interval (0 here), so the first call saves
  CHECK(holdfast::save_when_due(p, ck, 1));
  CHECK(ck.saves == 1);
  CHECK(p.save_cost().count() == doctest::Approx(7));
  CHECK(p.last_save() == manual_clock::now());
  manual_clock::current() += 60s;  // T = daly(7 s, ~1 h) ~ 218 s: not due
  CHECK(!holdfast::save_when_due(p, ck, 2));
  manual_clock::current() += 200s;
  CHECK(holdfast::save_when_due(p, ck, 3));
  CHECK(ck.saves == 2);
  CHECK(m.all_steps() == std::vector<std::int64_t>{1, 3});
}

namespace {

// One incarnation of a job as docs/save-policy.md shows it (the handler with no_exit, the policy
// deciding the periodic saves, the history noting how the incarnation ended), in a forked child.
// SIGTERM at step `notice_at` (never when negative); `steps` steps in all; `launch`: the kv
// incarnation.
void job_incarnation(const std::string& run_dir, std::uint64_t launch, std::int64_t notice_at,
                     std::int64_t steps) {
  // [snippet save-policy-options]
  holdfast::save_interval_options options;
  options.mtbi_prior = std::chrono::hours(8);      // your guess of M, before any history
  options.prior_weight = 1;                        // ... worth one interruption seen
  options.min_interval = std::chrono::minutes(1);  // bounds on the interval
  options.max_interval = std::chrono::hours(6);
  // [/snippet save-policy-options]
  options.min_interval = options.max_interval = save_seconds(0);  // here: every step is due
  holdfast_test::scoped_disposition quiet(SIGTERM, SIG_IGN);      // under the notice: not doctest's
  using config = holdfast::termination_config<holdfast::signal_notice<SIGTERM>, holdfast::no_exit>;
  holdfast::filesystem_kv kv(run_dir + "/kv", {"run-1", launch});
  holdfast::checkpoint_options keep_all;
  keep_all.retention = holdfast::retention_policy::keep_last(100);
  holdfast::checkpoint_manager<> manager(holdfast::store::create(run_dir + "/store"), "run-1",
                                         keep_all);
  manager.set_writer([](const std::string& d) { holdfast_test::write_plain(d + "/w", "w"); });
  holdfast::cluster_info me{0, 1, "run-1"};
  holdfast::preemption_handler<config, holdfast::filesystem_kv> handler(config{}, kv, me,
                                                                        std::move(manager));
  std::int64_t trained = 0;
  auto train_step = [&] {
    if (handler.total_run_calls() == notice_at) std::raise(SIGTERM);  // the platform's notice
    ++trained;
  };
  using std::chrono::steady_clock;
  using std::chrono::system_clock;
  // [snippet save-policy-loop]
  holdfast::run_history history(run_dir);          // <run_dir>/holdfast-run-history.json
  history.begin(system_clock::now());              // closes the previous incarnation
  holdfast::save_interval_policy policy(options);  // C measured, M from the prior and history
  policy.observe(history);                         // M and the last C from the history
  policy.start(steady_clock::now());               // the restored state counts as saved now
  auto& ckpt = handler.checkpointer();             // the handler's checkpoint_manager
  while (handler.total_run_calls() < steps) {
    // a config with no_exit: run() returns `stopped` after the preemption save committed
    if (handler.run(train_step) == holdfast::run_status::stopped) {
      history.note_notice(system_clock::now());  // this incarnation ended with a notice
      return;
    }
    if (holdfast::save_when_due(policy, ckpt, handler.total_run_calls()))  // due: saved, timed
      history.note_save(system_clock::now(), policy.save_cost());          // for the next one
  }
  history.note_clean_end(system_clock::now());  // the job ended on purpose
  // [/snippet save-policy-loop]
}

}  // namespace

TEST_CASE("save_when_due in the handler loop: periodic saves, a noticed end, a clean end") {
  holdfast_test::temp_dir dir("loop");
  holdfast_test::child first([&] { job_incarnation(dir.path(), 1, 5, 10); });
  holdfast_test::child_result r = first.wait();
  CHECK(r.ok());
  CHECK(r.failures == "");
  {
    holdfast::run_history h(dir.path());
    CHECK(h.begin(std::chrono::system_clock::now()));
    CHECK(h.counters().noticed == 1);  // ended with a notice, not killed
    CHECK(h.counters().unnoticed == 0);
    REQUIRE(h.save_cost());  // the periodic saves were measured and recorded
    CHECK(h.save_cost()->count() > 0);
    CHECK(h.note_clean_end(std::chrono::system_clock::now()));
  }
  holdfast::checkpoint_manager<> read(holdfast::read_only, holdfast::store::create(dir / "store"),
                                      "run-1");
  // the policy saved every step (every step due) up to the handler's preemption save
  const std::vector<std::int64_t> saved = read.all_steps();
  REQUIRE(saved.size() >= 5);
  for (std::size_t k = 0; k < saved.size(); ++k) CHECK(saved[k] == std::int64_t(k) + 1);
  holdfast_test::child second([&] { job_incarnation(dir.path(), 2, -1, 12); });
  r = second.wait();
  CHECK(r.ok());
  CHECK(r.failures == "");
  holdfast::run_history h(dir.path());
  CHECK(h.begin(std::chrono::system_clock::now()));
  CHECK(h.counters().noticed == 1);
  CHECK(h.counters().clean == 2);
  CHECK(h.counters().unnoticed == 0);
  CHECK(read.all_steps().back() == 12);  // resumed, saved each step to the end
}
