// Key-value backends: per-operation latency (median and p99 over single operations) of insert,
// get of an existing key and list of 16 keys, and the wake-up latency from an insert in one
// process (or thread, in-process) until a blocked get returns in another. Baselines:
//   in_process  — a bare std::mutex + std::map (and a bare condition variable for wake-ups);
//   filesystem  — the bare syscalls on the same layout (a directory per parent prefix, temps in
//                 .tmp: open O_EXCL + write + close + renameat2 NOREPLACE; open + read + close;
//                 readdir of the namespace and of the prefix's directory + 16 reads) and a bare
//                 inotify wake-up;
//   etcd        — the same JSON request as a bare HTTP POST over a raw socket, and for the
//                 wake-up a bare txn POST seen by a raw watch socket in another process.
//   etcd over TLS (built with OpenSSL: HOLDFAST_BENCH_TLS) — get and insert through the example
//                 OpenSSL transport against the plain etcd_kv rows, both on reused (keep-alive)
//                 connections; and the TLS handshake once, against a bare TCP connect.
// And, no baseline, "kv/etcd/server CPU per {get,put,list 16}": etcd's own CPU time per request
// (its process's utime + stime over 4,000 requests of one client), the service time of the
// simulated etcd server in scale_model_bench.cpp.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <holdfast/detail/base64.hpp>
#include <holdfast/kv/etcd.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/kv/in_process.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "../tests/support/etcd_server.hpp"
#include "../tests/support/temp_dir.hpp"
#include "bench.hpp"
#include "stamps.hpp"
#ifdef HOLDFAST_BENCH_TLS
#include "../examples/tls/openssl_transport.hpp"
#include "../tests/support/tls_etcd.hpp"
#endif

namespace {

using holdfast::kv_namespace;

// Latency cases: one operation per repetition, so min/median/p99 are per operation.
const bench::config latency{1, 300, 10, 0};
const bench::config wakeup{1, 60, 3, 0};

using bench::next_id;  // fresh keys
using bench::now_ns;   // when a waiter woke

// Fills `kv` with the keys the get and list cases read.
template <class Kv>
void seed(Kv& kv) {
  kv.put("existing", std::string(64, 'v'));
  for (int i = 0; i < 16; ++i) kv.put("list16/" + std::to_string(100 + i), std::string(64, 'v'));
}

// ---- wake-up across processes ---------------------------------------------------------------

// Forks a child that signals it is about to block, runs `block()` (which returns when the
// parent's `wake()` lands) and reports the monotonic time it returned. Returns return - start
// of wake(), in ns. `settle` lets the child's wait get established before waking it.
template <class Block, class Wake>
double cross_process_wakeup(Block block, Wake wake, std::chrono::milliseconds settle) {
  int ready[2], done[2];
  if (::pipe2(ready, O_CLOEXEC) != 0 || ::pipe2(done, O_CLOEXEC) != 0) return -1;
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    (void)!::write(ready[1], "r", 1);
    block();
    std::int64_t t = now_ns();
    (void)!::write(done[1], &t, sizeof t);
    ::_exit(0);
  }
  char c;
  (void)!::read(ready[0], &c, 1);
  std::this_thread::sleep_for(settle);
  std::int64_t t0 = now_ns();
  wake();
  std::int64_t t1 = 0;
  pollfd p{done[0], POLLIN, 0};
  if (::poll(&p, 1, 10000) == 1) (void)!::read(done[0], &t1, sizeof t1);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  for (int fd : {ready[0], ready[1], done[0], done[1]}) ::close(fd);
  return t1 > 0 ? static_cast<double>(t1 - t0) : -1;
}

// ---- in_process ------------------------------------------------------------------------------

holdfast::in_process_kv& mem_kv() {
  static holdfast::in_process_kv kv = [] {
    holdfast::in_process_kv k(kv_namespace("bench", 0));
    seed(k);
    return k;
  }();
  return kv;
}

struct bare_map {
  std::mutex m;
  std::map<std::string, std::string> data;
  bare_map() {
    data["bench/0/existing"] = std::string(64, 'v');
    for (int i = 0; i < 16; ++i)
      data["bench/0/list16/" + std::to_string(100 + i)] = std::string(64, 'v');
  }
};
bare_map& bare() {
  static bare_map b;
  return b;
}

bench::registrar mem_insert{{"kv/in_process/insert", bench::timed([](std::size_t) {
                               mem_kv().insert("ins/" + std::to_string(next_id()), "value");
                             }),
                             "bare mutex+map emplace", bench::timed([](std::size_t) {
                               std::lock_guard<std::mutex> l(bare().m);
                               bare().data.emplace("bench/0/ins/" + std::to_string(next_id()),
                                                   "value");
                             }),
                             latency}};

bench::registrar mem_get{{"kv/in_process/get existing", bench::timed([](std::size_t) {
                            auto v = mem_kv().get("existing", std::chrono::milliseconds(0));
                            if (!v) std::abort();
                          }),
                          "bare mutex+map find", bench::timed([](std::size_t) {
                            std::lock_guard<std::mutex> l(bare().m);
                            auto it = bare().data.find("bench/0/existing");
                            std::string v = it->second;
                            if (v.empty()) std::abort();
                          }),
                          latency}};

bench::registrar mem_list{{"kv/in_process/list 16", bench::timed([](std::size_t) {
                             if (mem_kv().list("list16").size() != 16) std::abort();
                           }),
                           "bare mutex+map range copy", bench::timed([](std::size_t) {
                             const std::string p = "bench/0/list16/";
                             std::vector<std::pair<std::string, std::string>> out;
                             std::lock_guard<std::mutex> l(bare().m);
                             for (auto it = bare().data.lower_bound(p);
                                  it != bare().data.end() && it->first.compare(0, p.size(), p) == 0;
                                  ++it)
                               out.emplace_back(it->first.substr(8), it->second);
                             if (out.size() != 16) std::abort();
                           }),
                           latency}};

// In one process the "other side" is a thread.
template <class Block, class Wake>
double thread_wakeup(Block block, Wake wake) {
  std::atomic<bool> ready{false};
  std::int64_t t1 = 0;
  std::thread t([&] {
    ready = true;
    block();
    t1 = now_ns();
  });
  while (!ready) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::int64_t t0 = now_ns();
  wake();
  t.join();
  return static_cast<double>(t1 - t0);
}

bench::registrar mem_wake{{"kv/in_process/wake-up (thread)",
                           [](std::size_t) {
                             std::string key = "wake/" + std::to_string(next_id());
                             return thread_wakeup(
                                 [&] { mem_kv().get(key, std::chrono::seconds(10)); },
                                 [&] { mem_kv().insert(key, "go"); });
                           },
                           "bare condition_variable wake-up",
                           [](std::size_t) {
                             std::mutex m;
                             std::condition_variable cv;
                             bool set = false;
                             return thread_wakeup(
                                 [&] {
                                   std::unique_lock<std::mutex> l(m);
                                   cv.wait(l, [&] { return set; });
                                 },
                                 [&] {
                                   {
                                     std::lock_guard<std::mutex> l(m);
                                     set = true;
                                   }
                                   cv.notify_all();
                                 });
                           },
                           wakeup}};

// ---- filesystem ------------------------------------------------------------------------------

holdfast_test::temp_dir& fs_dir() {
  static holdfast_test::temp_dir d("kvbench");
  return d;
}
holdfast::filesystem_kv& fs_kv() {
  static holdfast::filesystem_kv kv = [] {
    holdfast::filesystem_kv k(fs_dir().path() + "/store", kv_namespace("bench", 0));
    seed(k);
    return k;
  }();
  return kv;
}
holdfast::network_filesystem_kv& nfs_kv() {
  static holdfast::network_filesystem_kv kv(fs_dir().path() + "/store", kv_namespace("bench", 0));
  return kv;
}
const std::string& bare_dir() {
  static std::string d = [] {
    std::string p = fs_dir().path() + "/bare";
    for (const char* sub : {"", "/.tmp", "/ins%2F", "/list16%2F"}) ::mkdir((p + sub).c_str(), 0755);
    for (int i = 0; i < 16; ++i) {
      std::string f = p + "/list16%2F/" + std::to_string(100 + i);
      int fd = ::open(f.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
      (void)!::write(fd, std::string(64, 'v').data(), 64);
      ::close(fd);
    }
    return p;
  }();
  return d;
}

// What publish_once does without the library: temp O_EXCL, write, fchmod, close, rename-noreplace.
void bare_publish_once(const std::string& target, const std::string& value) {
  std::string tmp = bare_dir() + "/.tmp/.t." + std::to_string(next_id());
  int fd = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  (void)!::write(fd, value.data(), value.size());
  ::fchmod(fd, 0644);
  ::close(fd);
  if (::syscall(SYS_renameat2, AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), 1u) != 0)
    ::unlink(tmp.c_str());
}
std::string bare_read(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  return std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
}

bench::registrar fs_insert{
    {"kv/filesystem/insert",
     bench::timed([](std::size_t) { fs_kv().insert("ins/" + std::to_string(next_id()), "value"); }),
     "bare open+write+close+renameat2", bench::timed([](std::size_t) {
       bare_publish_once(bare_dir() + "/ins%2F/" + std::to_string(next_id()), "value");
     }),
     latency}};

bench::registrar fs_get{{"kv/filesystem/get existing", bench::timed([](std::size_t) {
                           if (!fs_kv().get("existing", std::chrono::milliseconds(0))) std::abort();
                         }),
                         "bare open+read+close", bench::timed([](std::size_t) {
                           if (bare_read(bare_dir() + "/list16%2F/100").empty()) std::abort();
                         }),
                         latency}};

bench::registrar fs_list{{"kv/filesystem/list 16", bench::timed([](std::size_t) {
                            if (fs_kv().list("list16").size() != 16) std::abort();
                          }),
                          "bare 2 readdirs + 16 x open+read+close", bench::timed([](std::size_t) {
                            DIR* d = ::opendir(bare_dir().c_str());
                            std::size_t n = 0;
                            while (dirent* e = ::readdir(d)) {  // scan all, enter the prefix's
                              if (std::strcmp(e->d_name, "list16%2F") != 0) continue;
                              const std::string sub = bare_dir() + "/" + e->d_name;
                              DIR* s = ::opendir(sub.c_str());
                              while (dirent* f = ::readdir(s))
                                if (f->d_name[0] != '.' &&
                                    !bare_read(sub + "/" + f->d_name).empty())
                                  ++n;
                              ::closedir(s);
                            }
                            if (n != 16) std::abort();
                            ::closedir(d);
                          }),
                          latency}};

// The floor for a file wake-up: inotify on the directory, a file created in another process.
double bare_inotify_wakeup() {
  std::string name = bare_dir() + "/wake-" + std::to_string(next_id());
  int in = ::inotify_init1(IN_CLOEXEC);
  ::inotify_add_watch(in, bare_dir().c_str(), IN_CREATE | IN_MOVED_TO);
  double r = cross_process_wakeup(
      [&] {
        pollfd p{in, POLLIN, 0};
        ::poll(&p, 1, 10000);
      },
      [&] { ::close(::open(name.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644)); },
      std::chrono::milliseconds(5));
  ::close(in);
  return r;
}

template <class Kv>
double kv_wakeup(Kv& kv, std::chrono::milliseconds settle) {
  std::string key = "wake/" + std::to_string(next_id());
  return cross_process_wakeup([&] { kv.get(key, std::chrono::seconds(10)); },
                              [&] { kv.insert(key, "go"); }, settle);
}

bench::registrar fs_wake{
    {"kv/filesystem/wake-up (inotify, fork)",
     [](std::size_t) { return kv_wakeup(fs_kv(), std::chrono::milliseconds(5)); },
     "bare inotify wake-up (fork)", [](std::size_t) { return bare_inotify_wakeup(); }, wakeup}};

bench::registrar nfs_wake{{"kv/filesystem/wake-up (poll_wait, fork)",
                           [](std::size_t) {
                             // the poll interval has backed off to its 100 ms cap by now
                             return kv_wakeup(nfs_kv(), std::chrono::milliseconds(300));
                           },
                           "bare inotify wake-up (fork)",
                           [](std::size_t) { return bare_inotify_wakeup(); },
                           bench::config{1, 15, 1, 0}}};

// ---- etcd ------------------------------------------------------------------------------------

bool have_etcd() { return ::access(holdfast_test::etcd_binary().c_str(), X_OK) == 0; }

holdfast_test::etcd_server& etcd() {
  static holdfast_test::etcd_server s;
  return s;
}
holdfast::etcd_kv& etcd_store() {
  static holdfast::etcd_kv kv = [] {
    holdfast::etcd_options o;
    o.endpoints = {etcd().url()};
    holdfast::etcd_kv k(o, kv_namespace("bench", 0));
    seed(k);
    return k;
  }();
  return kv;
}

// A raw TCP connection to the plain etcd (what the bare baselines talk over).
int connect_etcd() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(etcd().port());
  ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  return fd;
}

// One JSON POST over a raw socket: connect, send, read to EOF (Connection: close).
std::string bare_post(const std::string& target, const std::string& body) {
  int fd = connect_etcd();
  std::string req =
      "POST " + target + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(etcd().port()) +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n\r\n" + body;
  (void)!::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[16384];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}
std::string b64q(const std::string& s);
// Blocks on a bare watch of `key` until an event arrives (or the stream ends).
void bare_watch(const std::string& key) {
  int fd = connect_etcd();
  std::string body =
      "{\"create_request\":{\"key\":\"" + holdfast::detail::base64_encode(key) + "\"}}";
  std::string req = "POST /v3/watch HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  (void)!::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string in;
  char buf[4096];
  ssize_t n;
  while (in.find("\"events\"") == std::string::npos && (n = ::recv(fd, buf, sizeof buf, 0)) > 0)
    in.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
}
std::string bare_txn_insert(const std::string& key) {
  std::string k = b64q(key);
  return bare_post("/v3/kv/txn", "{\"compare\":[{\"target\":\"CREATE\",\"key\":" + k +
                                     ",\"createRevision\":\"0\"}],\"success\":[{\"requestPut\":{"
                                     "\"key\":" +
                                     k + ",\"value\":" + b64q("value") + "}}]}");
}
std::string b64q(const std::string& s) { return "\"" + holdfast::detail::base64_encode(s) + "\""; }

// etcd's own CPU time (utime + stime of its process, all threads, from /proc/<pid>/stat) per
// request over `n` requests of one client: the service time handler/simulated's etcd server
// is given (scale_model_bench.cpp). Clock ticks are coarse (10 ms), so n is large.
double etcd_cpu_ns() {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(etcd().pid()) + "/stat").c_str(), "r");
  if (!f) std::abort();
  char buf[1024] = {};
  const std::size_t got = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  std::string st(buf, got);
  std::size_t at = st.rfind(')') + 2;  // field 3 (state) on
  unsigned long long utime = 0, stime = 0;
  if (std::sscanf(st.c_str() + at, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                  &stime) != 2)
    std::abort();
  return static_cast<double>(utime + stime) * 1e9 / static_cast<double>(::sysconf(_SC_CLK_TCK));
}
template <class Request>
double etcd_service_ns(Request request) {
  constexpr int n = 4000;
  etcd_store();
  const double c0 = etcd_cpu_ns();
  for (int i = 0; i < n; ++i) request();
  return (etcd_cpu_ns() - c0) / n;
}

std::vector<bench::registrar> etcd_cases() {
  std::vector<bench::registrar> r;
  if (!have_etcd()) {
    std::fprintf(stderr, "kv_bench: /usr/bin/etcd missing (Debian etcd-server): no etcd cases\n");
    return r;
  }
  r.emplace_back(bench::case_def{"kv/etcd/insert", bench::timed([](std::size_t) {
                                   etcd_store().insert("ins/" + std::to_string(next_id()), "value");
                                 }),
                                 "bare POST /v3/kv/txn", bench::timed([](std::size_t) {
                                   bare_txn_insert("holdfast/bench/0/bare/" +
                                                   std::to_string(next_id()));
                                 }),
                                 latency});
  r.emplace_back(bench::case_def{"kv/etcd/get existing", bench::timed([](std::size_t) {
                                   if (!etcd_store().get("existing", std::chrono::milliseconds(0)))
                                     std::abort();
                                 }),
                                 "bare POST /v3/kv/range", bench::timed([](std::size_t) {
                                   bare_post("/v3/kv/range",
                                             "{\"key\":" + b64q("holdfast/bench/0/existing") + "}");
                                 }),
                                 latency});
  r.emplace_back(bench::case_def{
      "kv/etcd/list 16", bench::timed([](std::size_t) {
        if (etcd_store().list("list16").size() != 16) std::abort();
      }),
      "bare POST /v3/kv/range prefix", bench::timed([](std::size_t) {
        bare_post("/v3/kv/range", "{\"key\":" + b64q("holdfast/bench/0/list16/") +
                                      ",\"range_end\":" + b64q("holdfast/bench/0/list160") + "}");
      }),
      latency});
  // The server's CPU per request (see etcd_service_ns), no baseline: one repetition of 4,000.
  const bench::config server{1, 1, 0, 0};
  r.emplace_back(
      bench::case_def{"kv/etcd/server CPU per get",
                      [](std::size_t) {
                        return etcd_service_ns([] {
                          if (!etcd_store().get("existing", std::chrono::milliseconds(0)))
                            std::abort();
                        });
                      },
                      "",
                      {},
                      server});
  r.emplace_back(bench::case_def{"kv/etcd/server CPU per put",
                                 [](std::size_t) {
                                   return etcd_service_ns([] {
                                     etcd_store().put("put/" + std::to_string(next_id() % 64),
                                                      "ack 1002 by 7/0123456789abcdef");
                                   });
                                 },
                                 "",
                                 {},
                                 server});
  r.emplace_back(bench::case_def{"kv/etcd/server CPU per list 16",
                                 [](std::size_t) {
                                   return etcd_service_ns([] {
                                     if (etcd_store().list("list16").size() != 16) std::abort();
                                   });
                                 },
                                 "",
                                 {},
                                 server});
  r.emplace_back(bench::case_def{
      "kv/etcd/wake-up (watch, fork)",
      [](std::size_t) { return kv_wakeup(etcd_store(), std::chrono::milliseconds(20)); },
      "bare POST txn -> raw watch (fork)",
      [](std::size_t) {
        etcd_store();  // started before the fork
        std::string key = "holdfast/bench/0/barewake/" + std::to_string(next_id());
        return cross_process_wakeup([&] { bare_watch(key); }, [&] { bare_txn_insert(key); },
                                    std::chrono::milliseconds(20));
      },
      wakeup});
  return r;
}
std::vector<bench::registrar> etcd_registrars = etcd_cases();

#ifdef HOLDFAST_BENCH_TLS
// ---- etcd over TLS ---------------------------------------------------------------------------

using tls_transport = holdfast_tls::openssl_transport<>;

holdfast_test::etcd_server& tls_etcd() {
  static holdfast_test::etcd_server s(
      holdfast_test::tls_member(holdfast_test::shared_certs().server_cert));
  return s;
}
holdfast::tls_options bench_tls() { return holdfast_test::trusting_ca(); }
holdfast::basic_etcd_kv<holdfast::posix_io, tls_transport>& tls_store() {
  static holdfast::basic_etcd_kv<holdfast::posix_io, tls_transport> kv = [] {
    holdfast::etcd_options o;
    o.endpoints = {tls_etcd().url()};
    o.tls = bench_tls();
    holdfast::basic_etcd_kv<holdfast::posix_io, tls_transport> k(o, kv_namespace("bench", 0));
    seed(k);
    return k;
  }();
  return kv;
}

std::vector<bench::registrar> tls_cases() {
  std::vector<bench::registrar> r;
  if (!have_etcd()) return r;
  r.emplace_back(bench::case_def{"kv/etcd/get/tls", bench::timed([](std::size_t) {
                                   if (!tls_store().get("existing", std::chrono::milliseconds(0)))
                                     std::abort();
                                 }),
                                 "kv/etcd/get existing (plain, reused)",
                                 bench::timed([](std::size_t) {
                                   if (!etcd_store().get("existing", std::chrono::milliseconds(0)))
                                     std::abort();
                                 }),
                                 latency});
  r.emplace_back(
      bench::case_def{"kv/etcd/insert/tls", bench::timed([](std::size_t) {
                        tls_store().insert("ins-tls/" + std::to_string(next_id()), "value");
                      }),
                      "kv/etcd/insert (plain, reused)", bench::timed([](std::size_t) {
                        etcd_store().insert("ins-plain/" + std::to_string(next_id()), "value");
                      }),
                      latency});
  // The cost a pooled connection saves: TCP connect + TLS handshake, against a bare connect.
  r.emplace_back(bench::case_def{
      "kv/etcd/tls handshake (connect + handshake)", bench::timed([](std::size_t) {
        static const tls_transport t(bench_tls());
        static const auto ep = holdfast::detail::parse_endpoint_url(tls_etcd().url());
        auto c = t.connect(ep, std::chrono::milliseconds(5000), "bench", nullptr);
      }),
      "bare TCP connect", bench::timed([](std::size_t) {
        static const auto ep = holdfast::detail::parse_endpoint_url(tls_etcd().url());
        ::close(holdfast::connect_tcp<holdfast::posix_io>(ep, std::chrono::milliseconds(5000),
                                                          "bench", nullptr));
      }),
      bench::config{1, 100, 5, 0}});
  return r;
}
std::vector<bench::registrar> tls_registrars = tls_cases();
#endif

}  // namespace
