// Fuzzes the bodies of cloud preemption notices (termination.hpp), through the pollers the
// notice classes run, over scripted_io (the metadata server's answers are canned):
//   - AWS spot: detail::aws_spot_poll: the IMDSv2 token, then spot/instance-action, whose 200
//     body is JSON {"action":"terminate|stop|hibernate","time":"<ISO 8601>"};
//   - GCE: detail::gce_metadata_poll on instance/maintenance-event (NONE,
//     MIGRATE_ON_HOST_MAINTENANCE, TERMINATE_ON_HOST_MAINTENANCE) and instance/preempted
//     (TRUE/FALSE).
// Input: byte 0 chooses the AWS action status (0-4: 200, 5: 404, 6: 401 then a new token and
// 200, 7: 500) and (bit 3) which GCE key; the rest is the body both servers answer.
// Properties: only holdfast::error escapes; AWS notices exactly on a 200 with a deadline, never
// on a 404; GCE notices exactly when the trimmed body is the expected value.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include <holdfast/termination.hpp>

#include "fuzz_support.hpp"

namespace {

namespace d = holdfast::detail;
using hf_fuzz::http_ok;
using hf_fuzz::scripted_io;

void aws(int choice, std::string_view body) {
  const int status = choice <= 4 ? 200 : choice == 5 ? 404 : choice == 6 ? 401 : 500;
  std::vector<std::string> script{http_ok("AQAEAFakeToken=="), http_ok(body, status)};
  if (status == 401) {
    script.push_back(http_ok("AQAEAnotherToken"));
    script.push_back(http_ok(body, 200));
  }
  scripted_io::reset(std::move(script), 0);
  d::aws_spot_poll<scripted_io> poll;
  poll.endpoint = d::http_endpoint{"169.254.169.254", 80};
  std::atomic<bool> stopping{false};
  holdfast::poll_result r;
  try {
    r = poll(stopping);
  } catch (const holdfast::error&) {
    return;
  }
  if (status == 404) hf_fuzz::check(!r.noticed, "a 404 instance-action counted as a notice");
  if (status == 200 || status == 401) {
    hf_fuzz::check(r.noticed, "a 200 instance-action accepted without a notice");
    hf_fuzz::check(r.deadline.has_value(), "an AWS notice without its deadline");
  }
  hf_fuzz::check(status != 500, "a 500 answer accepted");
}

void gce(bool preempted, std::string_view body) {
  scripted_io::reset({http_ok(body)}, 0);
  d::gce_metadata_poll<scripted_io> poll;
  poll.endpoint = d::http_endpoint{"169.254.169.254", 80};
  if (preempted) {
    poll.key = "preempted";
    poll.expect = "TRUE";
    poll.known = {"FALSE"};
  } else {
    poll.key = "maintenance-event";
    poll.expect = "TERMINATE_ON_HOST_MAINTENANCE";
    poll.known = {"NONE", "MIGRATE_ON_HOST_MAINTENANCE"};
  }
  std::atomic<bool> stopping{false};
  holdfast::poll_result r;
  try {
    r = poll(stopping);
  } catch (const holdfast::error&) {
    return;
  }
  hf_fuzz::check(r.noticed == (d::trim_ascii(body) == poll.expect),
                 "a GCE notice does not match the value the server sent");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const auto body = hf_fuzz::text(data + 1, size - 1);
  aws(data[0] & 7, body);
  gce((data[0] & 8) != 0, body);
  return 0;
}
