// step_agreement, the pure state machine: every row of the transition table in agreement.hpp,
// then many machines driven together over a tiny in-test key-value map (a discrete-event
// simulation with random notices, skews and interleavings, workers stalled, dead or cut off from
// the store), which must always agree on one step.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <holdfast/agreement.hpp>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
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

std::string name(agreement_key k, std::uint64_t round, int task = -1) {
  return holdfast::agreement_key_name(scope, k, round, task);
}
std::string key_of(const step_agreement::instruction& in) {
  return name(in.key, in.round, in.task);
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
  bool has(const std::string& k) const { return m.count(k) != 0; }
  std::vector<std::pair<std::string, std::string>> list(const std::string& prefix) {
    ++ops;
    std::vector<std::pair<std::string, std::string>> out;
    for (auto it = m.lower_bound(prefix);
         it != m.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
      out.push_back(*it);
    return out;
  }
  void erase(const std::string& k) {
    ++ops;
    m.erase(k);
  }
  // How many keys start with `prefix`.
  std::size_t count(const std::string& prefix) const {
    std::size_t c = 0;
    for (auto it = m.lower_bound(prefix);
         it != m.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
      ++c;
    return c;
  }
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (auto& kv : m) out.push_back(kv.first);
    return out;
  }
};

// The ack keys of every round and phase ("<scope>ack/..." and "<scope>final_ack/...").
std::size_t ack_keys(const fake_kv& kv) {
  return kv.count(scope + "ack/") + kv.count(scope + "final_ack/");
}

// Performs one store instruction on `kv`; a wait whose key is absent (the outcome key, or an ack
// key the claimant collects) is answered now as the deadline (for single-machine tests); an erase
// is done and reported to nobody. Returns false for a decide.
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
    case op::wait:  // a wait on the outcome key or on one task's ack key
      ++kv.ops;
      a.on_value(kv.try_get(key_of(in)));
      return true;
    case op::list:
      a.on_list(kv.list(key_of(in)));
      return true;
    case op::erase:  // no result is reported
      kv.erase(key_of(in));
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

// The store instructions protocol_next() hands out until it answers a decide (erases and the
// like, which report no result), as "op key" strings.
std::vector<std::string> pending(step_agreement& a, std::int64_t counter, clk::time_point now,
                                 fake_kv* kv = nullptr) {
  std::vector<std::string> out;
  for (int i = 0; i < 100; ++i) {
    auto in = a.protocol_next(counter, now);
    if (in.kind == op::decide) return out;
    CHECK(in.kind == op::erase);  // the only instructions with no result
    out.push_back("erase " + key_of(in));
    if (kv) kv->erase(key_of(in));
  }
  FAIL("exchange did not end");
  return out;
}

// A claimant of `n` tasks (task `me`, noticed at t0) that has claimed and published `counter`.
step_agreement claimant_after_ack(int me, int n, std::int64_t counter) {
  step_agreement a(cfg(me, n));
  a.on_notice(t0);
  CHECK(a.protocol_next(counter, t0).kind == op::insert);
  a.on_insert(true);
  CHECK(a.claimant());
  auto in = a.protocol_next(counter, t0);
  CHECK(in.kind == op::put);
  CHECK(in.value == std::to_string(counter));
  a.on_put();
  CHECK(a.state() == agreement_state::acked);
  return a;
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

TEST_CASE("key names: control keys under ctl, acks apart, scoped by run and round") {
  using holdfast::agreement_key_name;
  CHECK(agreement_key_name("j/", agreement_key::claim, 3) == "j/ctl/r3/claim");
  CHECK(agreement_key_name("j/", agreement_key::step, 1) == "j/ctl/r1/step");
  CHECK(agreement_key_name("j/", agreement_key::final_claim, 1) == "j/ctl/r1/final");
  CHECK(agreement_key_name("j/", agreement_key::final_step, 1) == "j/ctl/r1/final_step");
  CHECK(agreement_key_name("j/", agreement_key::error, 9) == "j/ctl/error");
  CHECK(agreement_key_name("j/", agreement_key::ack, 0, 7) == "j/ack/r0/7");
  CHECK(agreement_key_name("j/", agreement_key::ack, 0) == "j/ack/r0/");
  CHECK(agreement_key_name("j/", agreement_key::final_ack, 1, 2) == "j/final_ack/r1/2");
  CHECK(agreement_key_name("j/", agreement_key::final_ack, 1) == "j/final_ack/r1/");
  CHECK(holdfast::agreement_control_prefix("j/") == "j/ctl");
  // Every control key is under the control prefix, no ack is: a watch on the prefix sees O(1)
  // events per round.
  const std::string ctl = holdfast::agreement_control_prefix("j/");
  for (agreement_key k : {agreement_key::claim, agreement_key::step, agreement_key::final_claim,
                          agreement_key::final_step, agreement_key::error})
    CHECK(agreement_key_name("j/", k, 12).rfind(ctl + "/", 0) == 0);
  for (agreement_key k : {agreement_key::ack, agreement_key::final_ack})
    for (int t : {-1, 0, 5}) CHECK(agreement_key_name("j/", k, 12, t).rfind(ctl, 0) != 0);
  // The ack prefix of round 1 is not a prefix of round 10's acks.
  CHECK(agreement_key_name("j/", agreement_key::ack, 10, 3)
            .rfind(agreement_key_name("j/", agreement_key::ack, 1), 0) != 0);
}

TEST_CASE("one worker: notice → claim → ack → step recorded with no wait → save then exit") {
  step_agreement a(cfg(0, 1));
  a.on_notice(t0);
  CHECK(a.state() == agreement_state::noticed);
  CHECK(a.needs_attention());

  auto in = a.protocol_next(5, t0);
  CHECK(in.kind == op::insert);
  CHECK(key_of(in) == "run/ctl/r0/claim");
  CHECK(in.value == "claim by 0/0");
  a.on_insert(true);
  CHECK(a.state() == agreement_state::claimed);
  CHECK(a.claimant());

  in = a.protocol_next(5, t0);
  CHECK(in.kind == op::put);
  CHECK(key_of(in) == "run/ack/r0/0");
  CHECK(in.value == "5");
  a.on_put();
  CHECK(a.state() == agreement_state::acked);

  // The claimant of a one-task job has every counter: no wait, no list.
  in = a.protocol_next(5, t0);
  CHECK(in.kind == op::insert);
  CHECK(key_of(in) == "run/ctl/r0/step");
  CHECK(in.value == "step 6 by 0/0");  // max + 1
  a.on_insert(true);
  CHECK(a.state() == agreement_state::step_published);
  CHECK(a.agreed_step() == 6);
  CHECK(pending(a, 5, t0) == std::vector<std::string>{"erase run/ack/r0/0"});  // round 0

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

  // A lost claim's follower waits on the outcome key after its ack, like any follower.
  CHECK(a.protocol_next(3, t0).kind == op::put);
  a.on_put();
  in = a.protocol_next(3, t0);
  CHECK(in.kind == op::wait);
  CHECK(key_of(in) == "run/ctl/r0/step");
}

TEST_CASE("a follower waits on the outcome key alone until the deadline, then a step or timeout") {
  step_agreement a(cfg(0, 3));
  a.on_claim_seen(0);
  CHECK_FALSE(a.claimant());
  a.protocol_next(4, t0);
  a.on_put();
  CHECK(a.retry_deadline() == t0 + milliseconds(1000));  // deadline set by the ack
  CHECK_FALSE(a.collecting());
  auto in = a.protocol_next(4, t0 + milliseconds(10));
  CHECK(in.kind == op::wait);  // no list of the acks: only the claimant reads them
  CHECK(key_of(in) == "run/ctl/r0/step");
  CHECK(in.deadline == t0 + milliseconds(1000));  // acked at t0 + ack_timeout
  CHECK_FALSE(a.collecting());

  SUBCASE("the step arrives: followed, and this worker's ack is erased") {
    a.on_value(std::string("step 10 by 2/x"));
    CHECK(a.state() == agreement_state::step_published);
    CHECK(a.agreed_step() == 10);
    CHECK(pending(a, 4, t0) == std::vector<std::string>{"erase run/ack/r0/0"});
    CHECK(a.decide(9, t0).action == agreement_action::proceed);
    CHECK(a.decide(10, t0).action == agreement_action::save_then_exit);
  }
  SUBCASE("the deadline passes and task 1 never acked: the timeout is recorded, then raised") {
    a.on_value(std::nullopt);
    CHECK(a.retry_deadline() == t0 + milliseconds(2000));  // recording: one more ack_timeout
    in = a.protocol_next(4, t0 + milliseconds(1000));
    CHECK(in.kind == op::list);
    CHECK(key_of(in) == "run/ack/r0/");
    a.on_list({{"run/ack/r0/0", "4"}, {"run/ack/r0/2", "9"}});
    CHECK(a.state() == agreement_state::acked);  // nothing decided before it is recorded
    CHECK(a.decide(5, t0).action == agreement_action::wait);
    in = a.protocol_next(4, t0 + milliseconds(1000));
    CHECK(in.kind == op::insert);
    CHECK(key_of(in) == "run/ctl/r0/step");
    CHECK(in.value == "timeout 1 by 0/0");
    a.on_insert(true);
    CHECK(a.state() == agreement_state::failed);
    CHECK(a.failure().kind == agreement_failure::timeout);
    CHECK(a.failure().missing_tasks == std::vector<int>{1});
    CHECK(a.failure().key == agreement_key::step);
    CHECK(a.failure().round == 0);
    CHECK(pending(a, 4, t0).empty());                         // a timeout erases nothing
    CHECK(a.decide(4, t0).action == agreement_action::fail);  // sticky
    CHECK(a.decide(5, t0).action == agreement_action::fail);
  }
  SUBCASE("recording the timeout loses to a step recorded meanwhile: the step is followed") {
    a.on_value(std::nullopt);
    a.protocol_next(4, t0 + milliseconds(1000));
    a.on_list({{"run/ack/r0/0", "4"}, {"run/ack/r0/2", "9"}});
    CHECK(a.protocol_next(4, t0 + milliseconds(1000)).kind == op::insert);
    a.on_insert(false);
    in = a.protocol_next(4, t0 + milliseconds(1001));
    CHECK(in.kind == op::wait);
    CHECK(key_of(in) == "run/ctl/r0/step");
    a.on_value(std::string("step 12 by 1/late"));
    CHECK(a.state() == agreement_state::step_published);
    CHECK(a.agreed_step() == 12);
    CHECK(pending(a, 4, t0) == std::vector<std::string>{"erase run/ack/r0/0"});
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
    a.on_list({{"run/ack/r0/0", "4"}, {"run/ack/r0/1", "2"}, {"run/ack/r0/2", "9"}});
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
  SUBCASE("the deadline passes but the last ack landed meanwhile: the step is recorded here") {
    a.on_value(std::nullopt);
    a.protocol_next(4, t0 + milliseconds(1000));
    a.on_list({{"run/ack/r0/0", "4"}, {"run/ack/r0/1", "2"}, {"run/ack/r0/2", "9"}});
    in = a.protocol_next(4, t0);
    CHECK(in.kind == op::insert);
    CHECK(in.value == "step 10 by 0/0");
    SUBCASE("its insert wins") {
      a.on_insert(true);
      CHECK(a.agreed_step() == 10);
      CHECK(pending(a, 4, t0) == std::vector<std::string>{"erase run/ack/r0/0"});  // round 0
    }
    SUBCASE("someone else inserted it first: read it") {
      a.on_insert(false);
      in = a.protocol_next(4, t0);
      CHECK(in.kind == op::wait);
      a.on_value(std::string("step 10 by 2/x"));
      CHECK(a.agreed_step() == 10);
    }
  }
  SUBCASE("an aborted step names the peer's error") {
    a.on_value(std::string("abort by 1/y"));
    CHECK(a.state() == agreement_state::acked);
    in = a.protocol_next(4, t0);
    CHECK(in.kind == op::try_get);
    CHECK(key_of(in) == "run/ctl/error");
    a.on_value(step_agreement::encode_error(1, "std::runtime_error", "nan\nloss"));
    CHECK(a.state() == agreement_state::failed);
    CHECK(a.failure().kind == agreement_failure::peer);
    CHECK(a.failure().task == 1);
    CHECK(a.failure().type_name == "std::runtime_error");
    CHECK(a.failure().message == "nan\nloss");
  }
  SUBCASE("an abort whose error key is absent still fails") {
    a.on_value(std::string("abort by 1/y"));
    CHECK(a.protocol_next(4, t0).kind == op::try_get);
    a.on_value(std::nullopt);
    CHECK(a.state() == agreement_state::failed);
    CHECK(a.failure().kind == agreement_failure::peer);
    CHECK(a.failure().message == "agreement aborted");
  }
}

TEST_CASE("claimant: collects the N-1 other acks in task order, then records max + 1") {
  // Task 2 of 4 claimed and published 5; the other counters are skewed.
  fake_kv kv;
  kv.m["run/ack/r0/0"] = "3";
  kv.m["run/ack/r0/1"] = "1000";
  kv.m["run/ack/r0/3"] = "17";
  step_agreement a = claimant_after_ack(2, 4, 5);
  CHECK(a.decide(5, t0).action == agreement_action::proceed);
  CHECK(a.decide(6, t0).action == agreement_action::wait);  // might be the step
  std::vector<int> waited;
  for (;;) {
    auto in = a.protocol_next(5, t0 + milliseconds(1));
    if (in.kind != op::wait) {
      CHECK(in.kind == op::insert);
      CHECK(key_of(in) == "run/ctl/r0/step");
      CHECK(in.value == "step 1001 by 2/0");
      break;
    }
    CHECK(in.key == agreement_key::ack);
    CHECK(in.round == 0);
    CHECK(in.deadline == t0 + milliseconds(1000));  // the claimant's ack deadline
    CHECK(a.collecting());
    CHECK(a.outcome_key() == agreement_key::step);
    waited.push_back(in.task);
    a.on_value(kv.try_get(key_of(in)));
    CHECK_FALSE(a.collecting());
    CHECK(a.state() == agreement_state::acked);
  }
  CHECK(waited == std::vector<int>{0, 1, 3});               // in task order, its own skipped
  CHECK(a.decide(6, t0).action == agreement_action::wait);  // not recorded yet
  a.on_insert(true);
  CHECK(a.state() == agreement_state::step_published);
  CHECK(a.agreed_step() == 1001);
  CHECK(a.decide(1000, t0).action == agreement_action::proceed);
  CHECK(a.decide(1001, t0).action == agreement_action::save_then_exit);
}

TEST_CASE("the agreed step is max of the counters + 1, whatever the skew or the claimant") {
  for (int me = 0; me < 3; ++me) {
    fake_kv kv;
    const std::int64_t counters[] = {3, 1000, 17};
    for (int t = 0; t < 3; ++t)
      if (t != me) kv.m[name(agreement_key::ack, 0, t)] = std::to_string(counters[t]);
    step_agreement a = claimant_after_ack(me, 3, counters[me]);
    std::vector<int> waited;
    step_agreement::instruction in;
    while ((in = a.protocol_next(counters[me], t0)).kind == op::wait) {
      waited.push_back(in.task);
      a.on_value(kv.try_get(key_of(in)));
    }
    std::vector<int> others;
    for (int t = 0; t < 3; ++t)
      if (t != me) others.push_back(t);
    CHECK(waited == others);
    CHECK(in.value == "step 1001 by " + std::to_string(me) + "/0");
  }
  // The follower's path (every ack listed after the deadline) computes the same step.
  step_agreement b(cfg(1, 3));
  b.on_claim_seen(0);
  b.protocol_next(1000, t0);
  b.on_put();
  CHECK(b.protocol_next(1000, t0).kind == op::wait);
  b.on_value(std::nullopt);
  CHECK(b.protocol_next(1000, t0).kind == op::list);
  b.on_list({{"run/ack/r0/0", "3"}, {"run/ack/r0/1", "1000"}, {"run/ack/r0/2", "17"}});
  CHECK(b.protocol_next(1000, t0).value == "step 1001 by 1/0");
}

TEST_CASE("claimant: an ack absent at the deadline or malformed is missing: it records timeout") {
  // Task 1 of 5: task 2 never acks, task 3's ack is not a counter.
  fake_kv kv;
  kv.m["run/ack/r0/0"] = "7";
  kv.m["run/ack/r0/3"] = "x";
  kv.m["run/ack/r0/4"] = "8";
  step_agreement a = claimant_after_ack(1, 5, 6);
  auto in = a.protocol_next(6, t0);
  CHECK(key_of(in) == "run/ack/r0/0");
  a.on_value(kv.try_get(key_of(in)));
  in = a.protocol_next(6, t0 + milliseconds(5));
  CHECK(key_of(in) == "run/ack/r0/2");
  CHECK(in.deadline == t0 + milliseconds(1000));
  a.on_value(std::nullopt);  // the deadline passed
  CHECK(a.state() == agreement_state::acked);
  in = a.protocol_next(6, t0 + milliseconds(1500));  // past the deadline: no more blocking
  CHECK(key_of(in) == "run/ack/r0/3");
  CHECK(in.deadline == t0 + milliseconds(1500));
  a.on_value(kv.try_get(key_of(in)));  // "x"
  in = a.protocol_next(6, t0 + milliseconds(1500));
  CHECK(key_of(in) == "run/ack/r0/4");
  a.on_value(kv.try_get(key_of(in)));
  CHECK(a.retry_deadline() == t0 + milliseconds(1000));
  in = a.protocol_next(6, t0 + milliseconds(1500));
  CHECK(in.kind == op::insert);
  CHECK(key_of(in) == "run/ctl/r0/step");
  CHECK(in.value == "timeout 2,3 by 1/0");               // exactly the missing tasks
  CHECK(a.retry_deadline() == t0 + milliseconds(2000));  // recording
  CHECK(a.decide(7, t0).action == agreement_action::wait);
  SUBCASE("recorded: it fails with that timeout") {
    a.on_insert(true);
    CHECK(a.state() == agreement_state::failed);
    CHECK(a.failure().kind == agreement_failure::timeout);
    CHECK(a.failure().missing_tasks == std::vector<int>{2, 3});
    CHECK(pending(a, 6, t0).empty());
  }
  SUBCASE("a step was recorded first: it follows the step") {
    a.on_insert(false);
    in = a.protocol_next(6, t0 + milliseconds(1500));
    CHECK(in.kind == op::wait);
    CHECK(key_of(in) == "run/ctl/r0/step");
    a.on_value(std::string("step 9 by 0/z"));
    CHECK(a.agreed_step() == 9);
    CHECK(pending(a, 6, t0) == std::vector<std::string>{"erase run/ack/r0/1"});
  }
  SUBCASE("recording fails for good: unreachable, never a save") {
    a.on_store_failure("kv insert: EIO");
    CHECK(a.failure().kind == agreement_failure::unreachable);
  }
}

TEST_CASE("claimant: a malformed or foreign ack counts as missing, in a wait or a list") {
  step_agreement a = claimant_after_ack(0, 2, 1);
  auto in = a.protocol_next(1, t0);
  CHECK(key_of(in) == "run/ack/r0/1");
  a.on_value(std::string("-"));
  CHECK(a.protocol_next(1, t0).value == "timeout 1 by 0/0");

  step_agreement b(cfg(0, 2));  // the list after the deadline
  b.on_claim_seen(0);
  b.protocol_next(1, t0);
  b.on_put();
  b.protocol_next(1, t0);
  b.on_value(std::nullopt);
  CHECK(b.protocol_next(1, t0).kind == op::list);
  b.on_list({{"run/ack/r0/0", "1"}, {"run/ack/r0/1", "x"}, {"run/ack/r0/7", "3"}});
  CHECK(b.protocol_next(1, t0).value == "timeout 1 by 0/0");
}

TEST_CASE("claimant: the outcome key seen while it collects is followed") {
  step_agreement a = claimant_after_ack(0, 3, 4);
  auto in = a.protocol_next(4, t0);
  CHECK(key_of(in) == "run/ack/r0/1");
  CHECK(a.collecting());
  CHECK(a.outcome_key() == agreement_key::step);
  SUBCASE("a step: published, its ack erased, nothing more collected") {
    a.on_outcome_seen("step 12 by 2/q");
    CHECK_FALSE(a.collecting());
    CHECK(a.state() == agreement_state::step_published);
    CHECK(a.agreed_step() == 12);
    CHECK(pending(a, 4, t0) == std::vector<std::string>{"erase run/ack/r0/0"});
    CHECK(a.decide(12, t0).action == agreement_action::save_then_exit);
  }
  SUBCASE("a timeout: failed with its tasks") {
    a.on_outcome_seen("timeout 1 by 2/q");
    CHECK(a.state() == agreement_state::failed);
    CHECK(a.failure().kind == agreement_failure::timeout);
    CHECK(a.failure().missing_tasks == std::vector<int>{1});
    CHECK(pending(a, 4, t0).empty());
  }
  SUBCASE("an abort: the error is read, then raised") {
    a.on_outcome_seen("abort by 2/q");
    CHECK(a.state() == agreement_state::acked);
    in = a.protocol_next(4, t0);
    CHECK(in.kind == op::try_get);
    CHECK(key_of(in) == "run/ctl/error");
    a.on_value(step_agreement::encode_error(2, "E", "boom"));
    CHECK(a.state() == agreement_state::failed);
    CHECK(a.failure().kind == agreement_failure::peer);
    CHECK(a.failure().task == 2);
    CHECK(a.failure().message == "boom");
  }
  SUBCASE("a value outside the grammar: a peer error naming it") {
    a.on_outcome_seen("garbage");
    CHECK(a.failure().kind == agreement_failure::peer);
    CHECK(a.failure().message.find("malformed outcome 'garbage'") != std::string::npos);
  }
}

TEST_CASE("on_outcome_seen is ignored when the machine is not collecting") {
  const std::string step = "step 3 by 1/q";
  step_agreement idle(cfg(0, 2));
  idle.on_outcome_seen(step);
  CHECK(idle.state() == agreement_state::idle);

  // The claimant between two waits (the result of one reported, the next not asked for yet).
  fake_kv kv;
  kv.m["run/ack/r0/1"] = "2";
  step_agreement a = claimant_after_ack(0, 3, 1);
  auto in = a.protocol_next(1, t0);
  a.on_value(kv.try_get(key_of(in)));
  CHECK_FALSE(a.collecting());
  a.on_outcome_seen(step);
  CHECK(a.state() == agreement_state::acked);
  in = a.protocol_next(1, t0);  // the collection goes on
  CHECK(in.kind == op::wait);
  CHECK(key_of(in) == "run/ack/r0/2");

  // A follower's wait on the outcome key is answered by on_value, not on_outcome_seen.
  step_agreement f(cfg(1, 2));
  f.on_claim_seen(0);
  f.protocol_next(1, t0);
  f.on_put();
  CHECK(f.protocol_next(1, t0).kind == op::wait);
  CHECK_FALSE(f.collecting());
  f.on_outcome_seen("timeout 0 by 0/q");
  CHECK(f.state() == agreement_state::acked);
  f.on_value(step);
  CHECK(f.agreed_step() == 3);
  f.on_outcome_seen("timeout 0 by 0/q");  // published: ignored
  CHECK(f.state() == agreement_state::step_published);

  // Failed and stopped machines ignore it too.
  step_agreement g = claimant_after_ack(0, 2, 1);
  g.protocol_next(1, t0);
  g.on_error_seen(step_agreement::encode_error(1, "E", "m"));
  g.on_outcome_seen(step);
  CHECK(g.failure().kind == agreement_failure::peer);
  step_agreement h = claimant_after_ack(0, 2, 1);
  h.protocol_next(1, t0);
  h.on_stop();
  h.on_outcome_seen(step);
  CHECK(h.state() == agreement_state::stopped);
}

TEST_CASE("training side: proceeds up to its published counter, then waits for the step") {
  step_agreement a(cfg(0, 2));
  a.on_notice(t0);
  a.protocol_next(5, t0);
  a.on_insert(true);
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
  in = a.protocol_next(6, t0);
  CHECK(in.kind == op::wait);
  CHECK(key_of(in) == "run/ack/r0/1");
  a.on_value(std::string("9"));
  in = a.protocol_next(6, t0);
  CHECK(in.value == "step 10 by 0/0");
  CHECK(a.decide(6, t0).action == agreement_action::wait);  // still not published
  a.on_insert(true);
  CHECK(a.decide(6, t0).action == agreement_action::proceed);
  CHECK(a.decide(9, t0).action == agreement_action::proceed);
  CHECK(a.decide(10, t0).action == agreement_action::save_then_exit);
}

TEST_CASE("claimant: its step insert loses to another outcome and it follows that") {
  step_agreement a = claimant_after_ack(0, 2, 1);
  a.protocol_next(1, t0);
  a.on_value(std::string("4"));
  CHECK(a.protocol_next(1, t0).value == "step 5 by 0/0");
  a.on_insert(false);
  auto in = a.protocol_next(1, t0);
  CHECK(in.kind == op::wait);
  CHECK(key_of(in) == "run/ctl/r0/step");
  a.on_value(std::string("timeout 0 by 1/q"));  // a peer recorded a timeout first
  CHECK(a.failure().kind == agreement_failure::timeout);
  CHECK(a.failure().missing_tasks == std::vector<int>{0});
}

TEST_CASE("erase after a step: its own ack, and the recorder of round N erases round N-1") {
  auto c = cfg(0, 2, milliseconds(0), false);
  c.first_round = 5;
  const std::vector<std::string> previous = {"erase run/ctl/r4/claim", "erase run/ctl/r4/step",
                                             "erase run/ctl/r4/final",
                                             "erase run/ctl/r4/final_step"};
  SUBCASE("the claimant that records the step") {
    step_agreement a(c);
    a.on_notice(t0);
    a.protocol_next(1, t0);
    a.on_insert(true);
    a.protocol_next(1, t0);
    a.on_put();
    a.protocol_next(1, t0);
    a.on_value(std::string("3"));
    CHECK(a.protocol_next(1, t0).value == "step 4 by 0/0");
    a.on_insert(true);
    std::vector<std::string> want = {"erase run/ack/r5/0"};
    want.insert(want.end(), previous.begin(), previous.end());
    CHECK(a.needs_attention());
    SUBCASE("drained at once") { CHECK(pending(a, 1, t0) == want); }
    SUBCASE("drained after the save and re-arm: the instructions keep their rounds") {
      CHECK(a.decide(4, t0).action == agreement_action::save);
      CHECK(a.state() == agreement_state::idle);
      CHECK(a.round() == 6);
      CHECK(a.needs_attention());  // the erases are still to be done
      CHECK(pending(a, 4, t0) == want);
      CHECK_FALSE(a.needs_attention());
    }
  }
  SUBCASE("a follower erases its ack only") {
    auto fc = c;
    fc.task = 1;
    step_agreement f(fc);
    f.on_claim_seen(5);
    f.protocol_next(3, t0);
    f.on_put();
    f.protocol_next(3, t0);
    f.on_value(std::string("step 4 by 0/0"));
    CHECK(pending(f, 3, t0) == std::vector<std::string>{"erase run/ack/r5/1"});
  }
  SUBCASE("a follower that records the step after the deadline erases round N-1 too") {
    auto fc = c;
    fc.task = 1;
    step_agreement f(fc);
    f.on_claim_seen(5);
    f.protocol_next(3, t0);
    f.on_put();
    f.protocol_next(3, t0);
    f.on_value(std::nullopt);
    f.protocol_next(3, t0);
    f.on_list({{"run/ack/r5/0", "1"}, {"run/ack/r5/1", "3"}});
    CHECK(f.protocol_next(3, t0).value == "step 4 by 1/0");
    f.on_insert(true);
    std::vector<std::string> want = {"erase run/ack/r5/1"};
    want.insert(want.end(), previous.begin(), previous.end());
    CHECK(pending(f, 3, t0) == want);
  }
  SUBCASE("the claimant that follows an outcome seen while collecting erases its ack only") {
    step_agreement a(c);
    a.on_notice(t0);
    a.protocol_next(1, t0);
    a.on_insert(true);
    a.protocol_next(1, t0);
    a.on_put();
    a.protocol_next(1, t0);
    a.on_outcome_seen("step 4 by 1/0");
    CHECK(pending(a, 1, t0) == std::vector<std::string>{"erase run/ack/r5/0"});
  }
  SUBCASE("the final step's recorder erases its final ack only") {
    auto gc = c;
    gc.num_tasks = 1;
    gc.grace = milliseconds(10);
    step_agreement g(gc);
    fake_kv kv;
    g.on_notice(t0);
    drain(g, kv, 1, t0);
    CHECK(g.decide(2, t0).action == agreement_action::save_then_continue);
    CHECK(g.decide(3, t0 + milliseconds(11)).action == agreement_action::proceed);
    CHECK(g.state() == agreement_state::final_noticed);
    CHECK(g.protocol_next(3, t0 + milliseconds(11)).kind == op::insert);  // final claim
    g.on_insert(true);
    CHECK(g.protocol_next(3, t0 + milliseconds(11)).kind == op::put);
    g.on_put();
    auto in = g.protocol_next(3, t0 + milliseconds(11));
    CHECK(key_of(in) == "run/ctl/r5/final_step");
    g.on_insert(true);
    CHECK(pending(g, 3, t0) == std::vector<std::string>{"erase run/final_ack/r5/0"});
  }
}

TEST_CASE("per-agreement store traffic: constant for non-claimants, O(N) for the claimant") {
  // n workers over one map: task n/2 is noticed first and claims, task 1 is noticed too and
  // loses the claim; everyone else sees the claim. Waits on an absent key are parked until it
  // appears (no deadline passes).
  auto one_agreement = [](int n, std::vector<int>& per_worker, std::vector<int>& claimant_waits) {
    fake_kv kv;
    const int claimant = n / 2, loser = 1;
    std::vector<step_agreement> w;
    w.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) w.emplace_back(cfg(i, n));
    std::vector<std::optional<step_agreement::instruction>> parked(static_cast<std::size_t>(n));
    per_worker.assign(static_cast<std::size_t>(n), 0);
    claimant_waits.clear();
    w[static_cast<std::size_t>(claimant)].on_notice(t0);
    w[static_cast<std::size_t>(loser)].on_notice(t0);
    auto drive = [&](int i) {
      auto& a = w[static_cast<std::size_t>(i)];
      auto& p = parked[static_cast<std::size_t>(i)];
      if (p) {
        auto v = kv.try_get(key_of(*p));
        if (!v) return;
        p.reset();
        a.on_value(v);
      }
      for (;;) {
        auto in = a.protocol_next(10 + i % 7, t0);
        if (in.kind == op::decide) return;
        ++per_worker[static_cast<std::size_t>(i)];
        if (in.kind == op::wait && in.key == agreement_key::ack) {
          CHECK(i == claimant);
          claimant_waits.push_back(in.task);
        }
        if (in.kind == op::wait && !kv.has(key_of(in))) {
          p = in;
          return;
        }
        perform(a, in, kv);
      }
    };
    drive(claimant);
    for (int pass = 0; pass < 6; ++pass)
      for (int i = 0; i < n; ++i) {
        auto& a = w[static_cast<std::size_t>(i)];
        if (a.state() == agreement_state::idle && kv.has(name(agreement_key::claim, 0)))
          a.on_claim_seen(0);
        drive(i);
      }
    const std::int64_t want = (n < 7 ? 10 + n - 1 : 16) + 1;
    for (auto& a : w) {
      CHECK(a.state() == agreement_state::step_published);
      CHECK(a.agreed_step() == want);
      CHECK(a.protocol_next(0, t0).kind == op::decide);  // every erase done
    }
    CHECK(w[static_cast<std::size_t>(claimant)].claimant());
    CHECK(ack_keys(kv) == 0);  // every ack erased
    CHECK(kv.keys() == std::vector<std::string>{"run/ctl/r0/claim", "run/ctl/r0/step"});
  };
  std::vector<int> totals;
  for (int n : {4, 64, 1024}) {
    INFO("n " << n);
    std::vector<int> per, waits;
    one_agreement(n, per, waits);
    const int claimant = n / 2;
    // claim, put, n - 1 waits, insert step, erase its ack
    CHECK(per[static_cast<std::size_t>(claimant)] == n + 3);
    std::vector<int> expect_waits;
    for (int t = 0; t < n; ++t)
      if (t != claimant) expect_waits.push_back(t);
    CHECK(waits == expect_waits);
    CHECK(per[1] == 4);  // lost claim, put, wait step, erase
    int others_max = 0;
    for (int i = 0; i < n; ++i)
      if (i != claimant && i != 1) {
        CHECK(per[static_cast<std::size_t>(i)] == 3);  // put, wait step, erase
        others_max = std::max(others_max, per[static_cast<std::size_t>(i)]);
      }
    CHECK(others_max == 3);
    int total = 0;
    for (int x : per) total += x;
    CHECK(total == 4 * n + 1);  // linear in n
    totals.push_back(total);
  }
  CHECK(totals == std::vector<int>{17, 257, 4097});
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
  CHECK(key_of(in) == "run/ctl/r0/final");
  a.on_insert(true);
  CHECK(a.state() == agreement_state::final_claimed);
  in = a.protocol_next(13, t0 + milliseconds(701));
  CHECK(key_of(in) == "run/final_ack/r0/0");
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
  kv.m["run/ack/r0/0"] = "3";
  a.on_claim_seen(0);
  decide(a, kv, 3, t0);
  CHECK(a.agreed_step() == 4);
  CHECK(decide(a, kv, 4, t0).action == agreement_action::save_then_continue);
  CHECK(decide(a, kv, 5, t0 + std::chrono::hours(1)).action == agreement_action::proceed);
  CHECK(a.state() == agreement_state::grace);
  CHECK(kv.try_get("run/ctl/r0/final") == std::nullopt);
  a.on_final_seen(0);
  CHECK(a.state() == agreement_state::final_claimed);
  kv.m["run/final_ack/r0/0"] = "9";
  decide(a, kv, 6, t0);
  CHECK(a.agreed_step(1) == 10);
}

TEST_CASE("grace: the final phase has a claimant of its own, which collects the final acks") {
  // Task 0 claims the first save; task 1 (noticed later) claims the final one. Task 0 must then
  // wait on the final outcome key like any follower, and task 1 collect the final acks.
  const auto grace = milliseconds(1000);
  fake_kv kv;
  step_agreement a(cfg(0, 2, grace)), b(cfg(1, 2, grace));
  a.on_notice(t0);
  CHECK(perform(a, a.protocol_next(10, t0), kv));  // claim: won
  CHECK(a.claimant());
  b.on_claim_seen(0);
  b.on_notice(t0 + milliseconds(200));             // its grace ends later, but it is noticed too
  CHECK(perform(a, a.protocol_next(10, t0), kv));  // put 10
  CHECK(perform(b, b.protocol_next(12, t0), kv));  // put 12
  auto in = a.protocol_next(10, t0);
  CHECK(key_of(in) == "run/ack/r0/1");
  CHECK(perform(a, in, kv));
  in = b.protocol_next(12, t0);
  CHECK(in.kind == op::wait);
  CHECK(key_of(in) == "run/ctl/r0/step");
  CHECK(perform(a, a.protocol_next(10, t0), kv));  // insert step 13
  CHECK(perform(b, in, kv));
  CHECK(a.agreed_step() == 13);
  CHECK(b.agreed_step() == 13);
  CHECK(decide(a, kv, 13, t0).action == agreement_action::save_then_continue);
  CHECK(decide(b, kv, 13, t0).action == agreement_action::save_then_continue);
  CHECK_FALSE(a.claimant());  // the final phase has a claimant of its own

  // b's notice is later, yet b claims the final save first (its clock, its decision).
  CHECK(b.decide(14, t0 + milliseconds(1201)).action == agreement_action::proceed);
  CHECK(b.state() == agreement_state::final_noticed);
  in = b.protocol_next(14, t0 + milliseconds(1201));
  CHECK(key_of(in) == "run/ctl/r0/final");
  CHECK(perform(b, in, kv));
  CHECK(b.claimant());
  CHECK(a.decide(14, t0 + milliseconds(900)).action == agreement_action::proceed);
  CHECK(a.state() == agreement_state::grace);
  a.on_final_seen(0);
  CHECK(a.state() == agreement_state::final_claimed);
  in = a.protocol_next(14, t0 + milliseconds(900));
  CHECK(key_of(in) == "run/final_ack/r0/0");
  CHECK(perform(a, in, kv));
  in = a.protocol_next(14, t0 + milliseconds(900));
  CHECK(in.kind == op::wait);  // a follower now: no collection
  CHECK(key_of(in) == "run/ctl/r0/final_step");
  CHECK_FALSE(a.collecting());
  auto a_wait = in;
  CHECK(perform(b, b.protocol_next(15, t0 + milliseconds(1201)), kv));  // final ack 15
  in = b.protocol_next(15, t0 + milliseconds(1201));
  CHECK(in.kind == op::wait);
  CHECK(key_of(in) == "run/final_ack/r0/0");
  CHECK(b.collecting());
  CHECK(b.outcome_key() == agreement_key::final_step);
  CHECK(perform(b, in, kv));
  in = b.protocol_next(15, t0 + milliseconds(1201));
  CHECK(key_of(in) == "run/ctl/r0/final_step");
  CHECK(in.value == "step 16 by 1/0");
  CHECK(perform(b, in, kv));
  CHECK(b.agreed_step(1) == 16);
  CHECK(pending(b, 15, t0, &kv) == std::vector<std::string>{"erase run/final_ack/r0/1"});
  CHECK(perform(a, a_wait, kv));
  CHECK(a.agreed_step(1) == 16);
  CHECK(pending(a, 14, t0, &kv) == std::vector<std::string>{"erase run/final_ack/r0/0"});
  CHECK(decide(a, kv, 16, t0).action == agreement_action::save_then_exit);
  CHECK(decide(b, kv, 16, t0).action == agreement_action::save_then_exit);
  CHECK(ack_keys(kv) == 0);
}

TEST_CASE("grace: the final claimant sees the final outcome while collecting and follows it") {
  step_agreement a(cfg(0, 2, milliseconds(10)));
  fake_kv kv;
  kv.m["run/ack/r0/1"] = "0";
  a.on_notice(t0);
  CHECK(decide(a, kv, 0, t0).action == agreement_action::proceed);
  CHECK(decide(a, kv, 1, t0).action == agreement_action::save_then_continue);
  CHECK(a.decide(2, t0 + milliseconds(11)).action == agreement_action::proceed);
  CHECK(perform(a, a.protocol_next(2, t0 + milliseconds(11)), kv));  // final claim
  CHECK(a.claimant());
  CHECK(perform(a, a.protocol_next(2, t0 + milliseconds(11)), kv));  // final ack
  auto in = a.protocol_next(2, t0 + milliseconds(11));
  CHECK(key_of(in) == "run/final_ack/r0/1");
  CHECK(a.collecting());
  CHECK(a.outcome_key() == agreement_key::final_step);
  a.on_outcome_seen("step 7 by 1/q");
  CHECK(a.state() == agreement_state::final_published);
  CHECK(a.agreed_step(1) == 7);
}

TEST_CASE("no_exit: save, re-arm into the next round, agree again, round 0's keys erased") {
  step_agreement a(cfg(0, 1, milliseconds(0), false));
  fake_kv kv;
  a.on_notice(t0);
  decide(a, kv, 0, t0 + milliseconds(1));
  CHECK(kv.keys() == std::vector<std::string>{"run/ctl/r0/claim", "run/ctl/r0/step"});
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
  CHECK(key_of(in) == "run/ctl/r1/claim");
  CHECK(perform(a, in, kv));
  decide(a, kv, 7, t0 + milliseconds(5));
  CHECK(a.agreed_step() == 8);
  // The recorder of round 1's step erased round 0's control keys; no ack is left.
  CHECK(kv.keys() == std::vector<std::string>{"run/ctl/r1/claim", "run/ctl/r1/step"});
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
  CHECK(inserted ==
        std::vector<std::string>{"run/ctl/error=2\nstd::domain_error\nbad batch",
                                 "run/ctl/r0/step" + abort, "run/ctl/r0/final_step" + abort,
                                 "run/ctl/r0/claim" + abort, "run/ctl/r0/final" + abort,
                                 "run/ctl/r1/step" + abort, "run/ctl/r1/final_step" + abort,
                                 "run/ctl/r1/claim" + abort, "run/ctl/r1/final" + abort});
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

  step_agreement b = claimant_after_ack(0, 2, 1);
  CHECK(b.protocol_next(1, t0).kind == op::wait);  // the claimant collects: nobody lists
  CHECK_THROWS_AS(b.on_list({{"run/ack/r0/1", "1"}}), std::logic_error);
  CHECK_THROWS_AS(b.on_put(), std::logic_error);
  step_agreement c(cfg(1, 2));
  c.on_claim_seen(0);
  c.protocol_next(1, t0);
  c.on_put();
  CHECK_THROWS_AS(c.on_value(std::string("1")), std::logic_error);  // nothing asked yet
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

// ---- many machines over one map: a discrete-event simulation --------------------------------

namespace {

struct sim_worker {
  step_agreement sm;
  std::int64_t counter = 0;
  std::optional<step_agreement::instruction> parked;  // a wait whose key is absent
  std::optional<step_agreement::instruction> held;    // an instruction retried: store cut off
  std::set<std::pair<std::uint64_t, int>> saved_in;   // the (round, phase) it saved in
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
  int outcome_seen = 0;         // collections cut short by the outcome key (on_outcome_seen)
};

// Faults of a simulation: a short deadline, workers frozen (all their threads: SIGSTOP) from
// one tick to another, a worker dead from a tick on, workers whose store is cut off from one
// tick to another (the etcd leader lost with its node, a partition: every store instruction
// fails and the driver retries it until retry_deadline(), then reports on_store_failure; the
// training side runs on).
struct sim_faults {
  milliseconds ack_timeout{100000};
  std::vector<std::tuple<int, int, int>> stalls;  // (worker, from tick, to tick)
  int dead = -1;
  int dead_from = 0;
  std::vector<std::tuple<int, int, int>> cuts;  // (worker, from tick, to tick): store cut off
  bool frozen(int worker, int tick) const {
    if (worker == dead && tick >= dead_from) return true;
    for (auto& [who, from, to] : stalls)
      if (who == worker && tick >= from && tick < to) return true;
    return false;
  }
  bool cut_off(int worker, int tick) const {
    for (auto& [who, from, to] : cuts)
      if (who == worker && tick >= from && tick < to) return true;
    return false;
  }
};

std::string timeout_text(const std::vector<int>& tasks) {
  std::string ids;
  for (int t : tasks) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  return "timeout " + ids;
}

// What a worker that follows the recorded outcome `recorded` does: "save S" or "timeout 1,2".
std::string expected_act(const std::string& recorded) {
  auto v = holdfast::parse_agreement_value(recorded);
  if (!v) return "unparsable '" + recorded + "'";
  if (v->what == holdfast::agreement_value::kind::step) return "save " + std::to_string(v->step);
  if (v->what == holdfast::agreement_value::kind::timeout) return timeout_text(v->tasks);
  return "unexpected '" + recorded + "'";
}

// The invariant of a round: every worker that acted followed the one recorded outcome.
bool follows_recorded(const sim_result& r) {
  if (r.acted.empty()) return true;
  if (r.acted.size() != 1) return false;
  return *r.acted.begin() == expected_act(r.recorded);
}

// n machines over one fake store, ticked together: each tick, in a random order, each worker's
// watcher side sees the claim keys now and then, answers its parked wait (the key appeared, the
// deadline passed, or — while the claimant collects — the outcome key appeared and is reported
// with on_outcome_seen), and runs protocol_next until a decide; then its training side runs a
// step every `skew` ticks and acts on decide. What the workers did per (round, phase) is kept
// with the outcome key as it was when the first of them acted.
class sim_engine {
 public:
  sim_engine(int n, const std::vector<int>& skews, std::mt19937& rng, const sim_faults& faults,
             milliseconds grace = milliseconds(0), bool exits = true)
      : rng_(rng), faults_(faults) {
    for (int i = 0; i < n; ++i) {
      auto c = cfg(i, n, grace, exits);
      c.ack_timeout = faults.ack_timeout;
      w.push_back(sim_worker{step_agreement(c),
                             0,
                             std::nullopt,
                             std::nullopt,
                             {},
                             {},
                             false,
                             skews[static_cast<std::size_t>(i)],
                             false});
    }
  }

  bool dead(std::size_t i, int tick) const {
    return static_cast<int>(i) == faults_.dead && tick >= faults_.dead_from;
  }

  // Every worker idle in one round with nothing left to do (its erases done): between rounds.
  bool settled(int tick) const {
    const sim_worker* first = nullptr;
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (dead(i, tick)) continue;
      auto& x = w[i];
      if (x.exited || x.parked || x.held || x.sm.state() != agreement_state::idle ||
          x.sm.needs_attention() || (first && x.sm.round() != first->sm.round()))
        return false;
      if (!first) first = &x;
    }
    return first != nullptr;
  }

  void tick(int tick) {
    auto now = t0 + milliseconds(tick);
    std::vector<std::size_t> order(w.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng_);
    for (std::size_t i : order) {
      auto& x = w[i];
      if (x.exited || faults_.frozen(static_cast<int>(i), tick)) continue;
      watcher(x, now, faults_.cut_off(static_cast<int>(i), tick));
      training(x, tick, now);
    }
  }

  fake_kv kv;
  std::vector<sim_worker> w;
  int claims = 0;
  bool broken = false;  // a worker saved past the agreed step, saved twice, or failed otherwise
  std::string why;
  std::map<std::pair<std::uint64_t, int>, std::vector<std::string>> acted;
  std::map<std::pair<std::uint64_t, int>, std::string> recorded;
  int outcome_seen = 0;         // how many collections on_outcome_seen cut short
  int store_failures = 0;       // on_store_failure calls (a store cut off past the retry deadline)
  int claim_unknown = 0;        // of them, in noticed: the claim inserted first while recording
  int final_claim_unknown = 0;  // in final_noticed: the final claim inserted first
  // (round, phase, task) of each worker that failed unreachable
  std::vector<std::tuple<std::uint64_t, int, int>> unreachable;
  // > 0: the workers' steps end in a collective, so none gets more than `lockstep` steps ahead
  // of the slowest worker still training (over many rounds, free-running counters would drift
  // apart without bound; within one round they may)
  std::int64_t lockstep = 0;

 private:
  // The watcher side. While the store is cut off (`cut`) the watcher sees no key, and the
  // instruction it holds (a parked wait included: its connection is lost) is retried: when the
  // retry deadline passes first, on_store_failure; when the cut ends first, it is performed. An
  // erase is best effort: dropped.
  void watcher(sim_worker& x, clk::time_point now, bool cut) {
    const auto rd = x.sm.round();
    if (!cut && rng_() % 3 == 0 && kv.has(name(agreement_key::claim, rd))) x.sm.on_claim_seen(rd);
    if (!cut && rng_() % 3 == 0 && kv.has(name(agreement_key::final_claim, rd)))
      x.sm.on_final_seen(rd);
    if (x.parked && cut) {
      x.held = std::move(x.parked);
      x.parked.reset();
    } else if (x.parked) {
      auto v = kv.try_get(key_of(*x.parked));
      std::optional<std::string> outcome;
      if (!v && x.sm.collecting() && rng_() % 2 == 0)
        outcome = kv.try_get(name(x.sm.outcome_key(), x.sm.round()));
      if (outcome) {
        x.parked.reset();
        ++outcome_seen;
        x.sm.on_outcome_seen(*outcome);
      } else if (v || now >= x.parked->deadline) {
        x.parked.reset();
        x.sm.on_value(v);
      }
    }
    if (x.held) {
      if (!cut) {
        auto in = std::move(*x.held);
        x.held.reset();
        if (!issue(x, in, now, cut)) return;
      } else if (now >= x.sm.retry_deadline()) {
        x.held.reset();
        ++store_failures;
        const auto st = x.sm.state();
        claim_unknown += st == agreement_state::noticed;
        final_claim_unknown += st == agreement_state::final_noticed;
        x.sm.on_store_failure("store cut off");
      } else {
        return;  // still retrying
      }
    }
    while (!x.parked && !x.held) {
      auto in = x.sm.protocol_next(x.counter, now);  // the counter of the step under way
      if (in.kind == op::decide) break;
      if (!issue(x, in, now, cut)) break;
    }
  }

  // Performs `in`, or parks it (a wait whose key is absent) or holds it (the store cut off):
  // false when the watcher stops there this tick.
  bool issue(sim_worker& x, const step_agreement::instruction& in, clk::time_point now, bool cut) {
    if (cut) {
      if (in.kind != op::erase) x.held = in;  // an erase is dropped (best effort)
      return in.kind == op::erase;
    }
    if (in.kind == op::wait && now < in.deadline && !kv.has(key_of(in))) {
      x.parked = in;
      return false;
    }
    if (in.kind == op::insert && in.key == agreement_key::claim) {
      bool ok = kv.insert(key_of(in), in.value);
      claims += ok;
      x.sm.on_insert(ok);
      return true;
    }
    perform(x.sm, in, kv);
    check_claim(in);
    return true;
  }

  // No outcome key (step, final step) exists without its claim key (claim, final claim): the
  // idle workers (and those training through the grace period) watch the claim key alone, and
  // would never find the outcome. Checked as an outcome is recorded (a claim key is erased only
  // with its outcome key, one round later, in one go).
  void check_claim(const step_agreement::instruction& in) {
    if (in.kind != op::insert ||
        (in.key != agreement_key::step && in.key != agreement_key::final_step))
      return;
    const auto claim =
        in.key == agreement_key::step ? agreement_key::claim : agreement_key::final_claim;
    if (!kv.has(name(claim, in.round)))
      fail("round " + std::to_string(in.round) +
           (in.key == agreement_key::step ? ": outcome '" : ": final outcome '") +
           kv.try_get(key_of(in)).value_or("") + "' recorded without its claim");
  }

  // The smallest counter of the workers still training (not dead, not exited).
  std::int64_t min_counter(int tick) const {
    std::int64_t m = INT64_MAX;
    for (std::size_t i = 0; i < w.size(); ++i)
      if (!w[i].exited && !dead(i, tick)) m = std::min(m, w[i].counter);
    return m;
  }

  void note(std::uint64_t round, int phase, const std::string& what) {
    auto k = std::make_pair(round, phase);
    acted[k].push_back(what);
    if (!recorded.count(k))  // the outcome key is erased one round later at the earliest
      recorded[k] = kv.try_get(name(phase ? agreement_key::final_step : agreement_key::step, round))
                        .value_or("");
  }

  void fail(const std::string& what) {
    broken = true;
    if (why.empty()) why = what;
  }

  // The training side: one step every `skew` ticks (a step may be stuck for a while).
  void training(sim_worker& x, int tick, clk::time_point now) {
    if (tick % x.skew) return;
    if (x.running) {
      if (lockstep > 0 && x.counter >= min_counter(tick) + lockstep)
        return;  // inside a collective: its peers are behind
      ++x.counter;
      x.running = false;
    }
    const auto rd = x.sm.round();
    const int phase = x.sm.state() == agreement_state::final_published ? 1 : 0;
    const auto agreed = x.sm.agreed_step(phase);
    auto in = x.sm.decide(x.counter, now);
    switch (in.action) {
      case agreement_action::save_then_exit:
      case agreement_action::save:
      case agreement_action::save_then_continue:
        if (in.step != agreed || in.step != x.counter)
          fail("saved at " + std::to_string(in.step) + ", agreed " + std::to_string(agreed));
        x.saves.push_back(in.step);
        x.saved_in.emplace(rd, phase);
        note(rd, phase, "save " + std::to_string(in.step));
        if (in.action == agreement_action::save_then_exit)
          x.exited = true;
        else
          x.running = true;  // the step runs after the checkpoint
        break;
      case agreement_action::fail: {
        const auto& f = x.sm.failure();
        const int fphase = f.key == agreement_key::final_step ? 1 : 0;
        x.exited = true;
        if (f.kind == agreement_failure::unreachable) {  // outside the one-outcome invariant
          unreachable.emplace_back(f.round, fphase, x.sm.settings().task);
          if (x.saved_in.count({f.round, fphase}))
            fail("task " + std::to_string(x.sm.settings().task) +
                 " saved, then failed unreachable");
          break;
        }
        if (f.kind != agreement_failure::timeout)
          fail("failure kind " + std::to_string(static_cast<int>(f.kind)));
        note(f.round, fphase, timeout_text(f.missing_tasks));
        break;
      }
      case agreement_action::proceed:
        x.running = true;
        break;
      case agreement_action::wait:  // stays at this boundary
        break;
    }
  }

  std::mt19937& rng_;
  sim_faults faults_;
};

// Every (round, phase) in which workers acted: all followed the outcome recorded then.
bool all_follow_recorded(const sim_engine& e, std::string& why) {
  for (auto& [k, acts] : e.acted) {
    const std::string want = expected_act(e.recorded.at(k));
    for (auto& a : acts)
      if (a != want) {
        why = "round " + std::to_string(k.first) + " phase " + std::to_string(k.second) + ": '" +
              a + "', recorded '" + e.recorded.at(k) + "'";
        return false;
      }
  }
  return true;
}

// n workers; `noticed` lists (worker, tick) notices; returns what happened.
sim_result simulate(int n, const std::vector<std::pair<int, int>>& notices,
                    const std::vector<int>& skews, std::mt19937& rng, int max_ticks = 4000,
                    const sim_faults& faults = {}) {
  sim_engine e(n, skews, rng, faults);
  for (int tick = 0; tick < max_ticks; ++tick) {
    bool done = true;
    for (std::size_t i = 0; i < e.w.size(); ++i) done = done && (e.w[i].exited || e.dead(i, tick));
    if (done) break;
    for (auto& nt : notices)
      if (nt.second == tick)
        e.w[static_cast<std::size_t>(nt.first)].sm.on_notice(t0 + milliseconds(tick));
    e.tick(tick);
  }
  sim_result r;
  r.claims = e.claims;
  r.failed = e.broken;
  r.outcome_seen = e.outcome_seen;
  for (auto& [k, acts] : e.acted) r.acted.insert(acts.begin(), acts.end());
  r.recorded = e.kv.try_get(name(agreement_key::step, 0)).value_or("");
  for (std::size_t i = 0; i < e.w.size(); ++i) {
    auto& x = e.w[i];
    if (static_cast<int>(i) == faults.dead) continue;
    r.all_exited = r.all_exited && x.exited;
    for (auto s : x.saves) r.first_steps.insert(s);
    if (x.saves.size() > 1) r.failed = true;
  }
  return r;
}

// no_exit: `rounds` rounds in a row, each save re-arming the machines. With `barrier`, the next
// notices come only once every worker is idle in the next round (then the store is checked: no
// ack left, as many keys as after the first round); without, notices land at random ticks on
// random workers, whatever round they are in (rounds overlap: a worker claims round r + 1 while
// its peers still train towards round r's step).
struct rounds_result {
  std::uint64_t rounds = 0;          // rounds every worker finished
  std::size_t keys_first = 0;        // keys in the store once round 0 is over
  std::size_t keys_last = 0;         // keys in the store at the end
  std::size_t acks_settled = 0;      // the most ack keys seen between two rounds
  int settles = 0;                   // ticks at which every worker was idle between rounds
  std::uint64_t rounds_checked = 0;  // rounds after which the store was checked (all idle)
  bool timed_out = false;            // the run did not finish in its ticks
  bool all_failed_or_done = true;
};

rounds_result simulate_rounds(sim_engine& e, std::uint64_t rounds, bool barrier, std::mt19937& rng,
                              int max_ticks, const sim_faults& faults = {}) {
  rounds_result r;
  if (e.lockstep == 0) e.lockstep = 1 + static_cast<std::int64_t>(rng() % 3);
  const std::size_t n = e.w.size();
  int notice_at = -1;
  std::vector<std::size_t> to_notice;
  std::uint64_t last_checked = 0;
  int tick = 0;
  for (; tick < max_ticks; ++tick) {
    bool all_exited = true;
    for (std::size_t i = 0; i < n; ++i)
      all_exited = all_exited && (e.w[i].exited || e.dead(i, tick));
    if (all_exited) break;  // failed (a timeout): nothing more to do
    if (e.settled(tick)) {
      std::uint64_t rd = 0;
      for (std::size_t i = 0; i < n; ++i)
        if (!e.dead(i, tick)) rd = e.w[i].sm.round();
      ++r.settles;
      if (faults.dead < 0 || tick < faults.dead_from)  // a dead worker never erases its ack
        r.acks_settled = std::max(r.acks_settled, ack_keys(e.kv));
      if (rd >= 1 && rd != last_checked) {
        last_checked = rd;
        ++r.rounds_checked;
        if (rd == 1) r.keys_first = e.kv.m.size();
        r.keys_last = e.kv.m.size();
      }
      r.rounds = rd;
      if (rd >= rounds) break;
      if (barrier && notice_at < 0) {  // the next round's notices: a random non-empty subset
        notice_at = tick + 1 + static_cast<int>(rng() % 20);
        to_notice.clear();
        std::vector<std::size_t> live;  // a dead worker's watcher would never claim
        for (std::size_t i = 0; i < n; ++i)
          if (static_cast<int>(i) != faults.dead) live.push_back(i);
        for (std::size_t i : live)
          if (rng() % 3 == 0) to_notice.push_back(i);
        if (to_notice.empty()) to_notice.push_back(live[rng() % live.size()]);
      }
    }
    const auto now = t0 + milliseconds(tick);
    if (barrier && tick == notice_at) {
      for (std::size_t i : to_notice) e.w[i].sm.on_notice(now);
      notice_at = -1;
    } else if (!barrier && rng() % 25 == 0) {
      auto i = rng() % n;
      if (e.w[i].sm.round() < rounds) e.w[i].sm.on_notice(now);
    }
    e.tick(tick);
  }
  r.timed_out = tick == max_ticks;
  if (r.timed_out) {  // what each worker was doing, for the report
    for (auto& x : e.w)
      MESSAGE("task " << x.sm.settings().task << " round " << x.sm.round() << " state "
                      << static_cast<int>(x.sm.state()) << " counter " << x.counter << " agreed "
                      << x.sm.agreed_step() << " parked "
                      << (x.parked ? key_of(*x.parked) : std::string("-")));
    for (auto& [k, v] : e.kv.m) MESSAGE(k << " = " << v);
  }
  for (std::size_t i = 0; i < n; ++i) {
    auto& x = e.w[i];
    if (static_cast<int>(i) == faults.dead) continue;
    const bool ok = x.exited ? x.sm.state() == agreement_state::failed
                             : x.sm.round() >= rounds && x.sm.state() == agreement_state::idle;
    r.all_failed_or_done = r.all_failed_or_done && ok;
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
    CHECK(follows_recorded(r));
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
    REQUIRE(follows_recorded(r));
  }
}

TEST_CASE("simulation: 2000 trials with stalls and dead workers near the deadline — one outcome") {
  // Workers frozen (SIGSTOP) at random ticks around their peers' deadline, for random lengths
  // (some past it), and sometimes a worker dead from the start: every worker that acts follows
  // the recorded outcome, a save at its step or the timeout naming its tasks; none hangs.
  std::mt19937 rng(777);
  int timeouts = 0, saves = 0, outcome_seen = 0;
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
    outcome_seen += r.outcome_seen;
  }
  MESSAGE("recorded outcomes: " << saves << " steps, " << timeouts << " timeouts; " << outcome_seen
                                << " collections cut short by the outcome key");
  CHECK(timeouts > 100);  // the mix covers both outcomes
  CHECK(saves > 100);
  CHECK(outcome_seen > 10);
}

TEST_CASE("simulation: the claimant frozen or dead after its ack — a follower records it") {
  // The claimant stops right after its claim and ack (for a while or for good): nobody collects
  // the acks, every follower waits on the outcome key until its deadline, then records the
  // outcome itself (a step, or a timeout when another worker was stalled past the deadline).
  std::mt19937 rng(4242);
  int timeouts = 0, saves = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 6);
    std::vector<int> skews(static_cast<std::size_t>(n), 1);
    const int who = static_cast<int>(rng() % static_cast<unsigned>(n));
    sim_faults f;
    f.ack_timeout = milliseconds(50);
    const int from = 11 + static_cast<int>(rng() % 3);
    if (rng() % 2) {
      f.stalls.emplace_back(who, from, from + 20 + static_cast<int>(rng() % 200));
    } else {
      f.dead = who;
      f.dead_from = from;
    }
    if (n > 2 && rng() % 2)  // another worker stalled from the start, maybe past the deadline
      f.stalls.emplace_back((who + 1) % n, 0, 30 + static_cast<int>(rng() % 100));
    auto r = simulate(n, {{who, 10}}, skews, rng, 4000, f);
    INFO("trial " << trial << " n " << n << " recorded '" << r.recorded << "'");
    REQUIRE_FALSE(r.failed);
    REQUIRE(r.all_exited);
    REQUIRE(follows_recorded(r));
    REQUIRE(r.claims == 1);
    (r.recorded.rfind("timeout", 0) == 0 ? timeouts : saves)++;
  }
  MESSAGE("recorded outcomes: " << saves << " steps, " << timeouts << " timeouts");
  CHECK(timeouts > 10);
  CHECK(saves > 10);
}

TEST_CASE("simulation: no_exit, 1000 rounds in a row with re-arm — one step each, no key left") {
  for (int n : {1, 3, 8}) {
    INFO("n " << n);
    std::mt19937 rng(static_cast<unsigned>(99 + n));
    std::vector<int> skews;
    for (int i = 0; i < n; ++i) skews.push_back(1 + static_cast<int>(rng() % 5));
    sim_engine e(n, skews, rng, {}, milliseconds(0), false);
    auto r = simulate_rounds(e, 1000, true, rng, 1000 * 400);
    std::string why;
    CHECK_MESSAGE(all_follow_recorded(e, why), why);
    CHECK_MESSAGE(!e.broken, e.why);
    CHECK_FALSE(r.timed_out);
    CHECK(r.rounds == 1000);
    CHECK(r.all_failed_or_done);
    CHECK(e.claims == 1000);
    CHECK(r.rounds_checked == 1000);  // the store was checked after every round
    CHECK(r.acks_settled == 0);       // and held no ack then
    CHECK(r.keys_first > 0);
    CHECK(r.keys_last <= r.keys_first);  // no more keys after 1000 rounds than after 1
    CHECK(e.kv.keys() ==
          std::vector<std::string>{"run/ctl/r999/claim", "run/ctl/r999/step"});  // the last only
    CHECK(e.acted.size() == 1000);
    for (auto& [k, acts] : e.acted) {
      CHECK(acts.size() == static_cast<std::size_t>(n));  // every worker saved in every round
      CHECK(k.second == 0);
    }
  }
}

TEST_CASE("simulation: no_exit with the grace path, 300 rounds — two saves each, no key left") {
  std::mt19937 rng(31337);
  const int n = 4;
  sim_engine e(n, {1, 2, 3, 1}, rng, {}, milliseconds(30), false);
  auto r = simulate_rounds(e, 300, true, rng, 300 * 600);
  std::string why;
  CHECK_MESSAGE(all_follow_recorded(e, why), why);
  CHECK_MESSAGE(!e.broken, e.why);
  CHECK_FALSE(r.timed_out);
  CHECK(r.rounds == 300);
  CHECK(r.acks_settled == 0);
  CHECK(r.keys_last <= r.keys_first);
  CHECK(e.kv.keys() == std::vector<std::string>{"run/ctl/r299/claim", "run/ctl/r299/final",
                                                "run/ctl/r299/final_step", "run/ctl/r299/step"});
  CHECK(e.acted.size() == 600);  // a first and a final save in every round
  for (auto& [k, acts] : e.acted) CHECK(acts.size() == static_cast<std::size_t>(n));
}

TEST_CASE("simulation: no_exit, overlapping rounds with random notices — one outcome per round") {
  // Notices land on random workers at random ticks, whatever their round: a worker re-armed
  // into round r + 1 claims it while its peers still train towards round r's step.
  std::mt19937 rng(2024);
  for (int run = 0; run < 20; ++run) {
    const int n = 1 + static_cast<int>(rng() % 8);
    INFO("run " << run << " n " << n);
    std::vector<int> skews;
    for (int i = 0; i < n; ++i) skews.push_back(1 + static_cast<int>(rng() % 7));
    sim_engine e(n, skews, rng, {}, milliseconds(0), false);
    auto r = simulate_rounds(e, 100, false, rng, 100 * 2000);
    std::string why;
    REQUIRE_MESSAGE(all_follow_recorded(e, why), why);
    REQUIRE_MESSAGE(!e.broken, e.why);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.rounds == 100);
    CHECK(r.acks_settled == 0);
    CHECK(e.kv.keys() == std::vector<std::string>{"run/ctl/r99/claim", "run/ctl/r99/step"});
  }
}

// A job for the no_exit round simulations with faults: 2 to 6 workers of skews 1 to 4, an ack
// timeout of 60 to 259 ms, up to 5 stalls of 1 to 300 ticks within the first 3000, and one time
// in five a worker dead from a tick within them (drawn from `rng` in that order).
struct stalled_job {
  int n;
  std::vector<int> skews;
  sim_faults f;
};
stalled_job stalled_rounds_job(std::mt19937& rng) {
  stalled_job j;
  j.n = 2 + static_cast<int>(rng() % 5);
  for (int i = 0; i < j.n; ++i) j.skews.push_back(1 + static_cast<int>(rng() % 4));
  j.f.ack_timeout = milliseconds(60 + rng() % 200);
  for (int k = 0, stalls = static_cast<int>(rng() % 6); k < stalls; ++k) {
    const int from = static_cast<int>(rng() % 3000);
    const int who = static_cast<int>(rng() % static_cast<unsigned>(j.n));
    j.f.stalls.emplace_back(who, from, from + 1 + static_cast<int>(rng() % 300));
  }
  if (rng() % 5 == 0) {
    j.f.dead = static_cast<int>(rng() % static_cast<unsigned>(j.n));
    j.f.dead_from = static_cast<int>(rng() % 3000);
  }
  return j;
}

TEST_CASE("simulation: no_exit rounds with stalls, deaths and short deadlines — one outcome") {
  // Until a round times out (then every live worker fails with that timeout), each round saves
  // at one step; no worker ever acts otherwise than the recorded outcome of its round says.
  std::mt19937 rng(5150);
  int failed_runs = 0, full_runs = 0, outcome_seen = 0;
  for (int run = 0; run < 300; ++run) {
    const stalled_job job = stalled_rounds_job(rng);
    const int n = job.n;
    sim_engine e(n, job.skews, rng, job.f, milliseconds(0), false);
    auto r = simulate_rounds(e, 30, rng() % 2 == 0, rng, 30 * 2000, job.f);
    INFO("run " << run << " n " << n);
    std::string why;
    REQUIRE_MESSAGE(all_follow_recorded(e, why), why);
    REQUIRE_MESSAGE(!e.broken, e.why);
    REQUIRE_FALSE(r.timed_out);
    REQUIRE(r.all_failed_or_done);
    CHECK(r.acks_settled == 0);
    (r.rounds >= 30 ? full_runs : failed_runs)++;
    outcome_seen += e.outcome_seen;
  }
  MESSAGE("runs: " << full_runs << " all rounds saved, " << failed_runs << " ended in a timeout; "
                   << outcome_seen << " collections cut short by the outcome key");
  CHECK(failed_runs > 10);
  CHECK(full_runs > 10);
}
TEST_CASE("simulation: no_exit rounds on the grace path with stalls and deaths — one outcome") {
  // Two saves per round (the final one claimed by whichever noticed worker's grace ends first,
  // which collects the final acks): every worker that acts follows its phase's recorded outcome.
  std::mt19937 rng(8086);
  int failed_runs = 0, full_runs = 0;
  for (int run = 0; run < 200; ++run) {
    const stalled_job job = stalled_rounds_job(rng);
    const int n = job.n;
    const auto grace = milliseconds(20 + rng() % 50);
    sim_engine e(n, job.skews, rng, job.f, grace, false);
    auto r = simulate_rounds(e, 20, rng() % 2 == 0, rng, 20 * 4000, job.f);
    INFO("run " << run << " n " << n);
    std::string why;
    REQUIRE_MESSAGE(all_follow_recorded(e, why), why);
    REQUIRE_MESSAGE(!e.broken, e.why);
    REQUIRE_FALSE(r.timed_out);
    REQUIRE(r.all_failed_or_done);
    CHECK(r.acks_settled == 0);
    (r.rounds >= 20 ? full_runs : failed_runs)++;
  }
  MESSAGE("runs: " << full_runs << " all rounds saved twice, " << failed_runs
                   << " ended in a timeout");
  CHECK(failed_runs > 10);
  CHECK(full_runs > 10);
}

TEST_CASE(
    "simulation: 1000 trials with stores cut off around the deadlines — one outcome, no outcome "
    "without its claim") {
  // A worker's store is cut off (the etcd leader lost with its node, a partition) from around
  // the notice, or around the end of the grace period (the final claim), for up to 2.5 ack
  // timeouts or for good: the noticed worker's claim insert fails until its deadline (it then
  // inserts the claim while recording, and lists the acks), a follower's ack or wait fails (it
  // records or reads the outcome after its deadline), or the cut outlasts the recording too (it
  // fails unreachable, alone). Every trial, on top of the engine's checks (no save past the
  // agreed step, no outcome key recorded without its claim key; an unreachable worker never
  // saved in that phase): every worker that acts follows its phase's recorded
  // outcome; once an outcome is recorded, every live worker not cut off at the end acts on it
  // (none trains on unaware); no outcome only where every noticed worker failed unreachable or
  // is cut off at the end.
  std::mt19937 rng(3303);
  int timeouts = 0, saves = 0, none = 0, finals = 0;
  int store_failures = 0, claim_unknown = 0, final_claim_unknown = 0, unreachable = 0;
  constexpr int forever = 1 << 30;
  auto pick = [&](int m) { return static_cast<int>(rng() % static_cast<unsigned>(m)); };
  for (int trial = 0; trial < 1000; ++trial) {
    const int n = 2 + pick(5);
    std::vector<int> skews;
    for (int i = 0; i < n; ++i) skews.push_back(1 + pick(4));
    const bool grace_path = rng() % 2 == 0;
    const auto grace = grace_path ? milliseconds(30 + pick(50)) : milliseconds(0);
    sim_faults f;
    f.ack_timeout = milliseconds(40 + pick(60));
    const int ack = static_cast<int>(f.ack_timeout.count());
    const int notice = 20 + pick(50);
    const int noticed = pick(n);
    std::vector<std::pair<int, int>> notices{{noticed, notice}};
    if (rng() % 4 == 0) notices.emplace_back((noticed + 1) % n, notice + pick(ack));
    const int anchor =
        grace_path && rng() % 2 ? notice + static_cast<int>(grace.count()) + pick(10) : notice;
    const int from = anchor - 5 + pick(10);
    f.cuts.emplace_back(rng() % 4 ? noticed : pick(n), from,
                        rng() % 8 == 0 ? forever : from + ack / 2 + pick(2 * ack));
    if (rng() % 3 == 0) {  // another worker cut off around the deadline
      const int from2 = anchor + ack / 2 + pick(ack);
      f.cuts.emplace_back(pick(n), from2, from2 + 1 + pick(2 * ack));
    }
    if (rng() % 4 == 0) {  // and one frozen
      const int from3 = anchor + pick(2 * ack);
      f.stalls.emplace_back(pick(n), from3, from3 + 1 + pick(ack));
    }
    sim_engine e(n, skews, rng, f, grace, true);
    auto cut_at_end = [&](int i) {
      for (auto& [who, a, b] : f.cuts)
        if (who == i && b == forever) return true;
      return false;
    };
    // Until every worker acted or is cut off for good, or nothing can happen any more: every
    // noticed worker is gone, and the others are idle (or in grace) with no claim to join.
    const int last_notice = std::max(notices.front().second, notices.back().second);
    for (int tick = 0; tick < 8000; ++tick) {
      bool done = true, quiet = tick > last_notice;
      for (int i = 0; i < n; ++i) {
        const auto& x = e.w[static_cast<std::size_t>(i)];
        if (x.exited || (cut_at_end(i) && f.cut_off(i, tick))) continue;
        done = false;
        const auto st = x.sm.state();
        const bool claim = e.kv.has(name(
            st == agreement_state::idle ? agreement_key::claim : agreement_key::final_claim, 0));
        for (auto& nt : notices) quiet = quiet && nt.first != i;
        quiet = quiet && !claim && !x.parked && !x.held &&
                (st == agreement_state::idle || st == agreement_state::grace);
      }
      if (done || quiet) break;
      for (auto& nt : notices)
        if (nt.second == tick)
          e.w[static_cast<std::size_t>(nt.first)].sm.on_notice(t0 + milliseconds(tick));
      e.tick(tick);
    }
    const auto recorded = e.kv.try_get(name(agreement_key::step, 0));
    const auto final_recorded = e.kv.try_get(name(agreement_key::final_step, 0));
    INFO("trial " << trial << " n " << n << " grace " << grace.count() << " ack " << ack
                  << " notice " << notice << " task " << noticed << " cut "
                  << std::get<0>(f.cuts[0]) << " [" << from << ", " << std::get<2>(f.cuts[0])
                  << ") recorded '" << recorded.value_or("-") << "' final '"
                  << final_recorded.value_or("-") << "'");
    REQUIRE_MESSAGE(!e.broken, e.why);
    std::string why;
    REQUIRE_MESSAGE(all_follow_recorded(e, why), why);
    REQUIRE(e.claims <= 1);
    auto failed_unreachable = [&](int i) {
      for (auto& u : e.unreachable)
        if (std::get<2>(u) == i) return true;
      return false;
    };
    // The phases that must have an outcome: the first (a worker was noticed), and the final one
    // when the first saved on the grace path.
    const bool final_due = grace_path && recorded && recorded->rfind("step", 0) == 0;
    for (int p = 0; p < (final_due ? 2 : 1); ++p) {
      const bool have = p == 0 ? recorded.has_value() : final_recorded.has_value();
      if (have) {
        for (int i = 0; i < n; ++i) {
          const auto& x = e.w[static_cast<std::size_t>(i)];
          INFO("phase " << p << " task " << i << " state " << static_cast<int>(x.sm.state())
                        << " counter " << x.counter);
          CHECK((cut_at_end(i) || x.exited || x.saved_in.count({0, p}) != 0));
        }
      } else {
        for (auto& nt : notices) {
          INFO("phase " << p << ": no outcome, noticed task " << nt.first << " state "
                        << static_cast<int>(e.w[static_cast<std::size_t>(nt.first)].sm.state()));
          CHECK((cut_at_end(nt.first) || failed_unreachable(nt.first)));
        }
      }
    }
    if (!recorded)
      ++none;
    else
      (recorded->rfind("timeout", 0) == 0 ? timeouts : saves)++;
    finals += final_recorded.has_value();
    store_failures += e.store_failures;
    claim_unknown += e.claim_unknown;
    final_claim_unknown += e.final_claim_unknown;
    unreachable += static_cast<int>(e.unreachable.size());
  }
  MESSAGE("first outcomes: " << saves << " steps, " << timeouts << " timeouts, " << none
                             << " none; " << finals << " final outcomes; " << store_failures
                             << " store failures, " << claim_unknown << " with the claim unknown, "
                             << final_claim_unknown << " with the final claim unknown; "
                             << unreachable << " workers unreachable");
  CHECK(saves > 100);  // the mix covers every path
  CHECK(timeouts > 100);
  CHECK(finals > 100);
  CHECK(claim_unknown > 50);
  CHECK(final_claim_unknown > 20);
  CHECK(unreachable > 20);
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
  // Its claim may not exist: it is inserted first (an outcome without its claim would go unseen
  // by the workers that watch the claim key), then the acks are listed.
  auto in = a.protocol_next(4, t0 + milliseconds(1000));
  CHECK(in.kind == op::insert);
  CHECK(key_of(in) == "run/ctl/r0/claim");
  SUBCASE("the store is back: the claim, then the timeout naming the missing tasks") {
    a.on_insert(true);
    in = a.protocol_next(4, t0 + milliseconds(1000));
    CHECK(in.kind == op::list);
    a.on_list({{"run/ack/r0/0", "3"}});
    in = a.protocol_next(4, t0 + milliseconds(1000));
    CHECK(in.value == "timeout 1,2 by 1/0");
    a.on_insert(true);
    CHECK(a.failure().kind == agreement_failure::timeout);
    CHECK(a.failure().missing_tasks == std::vector<int>{1, 2});
  }
  SUBCASE("another claim exists: the acks, then the outcome, as a follower's recording") {
    a.on_insert(false);
    in = a.protocol_next(4, t0 + milliseconds(1000));
    CHECK(in.kind == op::list);
  }
  SUBCASE("recording fails too: unreachable, never a save") {
    a.on_store_failure("kv insert: Connection timed out");
    CHECK(a.state() == agreement_state::failed);
    CHECK(a.failure().kind == agreement_failure::unreachable);
    CHECK(a.failure().message == "kv insert: Connection timed out");
    CHECK(a.failure().key == agreement_key::step);
    CHECK(a.decide(4, t0).action == agreement_action::fail);
  }
}

TEST_CASE("grace: a final claim that failed until the deadline is inserted before the outcome") {
  step_agreement a(cfg(0, 1, milliseconds(1000)));
  fake_kv kv;
  a.on_notice(t0);
  CHECK(decide(a, kv, 10, t0).action == agreement_action::proceed);
  CHECK(decide(a, kv, 11, t0 + milliseconds(10)).action == agreement_action::save_then_continue);
  const auto mean = milliseconds(50);
  CHECK(a.decide(13, t0 + milliseconds(701), mean).action == agreement_action::proceed);
  REQUIRE(a.state() == agreement_state::final_noticed);
  auto in = a.protocol_next(13, t0 + milliseconds(701));
  CHECK(key_of(in) == "run/ctl/r0/final");
  a.on_store_failure("kv insert: Connection timed out");  // retried until the deadline
  CHECK(a.state() == agreement_state::final_acked);
  in = a.protocol_next(13, t0 + milliseconds(1701));
  CHECK(in.kind == op::insert);  // the final claim first, then the final acks
  CHECK(key_of(in) == "run/ctl/r0/final");
  a.on_insert(true);
  in = a.protocol_next(13, t0 + milliseconds(1701));
  CHECK(in.kind == op::list);
  CHECK(key_of(in) == "run/final_ack/r0/");
}

TEST_CASE("the retry deadline follows the ack deadline once acked") {
  step_agreement a(cfg(0, 2));
  a.on_claim_seen(0);
  a.protocol_next(1, t0);  // the ack
  a.on_put();
  CHECK(a.retry_deadline() == t0 + milliseconds(1000));
  CHECK(a.protocol_next(1, t0 + milliseconds(300)).kind == op::wait);  // on the outcome key
  a.on_store_failure("kv wait: EAGAIN");
  CHECK(a.retry_deadline() == t0 + milliseconds(2000));
  CHECK(a.protocol_next(1, t0 + milliseconds(1000)).kind == op::list);  // recording
  a.on_stop();
}

TEST_CASE("a store failure while the claimant collects goes on to record the outcome") {
  step_agreement a = claimant_after_ack(0, 3, 2);
  auto in = a.protocol_next(2, t0 + milliseconds(10));
  CHECK(key_of(in) == "run/ack/r0/1");
  CHECK(a.retry_deadline() == t0 + milliseconds(1000));
  a.on_store_failure("kv wait: Connection reset");  // retried until the ack deadline
  CHECK_FALSE(a.collecting());
  CHECK(a.state() == agreement_state::acked);
  CHECK(a.retry_deadline() == t0 + milliseconds(2000));
  in = a.protocol_next(2, t0 + milliseconds(1000));
  CHECK(in.kind == op::list);
  CHECK(key_of(in) == "run/ack/r0/");
  a.on_list({{"run/ack/r0/0", "2"}, {"run/ack/r0/1", "5"}, {"run/ack/r0/2", "3"}});
  in = a.protocol_next(2, t0 + milliseconds(1000));
  CHECK(in.value == "step 6 by 0/0");
  a.on_insert(true);
  CHECK(a.agreed_step() == 6);
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
  CHECK(round_trip({kind::claim, -1, {}, 3, "abc", {}, 0, 0}));
  CHECK(round_trip({kind::step, 9223372036854775807, {}, 0, "n", {}, 0, 0}));
  CHECK(round_trip({kind::timeout, -1, {0, 7, 12}, 1, "x-Y_9", {}, 0, 0}));
  CHECK(round_trip({kind::abort, -1, {}, 2, "n", {}, 0, 0}));
  CHECK(round_trip({kind::none, -1, {}, 0, "n", {}, 0, 0}));
  CHECK(holdfast::format_agreement_value({kind::step, 57, {}, 2, "9f3a", {}, 0, 0}) ==
        "step 57 by 2/9f3a");
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
  CHECK_THROWS_AS(holdfast::format_agreement_value({kind::timeout, -1, {}, 0, "n", {}, 0, 0}),
                  std::invalid_argument);
  CHECK_THROWS_AS(holdfast::format_agreement_value({kind::step, 1, {}, 0, "bad nonce", {}, 0, 0}),
                  std::invalid_argument);
}

TEST_CASE("values: a periodic save's decision and its reports round-trip, malformed ones refused") {
  using holdfast::agreement_value;
  using kind = agreement_value::kind;
  auto round_trip = [](const agreement_value& v) {
    auto back = holdfast::parse_agreement_value(holdfast::format_agreement_value(v));
    return back && *back == v;
  };
  CHECK(round_trip({kind::save, 120, {}, 0, "n", {}, 0, 0}));
  CHECK(round_trip({kind::saved, 120, {}, 2, "n", {}, 0, 0, 48211}));
  CHECK(round_trip({kind::saved, 120, {}, 1, "n", {}, 0, 0, -1}));
  CHECK(holdfast::format_agreement_value({kind::save, 120, {}, 0, "n", {}, 0, 0}) ==
        "save 120 by 0/n");
  CHECK(holdfast::format_agreement_value({kind::saved, 7, {}, 3, "n", {}, 0, 0, 0}) ==
        "saved 7 0 by 3/n");
  CHECK(holdfast::format_agreement_value({kind::saved, 7, {}, 3, "n", {}, 0, 0, -1}) ==
        "saved 7 - by 3/n");
  for (const char* bad : {"save by 0/n", "save -1 by 0/n", "save 01 by 0/n", "save 1 2 by 0/n",
                          "saved 1 by 0/n", "saved 1  by 0/n", "saved 1 -1 by 0/n",
                          "saved - 5 by 0/n", "saved 1 5 6 by 0/n", "saved 1 x by 0/n"})
    CHECK_MESSAGE(!holdfast::parse_agreement_value(bad), bad);
  CHECK_THROWS_AS(holdfast::format_agreement_value({kind::save, -1, {}, 0, "n", {}, 0, 0}),
                  std::invalid_argument);
  CHECK_THROWS_AS(holdfast::format_agreement_value({kind::saved, 1, {}, 0, "n", {}, 0, 0, -2}),
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

TEST_CASE("restore agreement: checkpoint identities, identity lists and the newest common one") {
  using holdfast::checkpoint_identity;
  CHECK(holdfast::format_checkpoint_identity({57, ""}) == "57");
  CHECK(holdfast::format_checkpoint_identity({57, "9f3a"}) == "57@9f3a");
  CHECK(holdfast::parse_checkpoint_identity("57@9f3a") == checkpoint_identity{57, "9f3a"});
  CHECK(holdfast::parse_checkpoint_identity("0") == checkpoint_identity{0, ""});
  for (const char* bad : {"", "@a", "5@", "5@a b", "-5@a", "05@a", "5@a@b", "x",
                          "5@123456789012345678901234567890123"})
    CHECK_MESSAGE(!holdfast::parse_checkpoint_identity(bad), bad);
  CHECK_THROWS_AS(holdfast::format_checkpoint_identity({-1, "a"}), std::invalid_argument);
  CHECK_THROWS_AS(holdfast::format_checkpoint_identity({1, "a/b"}), std::invalid_argument);
  try {
    holdfast::read_checkpoint_identity("5@a b", "ckpt/step-5/holdfast-metadata.json");
    FAIL("a bad identity was read");
  } catch (const holdfast::format_error& e) {
    CHECK(e.path() == "ckpt/step-5/holdfast-metadata.json");
    CHECK(std::string(e.what()).find("5@a b") != std::string::npos);
  }

  using ids = std::vector<checkpoint_identity>;
  CHECK(holdfast::format_identity_list({{1, ""}, {5, "h1"}, {9, "h2"}}) == "1,5@h1,9@h2");
  CHECK(holdfast::format_identity_list({{1, ""}, {5, "h1"}, {9, "h2"}}, 1) == "9@h2");
  CHECK(holdfast::parse_identity_list("1,5@h1,9@h2") == ids{{1, ""}, {5, "h1"}, {9, "h2"}});
  CHECK(holdfast::parse_identity_list("") == ids{});
  CHECK(holdfast::parse_identity_list("3,4") == ids{{3, ""}, {4, ""}});  // a plain step list
  for (const char* bad : {",", "1@a,", "5@a,1@a", "1@a,1@b", "1@", "1,,2"})
    CHECK_MESSAGE(!holdfast::parse_identity_list(bad), bad);

  // Invariant: a chosen identity is held, with that history, by every list.
  using lists = std::vector<ids>;
  // diverged at 20 (two launches saved it): the newest shared one is 10
  CHECK(holdfast::newest_common_identity(lists{
            {{10, "h0"}, {20, "hA"}}, {{10, "h0"}, {20, "hB"}}}) == checkpoint_identity{10, "h0"});
  // diverged everywhere: none
  CHECK(
      !holdfast::newest_common_identity(lists{{{10, "h0"}, {20, "hA"}}, {{10, "hX"}, {20, "hB"}}}));
  // unknown histories match by step only where every list's is unknown
  CHECK(holdfast::newest_common_identity(lists{{{10, ""}, {20, "h1"}}, {{10, ""}, {20, "h1"}}}) ==
        checkpoint_identity{20, "h1"});
  CHECK(holdfast::newest_common_identity(lists{{{10, ""}, {20, ""}}, {{10, ""}, {20, "h1"}}}) ==
        checkpoint_identity{10, ""});
  CHECK(!holdfast::newest_common_identity(lists{{{10, "h1"}}, {{10, ""}}}));
  CHECK(!holdfast::newest_common_identity(lists{}));
  CHECK(holdfast::newest_common_identity(lists{{{4, "h"}}}) == checkpoint_identity{4, "h"});
}
