// holdfast/holdfast.hpp — the umbrella header: every public component of holdfast.
//
// holdfast keeps a training job's progress and artifacts safe on machines that get preempted:
// atomic publishing, a pfio-compatible file cache, termination configs, step agreement through a
// coordination store, and an artifact store. Include this, or only the component you need.
#pragma once

#include "error.hpp"
#include "io.hpp"
#include "version.hpp"
