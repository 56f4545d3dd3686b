// step_agreement, the pure state machine: every row of the transition table in agreement.hpp,
// then many machines driven together over a tiny in-test key-value map (a discrete-event
// simulation with random notices, skews and interleavings), which must always agree on one step.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <holdfast/agreement.hpp>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

using holdfast::agreement_action;
using holdfast::agreement_failure;
using holdfast::agreement_key;
using holdfast::agreement_state;
using holdfast::step_agreement;
using op = step_agreement::instruction::op;
using clk = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

const std::string scope = "run/";
const clk::time_point t0 = clk::time_point(std::chrono::hours(1));

step_agreement::config cfg(int task, int n, milliseconds grace = milliseconds(0),
                           bool exits = true) {
  step_agreement::config c;
  c.task = task;
  c.num_tasks = n;
  c.grace = grace;
  c.ack_timeout = milliseconds(1000);
  c.exit_after_save = exits;
  return c;
}

std::string key_of(const step_agreement::instruction& in) {
  return holdfast::agreement_key_name(scope, in.key, in.round, in.task);
}

// The test-local fake store: a sorted map (agreement tests only; handler tests use real stores).
struct fake_kv {
  std::map<std::string, std::string> m;
  int ops = 0;
  bool insert(const std::string& k, const std::string& v) {
    ++ops;
    return m.emplace(k, v).second;
  }
  std::optional<std::string> try_get(const std::string& k) const {
    auto it = m.find(k);
    if (it == m.end()) return std::nullopt;
    return it->second;
  }
  std::vector<std::pair<std::string, std::string>> list(const std::string& prefix) {
    ++ops;
    std::vector<std::pair<std::string, std::string>> out;
    for (auto it = m.lower_bound(prefix);
         it != m.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
      out.push_back(*it);
    return out;
  }
};

// Performs one store instruction on `kv`; a wait whose key is absent is answered now as the
// deadline (for single-machine tests). Returns false for a decide.
bool perform(step_agreement& a, const step_agreement::instruction& in, fake_kv& kv) {
  switch (in.kind) {
    case op::decide:
      return false;
    case op::insert:
      a.on_insert(kv.insert(key_of(in), in.value));
      return true;
    case op::put:
      ++kv.ops;
      kv.m[key_of(in)] = in.value;
      a.on_put();
      return true;
    case op::try_get:
    case op::wait:
      ++kv.ops;
      a.on_value(kv.try_get(key_of(in)));
      return true;
    case op::list:
      a.on_list(kv.list(key_of(in)));
      return true;
  }
  return false;
}

// Lets the watcher side do its store work, then asks the training side; when that started the
// final phase (grace), the watcher side runs again and the training side is asked again.
void drain(step_agreement& a, fake_kv& kv, std::int64_t counter, clk::time_point now) {
  for (int i = 0; i < 100; ++i)
    if (!perform(a, a.protocol_next(counter, now), kv)) return;
  FAIL("exchange did not end");
}
step_agreement::instruction decide(step_agreement& a, fake_kv& kv, std::int64_t counter,
                                   clk::time_point now,
                                   clk::duration mean = clk::duration::zero()) {
  drain(a, kv, counter, now);
  auto v = a.decide(counter, now, mean);
  if (a.state() != agreement_state::final_noticed) return v;
  drain(a, kv, counter, now);
  return a.decide(counter, now, mean);
}

}  // namespace

TEST_CASE("idle: proceeds with no store traffic and needs no attention") {
  step_agreement a(cfg(0, 2));
  CHECK(a.state() == agreement_state::idle);
  CHECK_FALSE(a.needs_attention());
  CHECK(a.watch_key() == agreement_key::claim);
  for (int c = 0; c < 5; ++c) {
    auto in = a.decide(c, t0);
    CHECK(in.kind == op::decide);
    CHECK(in.action == agreement_action::proceed);
  }
}

TEST_CASE("rejects a task id outside the job") {
  CHECK_THROWS_AS(step_agreement(cfg(2, 2)), std::invalid_argument);
  CHECK_THROWS_AS(step_agreement(cfg(-1, 2)), std::invalid_argument);
}

TEST_CASE("key names are scoped by run and round") {
  CHECK(holdfast::agreement_key_name("j/", agreement_key::claim, 3) == "j/r3/claim");
  CHECK(holdfast::agreement_key_name("j/", agreement_key::ack, 0, 7) == "j/r0/ack/7");
  CHECK(holdfast::agreement_key_name("j/", agreement_key::ack, 0) == "j/r0/ack/");
  CHECK(holdfast::agreement_key_name("j/", agreement_key::final_ack, 1, 2) == "j/r1/final_ack/2");
  CHECK(holdfast::agreement_key_name("j/", agreement_key::step, 1) == "j/r1/step");
  CHECK(holdfast::agreement_key_name("j/", agreement_key::final_claim, 1) == "j/r1/final");
  CHECK(holdfast::agreement_key_name("j/", agreement_key::final_step, 1) == "j/r1/final_step");
  CHECK(holdfast::agreement_key_name("j/", agreement_key::error, 9) == "j/error");
}

TEST_CASE("one worker: notice → claim → ack → list → step published → save then exit") {
  step_agreement a(cfg(0, 1));
  a.on_notice(t0);
  CHECK(a.state() == agreement_state::noticed);
  CHECK(a.needs_attention());

  auto in = a.protocol_next(5, t0);
  CHECK(in.kind == op::insert);
  CHECK(key_of(in) == "run/r0/claim");
  CHECK(in.value == "claim by 0/0");
  a.on_insert(true);
  CHECK(a.state() == agreement_state::claimed);
  CHECK(a.claimant());

  in = a.protocol_next(5, t0);
  CHECK(in.kind == op::put);
  CHECK(key_of(in) == "run/r0/ack/0");
  CHECK(in.value == "5");
  a.on_put();
  CHECK(a.state() == agreement_state::acked);

  in = a.protocol_next(5, t0);
  CHECK(in.kind == op::list);
  CHECK(key_of(in) == "run/r0/ack/");
  a.on_list({{"run/r0/ack/0", "5"}});
  in = a.protocol_next(5, t0);
  CHECK(in.kind == op::insert);
  CHECK(key_of(in) == "run/r0/step");
  CHECK(in.value == "step 6 by 0/0");  // max + 1
  a.on_insert(true);
  CHECK(a.state() == agreement_state::step_published);
  CHECK(a.agreed_step() == 6);

  in = a.decide(5, t0);
  CHECK(in.kind == op::decide);
  CHECK(in.action == agreement_action::proceed);
  in = a.decide(6, t0);
  CHECK(in.action == agreement_action::save_then_exit);
  CHECK(in.step == 6);
  CHECK(a.state() == agreement_state::exiting);
  CHECK_FALSE(a.needs_attention());
  CHECK(a.decide(7, t0).action == agreement_action::proceed);
}

TEST_CASE("lost claim and a claim seen by the watcher both make a follower") {
  step_agreement a(cfg(1, 2));
  a.on_notice(t0);
  auto in = a.protocol_next(3, t0);
  CHECK(in.kind == op::insert);
  a.on_insert(false);
  CHECK(a.state() == agreement_state::claimed);
  CHECK_FALSE(a.claimant());

  step_agreement b(cfg(1, 2));
  b.on_claim_seen(1);  // another round: ignored
  CHECK(b.state() == agreement_state::idle);
  b.on_claim_seen(0);
  CHECK(b.state() == agreement_state::claimed);
  CHECK(b.watch_key() == std::nullopt);

  step_agreement c(cfg(1, 2));  // noticed, but the claim was seen before claiming: no insert
  c.on_notice(t0);
  c.on_claim_seen(0);
  CHECK(c.state() == agreement_state::claimed);
  CHECK(c.protocol_next(2, t0).kind == op::put);
}

TEST_CASE("incomplete acks: wait for the step until the deadline, then a step or a timeout") {
  step_agreement a(cfg(0, 3));
  a.on_claim_seen(0);
  a.protocol_next(4, t0);
  a.on_put();
  CHECK(a.protocol_next(4, t0).kind == op::list);
  a.on_list({{"run/r0/ack/0", "4"}, {"run/r0/ack/2", "9"}});
  auto in = a.protocol_next(4, t0 + milliseconds(10));
  CHECK(in.kind == op::wait);
  CHECK(key_of(in) == "run/r0/step");
  CHECK(in.deadline == t0 + milliseconds(1000));  // acked at t0 + ack_timeout

  SUBCASE("the step arrives") {
    a.on_value(std::string("step 10 by 2/x"));
    CHECK(a.state() == agreement_state::step_published);
    CHECK(a.agreed_step() == 10);
    CHECK(a.decide(9, t0).action == agreement_action::proceed);
    CHECK(a.decide(10, t0).action == agreement_action::save_then_exit);
  }
  SUBCASE("the deadline passes and task 1 never acked: the timeout is recorded, then raised") {
    a.on_value(std::nullopt);
    in = a.protocol_next(4, t0 + milliseconds(1000));
    CHECK(in.kind == op::list);
    a.on_list({{"run/r0/ack/0", "4"}, {"run/r0/ack/2", "9"}});
    CHECK(a.state() == agreement_state::acked);  // nothing decided before it is recorded
    CHECK(a.decide(5, t0).action == agreement_action::wait);
    in = a.protocol_next(4, t0 + milliseconds(1000));
    CHECK(in.kind == op::insert);
    CHECK(key_of(in) == "run/r0/step");
    CHECK(in.value == "timeout 1 by 0/0");
    a.on_insert(true);
    CHECK(a.state() == agreement_state::failed);
    CHECK(a.failure().kind == agreement_failure::timeout);
    CHECK(a.failure().missing_tasks == std::vector<int>{1});
    CHECK(a.failure().key == agreement_key::step);
    CHECK(a.decide(4, t0).action == agreement_action::fail);  // sticky
    CHECK(a.decide(5, t0).action == agreement_action::fail);
  }
  SUBCASE("recording the timeout loses to a step recorded meanwhile: the step is followed") {
    a.on_value(std::nullopt);
    a.protocol_next(4, t0 + milliseconds(1000));
    a.on_list({{"run/r0/ack/0", "4"}, {"run/r0/ack/2", "9"}});
    CHECK(a.protocol_next(4, t0 + milliseconds(1000)).kind == op::insert);
    a.on_insert(false);
    in = a.protocol_next(4, t0 + milliseconds(1001));
    CHECK(in.kind == op::wait);
    CHECK(key_of(in) == "run/r0/step");
    a.on_value(std::string("step 12 by 1/late"));
    CHECK(a.state() == agreement_state::step_published);
    CHECK(a.agreed_step() == 12);
    CHECK(a.decide(12, t0).action == agreement_action::save_then_exit);
  }
  SUBCASE("another worker's recorded timeout is followed, with its list of tasks") {
    a.on_value(std::string("timeout 1,2 by 2/other"));
    CHECK(a.state() == agreement_state::failed);
    CHECK(a.failure().kind == agreement_failure::timeout);
    CHECK(a.failure().missing_tasks == std::vector<int>{1, 2});
  }
  SUBCASE("a late worker that sees every ack finds the recorded timeout and raises it") {
    a.on_value(std::nullopt);
    a.protocol_next(4, t0 + milliseconds(5000));  // resumed long after the deadline
    a.on_list({{"run/r0/ack/0", "4"}, {"run/r0/ack/1", "2"}, {"run/r0/ack/2", "9"}});
    in = a.protocol_next(4, t0 + milliseconds(5000));
    CHECK(in.value == "step 10 by 0/0");
    a.on_insert(false);
    CHECK(a.protocol_next(4, t0 + milliseconds(5000)).kind == op::wait);
    a.on_value(std::string("timeout 1 by 2/other"));
    CHECK(a.failure().kind == agreement_failure::timeout);
    CHECK(a.failure().missing_tasks == std::vector<int>{1});
    CHECK(a.decide(10, t0).action == agreement_action::fail);  // never a save at 10
  }
  SUBCASE("a value outside the grammar fails as a peer error naming it") {
    a.on_value(std::string("10"));
    CHECK(a.state() == agreement_state::failed);
    CHECK(a.failure().kind == agreement_failure::peer);
    CHECK(a.failure().message.find("malformed outcome '10'") != std::string::npos);
  }
  SUBCASE("the deadline passes but the last ack landed meanwhile: the step is computed here") {
    a.on_value(std::nullopt);
    a.protocol_next(4, t0 + milliseconds(1000));
    a.on_list({{"run/r0/ack/0", "4"}, {"run/r0/ack/1", "2"}, {"run/r0/ack/2", "9"}});
    in = a.protocol_next(4, t0);
    CHECK(in.kind == op::insert);
    CHECK(in.value == "step 10 by 0/0");
    a.on_insert(false);  // someone else inserted it first: read it
    in = a.protocol_next(4, t0);
    CHECK(in.kind == op::wait);
    a.on_value(std::string("step 10 by 2/x"));
    CHECK(a.agreed_step() == 10);
  }
  SUBCASE("an aborted step names the peer's error") {
    a.on_value(std::string("abort by 1/y"));
    in = a.protocol_next(4, t0);
    CHECK(in.kind == op::try_get);
    CHECK(key_of(in) == "run/error");
    a.on_value(step_agreement::encode_error(1, "std::runtime_error", "nan\nloss"));
    CHECK(a.state() == agreement_state::failed);
    CHECK(a.failure().kind == agreement_failure::peer);
    CHECK(a.failure().task == 1);
    CHECK(a.failure().type_name == "std::runtime_error");
    CHECK(a.failure().message == "nan\nloss");
  }
}

TEST_CASE("training side: proceeds up to its published counter, then waits for the step") {
  step_agreement a(cfg(0, 2));
  a.on_claim_seen(0);
  CHECK(a.wants_counter());
  CHECK(a.decide(5, t0).action == agreement_action::proceed);  // the ack will carry >= 5
  auto in = a.protocol_next(5, t0);
  CHECK(in.kind == op::put);
  CHECK(in.value == "5");
  CHECK_FALSE(a.wants_counter());
  CHECK(a.published_counter() == 5);
  CHECK(a.decide(5, t0).action == agreement_action::proceed);  // below the step (>= 6)
  CHECK(a.decide(6, t0).action == agreement_action::wait);     // might be the step: wait
  a.on_put();
  CHECK(a.protocol_next(6, t0).kind == op::list);
  a.on_list({{"run/r0/ack/0", "5"}, {"run/r0/ack/1", "9"}});
  in = a.protocol_next(6, t0);
  CHECK(in.value == "step 10 by 0/0");
  CHECK(a.decide(6, t0).action == agreement_action::wait);  // still not published
  a.on_insert(true);
  CHECK(a.decide(6, t0).action == agreement_action::proceed);
  CHECK(a.decide(9, t0).action == agreement_action::proceed);
  CHECK(a.decide(10, t0).action == agreement_action::save_then_exit);
}

TEST_CASE("the agreed step is max of the counters + 1, whatever the skew") {
  for (int me = 0; me < 3; ++me) {
    step_agreement a(cfg(me, 3));
    a.on_claim_seen(0);
    a.protocol_next(1000, t0);
    a.on_put();
    a.protocol_next(1000, t0);
    a.on_list({{"run/r0/ack/0", "3"}, {"run/r0/ack/1", "1000"}, {"run/r0/ack/2", "17"}});
    auto in = a.protocol_next(1000, t0);
    CHECK(in.value == "step 1001 by " + std::to_string(me) + "/0");
  }
}

TEST_CASE("a malformed ack or a foreign task id counts as missing") {
  step_agreement a(cfg(0, 2));
  a.on_claim_seen(0);
  a.protocol_next(1, t0);
  a.on_put();
  a.protocol_next(1, t0);
  a.on_list({{"run/r0/ack/0", "1"}, {"run/r0/ack/1", "x"}, {"run/r0/ack/7", "3"}});
  CHECK(a.protocol_next(1, t0).kind == op::wait);
}

TEST_CASE("grace path: save then continue, final claim at end − 6 × mean step, final save") {
  const auto grace = milliseconds(1000);
  step_agreement a(cfg(0, 1, grace));
  fake_kv kv;
  a.on_notice(t0);
  auto in = decide(a, kv, 10, t0);
  CHECK(in.action == agreement_action::proceed);  // agreed step is 11
  CHECK(a.agreed_step() == 11);
  in = decide(a, kv, 11, t0 + milliseconds(10));
  CHECK(in.action == agreement_action::save_then_continue);
  CHECK(in.step == 11);
  CHECK(a.state() == agreement_state::grace);
  CHECK(a.needs_attention());
  CHECK(a.watch_key() == agreement_key::final_claim);

  const auto mean = milliseconds(50);  // buffer 300 ms: final claim after t0 + 700 ms
  CHECK(decide(a, kv, 12, t0 + milliseconds(600), mean).action == agreement_action::proceed);
  CHECK(a.state() == agreement_state::grace);
  CHECK(a.decide(13, t0 + milliseconds(701), mean).action == agreement_action::proceed);
  CHECK(a.state() == agreement_state::final_noticed);
  in = a.protocol_next(13, t0 + milliseconds(701));
  CHECK(in.kind == op::insert);
  CHECK(key_of(in) == "run/r0/final");
  a.on_insert(true);
  CHECK(a.state() == agreement_state::final_claimed);
  in = a.protocol_next(13, t0 + milliseconds(701));
  CHECK(key_of(in) == "run/r0/final_ack/0");
  CHECK(perform(a, in, kv));
  CHECK(a.state() == agreement_state::final_acked);
  in = decide(a, kv, 13, t0 + milliseconds(701), mean);
  CHECK(a.state() == agreement_state::final_published);
  CHECK(a.agreed_step(1) == 14);
  CHECK(in.action == agreement_action::proceed);
  in = decide(a, kv, 14, t0 + milliseconds(760), mean);
  CHECK(in.action == agreement_action::save_then_exit);
  CHECK(in.step == 14);
  CHECK(a.state() == agreement_state::exiting);
}

TEST_CASE("grace path uses the announced deadline and a zero mean gives no buffer") {
  step_agreement a(cfg(0, 1, milliseconds(100000)));
  fake_kv kv;
  a.on_notice(t0, t0 + milliseconds(500));
  decide(a, kv, 0, t0);
  CHECK(decide(a, kv, 1, t0).action == agreement_action::save_then_continue);
  CHECK(decide(a, kv, 2, t0 + milliseconds(500)).action == agreement_action::proceed);
  CHECK(a.state() == agreement_state::grace);
  CHECK(decide(a, kv, 3, t0 + milliseconds(501)).action == agreement_action::proceed);
  CHECK(a.state() == agreement_state::final_published);
  CHECK(decide(a, kv, 4, t0 + milliseconds(501)).action == agreement_action::save_then_exit);
}

TEST_CASE("grace: the final claim also leaves room for twice the first save's overhead") {
  step_agreement a(cfg(0, 1, milliseconds(1000)));
  fake_kv kv;
  a.on_notice(t0);
  decide(a, kv, 0, t0);
  CHECK(decide(a, kv, 1, t0).action == agreement_action::save_then_continue);
  a.note_overhead(milliseconds(100));
  a.note_overhead(milliseconds(50));   // the largest is kept
  const auto mean = milliseconds(10);  // 60 ms + 2 × 100 ms: final claim after t0 + 740 ms
  CHECK(decide(a, kv, 2, t0 + milliseconds(739), mean).action == agreement_action::proceed);
  CHECK(a.state() == agreement_state::grace);
  decide(a, kv, 3, t0 + milliseconds(741), mean);
  CHECK(a.state() == agreement_state::final_published);
}

TEST_CASE("grace: a worker that was never noticed waits for the final claim") {
  step_agreement a(cfg(1, 2, milliseconds(10)));
  fake_kv kv;
  kv.m["run/r0/ack/0"] = "3";
  a.on_claim_seen(0);
  decide(a, kv, 3, t0);
  CHECK(a.agreed_step() == 4);
  CHECK(decide(a, kv, 4, t0).action == agreement_action::save_then_continue);
  CHECK(decide(a, kv, 5, t0 + std::chrono::hours(1)).action == agreement_action::proceed);
  CHECK(a.state() == agreement_state::grace);
  CHECK(kv.try_get("run/r0/final") == std::nullopt);
  a.on_final_seen(0);
  CHECK(a.state() == agreement_state::final_claimed);
  kv.m["run/r0/final_ack/0"] = "9";
  decide(a, kv, 6, t0);
  CHECK(a.agreed_step(1) == 10);
}

TEST_CASE("no_exit: save, re-arm into the next round, and agree again") {
  step_agreement a(cfg(0, 1, milliseconds(0), false));
  fake_kv kv;
  a.on_notice(t0);
  decide(a, kv, 0, t0 + milliseconds(1));
  auto in = decide(a, kv, 1, t0 + milliseconds(2));
  CHECK(in.action == agreement_action::save);
  CHECK(a.state() == agreement_state::idle);
  CHECK(a.round() == 1);
  CHECK_FALSE(a.needs_attention());
  a.on_notice(t0);  // the notice that was served: ignored
  CHECK(a.state() == agreement_state::idle);
  a.on_notice(t0 + milliseconds(2));  // up to the save: served too
  CHECK(a.state() == agreement_state::idle);
  a.on_notice(t0 + milliseconds(5));  // a new one
  CHECK(a.state() == agreement_state::noticed);
  in = a.protocol_next(7, t0 + milliseconds(5));
  CHECK(key_of(in) == "run/r1/claim");
  CHECK(perform(a, in, kv));
  decide(a, kv, 7, t0 + milliseconds(5));
  CHECK(a.agreed_step() == 8);
  CHECK(decide(a, kv, 8, t0 + milliseconds(6)).action == agreement_action::save);
  CHECK(a.round() == 2);
}

TEST_CASE("explicit rearm from exiting, and rearm does nothing once failed or stopped") {
  step_agreement a(cfg(0, 1));
  fake_kv kv;
  a.on_notice(t0);
  decide(a, kv, 0, t0);
  CHECK(decide(a, kv, 1, t0).action == agreement_action::save_then_exit);
  a.rearm();
  CHECK(a.state() == agreement_state::idle);
  CHECK(a.round() == 1);
  a.on_stop();
  a.rearm();
  CHECK(a.state() == agreement_state::stopped);
  CHECK(a.round() == 1);
}

TEST_CASE("a local error publishes the error and aborts both rounds' step keys, then fails") {
  step_agreement a(cfg(2, 4));
  fake_kv kv;
  a.on_local_error("std::domain_error", "bad batch");
  CHECK(a.state() == agreement_state::failed);
  CHECK(a.needs_attention());
  std::vector<std::string> inserted;
  for (;;) {
    auto in = a.protocol_next(3, t0);
    if (in.kind == op::decide) {
      CHECK(a.decide(3, t0).action == agreement_action::fail);
      break;
    }
    CHECK(in.kind == op::insert);
    inserted.push_back(key_of(in) + "=" + in.value);
    perform(a, in, kv);
  }
  const std::string abort = "=abort by 2/0";
  CHECK(inserted == std::vector<std::string>{"run/error=2\nstd::domain_error\nbad batch",
                                             "run/r0/step" + abort, "run/r0/final_step" + abort,
                                             "run/r0/claim" + abort, "run/r0/final" + abort,
                                             "run/r1/step" + abort, "run/r1/final_step" + abort,
                                             "run/r1/claim" + abort, "run/r1/final" + abort});
  CHECK(a.failure().kind == agreement_failure::local);
  CHECK(a.failure().task == 2);
  a.on_error_seen(step_agreement::encode_error(1, "x", "y"));  // first error wins locally
  CHECK(a.failure().task == 2);
}

TEST_CASE("a peer's error seen by the watcher fails the machine in any state") {
  for (int start = 0; start < 3; ++start) {
    step_agreement a(cfg(0, 2));
    if (start == 1) a.on_notice(t0);
    if (start == 2) a.on_claim_seen(0);
    a.on_error_seen(step_agreement::encode_error(1, "E", "m"));
    CHECK(a.state() == agreement_state::failed);
    auto in = a.decide(0, t0);
    CHECK(in.action == agreement_action::fail);
    CHECK(a.failure().kind == agreement_failure::peer);
    CHECK(a.failure().task == 1);
    a.on_notice(t0);  // nothing revives it
    a.on_claim_seen(0);
    CHECK(a.state() == agreement_state::failed);
  }
}

TEST_CASE("results arriving after a failure or stop are ignored") {
  step_agreement a(cfg(0, 2));
  a.on_notice(t0);
  CHECK(a.protocol_next(0, t0).kind == op::insert);
  a.on_error_seen(step_agreement::encode_error(1, "E", "m"));
  a.on_insert(true);  // no throw
  CHECK(a.state() == agreement_state::failed);

  step_agreement b(cfg(0, 2));
  b.on_claim_seen(0);
  CHECK(b.protocol_next(0, t0).kind == op::put);
  b.on_stop();
  b.on_put();
  CHECK(b.state() == agreement_state::stopped);
  CHECK(b.decide(0, t0).action == agreement_action::proceed);
  CHECK_FALSE(b.needs_attention());
}

TEST_CASE("misuse is a logic_error, not a silent wrong answer") {
  step_agreement a(cfg(0, 2));
  CHECK_THROWS_AS(a.on_put(), std::logic_error);
  a.on_notice(t0);
  a.protocol_next(0, t0);                                     // insert claim issued
  CHECK_THROWS_AS(a.protocol_next(0, t0), std::logic_error);  // its result was never reported
}

TEST_CASE("stop is safe in every state") {
  for (int k = 0; k < 6; ++k) {
    step_agreement a(cfg(0, 1, milliseconds(10)));
    fake_kv kv;
    if (k >= 1) a.on_notice(t0);
    if (k >= 2) a.protocol_next(0, t0);  // claim in flight
    if (k >= 3) a.on_insert(true);
    if (k >= 4) decide(a, kv, 0, t0);
    if (k >= 5) decide(a, kv, 1, t0);
    a.on_stop();
    CHECK(a.state() == agreement_state::stopped);
    CHECK(a.decide(0, t0).action == agreement_action::proceed);
  }
}

// ---- many machines over one map: a discrete-event simulation --------------------------------

namespace {

struct sim_worker {
  step_agreement sm;
  std::int64_t counter = 0;
  std::optional<step_agreement::instruction> parked;  // a wait whose key is absent
  std::vector<std::int64_t> saves;
  bool exited = false;
  int skew = 1;          // this worker runs one step every `skew` ticks
  bool running = false;  // a step is under way (the counter moves when it ends)
};

struct sim_result {
  std::set<std::int64_t> first_steps;
  int claims = 0;
  bool all_exited = true;
  bool failed = false;
  std::set<std::string> acted;  // what the workers that acted did: "save S" or "timeout 1,2"
  std::string recorded;         // the round's outcome key, as recorded
};

// Faults of a simulation: a short deadline, workers frozen (all their threads: SIGSTOP) from
// one tick to another, a worker dead from a tick on.
struct sim_faults {
  milliseconds ack_timeout{100000};
  std::vector<std::tuple<int, int, int>> stalls;  // (worker, from tick, to tick)
  int dead = -1;
  int dead_from = 0;
  bool frozen(int worker, int tick) const {
    if (worker == dead && tick >= dead_from) return true;
    for (auto& [who, from, to] : stalls)
      if (who == worker && tick >= from && tick < to) return true;
    return false;
  }
};

// The invariant of a round: every worker that acted followed the one recorded outcome.
bool follows_recorded(const sim_result& r) {
  if (r.acted.empty()) return true;
  if (r.acted.size() != 1) return false;
  auto v = holdfast::parse_agreement_value(r.recorded);
  if (!v) return false;
  if (v->what == holdfast::agreement_value::kind::step)
    return *r.acted.begin() == "save " + std::to_string(v->step);
  std::string ids;
  for (int t : v->tasks) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  return *r.acted.begin() == "timeout " + ids;
}

// n workers; `noticed` lists (worker, tick) notices; returns what happened.
sim_result simulate(int n, const std::vector<std::pair<int, int>>& notices,
                    const std::vector<int>& skews, std::mt19937& rng, int max_ticks = 4000,
                    const sim_faults& faults = {}) {
  fake_kv kv;
  std::vector<sim_worker> w;
  for (int i = 0; i < n; ++i) {
    auto c = cfg(i, n);
    c.ack_timeout = faults.ack_timeout;
    w.push_back(sim_worker{
        step_agreement(c), 0, std::nullopt, {}, false, skews[static_cast<std::size_t>(i)], false});
  }
  sim_result r;
  for (int tick = 0; tick < max_ticks; ++tick) {
    if (std::all_of(w.begin(), w.end(), [&](const sim_worker& x) {
          return x.exited || (&x - w.data() == faults.dead && tick >= faults.dead_from);
        }))
      break;
    auto now = t0 + milliseconds(tick);
    for (auto& nt : notices)
      if (nt.second == tick) w[static_cast<std::size_t>(nt.first)].sm.on_notice(now);
    // the "watcher": deliver the claim to a random subset each tick
    bool claimed = kv.try_get(scope + "r0/claim").has_value();
    std::vector<std::size_t> order(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (std::size_t i : order) {
      auto& x = w[i];
      if (x.exited || faults.frozen(static_cast<int>(i), tick)) continue;
      if (claimed && rng() % 3 == 0) x.sm.on_claim_seen(0);
      // the watcher side: every tick, whatever the training side is doing
      if (x.parked) {
        auto v = kv.try_get(key_of(*x.parked));
        if (v || now >= x.parked->deadline) {
          x.parked.reset();
          x.sm.on_value(v);
        }
      }
      while (!x.parked) {
        auto in = x.sm.protocol_next(x.counter, now);  // the counter of the step under way
        if (in.kind == op::decide) break;
        if (in.kind == op::wait && !kv.try_get(key_of(in))) {
          x.parked = in;
          break;
        }
        if (in.kind == op::insert && in.key == agreement_key::claim) {
          bool ok = kv.insert(key_of(in), in.value);
          r.claims += ok;
          x.sm.on_insert(ok);
          continue;
        }
        perform(x.sm, in, kv);
      }
      // the training side: one step every `skew` ticks (a step may be stuck for a while)
      if (tick % x.skew) continue;
      if (x.running) {
        ++x.counter;
        x.running = false;
      }
      auto in = x.sm.decide(x.counter, now);
      if (in.action == agreement_action::save_then_exit) {
        x.saves.push_back(in.step);
        if (in.step != x.sm.agreed_step()) r.failed = true;  // never past the agreed step
        r.acted.insert("save " + std::to_string(in.step));
        x.exited = true;
      } else if (in.action == agreement_action::fail) {
        const auto& f = x.sm.failure();
        if (f.kind != agreement_failure::timeout) r.failed = true;
        std::string ids;
        for (int t : f.missing_tasks) ids += (ids.empty() ? "" : ",") + std::to_string(t);
        r.acted.insert("timeout " + ids);
        x.exited = true;
      } else if (in.action == agreement_action::proceed) {
        x.running = true;
      }  // wait: stays at this boundary
    }
  }
  r.recorded = kv.try_get(scope + "r0/step").value_or("");
  for (auto& x : w) {
    if (&x - w.data() == faults.dead) continue;
    r.all_exited = r.all_exited && x.exited;
    for (auto s : x.saves) r.first_steps.insert(s);
    if (x.saves.size() > 1) r.failed = true;
  }
  return r;
}

}  // namespace

TEST_CASE("simulation: no notice never saves") {
  std::mt19937 rng(1);
  auto r = simulate(4, {}, {1, 1, 2, 3}, rng, 300);
  CHECK(r.first_steps.empty());
  CHECK(r.claims == 0);
}

TEST_CASE("simulation: skewed workers, notice to the slowest or the fastest, agree on one step") {
  std::mt19937 rng(2);
  for (int target : {0, 3}) {
    auto r = simulate(4, {{target, 50}}, {1, 2, 5, 11}, rng);
    CHECK(r.claims == 1);
    CHECK(r.first_steps.size() == 1);
    CHECK(r.all_exited);
    CHECK_FALSE(r.failed);
  }
}

TEST_CASE("simulation: 1000 random trials — random notices, subsets, skews — one step each") {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 1000; ++trial) {
    int n = 1 + static_cast<int>(rng() % 8);
    std::vector<int> skews;
    for (int i = 0; i < n; ++i) skews.push_back(1 + static_cast<int>(rng() % 7));
    std::vector<std::pair<int, int>> notices;
    int base = static_cast<int>(rng() % 200);
    for (int i = 0; i < n; ++i)
      if (i == 0 || rng() % 2) notices.emplace_back(i, base + static_cast<int>(rng() % 3));
    auto r = simulate(n, notices, skews, rng);
    INFO("trial " << trial << " n " << n);
    REQUIRE(r.claims == 1);
    REQUIRE(r.first_steps.size() == 1);
    REQUIRE(r.all_exited);
    REQUIRE_FALSE(r.failed);
  }
}

TEST_CASE("simulation: 2000 trials with stalls and dead workers near the deadline — one outcome") {
  // Workers frozen (SIGSTOP) at random ticks around their peers' deadline, for random lengths
  // (some past it), and sometimes a worker dead from the start: every worker that acts follows
  // the recorded outcome, a save at its step or the timeout naming its tasks; none hangs.
  std::mt19937 rng(777);
  int timeouts = 0, saves = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 6);
    std::vector<int> skews;
    for (int i = 0; i < n; ++i) skews.push_back(1 + static_cast<int>(rng() % 5));
    const int notice = 20 + static_cast<int>(rng() % 50);
    auto pick = [&](int m) { return static_cast<int>(rng() % static_cast<unsigned>(m)); };
    std::vector<std::pair<int, int>> notices{{pick(n), notice}};
    sim_faults f;
    f.ack_timeout = milliseconds(40 + rng() % 60);
    const int deadline = notice + static_cast<int>(f.ack_timeout.count());
    for (int k = 0, stalls = 1 + static_cast<int>(rng() % 3); k < stalls; ++k) {
      int from = deadline - 30 + static_cast<int>(rng() % 60);
      f.stalls.emplace_back(pick(n), from,
                            from + 1 + pick(2 * static_cast<int>(f.ack_timeout.count())));
    }
    if (rng() % 4 == 0) f.dead = (notices[0].first + 1 + pick(n - 1)) % n;  // not the noticed
    auto r = simulate(n, notices, skews, rng, 4000, f);
    INFO("trial " << trial << " n " << n << " recorded '" << r.recorded << "'");
    REQUIRE_FALSE(r.failed);
    REQUIRE(r.all_exited);
    REQUIRE(follows_recorded(r));
    REQUIRE(r.claims == 1);
    (r.recorded.rfind("timeout", 0) == 0 ? timeouts : saves)++;
  }
  MESSAGE("recorded outcomes: " << saves << " steps, " << timeouts << " timeouts");
  CHECK(timeouts > 100);  // the mix covers both outcomes
  CHECK(saves > 100);
}

TEST_CASE("a store failure before the deadline goes on to record the outcome — during it, fails") {
  step_agreement a(cfg(1, 3));
  a.on_notice(t0);
  CHECK(a.protocol_next(4, t0).kind == op::insert);            // the claim
  CHECK(a.retry_deadline() == t0 + milliseconds(1000));        // joined at t0: ack_timeout
  a.on_store_failure("kv insert: Connection refused");         // retried until the deadline
  CHECK(a.state() == agreement_state::acked);                  // recording: nothing decided yet
  CHECK(a.retry_deadline() == t0 + milliseconds(2000));        // one more ack_timeout to record
  CHECK(a.decide(4, t0).action == agreement_action::proceed);  // never acked: never waits
  auto in = a.protocol_next(4, t0 + milliseconds(1000));
  CHECK(in.kind == op::list);
  SUBCASE("the store is back: the timeout naming the missing tasks is recorded") {
    a.on_list({{"run/r0/ack/0", "3"}});
    in = a.protocol_next(4, t0 + milliseconds(1000));
    CHECK(in.value == "timeout 1,2 by 1/0");
    a.on_insert(true);
    CHECK(a.failure().kind == agreement_failure::timeout);
    CHECK(a.failure().missing_tasks == std::vector<int>{1, 2});
  }
  SUBCASE("recording fails too: unreachable, never a save") {
    a.on_store_failure("kv list: Connection timed out");
    CHECK(a.state() == agreement_state::failed);
    CHECK(a.failure().kind == agreement_failure::unreachable);
    CHECK(a.failure().message == "kv list: Connection timed out");
    CHECK(a.failure().key == agreement_key::step);
    CHECK(a.decide(4, t0).action == agreement_action::fail);
  }
}

TEST_CASE("the retry deadline follows the ack deadline once acked") {
  step_agreement a(cfg(0, 2));
  a.on_claim_seen(0);
  a.protocol_next(1, t0);  // the ack
  a.on_put();
  CHECK(a.retry_deadline() == t0 + milliseconds(1000));
  a.protocol_next(1, t0 + milliseconds(300));  // list
  a.on_store_failure("kv list: EAGAIN");
  CHECK(a.retry_deadline() == t0 + milliseconds(2000));
  a.on_stop();
}

TEST_CASE("grace: the final claim is made grace_margin earlier") {
  auto c = cfg(0, 1, milliseconds(10000));
  c.grace_margin = milliseconds(3000);
  step_agreement a(c);
  fake_kv kv;
  a.on_notice(t0);
  CHECK(decide(a, kv, 0, t0).action == agreement_action::proceed);
  CHECK(decide(a, kv, 1, t0).action == agreement_action::save_then_continue);
  const auto mean = milliseconds(100);  // 6 x mean = 600 ms; the margin adds 3 s
  CHECK(decide(a, kv, 2, t0 + milliseconds(6300), mean).action == agreement_action::proceed);
  CHECK(a.state() == agreement_state::grace);
  decide(a, kv, 3, t0 + milliseconds(6500), mean);
  CHECK(a.state() != agreement_state::grace);  // 10 s - 0.6 s - 3 s = 6.4 s: claimed
}

TEST_CASE("values: one grammar, written and read back — anything else is refused") {
  using holdfast::agreement_value;
  using kind = agreement_value::kind;
  auto round_trip = [](const agreement_value& v) {
    auto back = holdfast::parse_agreement_value(holdfast::format_agreement_value(v));
    return back && *back == v;
  };
  CHECK(round_trip({kind::claim, -1, {}, 3, "abc"}));
  CHECK(round_trip({kind::step, 9223372036854775807, {}, 0, "n"}));
  CHECK(round_trip({kind::timeout, -1, {0, 7, 12}, 1, "x-Y_9"}));
  CHECK(round_trip({kind::abort, -1, {}, 2, "n"}));
  CHECK(round_trip({kind::none, -1, {}, 0, "n"}));
  CHECK(holdfast::format_agreement_value({kind::step, 57, {}, 2, "9f3a"}) == "step 57 by 2/9f3a");
  for (const char* bad : {"",
                          "57",
                          "step 57",
                          "step 57 by",
                          "step 57 by 2",
                          "step 57 by 2/",
                          "step -1 by 0/n",
                          "step 057 by 0/n",
                          "step 5x by 0/n",
                          "step 9223372036854775808 by 0/n",
                          "step  5 by 0/n",
                          "timeout  by 0/n",
                          "timeout 1, by 0/n",
                          "timeout 3,1 by 0/n",
                          "timeout 1,1 by 0/n",
                          "abort by -1/n",
                          "abort by 0/n n",
                          "abort by 0/"
                          "123456789012345678901234567890123",
                          "claim by 2147483648/n",
                          "Step 5 by 0/n",
                          "abort by 0/n\n",
                          "stop by 0/n"})
    CHECK_MESSAGE(!holdfast::parse_agreement_value(bad), bad);
  CHECK_THROWS_AS(holdfast::format_agreement_value({kind::timeout, -1, {}, 0, "n"}),
                  std::invalid_argument);
  CHECK_THROWS_AS(holdfast::format_agreement_value({kind::step, 1, {}, 0, "bad nonce"}),
                  std::invalid_argument);
}

TEST_CASE("restore agreement: step lists and the newest common step") {
  CHECK(holdfast::format_step_list({}) == "");
  CHECK(holdfast::format_step_list({1, 5, 9}) == "1,5,9");
  CHECK(holdfast::format_step_list({1, 5, 9}, 2) == "5,9");  // the newest only
  CHECK(holdfast::parse_step_list("") == std::vector<std::int64_t>{});
  CHECK(holdfast::parse_step_list("1,5,9") == std::vector<std::int64_t>{1, 5, 9});
  for (const char* bad : {",", "1,", ",1", "5,1", "1,1", "x", "-1", "01", "1,,2"})
    CHECK_MESSAGE(!holdfast::parse_step_list(bad), bad);
  using lists = std::vector<std::vector<std::int64_t>>;
  CHECK(holdfast::newest_common_step(lists{{10, 20, 30}, {10, 20}, {20, 30}}) == 20);
  CHECK(holdfast::newest_common_step(lists{{10, 30}, {20}}) == std::nullopt);
  CHECK(holdfast::newest_common_step(lists{{}, {1}}) == std::nullopt);
  CHECK(holdfast::newest_common_step(lists{{4}}) == 4);
  CHECK(holdfast::newest_common_step(lists{}) == std::nullopt);
}
