"""torch_kv (packaging/python/holdfast_torch.cpp), the Handler's store over PyTorch's TCPStore:
its operations, its watch (a helper thread blocked in c10d's wait on a clone of the store), its
batched get, and the Handler over it in real worker processes against a real TCPStore server.

    /path/to/venv/bin/python tests/pytorch/test_torch_store.py [name ...]

Exits non-zero when a case fails; the last line is "N passed, M failed". Timing bounds are as
loose as the behaviour they tell apart allows on a loaded 2-core machine.
"""

import datetime
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_store_support as sup  # noqa: E402

hf = sup.load_holdfast()
ext = hf.load_extension()
import torch.distributed as dist  # noqa: E402

CASES, case = sup.case_list()


check = sup.check
readable = sup.readable


class Run:
    """A scratch directory and worker processes, stopped at the end."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="holdfast-torch-store-")
        self.workers = []

    def start(self, port, n, run_id, mode="train", tasks=None, num_tasks=None, **cfg):
        ws = []
        for t in (range(n) if tasks is None else tasks):
            w = sup.Worker(dict(cfg, port=port, task=t, num_tasks=num_tasks or n, run_id=run_id,
                                dir=self.dir, mode=mode))
            ws.append(w)
        self.workers += ws
        for w in ws:
            w.expect("loaded", timeout=120)
        return ws

    def go(self):
        for w in self.workers:
            w.send("go")

    def start_steps(self, delay=0.05):
        start = time.monotonic_ns() + int(delay * 1e9)
        for w in self.workers:
            w.send(f"start {start}")
        return start

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for w in self.workers:
            w.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- the finding the code relies on -----------------------------------------------------------


@case
def timed_out_wait_leaves_no_late_reply():
    """torch 2.x: a wait that timed out, then the key set by another client: the next requests on
    the same client read their own answers (torch 1.13 left the late reply on the socket)."""
    for libuv in (True, False):
        server = sup.start_server(use_libuv=libuv)
        a = sup.connect(server.port, use_libuv=libuv)
        b = sup.connect(server.port, use_libuv=libuv)
        for i in range(10):
            k = f"late/{i}"
            try:
                a.wait([k], datetime.timedelta(milliseconds=50))
                raise AssertionError("wait on a missing key returned")
            except dist.DistStoreError:
                pass
            b.set(k, "late")
            b.set(f"other/{i}", f"v{i}")
            time.sleep(0.005)
            check(a.get(f"other/{i}") == f"v{i}".encode(), f"libuv={libuv}: get misread")
            check(not a.check([f"never/{i}"]), f"libuv={libuv}: check misread")
            check(a.add(f"n/{i}", 7) == 7, f"libuv={libuv}: add misread")
            check(a.compare_set(f"cs/{i}", "", "x") == b"x", f"libuv={libuv}: compareSet misread")
            check(a.multi_get([k]) == [b"late"], f"libuv={libuv}: multiGet misread")


# ---- torch_kv itself ------------------------------------------------------------------------


@case
def operations():
    server = sup.start_server()
    kv = ext._TorchKV(sup.connect(server.port), "ops", 0)
    check(kv.can_watch, "a TCPStore can be cloned: watch supported")
    check(kv.insert("a/b", "one") and not kv.insert("a/b", "two"), "insert-once")
    check(kv.try_get("a/b") == "one" and kv.try_get("a/c") is None, "try_get")
    kv.put("a/c", "three")
    check(kv.get("a/c", 1.0) == "three", "get of a present key")
    t0 = time.monotonic()
    check(kv.get("a/missing", 0.3) is None, "get of a missing key")
    waited = time.monotonic() - t0
    check(0.25 <= waited < 2.0, f"get waited {waited:.3f} s for a 0.3 s timeout")
    other = sup.connect(server.port)
    threading.Timer(0.2, lambda: other.set("holdfast-kv/ops/0/a/late", "late")).start()
    t0 = time.monotonic()
    check(kv.get("a/late", 5.0) == "late", "get of a key set while it waits")
    check(time.monotonic() - t0 < 2.0, "get woke when the key was set")
    check(kv.erase("a/c") and not kv.erase("a/c") and kv.try_get("a/c") is None, "erase")
    try:
        kv.put("a//b", "x")
        raise AssertionError("an invalid key was accepted")
    except hf.Error as e:
        check(e.errno == 22, f"EINVAL for an invalid key, got {e.errno}")


@case
def get_many_names_exactly_the_missing_keys():
    server = sup.start_server()
    kv = ext._TorchKV(sup.connect(server.port), "many", 0)
    for t in (0, 1, 3):
        kv.put(f"ack/{t}", f"a{t}")
    keys = [f"ack/{t}" for t in range(5)]
    check(kv.get_many(keys, 0) == ["a0", "a1", None, "a3", None], "timeout 0: what exists now")
    t0 = time.monotonic()
    got = kv.get_many(keys, 0.3)
    check(got == ["a0", "a1", None, "a3", None], f"after the timeout: {got}")
    check(0.25 <= time.monotonic() - t0 < 2.0, "waited for the timeout")
    other = sup.connect(server.port)
    threading.Timer(0.1, lambda: other.set("holdfast-kv/many/0/ack/2", "a2")).start()
    threading.Timer(0.2, lambda: other.set("holdfast-kv/many/0/ack/4", "a4")).start()
    t0 = time.monotonic()
    got = kv.get_many(keys, 10.0)
    check(got == ["a0", "a1", "a2", "a3", "a4"], f"all present: {got}")
    check(time.monotonic() - t0 < 3.0, "returned once the last key appeared")
    check(kv.get_many([], 1.0) == [], "no keys")


@case
def watch_rings_once_the_followed_key_exists():
    server = sup.start_server()
    kv = ext._TorchKV(sup.connect(server.port), "w", 0, 0.01, 0.3)  # 0.3 s slices
    other = sup.connect(server.port)
    w = kv.watch("ctl")
    check(w.buffered() and w.take(), "the first take reports resync")
    check(w.due_in() is None, "nothing due while nothing is followed")
    w.follow("ctl/r0/claim")
    check(not readable(w.fd(), 1.0), "quiet while the key is missing (over several slices)")
    check(w.due_in() is None, "nothing due while the thread waits for the followed key")
    t0 = time.monotonic()
    other.set("holdfast-kv/w/0/ctl/r0/claim", "c")
    check(readable(w.fd(), 5.0), "readable once the key exists")
    woke = time.monotonic() - t0
    check(w.take() and not w.take(), "one resync per ring")
    check(kv.try_get("ctl/r0/claim") == "c", "the woken key reads back (the watch's read)")
    check(not readable(w.fd(), 0.3), "quiet after the ring until the next follow")
    w.follow("ctl/r0/claim")
    check(readable(w.fd(), 5.0) and w.take(), "following a present key rings at once")
    # what the watch read is for the next try_get of that key only until the next follow()
    other.delete_key("holdfast-kv/w/0/ctl/r0/claim")
    w.follow("ctl/r0/step")
    check(kv.try_get("ctl/r0/claim") is None, "a follow() drops what the last wake-up read")
    # insert (compareSet) wakes it too, on the libuv server and the classic one
    for libuv in (True, False):
        s2 = sup.start_server(use_libuv=libuv)
        kv2 = ext._TorchKV(sup.connect(s2.port, use_libuv=libuv), "w", 0, 0.01, 30.0)
        writer = ext._TorchKV(sup.connect(s2.port, use_libuv=libuv), "w", 0)
        w2, tid = sup.watch_and_thread(kv2, "ctl")
        w2.take()
        w2.follow("ctl/r1/claim")
        sup.wait_asleep_in({tid}, what="the watch thread in its wait")  # before the insert
        check(writer.insert("ctl/r1/claim", "c"), "inserted")
        check(readable(w2.fd(), 5.0), f"an insert woke the watch (libuv={libuv})")
        w2.close()
    print(f"    woke {woke * 1e3:.1f} ms after the set")


@case
def watch_polls_while_its_thread_waits_for_a_replaced_key():
    server = sup.start_server()
    kv = ext._TorchKV(sup.connect(server.port), "s", 0, 0.01, 1.0)
    w, tid = sup.watch_and_thread(kv, "ctl")
    w.take()
    w.follow("ctl/a")
    sup.wait_asleep_in({tid}, what="the watch thread in its wait for ctl/a")
    w.follow("ctl/b")  # the thread is still in its wait for ctl/a (up to 1 s)
    due = w.due_in()
    check(due is not None and due <= 0.05, f"due while the thread cannot wait for ctl/b: {due}")
    # the poll interval (10 ms) since the last take() passes while the thread's wait for ctl/a
    # (a 1 s slice) goes on
    sup.eventually(lambda: w.due_in() == 0, timeout=0.5, what="due within the poll interval")
    check(w.take(), "resync when due")
    sup.connect(server.port).set("holdfast-kv/s/0/ctl/b", "b")
    check(readable(w.fd(), 3.0), "the thread takes ctl/b after its slice and rings")
    check(w.due_in() is None, "quiet again once it waits for the followed key")


@case
def idle_watch_costs_two_requests_per_slice_and_closes_at_once():
    server = sup.start_server()
    proxy = sup.CountingProxy(server.port)
    checks, wait = proxy.calibrate()
    check(checks == 20 and wait == 2, f"calibration: 20 checks counted {checks}, a timed-out "
          f"wait {wait} (expected 2)")
    kv = ext._TorchKV(sup.connect(proxy.port), "idle", 0, 0.01, 0.25)
    w, tid = sup.watch_and_thread(kv, "ctl")
    w.take()
    w.follow("ctl/r0/claim")
    sup.wait_asleep_in({tid}, what="the watch thread in its first wait")  # its WAIT is counted
    r0, _ = proxy.counts()
    time.sleep(2.0)
    r1, _ = proxy.counts()
    slices = 2.0 / 0.25
    check(2 * slices - 4 <= r1 - r0 <= 2 * slices + 4,
          f"{r1 - r0} requests in 2 s of 0.25 s slices (expected about {2 * slices:.0f})")
    w.close()
    # close() while the thread has a whole slice of its wait left: joining it would take the
    # slice (10 s), not waiting takes none; the bound is a fifth of the slice
    slice_s = 10.0
    kv = ext._TorchKV(sup.connect(server.port), "close", 0, 0.01, slice_s)
    w, tid = sup.watch_and_thread(kv, "ctl")
    w.take()
    w.follow("ctl/r0/claim")
    sup.wait_asleep_in({tid}, what="the watch thread in its wait")
    t0 = time.monotonic()
    w.close()
    took = time.monotonic() - t0
    check(took < slice_s / 5, f"closing a watch took {took:.3f} s: it waited for its thread "
          f"(in a {slice_s:.0f} s slice; bound {slice_s / 5:.0f} s)")


def forwarding_store(inner):
    """A Python dist.Store class whose operations forward to `inner`, without clone() (torch's
    pure virtual there): a base for stores that change one operation."""

    class Forwarding(dist.Store):
        def set(self, k, v):
            inner.set(k, v)

        def get(self, k):
            return inner.get(k)

        def check(self, keys):
            return inner.check(keys)

        def compare_set(self, k, expected, desired):
            return inner.compare_set(k, expected, desired)

        def delete_key(self, k):
            return inner.delete_key(k)

        def wait(self, keys, timeout=None):
            return inner.wait(keys, timeout) if timeout else inner.wait(keys)

        def multi_get(self, keys):
            return inner.multi_get(keys)

    return Forwarding


@case
def store_without_clone_has_no_watch_but_gets():
    server = sup.start_server()
    inner = sup.connect(server.port)

    class NoClone(forwarding_store(inner)):  # clone() not implemented: torch's pure virtual
        pass

    store = NoClone()  # kept: torch's trampoline needs its Python object alive
    kv = ext._TorchKV(store, "nc", 0)
    check(not kv.can_watch, "no clone(): no watch")
    kv.put("k/1", "v")
    check(kv.get_many(["k/1", "k/2"], 0.2) == ["v", None], "get_many by polling check()")
    check(kv.get("k/1", 0.1) == "v", "get by polling check()")
    check(kv.try_get("k/1") == "v" and kv.try_get("k/2") is None, "try_get: check, then get")


@case
def try_get_answers_through_prefix_and_hash_stores_and_wakes_no_watch():
    server = sup.start_server()
    stores = {"tcp": sup.connect(server.port),
              "prefix": dist.PrefixStore("a", dist.PrefixStore("b", sup.connect(server.port))),
              "hash": dist.HashStore()}
    for name, store in stores.items():
        kv = ext._TorchKV(store, "tg", 0)
        kv.put("x/1", "one")
        kv.put("x/empty", "")
        check(kv.try_get("x/1") == "one", f"{name}: a present key")
        check(kv.try_get("x/empty") == "", f"{name}: an empty value")
        check(kv.try_get("x/2") is None, f"{name}: a missing key")
        check(kv.try_get("x/2") is None and kv.insert("x/2", "two"),
              f"{name}: try_get wrote nothing")
    # a try_get of a missing key must not wake a watch following it (the libuv server wakes a
    # key's waiters on any compareSet of it, so try_get must not be one)
    kv = ext._TorchKV(stores["tcp"], "tg", 0)
    w, tid = sup.watch_and_thread(kv, "ctl")
    w.take()
    w.follow("ctl/k")
    sup.wait_asleep_in({tid}, what="the watch thread in its wait")  # before the try_gets
    for _ in range(3):
        check(kv.try_get("ctl/k") is None, "missing")
    check(not readable(w.fd(), 0.3), "a try_get woke the watch")


@case
def try_get_of_a_key_erased_after_its_check_does_not_block():
    """A key erased between try_get's check and its read (a round's keys cleaned up meanwhile):
    nothing, at once. c10d's get() is a wait for the key, then a read: it blocks until the
    store's timeout (10 s here), which try_get must not."""
    server = sup.start_server()
    inner = sup.connect(server.port, timeout=10)

    class EraseAfterCheck(forwarding_store(inner)):  # check(), then the key .erase names goes
        erase = None

        def check(self, keys):
            present = inner.check(keys)
            if present and self.erase in keys:
                inner.delete_key(self.erase)
            return present

    store = EraseAfterCheck()  # kept: torch's trampoline needs its Python object alive
    kv = ext._TorchKV(store, "race", 0)
    kv.put("k/1", "one")
    check(kv.try_get("k/1") == "one", "a present key reads")
    store.erase = "holdfast-kv/race/0/k/1"
    t0 = time.monotonic()
    try:
        got = kv.try_get("k/1")
    except hf.Error as e:  # the old check-then-get: DistStoreError after the store's timeout
        got = e
    took = time.monotonic() - t0
    check(got is None, f"a key erased after the check: {got!r}, not None")
    check(took < 3.0, f"try_get took {took:.2f} s: it waited for the erased key")
    check(not inner.check(["holdfast-kv/race/0/k/1"]), "try_get wrote nothing")
    store.erase = None
    kv.put("k/1", "again")
    check(kv.try_get("k/1") == "again", "the key put again reads")


# ---- the Handler over the store, in worker processes ------------------------------------------


@case
def idle_handlers_send_at_most_one_request_per_second():
    server = sup.start_server()
    proxy = sup.CountingProxy(server.port)
    checks, wait = proxy.calibrate()
    check(checks == 20 and wait == 2, f"calibration: {checks} for 20 checks, {wait} for a wait")
    with Run() as run:
        ws = run.start(proxy.port, 4, "idle", step=0.01, watch_stop=True)
        loaded = {w.proc.pid: sup.thread_ids(w.proc.pid) for w in ws}  # before the Handlers
        run.go()
        for w in ws:
            w.expect("ready", timeout=60)
        run.start_steps()
        # the start-up traffic is over once the threads each worker started since "loaded"
        # (the handler's watcher, polling its descriptors, and torch_kv's watch threads, one
        # per followed key, each in c10d's wait: the claim and ctl/hang, hang_policy="report")
        # are all asleep in poll(), three of them at least (the second watch thread connects
        # its own client first)
        for w in ws:
            pid = w.proc.pid
            sup.wait_asleep_in(lambda: sup.thread_ids(pid) - loaded[pid], pid=pid, count=3,
                               every=True,
                               what=f"task {w.task}: its watcher and its two watch threads")
        r0, b0 = proxy.counts()
        window = 32.0  # more than one 30 s slice of every watch: its WAIT and CANCEL_WAIT
        time.sleep(window)
        r1, b1 = proxy.counts()
        with open(os.path.join(run.dir, "stop"), "w"):
            pass
        rate = (r1 - r0) / (4 * window)
        print(f"    idle: {r1 - r0} requests ({b1 - b0} bytes) from 4 workers in {window:.0f} s: "
              f"{rate:.3f} requests per worker-second")
        check(rate <= 1.0, f"{rate:.3f} requests per worker-second (bound 1)")


@case
def notice_reaches_the_claim_and_all_save_at_one_step():
    server = sup.start_server()
    observer = sup.connect(server.port)
    latencies = []
    runs = 5
    # the notice wakes the noticed worker's watcher, which writes the claim at once; a watcher
    # that looked for it every watch_interval instead would take half of it on average
    watch_interval = 10.0
    with Run() as run:
        ws = run.start(server.port, 4, "notice", reps=runs, step=0.005,
                       watch_interval=watch_interval)
        for rep in range(runs):
            run.go()
            for w in ws:
                w.expect("ready", timeout=60)
            run.start_steps()
            time.sleep(0.3)
            noticed = ws[rep % 4]
            key = sup.claim_key(f"notice-{rep}")
            t0 = time.monotonic_ns()
            noticed.signal(signal.SIGTERM)
            observer.wait([key], datetime.timedelta(seconds=10))
            latencies.append((time.monotonic_ns() - t0) / 1e6)
            saved = [w.expect("saved", timeout=30) for w in ws]
            steps = {e["step"] for e in saved}
            check(len(steps) == 1 and None not in steps, f"run {rep}: saved at steps {steps}")
    median = statistics.median(latencies)
    print(f"    notice -> claim in the store: median {median:.1f} ms, runs "
          f"{', '.join(f'{x:.1f}' for x in latencies)} ms")
    bound = watch_interval / 5 * 1e3
    check(max(latencies) <= bound, f"notice -> claim up to {max(latencies):.1f} ms (bound "
          f"{bound:.0f} ms, a fifth of the {watch_interval:.0f} s watch_interval)")


@case
def close_while_idle_takes_under_a_second():
    server = sup.start_server()
    with Run() as run:
        ws = run.start(server.port, 2, "close", mode="close", idle=1.5, step=0.01)
        run.go()
        for w in ws:
            w.expect("ready", timeout=60)
        for w in ws:
            e = w.expect("closed", timeout=30)
            print(f"    task {w.task}: close() took {e['close_s'] * 1e3:.1f} ms")
            check(e["close_s"] <= 1.0, f"close() took {e['close_s']:.3f} s")
        for w in ws:  # and the process ends although a watch thread may still be in its wait
            w.expect("done", timeout=10)
            t0 = time.monotonic()
            check(w.proc.wait(timeout=10) == 0, "the worker exited cleanly")
            check(time.monotonic() - t0 < 5, "the worker exited promptly")


@case
def a_killed_worker_is_named_by_the_survivors():
    server = sup.start_server()
    ack_timeout = 3.0
    with Run() as run:
        ws = run.start(server.port, 4, "dead", ack_timeout=ack_timeout, step=0.005)
        run.go()
        for w in ws:
            w.expect("ready", timeout=60)
        run.start_steps()
        time.sleep(0.3)
        ws[3].proc.kill()
        ws[3].proc.wait()
        t0 = time.monotonic_ns()
        ws[0].signal(signal.SIGTERM)
        for w in ws[:3]:
            e = w.expect("timeout", "saved", timeout=30)
            check(e["ev"] == "timeout", f"task {w.task}: {e}")
            check(e["missing"] == [3], f"task {w.task} names {e['missing']}, not [3]")
            took = (e["t"] - t0) / 1e9
            print(f"    task {w.task}: AgreementTimeout naming [3] after {took:.2f} s")
            check(took <= ack_timeout + 2.0, f"task {w.task}: {took:.2f} s after the notice")


@case
def a_worker_that_never_starts_is_named_at_the_restore_agreement():
    server = sup.start_server()
    restore_timeout = 3.0  # the start's wait has its own bound (ack_timeout is not it)
    with Run() as run:
        ws = run.start(server.port, 3, "absent", tasks=[0, 1, 2], num_tasks=4,
                       restore_timeout=restore_timeout)
        t0 = time.monotonic_ns()
        run.go()
        for w in ws:
            e = w.expect("timeout", "ready", timeout=30)
            check(e["ev"] == "timeout", f"task {w.task}: {e}")
            check(e["missing"] == [3], f"task {w.task} names {e['missing']}, not [3]")
            took = (e["t"] - t0) / 1e9
            check(took <= restore_timeout + 3.0, f"task {w.task}: {took:.2f} s after the start")


if __name__ == "__main__":
    sup.exit_now(sup.run_cases(CASES, sys.argv[1:]))
