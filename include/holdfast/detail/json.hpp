// holdfast/detail/json.hpp — a small strict JSON (RFC 8259) value, parser and writer.
//
// Used for command files (handoff.hpp), ready markers, and the etcd JSON gateway (kv/etcd.hpp).
// The parts: detail/json/value.hpp (the value and its writer), detail/json/parse.hpp (the
// parser); each states its guarantees.
#pragma once

#include "json/parse.hpp"
#include "json/value.hpp"
