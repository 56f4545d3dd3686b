// holdfast/holdfast.hpp — the umbrella header: every public component of holdfast.
//
// holdfast keeps a training job's progress and artifacts safe on machines that get preempted:

// atomic publishing, a pfio-compatible file cache, termination configs, step agreement through a
// coordination store, and an artifact store. Include this, or only the component you need.
#pragma once

// foundation
#include "error.hpp"
#include "io.hpp"
#include "version.hpp"

// atomic publishing, waiting, handoff between jobs
#include "handoff.hpp"
#include "publish.hpp"
#include "wait.hpp"

// the file cache
#include "cache.hpp"

// termination configs
#include "termination.hpp"

// coordination stores and step agreement
#include "agreement.hpp"
#include "handler.hpp"
#include "kv.hpp"
#include "kv/any.hpp"
#include "kv/etcd.hpp"
#include "kv/filesystem.hpp"
#include "kv/in_process.hpp"
#include "kv/incarnation.hpp"
#include "kv/url.hpp"

// artifact store
#include "checkpoint.hpp"
#include "store.hpp"
