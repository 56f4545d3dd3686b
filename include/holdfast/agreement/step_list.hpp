// holdfast/agreement/step_list.hpp — the restore agreement's step lists: a checkpoint's
// identity (its step and the history it belongs to), the text form of the checkpoints a worker
// holds, and the newest checkpoint every worker holds with the same identity.
//
// Guarantees:
//   - parse_step_list accepts exactly what format_step_list writes: strictly ascending
//     non-negative decimals joined by ',' ("" for none), no trailing ','. The identity lists
//     (format_identity_list / parse_identity_list) are the same with an optional "@<history>"
//     after each step; a plain step list is an identity list whose histories are all unknown.
//   - parse_checkpoint_identity accepts exactly what format_checkpoint_identity writes;
//     read_checkpoint_identity throws format_error naming the file (or key) it came from.
//   - newest_common_identity picks a step only where every list holds it with the same known
//     history, or where every list holds it with an unknown one (checkpoints written before
//     histories were recorded): two checkpoints of one step from different histories (a save
//     that failed on some workers, then was redone from an older restore) never match.
//   - newest_common_step answers from ascending lists without copying them.
// Caveats:
//   - format_step_list writes at most the newest `max_steps` (1000 by default): older steps are
//     not proposed for a restore.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>  // std::invalid_argument: an identity the text form cannot spell
#include <string>
#include <string_view>
#include <vector>

#include "../error.hpp"  // format_error: a bad identity names where it was read
#include "../version.hpp"
#include "value.hpp"  // detail::parse_agreement_int: the grammar's one integer reader

HOLDFAST_NAMESPACE_BEGIN

/// The text of a restore agreement's step list: the steps a worker holds, ascending, joined by
/// ',' ("" for none). At most the newest `max_steps` are written.
inline std::string format_step_list(const std::vector<std::int64_t>& steps,
                                    std::size_t max_steps = 1000) {
  std::string s;
  const std::size_t from = steps.size() > max_steps ? steps.size() - max_steps : 0;
  for (std::size_t i = from; i < steps.size(); ++i)
    s += (i > from ? "," : "") + std::to_string(steps[i]);
  return s;
}

/// Parses format_step_list's text (strictly ascending non-negative steps); std::nullopt when it
/// does not follow that form.
inline std::optional<std::vector<std::int64_t>> parse_step_list(std::string_view text) {
  std::vector<std::int64_t> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    auto s = detail::parse_agreement_int(text.substr(0, comma), INT64_MAX);
    if (!s || (!out.empty() && *s <= out.back())) return std::nullopt;
    out.push_back(*s);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
    if (text.empty()) return std::nullopt;  // a trailing ','
  }
  return out;
}

/// The newest step present in every list (each ascending), or std::nullopt when they share none.
inline std::optional<std::int64_t> newest_common_step(
    const std::vector<std::vector<std::int64_t>>& lists) {
  if (lists.empty()) return std::nullopt;
  const auto& first = lists.front();
  for (auto it = first.rbegin(); it != first.rend(); ++it) {
    bool everywhere = std::all_of(lists.begin() + 1, lists.end(), [&](const auto& l) {
      return std::binary_search(l.begin(), l.end(), *it);
    });
    if (everywhere) return *it;
  }
  return std::nullopt;
}

/// What a checkpoint is, beyond its step: the step and the history it was saved in. A history
/// is an id minted for each launch by the restore agreement (the recorded outcome's nonce) and
/// recorded in every checkpoint saved in that launch, so two checkpoints of one step match only
/// when they were trained from the same restored state. An empty history is unknown (a
/// checkpoint written before histories were recorded). Text form: "<step>" or
/// "<step>@<history>", history := 1 to 32 of [0-9A-Za-z_-].
struct checkpoint_identity {
  std::int64_t step = -1;  ///< the step
  std::string history;     ///< the history id; empty when unknown
  /// Whether the history is known.
  bool known() const noexcept { return !history.empty(); }
  /// Same step and history.
  friend bool operator==(const checkpoint_identity& a, const checkpoint_identity& b) {
    return a.step == b.step && a.history == b.history;
  }
  /// Not the same identity.
  friend bool operator!=(const checkpoint_identity& a, const checkpoint_identity& b) {
    return !(a == b);
  }
};

/// Whether `h` is a valid history id (1 to 32 of [0-9A-Za-z_-]; the empty "unknown" is not).
inline bool checkpoint_history_ok(std::string_view h) { return detail::agreement_nonce_ok(h); }

/// The text form of `id` ("57" or "57@9f3a0c1d"). Throws std::invalid_argument for a negative
/// step or a history that is not valid.
inline std::string format_checkpoint_identity(const checkpoint_identity& id) {
  if (id.step < 0) throw std::invalid_argument("checkpoint identity: negative step");
  if (id.known() && !checkpoint_history_ok(id.history))
    throw std::invalid_argument("checkpoint identity: bad history id");
  return std::to_string(id.step) + (id.known() ? "@" + id.history : std::string());
}

/// Parses format_checkpoint_identity's text; std::nullopt when it does not follow that form.
inline std::optional<checkpoint_identity> parse_checkpoint_identity(std::string_view text) {
  const auto at = text.find('@');
  auto step = detail::parse_agreement_int(text.substr(0, at), INT64_MAX);
  if (!step) return std::nullopt;
  checkpoint_identity id{*step, {}};
  if (at != std::string_view::npos) {
    if (!checkpoint_history_ok(text.substr(at + 1))) return std::nullopt;
    id.history = std::string(text.substr(at + 1));
  }
  return id;
}

/// As parse_checkpoint_identity, throwing format_error naming `where` (the file or key the text
/// came from) when `text` is not an identity.
inline checkpoint_identity read_checkpoint_identity(std::string_view text,
                                                    const std::string& where) {
  auto id = parse_checkpoint_identity(text);
  if (!id) throw format_error(where, "not a checkpoint identity: '" + std::string(text) + "'");
  return *id;
}

/// The text of a restore agreement's identity list: the checkpoints a worker holds, ascending
/// by step (one per step), each as format_checkpoint_identity writes it, joined by ','. At most
/// the newest `max_steps` are written.
inline std::string format_identity_list(const std::vector<checkpoint_identity>& ids,
                                        std::size_t max_steps = 1000) {
  std::string s;
  const std::size_t from = ids.size() > max_steps ? ids.size() - max_steps : 0;
  for (std::size_t i = from; i < ids.size(); ++i)
    s += (i > from ? "," : "") + format_checkpoint_identity(ids[i]);
  return s;
}

/// Parses format_identity_list's text (strictly ascending steps); std::nullopt when it does not
/// follow that form. A plain step list parses as identities with unknown histories.
inline std::optional<std::vector<checkpoint_identity>> parse_identity_list(std::string_view text) {
  std::vector<checkpoint_identity> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    auto id = parse_checkpoint_identity(text.substr(0, comma));
    if (!id || (!out.empty() && id->step <= out.back().step)) return std::nullopt;
    out.push_back(std::move(*id));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
    if (text.empty()) return std::nullopt;  // a trailing ','
  }
  return out;
}

/// The newest checkpoint every list (each ascending by step) holds with the same identity: the
/// same known history in every list, or an unknown history in every list (then matched by step
/// alone). std::nullopt when they share none.
inline std::optional<checkpoint_identity> newest_common_identity(
    const std::vector<std::vector<checkpoint_identity>>& lists) {
  if (lists.empty()) return std::nullopt;
  const auto by_step = [](const checkpoint_identity& a, std::int64_t s) { return a.step < s; };
  const auto& first = lists.front();
  for (auto it = first.rbegin(); it != first.rend(); ++it) {
    bool everywhere = std::all_of(lists.begin() + 1, lists.end(), [&](const auto& l) {
      auto f = std::lower_bound(l.begin(), l.end(), it->step, by_step);
      return f != l.end() && f->step == it->step && f->history == it->history;
    });
    if (everywhere) return *it;
  }
  return std::nullopt;
}

HOLDFAST_NAMESPACE_END
