// holdfast/handoff/json_codec.hpp — the command codec for a flat JSON object (`command.json`,
// `ready.json`).
//
// Guarantees:
//   - json_codec writes and reads a flat JSON object whose values are strings, integers
//     (int64, exact), booleans and doubles (always written with '.' or an exponent, so their
//     type survives), with RFC 8259 escapes.
//   - Malformed input (bad syntax, a nested or null value, a duplicate key) throws
//     holdfast::format_error naming the file and the byte offset. Reading never modifies
//     anything.
#pragma once

#include <string>
#include <string_view>

#include "../detail/json.hpp"  // parse_json, json_value: the object read and written
#include "../error.hpp"
#include "command.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// Codec: a flat JSON object (strings, integers, booleans, doubles), file `command.json`.
struct json_codec {
  /// The default file name in a cache root.
  static constexpr std::string_view file_name = "command.json";

  /// The JSON text of `c`, one member per line.
  static std::string encode(const command& c) {
    detail::json_value obj{detail::json_value::object_t{}};
    for (const auto& e : c.entries()) {
      switch (e.val.kind) {
        case command::type::string:
          obj.set(e.key, e.val.text);
          break;
        case command::type::integer:
          obj.set(e.key, e.val.integer);
          break;
        case command::type::boolean:
          obj.set(e.key, e.val.boolean);
          break;
        case command::type::real:
          obj.set(e.key, e.val.real);
          break;
      }
    }
    return detail::to_json(obj, 2);
  }

  /// Parses `text` read from `source`; throws format_error naming source and byte offset.
  static command decode(std::string_view text, const std::string& source) {
    detail::json_value doc = detail::parse_json(text, source);
    auto offset_of = [&](const std::string& key) -> std::size_t {
      auto at = text.find(detail::json_quote(key));
      return at == std::string_view::npos ? 0 : at;
    };
    if (!doc.is_object())
      throw format_error(source, std::string("offset 0: expected a JSON object, got ") +
                                     detail::json_value::kind_name(doc.type()));
    command c(source);
    c.where_kind_ = "offset";
    for (const auto& m : doc.as_object()) {
      std::size_t at = offset_of(m.first);
      try {
        command::validate_key(m.first);
      } catch (const error& e) {
        throw format_error(source, "offset " + std::to_string(at) + ": bad key " +
                                       detail::json_quote(m.first) + ": " + e.what());
      }
      command::value v;
      const auto& j = m.second;
      if (j.is_string()) {
        v.text = j.as_string();
      } else if (j.is_bool()) {
        v.kind = command::type::boolean;
        v.boolean = j.as_bool();
        v.text = v.boolean ? "true" : "false";
      } else if (j.is_integer()) {
        v.kind = command::type::integer;
        v.text = j.number_text();
        try {
          v.integer = j.as_int64();
        } catch (const error&) {
          throw format_error(source, "offset " + std::to_string(at) + ": key '" + m.first +
                                         "': integer outside int64: " + v.text);
        }
      } else if (j.is_number()) {
        v.kind = command::type::real;
        v.text = j.number_text();
        try {
          v.real = j.as_double();
        } catch (const error&) {
          throw format_error(source, "offset " + std::to_string(at) + ": key '" + m.first +
                                         "': number outside double range: " + v.text);
        }
      } else {
        throw format_error(source, "offset " + std::to_string(at) + ": key '" + m.first +
                                       "': value must be a string, integer, boolean or "
                                       "double, not " +
                                       detail::json_value::kind_name(j.type()));
      }
      c.add_parsed(m.first, std::move(v), at, "offset");
    }
    return c;
  }
};

HOLDFAST_NAMESPACE_END
