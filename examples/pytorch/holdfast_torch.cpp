// holdfast_torch — holdfast's preemption handler, checkpoint manager and multiprocess file cache
// for PyTorch training scripts (a torch C++ extension; examples/pytorch/holdfast_torch.py builds
// and loads it with torch.utils.cpp_extension.load and adds the Python-side defaults).
//
//   Handler            preemption_handler<Config, any_kv, py_checkpointer>: one Config per
//                      notice source (SIGTERM; SIGUSR1+SIGTERM; GCE; AWS), whose Exit policy
//                      throws instead of exiting, so Python sees holdfast.Preempted (a
//                      SystemExit carrying the preset's exit code) and runs its finally blocks.
//   torch_kv           a holdfast coordination store over c10d::Store (the job's own TCPStore
//                      or PrefixStore); file:// and etcd:// URLs go through holdfast::make_kv.
//   CheckpointManager  holdfast::checkpoint_manager with Python save/restore callables, and the
//                      members the handler's restore agreement uses (all_steps, restore_step,
//                      pin, wait_until_finished).
//   Cache              holdfast::multiprocess_file_cache: get(i) -> bytes | None, put(i, bytes).
//
// The GIL: released while holdfast blocks or does I/O (the agreement, store calls, a save's
// fsyncs, a cache put, the restore agreement at construction), taken back for every Python
// callback (the step function, the save and restore callables). The handler's watcher thread
// never touches Python.
#include <Python.h>
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <holdfast/holdfast.hpp>

namespace py = pybind11;
using namespace std::chrono_literals;

namespace holdfast_torch {

// ---------------------------------------------------------------------------------------------
// torch_kv: the coordination store the handler needs (insert, put, try_get, get; erase) on a
// c10d::Store.

/// A holdfast coordination store over a c10d store, keys under "holdfast-kv/<run>/<restart>/".
///
/// - insert: compareSet(key, "", value); created iff the answer is our value (holdfast's values
///   name their writer, so an equal value is ours).
/// - get(key, timeout) polls check() every poll interval until the key exists or the timeout
///   passes. It does NOT use c10d's wait(keys, timeout): on torch 1.13's TCPStore a wait that
///   times out can leave the server's late reply on the socket, where the next request reads it
///   as its own answer.
/// - Failures of the store (c10::Error, socket errors) become holdfast::error(ECONNRESET), which
///   the handler retries as transient until the round's deadline.
class torch_kv {
 public:
  torch_kv(c10::intrusive_ptr<c10d::Store> store, const holdfast::kv_namespace& ns,
           std::chrono::milliseconds poll = 10ms)
      : store_(std::move(store)),
        prefix_("holdfast-kv/" + ns.path() + "/"),
        poll_(std::max(poll, std::chrono::milliseconds(1))) {
    if (!store_) throw holdfast::error(EINVAL, "torch store", "", "no store");
  }

  /// Insert-once: true when this call created the key.
  bool insert(const std::string& key, std::string_view value) {
    const std::string k = full(key, "torch store insert");
    const std::vector<std::uint8_t> v = to_bytes(value);
    return guarded("compareSet", key, [&] { return store_->compareSet(k, {}, v); }) == v;
  }
  /// Sets the key.
  void put(const std::string& key, std::string_view value) {
    const std::string k = full(key, "torch store put");
    const std::vector<std::uint8_t> v = to_bytes(value);
    guarded("set", key, [&] {
      store_->set(k, v);
      return 0;
    });
  }
  /// The value, or nothing when the key does not exist (check, then get).
  std::optional<std::string> try_get(const std::string& key) {
    return lookup(full(key, "torch store try_get"), key);
  }
  /// Waits up to `timeout` for the key (polling check()); nothing when it never appeared.
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) {
    const std::string k = full(key, "torch store get");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto v = lookup(k, key)) return v;
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero()) return std::nullopt;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(poll_, left));
    }
  }
  /// Deletes the key; true when it existed.
  bool erase(const std::string& key) {
    const std::string k = full(key, "torch store erase");
    return guarded("deleteKey", key, [&] { return store_->deleteKey(k); });
  }

 private:
  std::string full(const std::string& key, const char* op) const {
    holdfast::validate_key(key, op);
    return prefix_ + key;
  }
  std::optional<std::string> lookup(const std::string& k, const std::string& key) {
    if (!guarded("check", key, [&] { return store_->check({k}); })) return std::nullopt;
    auto v = guarded("get", key, [&] { return store_->get(k); });
    return std::string(v.begin(), v.end());
  }
  static std::vector<std::uint8_t> to_bytes(std::string_view s) {
    return std::vector<std::uint8_t>(s.begin(), s.end());
  }
  template <class F>
  static auto guarded(const char* op, const std::string& key, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const holdfast::error&) {
      throw;
    } catch (const c10::Error& e) {
      throw holdfast::error(ECONNRESET, std::string("torch store ") + op, key,
                            e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw holdfast::error(ECONNRESET, std::string("torch store ") + op, key, e.what());
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  std::chrono::milliseconds poll_;
};

// ---------------------------------------------------------------------------------------------
// Exit: a C++ exception that the translator turns into holdfast.Preempted(code).

/// Thrown by the Exit policy after the agreed save; becomes Python's holdfast.Preempted.
struct preempted_exit {
  int code;
};

/// The Exit policy of every Python handler: throws preempted_exit with the preset's code.
struct throw_preempted {
  int exit_status = 42;
  /// The handler must not re-arm after it: the exception ends the training loop.
  static constexpr bool returns = false;
  [[noreturn]] void operator()(const holdfast::exit_context& = {}) const {
    throw preempted_exit{exit_status};
  }
};

/// A preset's notices, grace and save override, with the throwing Exit.
template <class Preset>
auto python_config(Preset preset) {
  return holdfast::with_exit(std::move(preset), throw_preempted{holdfast::exit_code_v<Preset>});
}

// ---------------------------------------------------------------------------------------------
// The Checkpointer: a checkpoint_manager whose writer and reader are Python callables.

/// State shared by the Python CheckpointManager object and every handler holding it.
struct checkpoint_state {
  py::object save_fn;     // save(directory, step): fills the checkpoint directory
  py::object restore_fn;  // restore(directory, step): loads it
  // Destroyed first (members are destroyed in reverse order): its callbacks use the above.
  holdfast::checkpoint_manager<> manager;

  checkpoint_state(py::object save, py::object restore, holdfast::checkpoint_manager<> m)
      : save_fn(std::move(save)), restore_fn(std::move(restore)), manager(std::move(m)) {
    manager.set_writer([this](const std::string& d, std::int64_t step) {
      py::gil_scoped_acquire gil;
      save_fn(d, step);
    });
    manager.set_reader([this](const std::string& d, std::int64_t step) {
      py::gil_scoped_acquire gil;
      restore_fn(d, step);
    });
  }
};

/// The handler's Checkpointer: a handle on checkpoint_state (copies share it). Called without
/// the GIL; the callbacks take it.
class py_checkpointer {
 public:
  explicit py_checkpointer(std::shared_ptr<checkpoint_state> s) : s_(std::move(s)) {}
  holdfast::checkpoint_info save(std::int64_t step) { return s_->manager.save(step); }
  std::optional<std::int64_t> restore() { return s_->manager.restore(); }
  std::vector<std::int64_t> all_steps() const { return s_->manager.all_steps(); }
  void restore_step(std::int64_t step) { s_->manager.restore_step(step); }
  void pin(std::optional<std::int64_t> step) noexcept { s_->manager.pin(step); }
  void wait_until_finished() { s_->manager.wait_until_finished(); }
  checkpoint_state& state() const noexcept { return *s_; }

 private:
  std::shared_ptr<checkpoint_state> s_;
};

// A deleter that takes the GIL: the state holds Python objects, and the last reference may be
// dropped by a handler destroyed without the GIL.
inline std::shared_ptr<checkpoint_state> make_checkpoint_state(
    py::object save, py::object restore, holdfast::checkpoint_manager<> manager) {
  return std::shared_ptr<checkpoint_state>(
      new checkpoint_state(std::move(save), std::move(restore), std::move(manager)),
      [](checkpoint_state* p) {
        py::gil_scoped_acquire gil;
        delete p;
      });
}

/// The Python CheckpointManager.
class py_checkpoint_manager {
 public:
  py_checkpoint_manager(const std::string& directory, py::object save, py::object restore,
                        std::size_t max_to_keep, bool async_save) {
    holdfast::checkpoint_options o;
    o.max_to_keep = max_to_keep;
    o.async_save = async_save;
    std::optional<holdfast::checkpoint_manager<>> m;
    {
      py::gil_scoped_release nogil;  // the writer lock may be held by a dying predecessor
      m.emplace(directory, holdfast::directory_commit::rename, std::move(o));
    }
    s_ = make_checkpoint_state(std::move(save), std::move(restore), std::move(*m));
  }
  py_checkpointer checkpointer() const { return py_checkpointer(s_); }
  holdfast::checkpoint_manager<>& manager() const { return s_->manager; }
  std::shared_ptr<checkpoint_state> shared() const { return s_; }

 private:
  std::shared_ptr<checkpoint_state> s_;
};

// ---------------------------------------------------------------------------------------------
// The handler.

/// A step callable without allocation: the handler invokes it in place.
struct step_ref {
  void* ctx;
  void (*fn)(void*);
  void operator()() const { fn(ctx); }
};

/// A step's Python exception, as a C++ exception the handler can publish to its peers (type
/// name holdfast_torch::python_step_error, message "PythonType: str(exception)").
struct python_step_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What the Python binding needs of a handler, whatever its Config.
class handler_iface {
 public:
  virtual ~handler_iface() = default;
  virtual holdfast::run_status run(step_ref step) = 0;
  virtual holdfast::run_status save_checkpoint_if_preempted() = 0;
  virtual std::int64_t total_run_calls() const noexcept = 0;
  virtual std::optional<std::int64_t> restored_step() const noexcept = 0;
  virtual holdfast::agreement_state state() const = 0;
  virtual double mean_step_time() const noexcept = 0;
  virtual double grace_period() const noexcept = 0;
  virtual int exit_code() const noexcept = 0;
  virtual const std::string& key_scope() const noexcept = 0;
  virtual const holdfast::cluster_info& cluster() const noexcept = 0;
  virtual void shutdown() noexcept = 0;
  virtual holdfast::any_kv& kv() noexcept = 0;
};

template <class Config>
class handler_impl final : public handler_iface {
 public:
  handler_impl(Config config, holdfast::any_kv kv, holdfast::cluster_info cluster,
               py_checkpointer ckpt, holdfast::handler_options o)
      : exit_code_(config.exit_policy().exit_status),
        grace_(std::chrono::duration<double>(config.grace_period()).count()),
        kv_(kv),
        h_(std::move(config), std::move(kv), std::move(cluster), std::move(ckpt), o) {}
  holdfast::run_status run(step_ref step) override { return h_.run(step); }
  holdfast::run_status save_checkpoint_if_preempted() override {
    return h_.save_checkpoint_if_preempted();
  }
  std::int64_t total_run_calls() const noexcept override { return h_.total_run_calls(); }
  std::optional<std::int64_t> restored_step() const noexcept override { return h_.restored_step(); }
  holdfast::agreement_state state() const override { return h_.state(); }
  double mean_step_time() const noexcept override {
    return std::chrono::duration<double>(h_.mean_step_time()).count();
  }
  double grace_period() const noexcept override { return grace_; }
  int exit_code() const noexcept override { return exit_code_; }
  const std::string& key_scope() const noexcept override { return h_.key_scope(); }
  const holdfast::cluster_info& cluster() const noexcept override { return h_.cluster(); }
  void shutdown() noexcept override { h_.shutdown(); }
  holdfast::any_kv& kv() noexcept override { return kv_; }

 private:
  using handler_type = holdfast::preemption_handler<Config, holdfast::any_kv, py_checkpointer>;
  int exit_code_;
  double grace_;         // seconds
  holdfast::any_kv kv_;  // a copy sharing the handler's store: round_summary reads it
  handler_type h_;
};

/// How often a notice file is looked for (one stat each).
constexpr std::chrono::milliseconds notice_file_interval{250};

template <class Config>
std::unique_ptr<handler_iface> make_handler(Config config, std::optional<double> grace,
                                            const std::string& notice_file, holdfast::any_kv kv,
                                            holdfast::cluster_info cluster, py_checkpointer ckpt,
                                            holdfast::handler_options o) {
  if (grace)
    config.set_grace_period(std::chrono::milliseconds(static_cast<std::int64_t>(*grace * 1000)));
  if (!notice_file.empty()) {  // the preset's notices, or the file appearing (a Slurm trap)
    using notice = holdfast::any_of<typename Config::notice_type, holdfast::file_notice>;
    using with_file = holdfast::termination_config<notice, typename Config::exit_type>;
    with_file c(notice(std::move(config.notice()),
                       holdfast::file_notice(notice_file, notice_file_interval)),
                config.exit_policy(), config.grace_period());
    return std::make_unique<handler_impl<with_file>>(std::move(c), std::move(kv),
                                                     std::move(cluster), std::move(ckpt), o);
  }
  return std::make_unique<handler_impl<Config>>(std::move(config), std::move(kv),
                                                std::move(cluster), std::move(ckpt), o);
}

inline std::unique_ptr<handler_iface> make_handler(
    const std::string& preset, std::optional<double> grace, const std::string& notice_file,
    holdfast::any_kv kv, holdfast::cluster_info cluster, py_checkpointer ckpt,
    holdfast::handler_options o) {
  namespace p = holdfast::presets;
  auto build = [&](auto config) {
    return make_handler(std::move(config), grace, notice_file, kv, cluster, ckpt, o);
  };
  std::string name = preset;
  if (name == "detect") name = holdfast::to_string(holdfast::detect_platform());
  if (name == "generic") return build(python_config(p::generic()));
  if (name == "k8s" || name == "kubernetes") return build(python_config(p::kubernetes()));
  if (name == "slurm") return build(python_config(p::slurm()));
  if (name == "gce") return build(python_config(p::gce_cpu()));
  if (name == "aws") return build(python_config(p::aws_spot()));
  throw std::invalid_argument("holdfast: unknown preset '" + preset +
                              "' (generic, k8s, kubernetes, slurm, gce, aws, detect)");
}

const char* state_name(holdfast::agreement_state s) {
  using st = holdfast::agreement_state;
  switch (s) {
    case st::idle:
      return "idle";
    case st::noticed:
      return "noticed";
    case st::claimed:
      return "claimed";
    case st::acked:
      return "acked";
    case st::step_published:
      return "step_published";
    case st::grace:
      return "grace";
    case st::final_noticed:
      return "final_noticed";
    case st::final_claimed:
      return "final_claimed";
    case st::final_acked:
      return "final_acked";
    case st::final_published:
      return "final_published";
    case st::exiting:
      return "exiting";
    case st::failed:
      return "failed";
    case st::stopped:
      return "stopped";
  }
  return "unknown";
}

const char* status_name(holdfast::run_status s) {
  switch (s) {
    case holdfast::run_status::ran:
      return "ran";
    case holdfast::run_status::saved:
      return "saved";
    case holdfast::run_status::stopped:
      return "stopped";
  }
  return "unknown";
}

/// The Python Handler (the Python subclass in holdfast_torch.py resolves the defaults).
class py_handler {
 public:
  py_handler(const std::string& preset, const std::string& store,
             std::optional<c10::intrusive_ptr<c10d::Store>> torch_store, int task, int num_tasks,
             const std::string& run_id, std::uint64_t restart,
             const py_checkpoint_manager& checkpoints, double ack_timeout,
             std::optional<double> grace, double grace_margin, double watch_interval,
             double store_poll, const std::string& notice_file) {
    auto ms = [](double s) {
      return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000));
    };
    const holdfast::kv_namespace ns(run_id, restart);
    std::optional<holdfast::any_kv> kv;
    if (store == "torch") {
      if (!torch_store || !*torch_store)
        throw std::invalid_argument("holdfast: store='torch' needs a torch_store");
      kv.emplace(torch_kv(std::move(*torch_store), ns, ms(store_poll)));
    }
    holdfast::handler_options o;
    o.ack_timeout = ms(ack_timeout);
    o.grace_margin = ms(grace_margin);
    o.watch_interval = ms(watch_interval);
    holdfast::cluster_info cluster{task, num_tasks, run_id};
    py_checkpointer ckpt = checkpoints.checkpointer();
    py::gil_scoped_release nogil;  // the restore agreement waits for every task
    if (!kv) kv.emplace(holdfast::make_kv(store, ns));
    h_ = make_handler(preset, grace, notice_file, std::move(*kv), std::move(cluster),
                      std::move(ckpt), o);
  }
  py_handler(const py_handler&) = delete;
  py_handler& operator=(const py_handler&) = delete;
  ~py_handler() { close(); }

  /// Stops the watcher and the notice (without the GIL), then frees the handler. Idempotent;
  /// total_run_calls, restored_step, exit_code and the rest stay readable.
  void close() {
    if (!h_) return;
    final_.total = h_->total_run_calls();
    final_.restored = h_->restored_step();
    final_.exit_code = h_->exit_code();
    final_.grace = h_->grace_period();
    final_.task = h_->cluster().task;
    final_.num_tasks = h_->cluster().num_tasks;
    final_.scope = h_->key_scope();
    py::gil_scoped_release nogil;
    h_->shutdown();
    h_.reset();
  }

  /// run(step_fn, *args, **kwargs): the handler's run() around a Python call; returns what
  /// step_fn returned. The GIL is released around the handler and taken for step_fn.
  py::object run(py::handle fn, py::args args, py::kwargs kwargs) {
    handler_iface& h = live();
    call_ctx c{fn.ptr(), args.ptr(), kwargs.size() ? kwargs.ptr() : nullptr};
    c.ts = PyEval_SaveThread();
    holdfast::run_status st;
    try {
      st = h.run(step_ref{&c, &call_ctx::invoke});
    } catch (...) {
      PyEval_RestoreThread(c.ts);
      if (c.error) throw *c.error;  // the step's own Python exception, unchanged
      throw;                        // translated: Preempted, AgreementTimeout, PeerError, ...
    }
    PyEval_RestoreThread(c.ts);
    last_status_ = st;
    if (!c.result) return py::none();
    return py::reinterpret_steal<py::object>(c.result);
  }

  /// For loops that run several steps per call (see handler.hpp).
  std::string save_checkpoint_if_preempted() {
    handler_iface& h = live();
    holdfast::run_status st;
    {
      py::gil_scoped_release nogil;
      st = h.save_checkpoint_if_preempted();
    }
    last_status_ = st;
    return status_name(st);
  }

  std::int64_t total_run_calls() const { return h_ ? h_->total_run_calls() : final_.total; }
  std::optional<std::int64_t> restored_step() const {
    return h_ ? h_->restored_step() : final_.restored;
  }
  std::string last_status() const { return status_name(last_status_); }
  std::string state() const {
    if (!h_) return "closed";
    py::gil_scoped_release nogil;  // the handler's mutex: never wait for it holding the GIL
    return state_name(h_->state());
  }
  double mean_step_time() const { return h_ ? h_->mean_step_time() : 0.0; }
  double grace_period() const { return h_ ? h_->grace_period() : final_.grace; }
  int exit_code() const { return h_ ? h_->exit_code() : final_.exit_code; }
  int task() const { return h_ ? h_->cluster().task : final_.task; }
  int num_tasks() const { return h_ ? h_->cluster().num_tasks : final_.num_tasks; }
  std::string key_scope() const { return h_ ? h_->key_scope() : final_.scope; }

  /// What the coordination store holds for round `round` (claim, acks, outcome) and the error
  /// key, read now: for timelines and post-mortems.
  py::dict round_summary(std::uint64_t round) {
    handler_iface& h = live();
    using k = holdfast::agreement_key;
    std::optional<std::string> claim, outcome, final_claim, final_outcome, err;
    std::vector<std::pair<int, std::string>> acks, final_acks;
    {
      py::gil_scoped_release nogil;
      holdfast::any_kv& kv = h.kv();
      const std::string& scope = h.key_scope();
      auto get = [&](k key, int task = -1) {
        return kv.try_get(holdfast::agreement_key_name(scope, key, round, task));
      };
      claim = get(k::claim);
      outcome = get(k::step);
      final_claim = get(k::final_claim);
      final_outcome = get(k::final_step);
      err = get(k::error);
      for (int t = 0; t < h.cluster().num_tasks; ++t) {
        if (auto v = get(k::ack, t)) acks.emplace_back(t, *v);
        if (auto v = get(k::final_ack, t)) final_acks.emplace_back(t, *v);
      }
    }
    py::dict d;
    d["round"] = round;
    d["claim"] = describe(claim);
    d["acks"] = counters(acks);
    d["outcome"] = describe(outcome);
    d["final_claim"] = describe(final_claim);
    d["final_acks"] = counters(final_acks);
    d["final_outcome"] = describe(final_outcome);
    if (err) {
      py::dict e;
      auto nl = err->find('\n');
      e["task"] = err->substr(0, nl);
      e["text"] = *err;
      d["error"] = e;
    } else {
      d["error"] = py::none();
    }
    return d;
  }

 private:
  struct call_ctx {
    PyObject* fn;
    PyObject* args;    // a tuple (maybe empty)
    PyObject* kwargs;  // a dict or nullptr
    PyThreadState* ts = nullptr;
    PyObject* result = nullptr;
    std::optional<py::error_already_set> error;

    static void invoke(void* p) {
      auto& c = *static_cast<call_ctx*>(p);
      PyEval_RestoreThread(c.ts);
      Py_XDECREF(c.result);  // a previous attempt's (never: the handler calls once)
      c.result = PyTuple_GET_SIZE(c.args) == 0 && !c.kwargs ? PyObject_CallNoArgs(c.fn)
                                                            : PyObject_Call(c.fn, c.args, c.kwargs);
      if (c.result) {
        c.ts = PyEval_SaveThread();
        return;
      }
      std::string message;
      {
        c.error.emplace();  // fetches the Python error
        message = describe_python_error(*c.error);
      }
      c.ts = PyEval_SaveThread();
      throw python_step_error(message);
    }
  };

  static std::string describe_python_error(const py::error_already_set& e) {
    try {
      std::string type = py::str(e.type().attr("__name__"));
      std::string text = py::str(e.value());
      return text.empty() ? type : type + ": " + text;
    } catch (...) {
      return "Python exception";
    }
  }

  static py::object describe(const std::optional<std::string>& v) {
    if (!v) return py::none();
    py::dict d;
    d["text"] = *v;
    auto parsed = holdfast::parse_agreement_value(*v);
    if (!parsed) return std::move(d);
    using kind = holdfast::agreement_value::kind;
    const char* what = "claim";
    switch (parsed->what) {
      case kind::claim:
        what = "claim";
        break;
      case kind::step:
        what = "step";
        break;
      case kind::timeout:
        what = "timeout";
        break;
      case kind::abort:
        what = "abort";
        break;
      case kind::none:
        what = "none";
        break;
    }
    d["kind"] = what;
    d["by"] = parsed->writer;
    if (parsed->what == kind::step) d["step"] = parsed->step;
    if (parsed->what == kind::timeout) d["missing"] = parsed->tasks;
    return std::move(d);
  }
  static py::dict counters(const std::vector<std::pair<int, std::string>>& acks) {
    py::dict d;
    for (const auto& [t, v] : acks) d[py::int_(t)] = v;
    return d;
  }

  handler_iface& live() const {
    if (!h_) throw holdfast::error(EBADF, "holdfast handler", "", "closed");
    return *h_;
  }

  std::unique_ptr<handler_iface> h_;
  holdfast::run_status last_status_ = holdfast::run_status::ran;
  struct {  // what the properties report after close()
    std::int64_t total = 0;
    std::optional<std::int64_t> restored;
    int exit_code = -1;
    double grace = 0;
    int task = 0, num_tasks = 1;
    std::string scope;
  } final_;
};

// ---------------------------------------------------------------------------------------------
// The cache.

/// The Python Cache: index-addressed, shared by the creating process, its forked children (e.g.
/// DataLoader workers) and processes that attach by path.
class py_cache {
 public:
  py_cache(std::uint64_t length, const std::string& dir, std::uint64_t size_limit) {
    holdfast::cache_options o;
    o.dir = dir;
    o.size_limit = size_limit;
    c_.emplace(holdfast::create_cache, length, o);
  }
  py_cache(holdfast::attach_cache_t, const std::string& path, std::uint64_t length) {
    c_.emplace(holdfast::attach_cache, path, length);
  }
  /// The item in slot i, or None (a lock-free read of the shared mapping).
  py::object get(std::uint64_t i) const {
    auto v = c_->get(i);
    if (!v) return py::none();
    return py::bytes(v->data(), v->size());
  }
  /// Stores bytes in slot i once; False when filled, frozen or full.
  bool put(std::uint64_t i, py::bytes b) {
    char* data = nullptr;
    Py_ssize_t n = 0;
    if (PyBytes_AsStringAndSize(b.ptr(), &data, &n) != 0) throw py::error_already_set();
    std::string_view view(data, static_cast<std::size_t>(n));
    py::gil_scoped_release nogil;  // another process may hold the lock
    return c_->put(i, view);
  }
  bool contains(std::uint64_t i) const { return c_->contains(i); }
  std::uint64_t length() const { return c_->length(); }
  const std::string& path() const { return c_->path(); }
  std::uint64_t filled() const { return c_->filled(); }

 private:
  std::optional<holdfast::multiprocess_file_cache> c_;
};

// ---------------------------------------------------------------------------------------------
// Exceptions: the classes are defined in holdfast_torch.py and handed over at import.

struct exception_classes {
  py::handle error, agreement_timeout, agreement_unreachable, peer_error, corrupt_cache,
      format_error, preempted;
};
exception_classes g_exc;  // strong references, never released (live until the process ends)

void set_exception_classes(py::dict d) {
  auto take = [&](const char* name) {
    py::object o = d[name];
    return o.release();  // keep the reference for the life of the process
  };
  g_exc.error = take("Error");
  g_exc.agreement_timeout = take("AgreementTimeout");
  g_exc.agreement_unreachable = take("AgreementUnreachable");
  g_exc.peer_error = take("PeerError");
  g_exc.corrupt_cache = take("CorruptCache");
  g_exc.format_error = take("FormatError");
  g_exc.preempted = take("Preempted");
}

void raise_holdfast(py::handle cls, const holdfast::error& e, py::dict extra) {
  if (!cls) cls = g_exc.error ? g_exc.error : py::handle(PyExc_RuntimeError);
  py::object inst = cls(e.what());
  try {
    inst.attr("errno") = e.errnum();
    inst.attr("operation") = e.operation();
    inst.attr("path") = e.path();
    for (auto item : extra) inst.attr(item.first) = item.second;
  } catch (py::error_already_set&) {  // a class without settable attributes: the message only
  }
  PyErr_SetObject(cls.ptr(), inst.ptr());
}

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const preempted_exit& e) {
    py::handle cls = g_exc.preempted ? g_exc.preempted : py::handle(PyExc_SystemExit);
    py::object inst = cls(e.code);
    PyErr_SetObject(cls.ptr(), inst.ptr());
  } catch (const holdfast::peer_error& e) {
    py::dict x;
    x["origin_task"] = e.origin_task();
    x["type_name"] = e.type_name();
    x["message"] = e.message();
    raise_holdfast(g_exc.peer_error, e, x);
  } catch (const holdfast::agreement_timeout& e) {
    py::dict x;
    x["missing_tasks"] = e.missing_tasks();
    raise_holdfast(g_exc.agreement_timeout, e, x);
  } catch (const holdfast::agreement_unreachable& e) {
    raise_holdfast(g_exc.agreement_unreachable, e, py::dict());
  } catch (const holdfast::corrupt_cache& e) {
    py::dict x;
    x["slot"] = e.slot();
    raise_holdfast(g_exc.corrupt_cache, e, x);
  } catch (const holdfast::format_error& e) {
    raise_holdfast(g_exc.format_error, e, py::dict());
  } catch (const holdfast::error& e) {
    raise_holdfast(g_exc.error, e, py::dict());
  }
}

}  // namespace holdfast_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace ht = holdfast_torch;
  m.doc() = "holdfast for PyTorch: preemption handler, checkpoints, multiprocess file cache";
  m.attr("holdfast_version") = holdfast::version.string;
  m.def("_set_exception_classes", &ht::set_exception_classes);
  m.def(
      "take_incarnation",
      [](const std::string& url, const std::string& run_id, const std::string& taker) {
        py::gil_scoped_release nogil;
        holdfast::any_kv kv = holdfast::make_kv(url, holdfast::incarnation_namespace(run_id));
        return holdfast::take_incarnation(kv, taker);
      },
      py::arg("url"), py::arg("run_id"), py::arg("taker"),
      "A fresh incarnation number for this launch of run_id, from the store at url "
      "(holdfast/kv/incarnation.hpp).");
  py::register_exception_translator(&ht::translate);

  py::class_<ht::py_checkpoint_manager>(m, "CheckpointManager")
      .def(py::init<const std::string&, py::object, py::object, std::size_t, bool>(),
           py::arg("directory"), py::arg("save"), py::arg("restore"), py::arg("max_to_keep") = 3,
           py::arg("async_save") = false)
      .def(
          "save",
          [](ht::py_checkpoint_manager& self, std::int64_t step) {
            py::gil_scoped_release nogil;
            return self.manager().save(step).path;
          },
          py::arg("step"), "Saves a checkpoint of `step` through the save callable; its path.")
      .def(
          "restore",
          [](ht::py_checkpoint_manager& self) {
            py::gil_scoped_release nogil;
            return self.manager().restore();
          },
          "Loads the latest checkpoint through the restore callable; its step, or None.")
      .def(
          "restore_step",
          [](ht::py_checkpoint_manager& self, std::int64_t step) {
            py::gil_scoped_release nogil;
            self.manager().restore_step(step);
          },
          py::arg("step"))
      .def("all_steps",
           [](ht::py_checkpoint_manager& self) {
             py::gil_scoped_release nogil;
             return self.manager().all_steps();
           })
      .def(
          "pin",
          [](ht::py_checkpoint_manager& self, std::optional<std::int64_t> step) {
            self.manager().pin(step);
          },
          py::arg("step"))
      .def_property_readonly(
          "pinned", [](ht::py_checkpoint_manager& self) { return self.manager().pinned(); })
      .def_property_readonly(
          "latest_step",
          [](ht::py_checkpoint_manager& self) { return self.manager().latest_step(); })
      .def("wait_until_finished",
           [](ht::py_checkpoint_manager& self) {
             py::gil_scoped_release nogil;
             self.manager().wait_until_finished();
           })
      .def_property_readonly(
          "directory", [](ht::py_checkpoint_manager& self) { return self.manager().directory(); });

  py::class_<ht::py_handler>(m, "Handler")
      .def(py::init<const std::string&, const std::string&,
                    std::optional<c10::intrusive_ptr<c10d::Store>>, int, int, const std::string&,
                    std::uint64_t, const ht::py_checkpoint_manager&, double, std::optional<double>,
                    double, double, double, const std::string&>(),
           py::arg("preset"), py::arg("store"), py::arg("torch_store"), py::arg("task"),
           py::arg("num_tasks"), py::arg("run_id"), py::arg("restart"), py::arg("checkpoints"),
           py::arg("ack_timeout"), py::arg("grace"), py::arg("grace_margin"),
           py::arg("watch_interval"), py::arg("store_poll"), py::arg("notice_file"))
      .def("run", &ht::py_handler::run, py::arg("step_fn"))
      .def("save_checkpoint_if_preempted", &ht::py_handler::save_checkpoint_if_preempted)
      .def_property_readonly("total_run_calls", &ht::py_handler::total_run_calls)
      .def_property_readonly("restored_step", &ht::py_handler::restored_step)
      .def_property_readonly("last_status", &ht::py_handler::last_status)
      .def_property_readonly("state", &ht::py_handler::state)
      .def_property_readonly("mean_step_time", &ht::py_handler::mean_step_time)
      .def_property_readonly("grace_period", &ht::py_handler::grace_period)
      .def_property_readonly("exit_code", &ht::py_handler::exit_code)
      .def_property_readonly("task", &ht::py_handler::task)
      .def_property_readonly("num_tasks", &ht::py_handler::num_tasks)
      .def_property_readonly("key_scope", &ht::py_handler::key_scope)
      .def("round_summary", &ht::py_handler::round_summary, py::arg("round") = 0)
      .def("close", &ht::py_handler::close);

  py::class_<ht::py_cache>(m, "Cache")
      .def(py::init<std::uint64_t, const std::string&, std::uint64_t>(), py::arg("length"),
           py::arg("dir") = "", py::arg("size_limit") = 0)
      .def_static(
          "attach",
          [](const std::string& path, std::uint64_t length) {
            return std::make_unique<ht::py_cache>(holdfast::attach_cache, path, length);
          },
          py::arg("path"), py::arg("length") = 0)
      .def("get", &ht::py_cache::get, py::arg("i"))
      .def("put", &ht::py_cache::put, py::arg("i"), py::arg("data"))
      .def("__contains__", &ht::py_cache::contains)
      .def("__len__", &ht::py_cache::length)
      .def_property_readonly("path", &ht::py_cache::path)
      .def("filled", &ht::py_cache::filled)
      .def(py::pickle(  // a spawned process attaches to the same file by path
          [](const ht::py_cache& c) { return py::make_tuple(c.path(), c.length()); },
          [](py::tuple t) {
            return std::make_unique<ht::py_cache>(holdfast::attach_cache, t[0].cast<std::string>(),
                                                  t[1].cast<std::uint64_t>());
          }));
}
