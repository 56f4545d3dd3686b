// holdfast/kv/etcd/watch.hpp — the long-lived etcd watch that basic_etcd_kv::watch(prefix)
// returns (kv.hpp, "Waiting on a store"; the handler keeps one for its life): a snapshot, then
// one streaming /v3/watch read without blocking, resumed when lost, probed for health.
//
// Guarantees:
//   - A range of the keys below `prefix + "/"` learns revision R and what they hold, then ONE
//     streaming /v3/watch from R + 1 on a connection of its own serves the watch for its whole
//     life. take() reads what arrived without blocking and returns each put (its value) and erase
//     (nullopt) below the prefix, in revision order, exactly once; the first take() is complete:
//     it starts with the range's snapshot, so the caller knows every key without a read.
//   - Whole revisions: a txn, an erase_prefix (deleterange) or a lease expiry is N events at one
//     revision, all of them delivered. etcd sends a revision whole in one message, so the filter
//     that keeps a resume from repeating events drops revisions at or below the last one a
//     complete message delivered, never later events of a revision it is delivering.
//   - Resume: when the stream ends or breaks (server restart, reset, etcd's "unavailable"), its
//     endpoint becomes suspect and the watch reopens from the last delivered revision + 1 on
//     the endpoint failover picks (the same one when it is the only one): nothing is lost or
//     repeated. One attempt per take(); while disconnected fd() is -1 and due() is the next
//     attempt: at once while endpoints remain untried, then 50 ms doubling up to the probe
//     interval. A resume older than etcd's last compaction is cancelled with compact_revision:
//     the watch ranges again, reopens, and its take() is complete again (a new snapshot).
//   - Health probe: a frozen member keeps a watch open and silent. So after every probe
//     interval, max(1 s, request_timeout / 2, 1.5 x the lease keep-alive period), in which the
//     stream's endpoint answered nothing (a message on the stream, or any request of this client
//     to that endpoint — a lease keep-alive included — postpones it), take() sends one
//     linearizable count-only range of a single key to that endpoint on a pooled keep-alive
//     connection, within request_timeout; it also fails on a member cut off from its quorum. A
//     failed probe marks the endpoint suspect and moves the watch (resuming), so a watch on a
//     frozen member delivers again within about 2 probe intervals + request_timeout. An idle
//     watch costs one probe per interval and nothing else; with a lease, the keep-alives (one
//     per TTL / 3, on the endpoint that last answered: the watch's) are the probes, and it costs
//     nothing more.
//   - A watch the server cancels for its token makes the client authenticate again at the next
//     open (kv/etcd/client.hpp).
// Caveats:
//   - take() may block on its own network work (each cut to the calling thread's
//     kv_call_deadline): a probe up to request_timeout, a reconnection
//     up to connect_timeout + request_timeout (after a compaction, plus a range that fails over
//     like list()). A watch cancelled for another reason (permission denied) makes take() throw;
//     the watch retries later.
//   - After a compaction past a disconnected watch's revision, the changes in between are not
//     replayed: take() reports a complete snapshot instead (what the keys hold now).
//   - The snapshot lists every key below the prefix: watch prefixes that stay small (the
//     handler's control keys: one round's, the rest are erased).
//   - Movable, not copyable; one thread at a time (the store may be used by others meanwhile).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>  // exception_ptr: a watch reports a stream failure after its events
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../detail/base64.hpp"
#include "../../detail/http/stream.hpp"  // http_open_stream: the watch's stream
#include "../../detail/json.hpp"
#include "../../error.hpp"
#include "../../kv.hpp"  // kv_changes, kv_event
#include "client.hpp"    // etcd_client: ranges, streams, probes, suspect marks
#include "gateway.hpp"   // etcd_int, etcd_take_lines, etcd_decoded_value, etcd_prefix_end

HOLDFAST_NAMESPACE_BEGIN

template <class Io, class Transport>
class basic_etcd_kv;  // kv/etcd/kv.hpp: the store whose watch(prefix) makes a watcher

namespace detail {

/// A long-lived etcd watch (see "Waiting on a store" in kv.hpp and this header), named
/// basic_etcd_kv<Io, Transport>::watcher and made by its watch(prefix): one streaming
/// POST /v3/watch on a connection of its own, read without blocking by take(), resumed from the
/// last revision seen when the stream is lost, and probed for health every probe_interval().
/// Movable, not copyable; one thread at a time (the store may be used by others meanwhile).
template <class Io, class Transport>
class etcd_watcher {
 public:
  using clock = std::chrono::steady_clock;

  etcd_watcher(etcd_watcher&&) = default;
  etcd_watcher& operator=(etcd_watcher&&) = default;
  etcd_watcher(const etcd_watcher&) = delete;
  etcd_watcher& operator=(const etcd_watcher&) = delete;
  ~etcd_watcher() = default;

  /// The watch stream's socket, to poll for POLLIN; -1 while disconnected (sleep until due()).
  int fd() const noexcept { return stream_.fd(); }
  /// True when take() has something without waiting: a snapshot, events already decoded,
  /// a complete message buffered, or bytes a TLS layer holds.
  bool buffered() const noexcept {
    return complete_ || !events_.empty() || pending_.find('\n') != std::string::npos ||
           stream_.pending();
  }
  /// When take() must be called even if fd() stays quiet: the next health probe while
  /// connected, the next reconnection attempt while not.
  clock::time_point due() const noexcept { return stream_.is_open() ? probe_at_ : retry_at_; }

  /// What changed since the last take(), in revision order, each event once: reads what the
  /// stream holds without waiting; when due, probes the endpoint or reconnects (each bounded by
  /// connect_timeout + request_timeout). Throws holdfast::error for what a retry will not cure
  /// (a malformed stream, a refused permission); the watch then stays usable and retries.
  kv_changes take() {
    if (stream_.is_open()) read_stream();
    if (stream_.is_open() && clock::now() >= probe_at_) probe();
    if (!stream_.is_open() && clock::now() >= retry_at_) {
      reconnect();
      // Compacted past our revision: range again and reopen at once (one round more).
      if (!stream_.is_open() && need_range_ && clock::now() >= retry_at_) reconnect();
    }
    kv_changes out;
    out.events = std::move(events_);
    events_.clear();
    out.complete = std::exchange(complete_, false);
    return out;
  }

  /// The last revision delivered whole (or that of the range that started or re-ranged the
  /// watch): a resume starts right after it.
  std::int64_t revision() const noexcept { return revision_; }
  /// The URL of the endpoint the stream is on; "" while disconnected.
  std::string endpoint() const {
    return stream_.is_open() ? client_->endpoint_url(endpoint_) : std::string();
  }
  /// How often a quiet stream is probed: max(1 s, request_timeout / 2, 1.5 x keep-alive period).
  std::chrono::milliseconds probe_interval() const noexcept { return interval_; }

 private:
  friend class basic_etcd_kv<Io, Transport>;  // watch(prefix) makes one
  using client_type = etcd_client<Io, Transport>;

  etcd_watcher(std::shared_ptr<client_type> client, std::string root, std::string start,
               std::string prefix)
      : client_(std::move(client)),
        root_(std::move(root)),
        start_(std::move(start)),
        prefix_(std::move(prefix)),
        interval_(std::max({std::chrono::milliseconds(std::chrono::seconds(1)),
                            client_->options().request_timeout / 2,
                            client_->keepalive_period() * 3 / 2})) {
    range();
    reconnect();  // a transient failure leaves it disconnected, retried by take()
  }

  // Learns the revision to watch from, and what the prefix holds at it: the snapshot the next
  // take() reports (complete) before the events that follow.
  void range() {
    const std::string body = "{\"key\":" + json_quote(base64_encode(start_)) + ",\"range_end\":" +
                             json_quote(base64_encode(etcd_prefix_end(start_))) + "}";
    auto r = client_->call(etcd_request::read, "/v3/kv/range", body, "etcd watch", prefix_);
    const json_value* header = r.find("header");
    revision_ = etcd_int(header ? header->find("revision") : nullptr);
    events_.clear();
    if (const auto* kvs = r.find("kvs"))
      for (const auto& kv : kvs->as_array()) {
        const std::string full =
            base64_decode(etcd_string_field(kv, "key", prefix_), "etcd watch range");
        if (full.compare(0, start_.size(), start_) == 0)
          events_.push_back(kv_event{full.substr(root_.size()), etcd_decoded_value(kv, prefix_)});
      }
    complete_ = true;
  }

  std::string create_body() const {
    return "{\"create_request\":{\"key\":" + json_quote(base64_encode(start_)) +
           ",\"range_end\":" + json_quote(base64_encode(etcd_prefix_end(start_))) +
           ",\"start_revision\":\"" + std::to_string(revision_ + 1) + "\"}}";
  }

  // One attempt on the preferred endpoint (after re-ranging when compacted); on failure the
  // watch stays disconnected until retry_at_.
  void reconnect() {
    stream_.close();
    try {
      if (need_range_) {
        range();
        need_range_ = false;
      }
      const std::size_t k = client_->preferred_endpoint();
      bool go = true;
      auto s =
          client_->open_stream_at(k, "/v3/watch", create_body(), "etcd watch", prefix_, pending_,
                                  [&](const json_value& msg) { return go = on_message(msg); });
      if (!go) {  // cancelled at once: compacted (range again now) or another reason (back off)
        pending_.clear();
        retry_at_ = need_range_ ? clock::now() : clock::now() + backoff(++failures_);
        return;
      }
      failures_ = 0;
      stream_ = std::move(s);
      endpoint_ = k;
      probe_at_ = clock::now() + interval_;
      read_lines();  // what arrived with the first message
    } catch (const error& e) {
      stream_.close();
      pending_.clear();
      retry_at_ = clock::now() + backoff(++failures_);
      if (!client_type::transient(e)) throw;
    }
  }

  // No delay while other endpoints are untried, then 50 ms doubling up to the probe interval.
  std::chrono::milliseconds backoff(unsigned failures) const {
    const std::size_t n = client_->endpoint_count();
    if (failures < n) return std::chrono::milliseconds(0);
    const auto doublings = std::min<std::size_t>(failures - n, 10);
    return std::min<std::chrono::milliseconds>(interval_,
                                               std::chrono::milliseconds(50) * (1 << doublings));
  }

  // Reads what the stream holds (no wait) and turns its messages into events.
  void read_stream() {
    using status = typename http_open_stream<Io, Transport>::status;
    const std::string url = stream_.where();
    bool got = false;
    status st = status::open;
    std::exception_ptr failure;
    try {
      st = stream_.read(
          [&](std::string_view b) {
            got = true;
            client_->append_message(pending_, b, url, "etcd watch", prefix_);
          },
          clock::time_point());
    } catch (const error& e) {
      if (!client_type::transient(e)) failure = std::current_exception();
      st = status::ended;
    }
    if (got) probe_at_ = clock::now() + interval_;  // any message proves the endpoint alive
    if (read_lines() && st == status::ended) lost();
    if (failure) std::rethrow_exception(failure);
  }

  // Handles the complete messages buffered; false when one ended the stream (now closed).
  bool read_lines() {
    const std::string url = client_->endpoint_url(endpoint_) + "/v3/watch";
    bool go = true;
    try {
      go = etcd_take_lines(pending_, [&](const std::string& line) {
        return on_message(client_type::stream_message(line, url, "etcd watch", prefix_));
      });
    } catch (const etcd_unauthenticated&) {
      client_->forget_token();  // the next open authenticates again
      go = false;
    } catch (const error& e) {
      lost();
      if (client_type::transient(e)) return false;  // etcd's "unavailable": resume elsewhere
      retry_at_ = clock::now() + backoff(++failures_);
      throw;
    }
    if (!go) {
      stream_.close();
      pending_.clear();
      retry_at_ = clock::now();
    }
    return go;
  }

  // The stream was lost: the endpoint is suspect; reconnect at once (resuming).
  void lost() {
    client_->suspect(endpoint_);
    stream_.close();
    pending_.clear();
    retry_at_ = clock::now();
  }

  // One watch message: events after revision_ become events_; false when the watch was
  // cancelled (need_range_ set when compacted). A cancel for another reason than compaction,
  // none or the token throws it.
  bool on_message(const json_value& msg) {
    const json_value* result = msg.find("result");
    if (!result) return true;
    if (const auto* c = result->find("canceled"); c && c->is_bool() && c->as_bool()) {
      const auto* why = result->find("cancel_reason");
      const std::string reason = why && why->is_string() ? why->as_string() : std::string();
      if (etcd_int(result->find("compact_revision")) != 0) {
        need_range_ = true;
        return false;
      }
      if (reason.empty()) return false;
      if (etcd_token_problem(0, reason)) {
        client_->forget_token();
        return false;
      }
      throw error(reason.find("permission denied") != std::string::npos ? EACCES : EIO,
                  "etcd watch", prefix_, "etcd cancelled the watch: " + http_body_excerpt(reason));
    }
    // Revisions, not events, are filtered: one revision holds every event of a txn, a
    // deleterange (erase_prefix) or a lease expiry, and etcd sends a revision whole in one
    // response, so what is at or below `delivered` came in an earlier message.
    const std::int64_t delivered = revision_;
    if (const auto* events = result->find("events"))
      for (const auto& ev : events->as_array()) {
        const auto* kv = ev.find("kv");
        if (!kv) continue;
        const std::int64_t rev = etcd_int(kv->find("mod_revision"));
        if (rev <= delivered) continue;  // delivered already (a resume overlaps): once only
        const std::string full =
            base64_decode(etcd_string_field(*kv, "key", prefix_), "etcd watch event");
        revision_ = std::max(revision_, rev);
        if (full.compare(0, start_.size(), start_) != 0) continue;
        const auto* type = ev.find("type");
        const bool erased = type && type->is_string() && type->as_string() == "DELETE";
        events_.push_back(kv_event{
            full.substr(root_.size()),
            erased ? std::nullopt : std::optional<std::string>(etcd_decoded_value(*kv, prefix_))});
      }
    return true;
  }

  // Sends the health probe on the stream's endpoint (see the header); a transient failure
  // (the endpoint is then suspect) moves the watch.
  void probe() {
    // Any answer from the endpoint since the last look (a lease keep-alive, another request of
    // this client) proves it alive: no probe of our own.
    const auto answered = client_->last_answer(endpoint_);
    if (answered + interval_ > clock::now()) {
      probe_at_ = answered + interval_;
      return;
    }
    const std::string body =
        "{\"key\":" + json_quote(base64_encode(start_)) + ",\"count_only\":true}";
    try {
      client_->call_at(endpoint_, "/v3/kv/range", body, "etcd watch probe", prefix_, true);
      probe_at_ = clock::now() + interval_;
    } catch (const error& e) {
      if (!client_type::transient(e)) {
        probe_at_ = clock::now() + interval_;
        throw;
      }
      stream_.close();  // call_at marked the endpoint suspect; resume on another one
      pending_.clear();
      retry_at_ = clock::now();
    }
  }

  std::shared_ptr<client_type> client_;
  std::string root_, start_, prefix_;
  std::chrono::milliseconds interval_;
  http_open_stream<Io, Transport> stream_;
  std::size_t endpoint_ = 0;
  std::string pending_;           // stream bytes not yet a complete message
  std::vector<kv_event> events_;  // decoded, not yet taken
  std::int64_t revision_ = 0;     // events are delivered up to here
  bool complete_ = false;         // events_ starts with a range's snapshot (first, compacted)
  bool need_range_ = false;       // compacted past revision_: range before reopening
  unsigned failures_ = 0;         // reconnection attempts failed in a row
  clock::time_point probe_at_{}, retry_at_{};
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
