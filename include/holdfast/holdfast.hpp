// holdfast/holdfast.hpp — the umbrella header: every public component of holdfast.
//
// holdfast keeps a training job's progress and artifacts safe on machines that get preempted:
// atomic publishing, a pfio-compatible file cache, termination configs, step agreement through a
// coordination store, and an artifact store. Include this, or only the component you need.
#pragma once

// foundation
#include "version.hpp"
#include "error.hpp"
#include "io.hpp"
// atomic publishing, waiting, handoff between jobs
#include "publish.hpp"
#include "wait.hpp"
#include "handoff.hpp"
// the file cache
#include "cache.hpp"
// termination configs
#include "termination.hpp"
// coordination stores and step agreement
#include "kv.hpp"
#include "kv/in_process.hpp"
#include "kv/filesystem.hpp"
#include "kv/etcd.hpp"
#include "agreement.hpp"
#include "handler.hpp"
// artifact store
#include "store.hpp"
#include "checkpoint.hpp"
