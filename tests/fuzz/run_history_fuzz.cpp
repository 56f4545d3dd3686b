// Fuzzes holdfast-run-history.json, which an earlier incarnation of the job wrote and a crash, a
// full disk or a user may have damaged (checkpoint/save_policy.hpp): detail::parse_run_history.
// Properties: it throws nothing but holdfast::error (run_history::begin logs that and starts from
// the prior); what it read formats back (format_run_history) to a file that parses to the same
// totals, incarnations, save cost and current incarnation; the totals' counts stay non-negative.
#include <cstddef>
#include <cstdint>
#include <holdfast/checkpoint/save_policy.hpp>
#include <string>

#include "fuzz_support.hpp"

namespace {

namespace d = holdfast::detail;

bool same(const holdfast::run_incarnation& a, const holdfast::run_incarnation& b) {
  return a.start == b.start && a.run_time == b.run_time && a.end == b.end;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = hf_fuzz::text(data, size);
  d::run_history_state s;
  try {
    s = d::parse_run_history(in, "fuzz/holdfast-run-history.json");
  } catch (const holdfast::error&) {
    return 0;  // reported and started afresh by run_history::begin
  } catch (const std::exception& e) {
    hf_fuzz::fail("parse_run_history threw a non-holdfast error: " + std::string(e.what()));
  }
  const holdfast::run_counters& t = s.totals;
  hf_fuzz::check(t.unnoticed >= 0 && t.noticed >= 0 && t.clean >= 0 && t.exposure.count() >= 0,
                 "negative totals were accepted");
  hf_fuzz::check(s.past.size() <= d::run_history_kept, "more incarnations kept than the bound");
  d::run_history_state again;
  try {
    again = d::parse_run_history(d::format_run_history(s), "fuzz/again.json");
  } catch (const std::exception& e) {
    hf_fuzz::fail("format_run_history wrote an unreadable file: " + std::string(e.what()));
  }
  hf_fuzz::check(again.totals.exposure == t.exposure && again.totals.unnoticed == t.unnoticed &&
                     again.totals.noticed == t.noticed && again.totals.clean == t.clean,
                 "the totals changed in a round trip");
  hf_fuzz::check(again.past.size() == s.past.size(), "the incarnations changed in a round trip");
  for (std::size_t i = 0; i < s.past.size(); ++i)
    hf_fuzz::check(same(again.past[i], s.past[i]), "an incarnation changed in a round trip");
  hf_fuzz::check(again.save_cost == s.save_cost, "the save cost changed in a round trip");
  hf_fuzz::check(again.current.has_value() == s.current.has_value() &&
                     (!s.current || same(*again.current, *s.current)) && again.alive == s.alive,
                 "the current incarnation changed in a round trip");
  return 0;
}
