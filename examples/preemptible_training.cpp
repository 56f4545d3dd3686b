// preemptible_training — holdfast doing its job from start to finish.
//
// A deterministic toy training job (linear regression by synchronous SGD, gradients averaged
// through the coordination store) runs as N worker processes. The driver preempts one of them
// with SIGTERM at a random step, as a spot VM or a Kubernetes eviction would; every worker
// checkpoints at one agreed step and exits with code 42; the driver restarts them as a
// scheduler would, they restore and finish, and the driver proves that the final model equals an
// uninterrupted run bit for bit and that every step ran exactly once.
//
//   preemptible_training [--workers N] [--steps S] [--preempt-at K] [--grace SECONDS]
//                        [--kv=etcd://127.0.0.1:2379] [--kill] [--seed X] [--dir D] [--keep]
//                        [--save-every N] [--ack-timeout MS] [--step-timeout MS]
//                        [--request-timeout MS]
//
// Without --dir the run directory is a fresh $TMPDIR/holdfast-training-XXXXXX (/tmp without
// TMPDIR) that the driver removes when the run ends, whatever the verdict, unless --keep: a run
// leaves nothing in $TMPDIR (the store and the checkpoints live in it, and the workers run with
// TMPDIR=<run dir>/tmp, where their caches go). A --dir of your own is never removed.
// --kill SIGKILLs a worker without notice instead: the others report the dead worker by task id
// within their deadline instead of hanging. --save-every N also checkpoints every N steps (a
// restart then agrees on the newest checkpoint every worker holds); --ack-timeout is the
// handler's ack_timeout (default 10 s) and --step-timeout how long a step waits for its peers'
// gradients (default 5 s; while an agreement is under way, until it ends), --request-timeout one
// etcd request's (default 5 s; a write in flight when the etcd leader dies gets no answer until
// then, and is retried). A step waiting for gradients also stops waiting once the handler says the
// agreement failed (a dead peer named through the recorded outcome, the store out of reach): it
// throws holdfast::step_abandoned and run() raises that outcome, rather than the step's own
// timeout.
//
// Built as preemptible_training_tls (HOLDFAST_DEMO_TLS, linked with OpenSSL), it also takes
// etcds:// URLs (TLS and authentication, holdfast/kv/url.hpp) through the example transport
// examples/tls/openssl_transport.hpp, e.g.
//   --kv='etcds://10.0.0.5:2379?ca=ca.pem&user=trainer&password_file=/run/secrets/etcd'
// The password is read from that file by every worker; it is never on a command line.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>  // mkdir: the workers' scratch TMPDIR
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <holdfast/holdfast.hpp>
#ifdef HOLDFAST_DEMO_TLS
#include "openssl_transport.hpp"  // examples/tls: the TLS transport for etcds://
#endif
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

// The transport etcd connections are made with: TLS-capable in the _tls build.
#ifdef HOLDFAST_DEMO_TLS
using demo_transport = holdfast_tls::openssl_transport<>;
#else
using demo_transport = holdfast::plain_transport<>;
#endif
using clock_type = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// The model and its data: everything here is deterministic and shared by the workers and the
// driver's uninterrupted reference run, so the two can be compared bit for bit.

constexpr int kDim = 8;                 // features
constexpr int kSamplesPerWorker = 256;  // one worker's shard
constexpr int kBatch = 16;              // samples per step (an epoch is 16 steps)
constexpr double kLearningRate = 0.05;

struct model {
  std::array<double, kDim> w{};
  double b = 0;
};
using gradient = std::array<double, kDim + 1>;

struct sample {
  std::array<double, kDim> x{};
  double y = 0;
};

std::uint64_t splitmix(std::uint64_t v) {
  v += 0x9e3779b97f4a7c15ULL;
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ULL;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebULL;
  return v ^ (v >> 31);
}
double unit(std::uint64_t v) { return static_cast<double>(splitmix(v) >> 11) / 9007199254740992.0; }

// Sample j of worker `task`'s shard: y = <true_w, x> + true_b + noise.
sample make_sample(std::uint64_t seed, int task, int j) {
  sample s;
  std::uint64_t base = seed * 1000003u + static_cast<std::uint64_t>(task) * 65537u +
                       static_cast<std::uint64_t>(j) * 131u;
  for (int d = 0; d < kDim; ++d) {
    s.x[static_cast<std::size_t>(d)] = 2 * unit(base + static_cast<std::uint64_t>(d)) - 1;
    s.y += (0.5 + 0.25 * d) * s.x[static_cast<std::size_t>(d)];
  }
  s.y += 1.5 + 0.01 * (unit(base + 97) - 0.5);
  return s;
}

std::string encode(const void* p, std::size_t n) {
  return std::string(static_cast<const char*>(p), n);
}
template <class T>
T decode(std::string_view bytes) {
  T v{};
  if (bytes.size() != sizeof v) throw std::runtime_error("bad record size");
  std::memcpy(&v, bytes.data(), sizeof v);
  return v;
}

// The mean-squared-error gradient over one batch.
gradient compute_gradient(const model& m, const std::vector<sample>& batch) {
  gradient g{};
  for (const auto& s : batch) {
    double pred = m.b;
    for (std::size_t d = 0; d < kDim; ++d) pred += m.w[d] * s.x[d];
    double err = pred - s.y;
    for (std::size_t d = 0; d < kDim; ++d) g[d] += 2 * err * s.x[d] / kBatch;
    g[kDim] += 2 * err / kBatch;
  }
  return g;
}

// Averages the workers' gradients in task order (so every worker computes the same bits).
void apply_update(model& m, const std::vector<gradient>& grads) {
  gradient avg{};
  for (const auto& g : grads)
    for (std::size_t d = 0; d <= kDim; ++d) avg[d] += g[d];
  for (std::size_t d = 0; d < kDim; ++d)
    m.w[d] -= kLearningRate * avg[d] / static_cast<double>(grads.size());
  m.b -= kLearningRate * avg[kDim] / static_cast<double>(grads.size());
}

int sample_index(std::int64_t step, int k) {
  return static_cast<int>((step * kBatch + k) % kSamplesPerWorker);
}

model reference_run(std::uint64_t seed, int workers, std::int64_t steps) {
  model m;
  for (std::int64_t s = 0; s < steps; ++s) {
    std::vector<gradient> grads;
    for (int t = 0; t < workers; ++t) {
      std::vector<sample> batch;
      for (int k = 0; k < kBatch; ++k) batch.push_back(make_sample(seed, t, sample_index(s, k)));
      grads.push_back(compute_gradient(m, batch));
    }
    apply_update(m, grads);
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
// Options.

struct options {
  int workers = 4;
  std::int64_t steps = 60;
  std::int64_t preempt_at = -1;  // -1: random
  int grace_s = 0;
  std::string kv = "filesystem";  // or etcd://host:port
  bool kill = false;
  std::uint64_t seed = 7;
  std::string dir;
  bool keep = false;            // keep the run directory the driver made
  std::int64_t save_every = 0;  // 0: only the preemption save
  std::chrono::milliseconds ack_timeout{10000}, step_timeout{5000};
  std::chrono::milliseconds request_timeout{5000};  // etcd: one request's limit
  // worker mode
  int task = -1;
  int incarnation = 0;
};

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--workers N] [--steps S] [--preempt-at K] [--grace SECONDS]\n"
               "          [--kv=etcd://127.0.0.1:2379] [--kill] [--seed X] [--dir D] [--keep]\n",
               argv0);
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const std::string& name) -> std::optional<std::string> {
      if (a.rfind(name + "=", 0) == 0) return a.substr(name.size() + 1);
      if (a == name && i + 1 < argc) return std::string(argv[++i]);
      return std::nullopt;
    };
    if (auto v = value("--workers"))
      o.workers = std::stoi(*v);
    else if (auto v2 = value("--steps"))
      o.steps = std::stoll(*v2);
    else if (auto v3 = value("--preempt-at"))
      o.preempt_at = std::stoll(*v3);
    else if (auto v4 = value("--grace"))
      o.grace_s = std::stoi(*v4);
    else if (auto v5 = value("--kv"))
      o.kv = *v5;
    else if (auto v6 = value("--seed"))
      o.seed = std::stoull(*v6);
    else if (auto v7 = value("--dir"))
      o.dir = *v7;
    else if (auto v8 = value("--worker"))
      o.task = std::stoi(*v8);
    else if (auto v9 = value("--incarnation"))
      o.incarnation = std::stoi(*v9);
    else if (auto v10 = value("--save-every"))
      o.save_every = std::stoll(*v10);
    else if (auto v11 = value("--ack-timeout"))
      o.ack_timeout = std::chrono::milliseconds(std::stoll(*v11));
    else if (auto v12 = value("--step-timeout"))
      o.step_timeout = std::chrono::milliseconds(std::stoll(*v12));
    else if (auto v13 = value("--request-timeout"))
      o.request_timeout = std::chrono::milliseconds(std::stoll(*v13));
    else if (a == "--kill")
      o.kill = true;
    else if (a == "--keep")
      o.keep = true;
    else
      usage(argv[0]);
  }
  if (o.workers < 1 || o.workers > 64 || o.steps < 2 || o.save_every < 0 ||
      o.ack_timeout.count() <= 0 || o.step_timeout.count() <= 0 || o.request_timeout.count() <= 0)
    usage(argv[0]);
  if (o.kv != "filesystem") {
    try {
      holdfast::parse_kv_url(o.kv);
    } catch (const holdfast::format_error& e) {
      std::fprintf(stderr, "--kv: %s\n", e.what());
      usage(argv[0]);
    }
  }
  return o;
}

std::vector<std::string> worker_args(const options& o, int task, int incarnation) {
  return {"--worker",
          std::to_string(task),
          "--incarnation",
          std::to_string(incarnation),
          "--workers",
          std::to_string(o.workers),
          "--steps",
          std::to_string(o.steps),
          "--grace",
          std::to_string(o.grace_s),
          "--kv",
          o.kv,
          "--seed",
          std::to_string(o.seed),
          "--dir",
          o.dir,
          "--save-every",
          std::to_string(o.save_every),
          "--ack-timeout",
          std::to_string(o.ack_timeout.count()),
          "--step-timeout",
          std::to_string(o.step_timeout.count()),
          "--request-timeout",
          std::to_string(o.request_timeout.count())};
}

// ---------------------------------------------------------------------------------------------
// The worker: one process of the job.

// Everything a worker prints goes to the driver through a pipe; lines starting with '@' are
// machine-readable progress the driver consumes, the rest is the timeline.
void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

template <class Kv>
int run_worker(const options& o, Kv kv) {
  const int t = o.task;
  model m;

  // Checkpoints: one run directory per worker in the store; the writer and reader move the
  // model in and out of a checkpoint directory.
  auto st = holdfast::store::create(o.dir + "/store");
  holdfast::checkpoint_manager<> checkpoints(st, "worker-" + std::to_string(t), {3});
  checkpoints.set_writer([&](const std::string& dir, std::int64_t step) {
    holdfast::publisher{}.publish(dir + "/model.bin", encode(&m, sizeof m));
    say("worker %d: saved checkpoint at step %" PRId64, t, step);
  });
  checkpoints.set_reader([&](const std::string& dir) {
    auto fd = holdfast::open_file(dir + "/model.bin", O_RDONLY);
    m = decode<model>(holdfast::read_all(fd));
  });

  // Training data: this worker's shard, read through a multiprocess cache in $TMPDIR (node-local
  // storage). The first epoch fills it; later epochs read it. Its temp file goes with the worker
  // however it ends but SIGKILL, the handler's exit after the save included.
  holdfast::multiprocess_file_cache cache(holdfast::create_cache, kSamplesPerWorker);
  std::int64_t fills = 0, hits = 0;

  holdfast::termination_config<holdfast::signal_notice<SIGTERM>, holdfast::exit_with<42>> config{
      holdfast::signal_notice<SIGTERM>(), holdfast::exit_with<42>(),
      std::chrono::seconds(o.grace_s)};
  holdfast::handler_options hopts;
  hopts.ack_timeout = o.ack_timeout;
  // the fixed reserve before the grace deadline: 3 s by default, a quarter of a short grace
  hopts.grace_margin = std::min<std::chrono::milliseconds>(3s, std::chrono::seconds(o.grace_s) / 4);
  holdfast::preemption_handler<decltype(config), Kv> handler(
      std::move(config), kv, {t, o.workers, "train"}, std::move(checkpoints), hopts);
  if (auto r = handler.restored_step())
    say("worker %d: restored checkpoint of step %" PRId64 ", resuming", t, *r);
  else
    say("worker %d: started fresh (incarnation %d, pid %d)", t, o.incarnation, ::getpid());

  // Every step this worker runs is appended to its log, so the driver can prove that each step
  // ran exactly once across incarnations.
  auto log = holdfast::open_file(o.dir + "/steps-" + std::to_string(t) + ".log",
                                 O_WRONLY | O_CREAT | O_APPEND, 0644);

  auto step = [&] {
    const std::int64_t s = handler.total_run_calls();
    std::vector<sample> batch;
    for (int k = 0; k < kBatch; ++k) {
      auto j = static_cast<std::uint64_t>(sample_index(s, k));
      if (auto bytes = cache.get(j)) {
        batch.push_back(decode<sample>(*bytes));
        ++hits;
      } else {
        sample smp = make_sample(o.seed, t, static_cast<int>(j));
        cache.put(j, encode(&smp, sizeof smp));
        batch.push_back(smp);
        ++fills;
      }
    }
    gradient g = compute_gradient(m, batch);
    // Synchronous data parallelism: publish this worker's gradient, wait for every peer's.
    const std::string prefix = "grad/" + std::to_string(s) + "/";
    const auto give_up = clock_type::now() + o.step_timeout;
    // The step gives up at its timeout, but not while an agreement is under way: that one ends
    // within its round's deadline plus ack_timeout with an outcome this step then follows.
    auto timed_out = [&] { return clock_type::now() >= give_up && !handler.agreement_under_way(); };
    // One store call, bounded to 300 ms (a kv_call_deadline: whatever the store's own timeouts
    // and however many etcd members are out of reach), retried after 20 ms while it fails
    // transiently (a member lost, an election). Before each, a failed agreement (the handler's
    // recorded outcome naming a dead peer, or its store out of reach) ends the step:
    // step_abandoned, which run() turns into that outcome.
    auto call = [&](auto fn) {
      for (;;) {
        if (handler.agreement_failed()) throw holdfast::step_abandoned{};
        try {
          const holdfast::kv_call_deadline bound(clock_type::now() + 300ms);
          return fn();
        } catch (const std::exception& e) {
          // Checked again here: the agreement may have failed while fn() waited, and then it is
          // no longer under way, so timed_out() turns true and the store's error would escape.
          if (handler.agreement_failed()) throw holdfast::step_abandoned{};
          if (!holdfast::is_transient_kv_error(e) || timed_out()) throw;
        }
        std::this_thread::sleep_for(20ms);
      }
    };
    call([&] {  // a retry writes the same value again
      kv.put(prefix + std::to_string(t), encode(&g, sizeof g));
      return true;
    });
    std::vector<gradient> grads(static_cast<std::size_t>(o.workers));
    std::vector<int> missing;
    for (int p = 0; p < o.workers; ++p) {
      std::optional<std::string> v;
      while (!(v = call([&] { return kv.get(prefix + std::to_string(p), 200ms); })) &&
             !timed_out()) {
      }
      if (v)
        grads[static_cast<std::size_t>(p)] = decode<gradient>(*v);
      else
        missing.push_back(p);
    }
    if (!missing.empty()) {
      if (handler.agreement_failed()) throw holdfast::step_abandoned{};  // as above
      throw holdfast::agreement_timeout(prefix, missing);
    }
    apply_update(m, grads);
    if (s >= 2) {  // cleanup of an older step's gradients: best effort, bounded
      try {
        const holdfast::kv_call_deadline bound(clock_type::now() + 300ms);
        kv.erase_prefix("grad/" + std::to_string(s - 2));
      } catch (const std::exception&) {  // a few keys left behind; never fails the step
      }
    }
    std::string line = std::to_string(s) + "\n";
    holdfast::write_all(log, line.data(), line.size());
    say("@step %d %" PRId64, t, s);
    std::this_thread::sleep_for(20ms);  // the rest of a real step's compute
  };

  try {
    while (handler.total_run_calls() < o.steps) {
      auto status = handler.run(step);
      if (o.save_every > 0 && status == holdfast::run_status::ran &&
          handler.total_run_calls() % o.save_every == 0)
        handler.checkpointer().save(handler.total_run_calls());
      if (status == holdfast::run_status::saved)
        say("worker %d: saved at the agreed step; training on through the grace period", t);
    }
  } catch (const holdfast::agreement_timeout& e) {
    say("worker %d: gave up waiting: %s", t, e.what());
    return 3;
  } catch (const holdfast::peer_error& e) {
    say("worker %d: peer failed: %s", t, e.what());
    return 4;
  } catch (const holdfast::agreement_unreachable& e) {
    say("worker %d: could not reach the store to learn the agreement: %s", t, e.what());
    return 5;
  }
  say("worker %d: finished %" PRId64 " steps (cache: %" PRId64 " fills, %" PRId64 " hits)", t,
      o.steps, fills, hits);
  if (t == 0) holdfast::publisher{}.publish(o.dir + "/final-model.bin", encode(&m, sizeof m));
  return 0;
}

// The coordination store of incarnation `inc`, from --kv: "filesystem" (the run directory's kv/
// folder) or a store URL (holdfast/kv/url.hpp). An etcd URL without a prefix gets one per run
// directory, so runs sharing a cluster never see each other's keys.
holdfast::any_kv open_kv(const options& o, int inc) {
  std::string url = o.kv;
  if (url == "filesystem") {
    url = "file://";  // appends: GCC 12 -Wrestrict misfires on "..." + string&&
    url += o.dir;
    url += "/kv";
  } else if (holdfast::parse_kv_url(url).scheme == holdfast::kv_url::kind::etcd) {
    // No prefix given (no '/' between the scheme and an etcds:// query): add one.
    const std::size_t start = url.find("://") + 3, query = std::min(url.find('?'), url.size());
    if (url.find('/', start) >= query) {
      std::string prefix = "/holdfast-example/";
      prefix += std::filesystem::path(o.dir).filename().string();
      url.insert(query, prefix);
    }
  }
  holdfast::etcd_options etcd;
  etcd.request_timeout = o.request_timeout;
  return holdfast::make_kv<demo_transport>(url, {"train", static_cast<std::uint64_t>(inc)},
                                           std::move(etcd));
}

int worker_main(const options& o) { return run_worker(o, open_kv(o, o.incarnation)); }

// ---------------------------------------------------------------------------------------------
// The driver: a scheduler in miniature.

struct worker_proc {
  int task;
  pid_t pid;
  int out;  // read end of the worker's stdout
  std::string partial;
  std::int64_t last_step = -1;
  int exit_code = -1;
  int term_signal = 0;
};

clock_type::time_point g_start;
void timeline(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void timeline(const char* fmt, ...) {
  double s = std::chrono::duration<double>(clock_type::now() - g_start).count();
  std::printf("[%7.3f s] ", s);
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

worker_proc spawn(const options& o, int task, int incarnation) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw holdfast::error(errno, "pipe2", "");
  std::vector<std::string> args = worker_args(o, task, incarnation);
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) throw holdfast::error(errno, "fork", "");
  if (pid == 0) {
    ::dup2(p[1], STDOUT_FILENO);
    std::vector<char*> argv{const_cast<char*>("preemptible_training")};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  ::close(p[1]);
  return {task, pid, p[0], {}, -1, -1, 0};
}

// Reads what the workers print until every one has exited; `on_step` sees each '@step' line.
template <class OnStep>
void supervise(std::vector<worker_proc>& ws, OnStep on_step) {
  std::size_t open = ws.size();
  while (open > 0) {
    std::vector<pollfd> fds;
    for (auto& w : ws)
      if (w.out >= 0) fds.push_back({w.out, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR)
      throw holdfast::error(errno, "poll", "");
    for (auto& w : ws) {
      if (w.out < 0) continue;
      pollfd probe{w.out, POLLIN, 0};
      if (::poll(&probe, 1, 0) <= 0) continue;
      char buf[4096];
      ssize_t n = ::read(w.out, buf, sizeof buf);
      if (n <= 0) {
        ::close(w.out);
        w.out = -1;
        --open;
        continue;
      }
      w.partial.append(buf, static_cast<std::size_t>(n));
      std::size_t nl;
      while ((nl = w.partial.find('\n')) != std::string::npos) {
        std::string line = w.partial.substr(0, nl);
        w.partial.erase(0, nl + 1);
        if (line.rfind("@step ", 0) == 0) {
          w.last_step = std::stoll(line.substr(line.rfind(' ') + 1));
          on_step(w);
        } else {
          timeline("%s", line.c_str());
        }
      }
    }
  }
  for (auto& w : ws) {
    int status = 0;
    ::waitpid(w.pid, &status, 0);
    if (WIFEXITED(status)) w.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) w.term_signal = WTERMSIG(status);
    if (w.term_signal)
      timeline("driver: worker %d was killed by signal %d", w.task, w.term_signal);
    else
      timeline("driver: worker %d exited with code %d", w.task, w.exit_code);
  }
}

std::string slurp(const std::string& path) {
  auto fd = holdfast::open_file(path, O_RDONLY);
  return holdfast::read_all(fd);
}

// Prints the agreement as the workers left it in the coordination store: who claimed, the
// acknowledged run counters still there (each worker erases its own once a step is agreed; a
// timeout leaves them), and the recorded outcome (the agreed step, max + 1, or a timeout naming
// the missing workers); the same for the final save of the grace path.
template <class Kv>
void print_agreement(Kv kv) {
  using holdfast::agreement_key;
  const std::string scope = "holdfast/train/";
  std::map<std::string, std::string> keys;
  for (const auto& [key, value] : kv.list("holdfast/train")) keys[key] = value;
  auto get = [&](const std::string& k) {
    auto it = keys.find(k);
    return it == keys.end() ? std::string() : it->second;
  };
  if (auto e = get(holdfast::agreement_key_name(scope, agreement_key::error, 0)); !e.empty())
    timeline("store: worker %s published an error; every other worker raises it",
             e.substr(0, e.find('\n')).c_str());
  for (std::uint64_t r = 0;; ++r) {
    if (get(holdfast::agreement_key_name(scope, agreement_key::claim, r)).empty()) break;
    for (bool final_phase : {false, true}) {
      auto claim = holdfast::parse_agreement_value(get(holdfast::agreement_key_name(
          scope, final_phase ? agreement_key::final_claim : agreement_key::claim, r)));
      if (!claim || claim->what != holdfast::agreement_value::kind::claim) continue;
      const std::string ack_prefix = holdfast::agreement_key_name(
          scope, final_phase ? agreement_key::final_ack : agreement_key::ack, r);
      std::string acks;
      for (auto it = keys.lower_bound(ack_prefix);
           it != keys.end() && it->first.compare(0, ack_prefix.size(), ack_prefix) == 0; ++it) {
        acks += ' ';  // appends, not operator+: GCC 12 -Wrestrict misfires on " " + string&&
        acks += it->first.substr(ack_prefix.size());
        acks += '@';
        acks += it->second;
      }
      if (acks.empty()) acks = " (erased once the step was agreed)";
      // "step S by ..." or "timeout ..."
      std::string outcome = get(holdfast::agreement_key_name(
          scope, final_phase ? agreement_key::final_step : agreement_key::step, r));
      if (auto v = holdfast::parse_agreement_value(outcome);
          v && v->what == holdfast::agreement_value::kind::step) {
        outcome = "agreed step ";  // appends: GCC 12 -Wrestrict misfires on "..." + string&&
        outcome += std::to_string(v->step);
        outcome += " = max + 1";
      }
      timeline("store: %s: worker %d claimed; acks (task@run counter):%s; outcome: %s",
               final_phase ? "final save" : "checkpoint", claim->writer, acks.c_str(),
               outcome.c_str());
    }
  }
}

// Removes the run directory the driver made when the run ends (any verdict, or an exception).
struct run_dir_cleanup {
  std::string dir;  // empty: nothing to remove (--dir given, or --keep)
  ~run_dir_cleanup() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

int driver_main(options o) {
  g_start = clock_type::now();
  run_dir_cleanup cleanup;
  std::string note;
  if (o.dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/holdfast-training-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw holdfast::error(errno, "mkdtemp", tmpl);
    o.dir = tmpl;
    if (!o.keep) cleanup.dir = o.dir;
    note = o.keep ? " (kept: --keep)" : " (removed at the end; --keep keeps it)";
  }
  // The workers' TMPDIR is the run's own scratch directory, as a scheduler gives a job one
  // (Slurm's per-job TMPDIR, a Kubernetes emptyDir): what a SIGKILLed worker leaves there (its
  // cache file) goes with the run, not into the machine's /tmp.
  const std::string scratch = o.dir + "/tmp";
  if (::mkdir(scratch.c_str(), 0700) != 0 && errno != EEXIST)
    throw holdfast::error(errno, "mkdir", scratch);
  if (::setenv("TMPDIR", scratch.c_str(), 1) != 0) throw holdfast::error(errno, "setenv", scratch);
  std::mt19937_64 rng(std::random_device{}());
  const int victim = std::uniform_int_distribution<int>(0, o.workers - 1)(rng);
  if (o.preempt_at < 0)
    o.preempt_at = std::uniform_int_distribution<std::int64_t>(o.steps / 4, o.steps / 2)(rng);
  std::printf("holdfast %s: %d workers, %" PRId64 " steps, run directory %s%s, coordination: %s\n",
              holdfast::version.string, o.workers, o.steps, o.dir.c_str(), note.c_str(),
              o.kv.c_str());
  std::printf("plan: %s worker %d when it reaches step %" PRId64 "\n\n",
              o.kill ? "SIGKILL (no notice)" : "SIGTERM", victim, o.preempt_at);

  model expected = reference_run(o.seed, o.workers, o.steps);

  // Incarnation 1: run until the preemption.
  std::vector<worker_proc> ws;
  for (int t = 0; t < o.workers; ++t) ws.push_back(spawn(o, t, 1));
  bool sent = false;
  supervise(ws, [&](worker_proc& w) {
    if (!sent && w.task == victim && w.last_step + 1 >= o.preempt_at) {
      sent = true;
      timeline("driver: %s -> worker %d (it has run steps 0..%" PRId64 ")",
               o.kill ? "SIGKILL" : "SIGTERM", victim, w.last_step);
      ::kill(w.pid, o.kill ? SIGKILL : SIGTERM);
    }
  });
  print_agreement(open_kv(o, 1));

  if (o.kill) {
    // A survivor reports the dead worker itself (3: its step's timeout names it), or through
    // the survivor that did first (4: that worker's published error, naming it, is raised on
    // every other worker, whose waiting step stops at it: step_abandoned).
    const auto error = open_kv(o, 1).try_get(
        holdfast::agreement_key_name("holdfast/train/", holdfast::agreement_key::error, 0));
    const bool error_names_victim =
        error && error->find("no answer from tasks " + std::to_string(victim)) != std::string::npos;
    int reported = 0;
    for (auto& w : ws)
      if (w.task != victim && (w.exit_code == 3 || (w.exit_code == 4 && error_names_victim)))
        ++reported;
    bool ok = reported == o.workers - 1;
    std::printf(
        "\nverdict: %s — %d of %d surviving workers reported the dead worker %d instead "
        "of hanging\n",
        ok ? "PASS" : "FAIL", reported, o.workers - 1, victim);
    return ok ? 0 : 1;
  }
  // Every worker exits with 42 after the agreed save; with a grace period long enough to finish
  // training, every worker instead finishes (0) after the first save and nothing is restarted.
  bool finished = true, preempted = true;
  for (auto& w : ws) {
    finished = finished && w.exit_code == 0;
    preempted = preempted && w.exit_code == 42;
  }
  if (!finished && !preempted) {
    std::printf("\nverdict: FAIL — the workers did not all exit with 42 (or all finish)\n");
    return 1;
  }
  if (finished) {
    std::printf("\n");
    timeline("driver: training finished within the grace period; nothing to restart");
  } else {
    // Incarnation 2: the scheduler restarts every worker; they restore and finish.
    std::printf("\n");
    timeline("driver: every worker saved and exited with 42; restarting them (incarnation 2)");
    ws.clear();
    for (int t = 0; t < o.workers; ++t) ws.push_back(spawn(o, t, 2));
    supervise(ws, [](worker_proc&) {});
    for (auto& w : ws)
      if (w.exit_code != 0) {
        std::printf("\nverdict: FAIL — worker %d exited with %d after the restart\n", w.task,
                    w.exit_code);
        return 1;
      }
  }

  // Verify: the model equals the uninterrupted run bit for bit; each step ran exactly once.
  model got = decode<model>(slurp(o.dir + "/final-model.bin"));
  bool same = std::memcmp(&got, &expected, sizeof got) == 0;
  std::int64_t total = 0;
  bool exact = true;
  for (int t = 0; t < o.workers; ++t) {
    std::vector<int> seen(static_cast<std::size_t>(o.steps), 0);
    std::string log = slurp(o.dir + "/steps-" + std::to_string(t) + ".log");
    for (std::size_t pos = 0, nl; (nl = log.find('\n', pos)) != std::string::npos; pos = nl + 1) {
      auto s = std::stoll(log.substr(pos, nl - pos));
      if (s >= 0 && s < o.steps) ++seen[static_cast<std::size_t>(s)];
      ++total;
    }
    for (int c : seen) exact = exact && c == 1;
  }
  std::printf("\nfinal model: w[0]=%.17g ... b=%.17g\n", got.w[0], got.b);
  std::printf("check: final model %s an uninterrupted run, bit for bit\n",
              same ? "equals" : "DIFFERS FROM");
  std::printf("check: %" PRId64 " steps ran in total; expected workers x steps = %" PRId64 "%s\n",
              total, static_cast<std::int64_t>(o.workers) * o.steps,
              exact ? ", each exactly once" : " — MISMATCH");
  bool ok = same && exact && total == o.workers * o.steps;
  std::printf("verdict: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    options o = parse(argc, argv);
    return o.task >= 0 ? worker_main(o) : driver_main(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "preemptible_training: %s\n", e.what());
    return 1;
  }
}
