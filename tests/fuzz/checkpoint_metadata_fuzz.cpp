// Fuzzes the small files of a checkpoint directory that other processes wrote (checkpoint.hpp):
// detail::parse_checkpoint_metadata (holdfast-metadata.json: step, time, user metrics) and
// detail::checkpoint_parse_holder (a writer lock file: pid and host of the holder).
// Properties: parse_checkpoint_metadata never throws (it answers std::nullopt for anything
// unreadable); what it read formats back (format_checkpoint_metadata) to a file that parses to
// the same step, time and metrics; a parsed holder written again (checkpoint_holder_text) parses
// to the same pid and host (hosts up to 255 bytes).
#include <cstddef>
#include <cstdint>
#include <string>

#include <holdfast/checkpoint.hpp>

#include "fuzz_support.hpp"

namespace {

namespace d = holdfast::detail;

void metadata(std::string_view in) {
  std::optional<holdfast::checkpoint_metadata> m;
  try {
    m = d::parse_checkpoint_metadata(in, "fuzz/holdfast-metadata.json");
  } catch (const std::exception& e) {
    hf_fuzz::fail("parse_checkpoint_metadata threw: " + std::string(e.what()));
  }
  if (!m) return;
  if (m->metrics.is_object())
    for (const auto& kv : m->metrics.as_object()) {
      try {
        (void)m->metric(kv.first);
      } catch (const holdfast::error&) {
      }
    }
  const holdfast::checkpoint_metrics* metrics =
      m->metrics.is_object() ? &m->metrics.as_object() : nullptr;
  const std::string text = d::format_checkpoint_metadata(m->step, m->time, metrics);
  auto again = d::parse_checkpoint_metadata(text, "fuzz/again.json");
  hf_fuzz::check(again.has_value(), "format_checkpoint_metadata wrote an unreadable file");
  hf_fuzz::check(again->step == m->step, "the step changed in a metadata round trip");
  hf_fuzz::check(again->time == m->time, "the time changed in a metadata round trip");
  hf_fuzz::check(again->metrics == m->metrics, "the metrics changed in a metadata round trip");
}

void holder(std::string_view in) {
  const auto h = d::checkpoint_parse_holder(in);
  // The host is kept for messages: its first 255 bytes, control bytes shown as \xNN (which can
  // make it longer). A longer one is cut again when read back; only shorter ones round-trip.
  if (h.second.size() > 255) return;
  const auto again = d::checkpoint_parse_holder(d::checkpoint_holder_text(h.first, h.second, ""));
  hf_fuzz::check(again.first == h.first, "a holder's pid changed in a round trip");
  hf_fuzz::check_equal(again.second, h.second, "a holder's host changed in a round trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = hf_fuzz::text(data, size);
  metadata(in);
  holder(in);
  return 0;
}
