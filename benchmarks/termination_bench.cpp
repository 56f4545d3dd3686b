// Termination: what a training step pays to ask "was there a notice?" (against a bare atomic
// load), what a signal costs with the chaining handler (against a bare sigaction handler), and
// one metadata request through detail/http.hpp (against bare socket calls to the same server).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <holdfast/termination.hpp>
#include <string>

#include "../tests/support/http_server.hpp"
#include "bench.hpp"

namespace {

volatile bool sink;  // keeps the loads from being optimized away
std::atomic<bool> bare_flag{false};

bench::registrar signal_noticed{{"termination/signal_notice.noticed()",
                                 bench::timed([](std::size_t n) {
                                   static holdfast::signal_notice<SIGUSR2> notice;
                                   notice.start();
                                   for (std::size_t i = 0; i < n; ++i) sink = notice.noticed();
                                 }),
                                 "bare atomic<bool> load", bench::timed([](std::size_t n) {
                                   for (std::size_t i = 0; i < n; ++i)
                                     sink = bare_flag.load(std::memory_order_acquire);
                                 })}};

bench::registrar polled_noticed{
    {"termination/polled_notice.noticed()", bench::timed([](std::size_t n) {
       static holdfast::polled_notice notice([] { return false; }, std::chrono::hours(1));
       for (std::size_t i = 0; i < n; ++i) sink = notice.noticed();
     }),
     "bare atomic<bool> load", bench::timed([](std::size_t n) {
       for (std::size_t i = 0; i < n; ++i) sink = bare_flag.load(std::memory_order_acquire);
     })}};

std::atomic<bool> bare_flag2{false};
bench::registrar any_of_noticed{
    {"termination/any_of<signal,file>.noticed()", bench::timed([](std::size_t n) {
       static holdfast::any_of<holdfast::signal_notice<SIGUSR2>, holdfast::file_notice> notice{
           holdfast::signal_notice<SIGUSR2>(),
           holdfast::file_notice("/nonexistent/holdfast-bench", std::chrono::hours(1))};
       for (std::size_t i = 0; i < n; ++i) sink = notice.noticed();
     }),
     "bare 2 atomic<bool> loads", bench::timed([](std::size_t n) {
       for (std::size_t i = 0; i < n; ++i)
         sink = bare_flag.load(std::memory_order_acquire) ||
                bare_flag2.load(std::memory_order_acquire);
     })}};

// A signal delivered to the process: our handler (scan the listener cells, chain to SIG_IGN)
// against a bare SA_SIGINFO handler that stores an atomic.
void bare_handler(int, siginfo_t*, void*) { bare_flag.store(true, std::memory_order_release); }

bench::registrar raise_signal{{"termination/raise(SIGURG) to signal_notice",
                               bench::timed([](std::size_t n) {
                                 holdfast::signal_notice<SIGURG> notice;
                                 notice.start();
                                 for (std::size_t i = 0; i < n; ++i) ::raise(SIGURG);
                                 sink = notice.noticed();
                               }),
                               "bare raise + sigaction handler", bench::timed([](std::size_t n) {
                                 struct sigaction sa {
                                 }, old{};
                                 sa.sa_sigaction = bare_handler;
                                 sa.sa_flags = SA_SIGINFO | SA_RESTART;
                                 sigemptyset(&sa.sa_mask);
                                 ::sigaction(SIGURG, &sa, &old);
                                 for (std::size_t i = 0; i < n; ++i) ::raise(SIGURG);
                                 ::sigaction(SIGURG, &old, nullptr);
                               })}};

holdfast_test::http_server& metadata_server() {
  static holdfast_test::http_server srv(
      [](const holdfast_test::seen_request&) { return holdfast_test::reply(200, "NONE"); });
  return srv;
}

// One GET (connect, send, receive, close) with the same request bytes, by hand.
void bare_get(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  static const std::string req =
      "GET /computeMetadata/v1/instance/maintenance-event HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Metadata-Flavor: Google\r\nConnection: close\r\n\r\n";
  (void)!::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  char buf[512];
  while (::recv(fd, buf, sizeof buf, 0) > 0) {
  }
  ::close(fd);
}

bench::registrar http_get{{"termination/http_call GET loopback", bench::timed([](std::size_t n) {
                             auto ep = holdfast::detail::parse_http_url(metadata_server().url());
                             holdfast::detail::http_request req{
                                 "GET",
                                 "/computeMetadata/v1/instance/maintenance-event",
                                 {{"Metadata-Flavor", "Google"}},
                                 {}};
                             for (std::size_t i = 0; i < n; ++i)
                               sink = holdfast::detail::http_call(ep, req).status == 200;
                           }),
                           "bare socket GET loopback", bench::timed([](std::size_t n) {
                             for (std::size_t i = 0; i < n; ++i) bare_get(metadata_server().port());
                           }),
                           bench::config{0, 9, 1, 50}}};

}  // namespace
