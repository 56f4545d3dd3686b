// A tour of the coordination key-value stores: one function written against the kv_store
// contract, run over the in-process, filesystem and counting stores (etcd needs a server).
#include <stdlib.h>  // mkdtemp

#include <chrono>
#include <filesystem>
#include <holdfast/kv/etcd.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/kv/in_process.hpp>
#include <iostream>
#include <string>

// [snippet]
using namespace std::chrono_literals;

// Any backend: the code that coordinates is written once against the kv_store contract.
template <class Kv>
void claim_and_wait(Kv& kv, int task) {
  if (kv.insert("claim", std::to_string(task)))  // insert-once: exactly one task wins
    std::cout << "task " << task << " claimed\n";
  kv.put("acks/" + std::to_string(task), "ok");
  for (const auto& [key, value] : kv.list("acks"))  // "acks/0", "acks/1", ... sorted
    std::cout << key << " = " << value << "\n";
  if (auto step = kv.get("final_step", 500ms))  // blocks until inserted, or 500 ms
    std::cout << "stop at " << *step << "\n";
}

void tour(const std::string& shared_dir) {
  holdfast::kv_namespace ns("run-42", /*incarnation=*/3);  // a restart uses incarnation 4

  holdfast::in_process_kv threads(ns);  // copies share one store between threads
  claim_and_wait(threads, 0);

  holdfast::filesystem_kv shared(shared_dir, ns);  // on NFS: network_filesystem_kv
  claim_and_wait(shared, 1);

  holdfast::counting_kv<holdfast::in_process_kv> counted(threads);
  claim_and_wait(counted, 2);
  std::cout << counted.counts().to_string() << "\n";  // insert=1 put=1 ... total=4

  holdfast::etcd_options o;
  o.endpoints = {"http://etcd-0:2379", "http://etcd-1:2379"};  // failover in this order
  o.lease_ttl = std::chrono::seconds(10);  // a dead worker's liveness keys vanish 10 s later
  o.leased_prefix = "live";  // only keys below live/; claims and outcomes are never leased
  // holdfast::etcd_kv cluster(o, ns);  claim_and_wait(cluster, 3);
  static_assert(holdfast::check_kv_store<holdfast::etcd_kv>());
}
// [/snippet]

int main() {
  std::string dir = (std::filesystem::temp_directory_path() / "holdfast-tour-kv-XXXXXX").string();
  if (!::mkdtemp(dir.data())) return 1;
  tour(dir);
  std::filesystem::remove_all(dir);
  std::cout << "tour_kv ok\n";
}
