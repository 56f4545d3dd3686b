// holdfast/agreement/value.hpp — the one grammar of what the step agreement writes to its control
// keys (agreement_value: a claim, a recorded step, a timeout, an abort, or "none", each naming
// its writer; and the periodic-save decision and reports, "save" and "saved"), with its parser and
// its formatter.
//
// Guarantees:
//   - parse_agreement_value accepts exactly the grammar below (no sign, no leading zero, no
//     spaces but the ones it spells, ascending timeout lists), never throws and never reads past
//     its text; format_agreement_value writes only text the parser accepts, and throws
//     std::invalid_argument for a value the grammar cannot spell.
// Caveats:
//   - A value names its writer (task and nonce) but is not authenticated: any process that can
//     write the store can write any value.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// What a control key of the agreement holds: a claim, or a round's recorded outcome (an agreed
/// step, a timeout naming the missing tasks, an abort after a step error, or "none" for a restore
/// agreement that found no common step), and who wrote it. Text form (one grammar, parsed by
/// parse_agreement_value and written by format_agreement_value):
///   value  := body " by " task "/" nonce
///   body   := "claim" | "step " int | "timeout " int ("," int)* | "abort" | "none"
///           | "hang " int " " phase " " (int | "-") " " int " " int
///           | "save " int | "saved " int " " (int | "-")
///   phase  := "step" | "save" | "restore" | "frozen" | "start"
///   int    := "0" | [1-9][0-9]*   (a non-negative int64; task ids fit an int)
///   nonce  := 1 to 32 of [0-9A-Za-z_-]   (the writing handler's instance: a restarted process
///                                         with the same task writes another nonce)
/// e.g. "step 57 by 2/9f3a0c1d", "timeout 1,3 by 0/77e2b4aa". Timeout task lists are ascending
/// with no duplicates. A hang verdict (handler/hang.hpp) names the hung task, the phase it hung
/// in, the step it was at ("-": unknown, a frozen worker), how long it had been in that phase and
/// the bound it passed, in milliseconds: "hang 2 step 57 12034 10000 by 0/77e2b4aa". A periodic
/// save (handler/preemption_handler.hpp) is decided by task 0 as "save <step>" (ctl/save/<k>:
/// every task saves at that step), and each task reports it as "saved <step> <microseconds the
/// save blocked>", or "saved <step> -" when it learned the decision past the step and skipped it.
struct agreement_value {
  /// What the value says.
  enum class kind : unsigned char { claim, step, timeout, abort, none, hang, save, saved };
  kind what = kind::step;  ///< the body
  std::int64_t step = -1;  ///< step, save, saved: the step; hang: the step, -1 unknown
  std::vector<int> tasks;  ///< timeout: the tasks that did not answer, ascending; hang: the task
  int writer = -1;         ///< the task that wrote it
  std::string nonce;       ///< the writing handler instance
  std::string phase;       ///< hang: step, save, restore, frozen or start
  std::int64_t elapsed_ms = 0;  ///< hang: how long the task had been in the phase
  std::int64_t bound_ms = 0;    ///< hang: the bound it passed
  std::int64_t cost_us = -1;    ///< saved: how long the save blocked; -1: skipped

  /// Same body and writer.
  friend bool operator==(const agreement_value& a, const agreement_value& b) {
    return a.what == b.what && a.step == b.step && a.tasks == b.tasks && a.phase == b.phase &&
           a.elapsed_ms == b.elapsed_ms && a.bound_ms == b.bound_ms && a.cost_us == b.cost_us &&
           a.writer == b.writer && a.nonce == b.nonce;
  }
  /// Not the same value.
  friend bool operator!=(const agreement_value& a, const agreement_value& b) { return !(a == b); }
};

namespace detail {
/// A non-negative decimal with no sign, no leading zero (but "0") and at most `max`.
inline std::optional<std::int64_t> parse_agreement_int(std::string_view s, std::int64_t max) {
  if (s.empty() || s.size() > 19 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const int d = c - '0';
    if (v > (max - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}
inline bool agreement_hang_phase_ok(std::string_view p) {
  return p == "step" || p == "save" || p == "restore" || p == "frozen" || p == "start";
}
inline bool agreement_nonce_ok(std::string_view n) {
  if (n.empty() || n.size() > 32) return false;
  for (char c : n)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
          c == '-'))
      return false;
  return true;
}
}  // namespace detail

/// The text form of `v` (see agreement_value). Throws std::invalid_argument for a value the
/// grammar cannot spell (a negative step or task, an empty timeout list, a bad nonce).
inline std::string format_agreement_value(const agreement_value& v) {
  if (v.writer < 0 || !detail::agreement_nonce_ok(v.nonce))
    throw std::invalid_argument("agreement value: bad writer " + std::to_string(v.writer) + "/" +
                                v.nonce);
  std::string body;
  switch (v.what) {
    case agreement_value::kind::claim:
      body = "claim";
      break;
    case agreement_value::kind::step:
      if (v.step < 0) throw std::invalid_argument("agreement value: negative step");
      body = "step " + std::to_string(v.step);
      break;
    case agreement_value::kind::timeout:
      if (v.tasks.empty()) throw std::invalid_argument("agreement value: empty timeout list");
      body = "timeout ";
      for (std::size_t i = 0; i < v.tasks.size(); ++i) {
        if (v.tasks[i] < 0 || (i > 0 && v.tasks[i] <= v.tasks[i - 1]))
          throw std::invalid_argument("agreement value: timeout tasks not ascending");
        body += (i ? "," : "") + std::to_string(v.tasks[i]);
      }
      break;
    case agreement_value::kind::abort:
      body = "abort";
      break;
    case agreement_value::kind::none:
      body = "none";
      break;
    case agreement_value::kind::hang:
      if (v.tasks.size() != 1 || v.tasks[0] < 0 || !detail::agreement_hang_phase_ok(v.phase) ||
          v.step < -1 || v.elapsed_ms < 0 || v.bound_ms < 0)
        throw std::invalid_argument("agreement value: bad hang verdict");
      body = "hang " + std::to_string(v.tasks[0]) + " " + v.phase + " " +
             (v.step < 0 ? std::string("-") : std::to_string(v.step)) + " " +
             std::to_string(v.elapsed_ms) + " " + std::to_string(v.bound_ms);
      break;
    case agreement_value::kind::save:
      if (v.step < 0) throw std::invalid_argument("agreement value: negative step");
      body = "save " + std::to_string(v.step);
      break;
    case agreement_value::kind::saved:
      if (v.step < 0 || v.cost_us < -1)
        throw std::invalid_argument("agreement value: bad save report");
      body = "saved " + std::to_string(v.step) + " " +
             (v.cost_us < 0 ? std::string("-") : std::to_string(v.cost_us));
      break;
  }
  return body + " by " + std::to_string(v.writer) + "/" + v.nonce;
}

/// Parses a control value (see agreement_value); std::nullopt when `text` does not follow the
/// grammar exactly. Never throws, never reads past `text`.
inline std::optional<agreement_value> parse_agreement_value(std::string_view text) noexcept {
  try {
    constexpr std::string_view by = " by ";
    const auto at = text.rfind(by);
    if (at == std::string_view::npos) return std::nullopt;
    std::string_view body = text.substr(0, at), who = text.substr(at + by.size());
    const auto slash = who.find('/');
    if (slash == std::string_view::npos) return std::nullopt;
    constexpr std::int64_t int_max = 0x7fffffff;
    auto writer = detail::parse_agreement_int(who.substr(0, slash), int_max);
    if (!writer || !detail::agreement_nonce_ok(who.substr(slash + 1))) return std::nullopt;
    agreement_value v;
    v.writer = static_cast<int>(*writer);
    v.nonce = std::string(who.substr(slash + 1));
    auto word = [&](std::string_view w) {
      if (body.substr(0, w.size()) != w) return false;
      body.remove_prefix(w.size());
      return true;
    };
    if (body == "claim") {
      v.what = agreement_value::kind::claim;
    } else if (body == "abort") {
      v.what = agreement_value::kind::abort;
    } else if (body == "none") {
      v.what = agreement_value::kind::none;
    } else if (word("saved ")) {
      const auto sp = body.find(' ');
      if (sp == std::string_view::npos) return std::nullopt;
      auto s = detail::parse_agreement_int(body.substr(0, sp), INT64_MAX);
      const std::string_view cost = body.substr(sp + 1);
      if (!s) return std::nullopt;
      v.what = agreement_value::kind::saved;
      v.step = *s;
      if (cost != "-") {
        auto c = detail::parse_agreement_int(cost, INT64_MAX);
        if (!c) return std::nullopt;
        v.cost_us = *c;
      }
    } else if (word("save ")) {
      auto s = detail::parse_agreement_int(body, INT64_MAX);
      if (!s) return std::nullopt;
      v.what = agreement_value::kind::save;
      v.step = *s;
    } else if (word("step ")) {
      auto s = detail::parse_agreement_int(body, INT64_MAX);
      if (!s) return std::nullopt;
      v.what = agreement_value::kind::step;
      v.step = *s;
    } else if (word("timeout ")) {
      v.what = agreement_value::kind::timeout;
      for (;;) {
        const auto comma = body.find(',');
        auto t = detail::parse_agreement_int(body.substr(0, comma), int_max);
        if (!t || (!v.tasks.empty() && *t <= v.tasks.back())) return std::nullopt;
        v.tasks.push_back(static_cast<int>(*t));
        if (comma == std::string_view::npos) break;
        body.remove_prefix(comma + 1);
      }
    } else if (word("hang ")) {
      v.what = agreement_value::kind::hang;
      auto field = [&]() {  // the next space-separated field (the last one: the rest)
        const auto sp = body.find(' ');
        std::string_view f = body.substr(0, sp);
        body = sp == std::string_view::npos ? std::string_view() : body.substr(sp + 1);
        return f;
      };
      auto task = detail::parse_agreement_int(field(), int_max);
      const std::string_view phase = field(), step = field();
      auto elapsed = detail::parse_agreement_int(field(), INT64_MAX);
      const std::string_view last = body;
      auto bound = detail::parse_agreement_int(last, INT64_MAX);
      if (!task || !detail::agreement_hang_phase_ok(phase) || !elapsed || !bound)
        return std::nullopt;
      if (step == "-") {
        v.step = -1;
      } else {
        auto s = detail::parse_agreement_int(step, INT64_MAX);
        if (!s) return std::nullopt;
        v.step = *s;
      }
      v.tasks.push_back(static_cast<int>(*task));
      v.phase = std::string(phase);
      v.elapsed_ms = *elapsed;
      v.bound_ms = *bound;
    } else {
      return std::nullopt;
    }
    return v;
  } catch (...) {  // std::bad_alloc: not a value we can hold
    return std::nullopt;
  }
}

HOLDFAST_NAMESPACE_END
