// holdfast/kv/etcd.hpp — a kv_store on etcd v3, through its JSON gateway (etcd 3.4+). Include
// this header for all of it; each part lives in kv/etcd/:
//
//   kv/etcd/options.hpp  etcd_options (endpoints, timeouts, lease and leased keys, prefix,
//                        TLS, user),
//                        etcd_stats (the client's counters)
//   kv/etcd/gateway.hpp  the JSON gateway's wire format: stream lines, prefix ranges, int64s,
//                        gRPC codes as errno, token problems, a kv object's decoded value,
//                        request bodies
//   kv/etcd/lease.hpp    detail::etcd_lease: the lease, its keep-alives (bounded per endpoint),
//                        its re-grant and the leased keys put back
//   kv/etcd/client.hpp   detail::etcd_client: endpoint failover, connection reuse,
//                        authentication, the writes (leased ones through the lease)
//   kv/etcd/watch.hpp    the long-lived watch (basic_etcd_kv::watcher): snapshot, one stream,
//                        resume, health probe
//   kv/etcd/kv.hpp       basic_etcd_kv<Io, Transport> (insert, put, try_get, get, list, erase,
//                        erase_prefix, watch), etcd_kv
//
// Each operation is one HTTP POST to one of the configured endpoints (detail/http.hpp); keys
// and values travel base64-encoded in JSON, as the gateway requires. A job's keys live under
// `<prefix>/<run id>/<incarnation>/` in etcd. `basic_etcd_kv<Io, Transport>` makes every
// connection through its Transport (plain_transport<Io> by default; a TLS transport such as
// examples/tls/openssl_transport.hpp for https:// endpoints, with `etcd_options::tls`); with
// `user` and a password file or environment variable the client authenticates and sends the
// token on every request and watch.
//
// Guarantees and caveats: see each part. In short: exactly one of any number of concurrent
// inserters wins; get waits on a watch (no polling) and misses no put; a watch delivers every
// change below its prefix once, in revision order (every event of a revision), starting with a
// complete snapshot, resumes where it stopped and is probed for health; reads fail over to
// another endpoint, writes that were sent never do (their outcome is unknown: a transient
// error); failures throw holdfast::error naming the operation and the key (EAGAIN, ETIMEDOUT,
// ECONNRESET... transient); with a lease, a process's keys below leased_prefix (liveness keys,
// no other) vanish a TTL after it dies, and live while a quorum answers its keep-alives (a lease
// lost to a pause is granted again and the keys put back). Without a TLS transport the traffic and
// a password cross the network in clear text; the lease is not revoked on destruction.
#pragma once

#include "etcd/client.hpp"
#include "etcd/gateway.hpp"
#include "etcd/kv.hpp"
#include "etcd/lease.hpp"
#include "etcd/options.hpp"
#include "etcd/watch.hpp"
