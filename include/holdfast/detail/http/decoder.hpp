// holdfast/detail/http/decoder.hpp — the response decoder: parsing a status line and header
// fields, choosing the body framing (RFC 9112 §6.3), and de-framing the body incrementally.
//
// Guarantees:
//   - Bodies framed by Content-Length, by chunked transfer coding (extensions and trailers are
//     accepted and ignored) or by the connection closing; no body for HEAD, 1xx, 204 and 304.
//   - http_body_decoder::feed() takes bytes in any pieces (one byte at a time included) and
//     passes the decoded body to its sink as it goes; it reports how many bytes follow the end
//     of the body, so a caller can tell whether a connection may serve again.
//   - A malformed status line, header line, Content-Length, chunk size or chunk end, a chunk
//     size that overflows 64 bits, or a Transfer-Encoding other than chunked throws
//     holdfast::error(EPROTO, "http", where) with the start of the offending line (escaped in
//     what()).
// Caveats:
//   - No I/O and no limits on the total size here: the exchange (exchange.hpp) caps the head
//     and a collected body.
//   - A chunk size or trailer line longer than 4096 bytes is refused (EPROTO).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "../../error.hpp"
#include "../ascii.hpp"  // hex_digit: chunk sizes
#include "message.hpp"   // http_response, http_iequal

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// Incremental decoder of a response body (Content-Length, chunked, or until close).
/// feed() passes decoded bytes to `sink(std::string_view) -> bool` (false: stop).
class http_body_decoder {
 public:
  enum class mode { none, length, chunked, until_close };
  enum class result { more, done, stopped };

  http_body_decoder() = default;
  http_body_decoder(mode m, std::uint64_t length, std::string where)
      : mode_(m), left_(length), where_(std::move(where)) {
    if (m == mode::none || (m == mode::length && length == 0)) done_ = true;
  }

  bool done() const noexcept { return done_; }
  /// True when the end of the connection ends the body properly.
  bool complete_at_eof() const noexcept { return done_ || mode_ == mode::until_close; }

  /// Decodes `in`; when `left` is given it receives how many bytes of `in` follow the end of
  /// the body (a connection with such bytes cannot be reused).
  template <class Sink>
  result feed(std::string_view in, Sink& sink, std::size_t* left = nullptr) {
    struct report {
      std::string_view& in;
      std::size_t* left;
      ~report() {
        if (left) *left = in.size();
      }
    } r{in, left};
    while (!done_ && !in.empty()) {
      if (mode_ == mode::length || mode_ == mode::until_close) {
        std::size_t take = in.size();
        if (mode_ == mode::length && left_ < take) take = static_cast<std::size_t>(left_);
        if (mode_ == mode::length) left_ -= take;
        if (mode_ == mode::length && left_ == 0) done_ = true;
        bool go = sink(in.substr(0, take));
        in.remove_prefix(take);
        if (!go) return done_ ? result::done : result::stopped;
        continue;
      }
      if (!feed_chunked(in, sink)) return done_ ? result::done : result::stopped;
    }
    return done_ ? result::done : result::more;
  }

 private:
  enum class chunk_state { size, data, data_end, trailer };

  [[noreturn]] void bad(const std::string& why) const { throw error(EPROTO, "http", where_, why); }

  // Collects one line (LF-terminated, CR stripped); returns true when complete.
  bool take_line(std::string_view& in) {
    std::size_t nl = in.find('\n');
    std::size_t take = nl == std::string_view::npos ? in.size() : nl + 1;
    line_.append(in.data(), take);
    in.remove_prefix(take);
    if (line_.size() > 4096) bad("chunk header line longer than 4096 bytes");
    if (nl == std::string_view::npos) return false;
    line_.pop_back();
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    return true;
  }

  void parse_size() {
    std::uint64_t size = 0;
    std::size_t i = 0;
    for (; i < line_.size(); ++i) {
      char c = line_[i];
      int digit = hex_digit(c);
      if (digit < 0) break;
      if (size > (UINT64_MAX >> 4)) bad("chunk size overflows");
      size = size * 16 + static_cast<std::uint64_t>(digit);
    }
    if (i == 0) bad("bad chunk size line '" + line_.substr(0, 40) + "'");
    while (i < line_.size() && (line_[i] == ' ' || line_[i] == '\t')) ++i;
    if (i < line_.size() && line_[i] != ';')
      bad("bad chunk size line '" + line_.substr(0, 40) + "'");
    left_ = size;
    state_ = size == 0 ? chunk_state::trailer : chunk_state::data;
  }

  // Returns false when the sink asked to stop.
  template <class Sink>
  bool feed_chunked(std::string_view& in, Sink& sink) {
    switch (state_) {
      case chunk_state::size:
        if (take_line(in)) {
          parse_size();
          line_.clear();
        }
        return true;
      case chunk_state::data: {
        std::size_t take = in.size();
        if (left_ < take) take = static_cast<std::size_t>(left_);
        left_ -= take;
        if (left_ == 0) state_ = chunk_state::data_end;
        bool go = sink(in.substr(0, take));
        in.remove_prefix(take);
        return go;
      }
      case chunk_state::data_end:
        if (take_line(in)) {
          if (!line_.empty()) bad("chunk data not followed by CRLF");
          state_ = chunk_state::size;
        }
        return true;
      case chunk_state::trailer:
        if (take_line(in)) {
          if (line_.empty()) done_ = true;
          line_.clear();
        }
        return true;
    }
    return true;
  }

  mode mode_ = mode::none;
  std::uint64_t left_ = 0;
  std::string where_;
  bool done_ = false;
  chunk_state state_ = chunk_state::size;
  std::string line_;
};

/// Parses a response head (status line and header fields, without the blank line).
inline void http_parse_head(std::string_view head, http_response& out, const std::string& where) {
  auto next_line = [&head]() {
    std::size_t nl = head.find('\n');
    std::string_view line = head.substr(0, nl);
    head.remove_prefix(nl == std::string_view::npos ? head.size() : nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return line;
  };
  std::string_view status = next_line();
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (status.size() < 12 || status.substr(0, 7) != "HTTP/1." || !digit(status[7]) ||
      status[8] != ' ' || !digit(status[9]) || !digit(status[10]) || !digit(status[11]) ||
      (status.size() > 12 && status[12] != ' '))
    throw error(EPROTO, "http", where,
                "bad status line '" + std::string(status.substr(0, 40)) + "'");
  out.status = (status[9] - '0') * 100 + (status[10] - '0') * 10 + (status[11] - '0');
  out.minor_version = status[7] - '0';
  out.headers.clear();
  while (!head.empty()) {
    std::string_view line = next_line();
    if (line.empty()) continue;
    std::size_t colon = line.find(':');
    if (colon == 0 || colon == std::string_view::npos || line.front() == ' ' ||
        line.front() == '\t')
      throw error(EPROTO, "http", where,
                  "bad header line '" + std::string(line.substr(0, 40)) + "'");
    std::string_view name = line.substr(0, colon);
    if (name.find_first_of(" \t") != std::string_view::npos)
      throw error(EPROTO, "http", where, "space in header name '" + std::string(name) + "'");
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    out.headers.emplace_back(std::string(name), std::string(value));
  }
}

/// Chooses the body framing for a parsed head (RFC 9112 §6.3).
inline http_body_decoder http_body_for(const http_response& head, const std::string& method,
                                       const std::string& where) {
  using mode = http_body_decoder::mode;
  if (method == "HEAD" || head.status == 204 || head.status == 304 || head.status / 100 == 1)
    return http_body_decoder(mode::none, 0, where);
  if (const std::string* te = head.header("Transfer-Encoding")) {
    std::string_view v(*te);
    std::size_t comma = v.rfind(',');
    std::string_view last = comma == std::string_view::npos ? v : v.substr(comma + 1);
    while (!last.empty() && last.front() == ' ') last.remove_prefix(1);
    if (!http_iequal(last, "chunked"))
      throw error(EPROTO, "http", where, "unsupported Transfer-Encoding '" + *te + "'");
    return http_body_decoder(mode::chunked, 0, where);
  }
  if (const std::string* cl = head.header("Content-Length")) {
    std::uint64_t n = 0;
    if (cl->empty()) throw error(EPROTO, "http", where, "empty Content-Length");
    for (char c : *cl) {
      if (c < '0' || c > '9' || n > (UINT64_MAX - 9) / 10)
        throw error(EPROTO, "http", where, "bad Content-Length '" + *cl + "'");
      n = n * 10 + static_cast<std::uint64_t>(c - '0');
    }
    return http_body_decoder(mode::length, n, where);
  }
  return http_body_decoder(mode::until_close, 0, where);
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
