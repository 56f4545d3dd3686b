// Fuzzes parse_sync_manifest (store.hpp): the manifest a mirrored sync keeps in the remote run
// directory, read back by the next sync (maybe from another machine, maybe cut short).
// Properties: only holdfast::error escapes; every path accepted is a safe relative path
// (manifest_path_problem finds nothing); format_sync_manifest of what was parsed parses back to
// the same manifest, and formatting that again gives the same text.
#include <cstddef>
#include <cstdint>
#include <string>

#include <holdfast/store.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = "fuzz/.holdfast-sync-manifest";
  holdfast::sync_manifest m;
  try {
    m = holdfast::parse_sync_manifest(hf_fuzz::text(data, size), path);
  } catch (const holdfast::error&) {
    return 0;
  }
  for (const auto& f : m.files)
    hf_fuzz::check(holdfast::detail::manifest_path_problem(f.first) == nullptr,
                   "parse_sync_manifest accepted a path that could leave the run directory");
  const std::string text = holdfast::format_sync_manifest(m);
  holdfast::sync_manifest again;
  try {
    again = holdfast::parse_sync_manifest(text, path);
  } catch (const holdfast::error& e) {
    hf_fuzz::fail("parse_sync_manifest refuses format_sync_manifest's text: " +
                  std::string(e.what()));
  }
  hf_fuzz::check(again.files == m.files, "a formatted manifest parses to another manifest");
  hf_fuzz::check_equal(holdfast::format_sync_manifest(again), text,
                       "format_sync_manifest is not stable across a round trip");
  return 0;
}
