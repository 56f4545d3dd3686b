"""Notice -> every worker saved, through PyTorch's TCPStore (the extension's torch_kv), against a
bare broadcast through the same store.

    /path/to/venv/bin/python benchmarks/torch_store_bench.py [--reps 5] [--workers 4,16] [--tsv]

Case: W worker processes (tests/pytorch/torch_store_support.py) each run the extension's
Handler (preset generic, store="torch") over one TCPStore server, training in lockstep on a
shared 1 ms step grid, as handler_bench's process rows do; task 0 gets SIGTERM in the middle of
the 21st step; the time from the signal to the last worker's save (its save callback starts).
Baseline: W processes with a client of the same server each: task 0 waits for SIGTERM in
sigwait and sets one key; the others are blocked in wait([key]) on their own client; the time
from the signal to the last one awake. The same store operations bare, no agreement.

With --service-time it measures instead what the simulated store of
benchmarks/scale_model_bench.cpp (handler/simulated) is given: the TCPStore server's CPU time per
request. A server process (TCPStore, is_master) and C client processes that each send R
requests (get of an existing key, set, and multi_get of 64 keys); the server's CPU time
(/proc/<pid>/stat utime + stime, its libuv loop serves one request at a time) over the
requests it served. Prints `tcpstore/service <op>: <ns> ns/request`.

Each repetition has fresh keys (a run id per repetition); worker processes are started once
per row and kept (a torch import costs seconds), and report their times 200 ms after the
notice, so that no report competes with the workers still on their way. Case and baseline
repetitions alternate, after one warm-up each. Prints `case<TAB>median_ns<TAB>baseline<TAB>baseline_median_ns<TAB>ratio`
rows with --tsv, as the C++ benchmarks do; else a table with the minimum as well.
"""

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "pytorch"))
import torch_store_support as sup  # noqa: E402

STEP = 0.001  # the training step of the case's workers (handler_bench's process rows: 1 ms)


class Pool:
    """W worker processes of one mode, kept for every repetition of a row."""

    def __init__(self, port, w, mode, reps, scratch, run_id):
        self.workers = [
            sup.Worker(dict(port=port, task=t, num_tasks=w, run_id=run_id, dir=scratch,
                            mode=mode, reps=reps, step=STEP, ack_timeout=60.0, pause=True,
                            quiet=True))
            for t in range(w)
        ]
        for k in self.workers:
            k.expect("loaded", timeout=600)

    def rep(self, lockstep):
        """One notice -> all saved: ns from SIGTERM to task 0 until the last worker's report."""
        for k in self.workers:
            k.send("go")
        for k in self.workers:
            k.expect("ready", timeout=120)
        if lockstep:  # 20 lockstep steps, then the notice in the middle of the 21st
            start = time.monotonic_ns() + 50_000_000
            for k in self.workers:
                k.send(f"start {start}")
            until = start + int(20.5 * STEP * 1e9)
            time.sleep(max(0, until - time.monotonic_ns()) / 1e9)
        else:
            time.sleep(0.05)  # every waiter is in its wait
        t0 = time.monotonic_ns()
        self.workers[0].signal(signal.SIGTERM)
        time.sleep(0.2)  # the workers report their times afterwards, not while others work
        for k in self.workers:
            k.send("report")
        last = 0
        steps = set()
        for k in self.workers:
            e = k.expect("saved", timeout=120)
            last = max(last, e["t"])
            steps.add(e.get("step"))
        if lockstep and len(steps) != 1:
            raise RuntimeError(f"the workers saved at different steps: {steps}")
        return last - t0

    def stop(self):
        for k in self.workers:
            k.stop()


def row(server_port, w, reps, scratch):
    case = Pool(server_port, w, "train", reps + 1, os.path.join(scratch, f"case-{w}"),
                f"bench-{w}")
    bare = Pool(server_port, w, "bare", reps + 1, os.path.join(scratch, f"bare-{w}"),
                f"bare-{w}")
    try:
        a, b = [], []
        for i in range(reps + 1):  # the first of each: warm-up
            x = case.rep(lockstep=True)
            y = bare.rep(lockstep=False)
            if i > 0:
                a.append(x)
                b.append(y)
        return a, b
    finally:
        case.stop()
        bare.stop()


def _server_cpu_ns(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1e9 / os.sysconf("SC_CLK_TCK")


def _client(port, op, n, keys):
    import datetime
    from torch.distributed import TCPStore
    c = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    for i in range(n):
        if op == "get":
            c.get("k0")
        elif op == "set":
            c.set(f"s{os.getpid()}/{i}", b"step 1003 by 7/0123456789abcdef")
        else:
            c.multi_get(keys)


def service_time(clients, n):
    """The TCPStore server's CPU time per request, per kind of request."""
    import datetime
    import multiprocessing as mp
    import subprocess
    code = ("import datetime,sys,time\nfrom torch.distributed import TCPStore\n"
            "s = TCPStore('127.0.0.1', 0, is_master=True, "
            "timeout=datetime.timedelta(seconds=600))\n"
            "print(s.port, flush=True)\nsys.stdin.read()\n")
    srv = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline())
        from torch.distributed import TCPStore
        c = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
        keys = [f"m/{i}" for i in range(64)]
        for k in keys + ["k0"]:
            c.set(k, b"ack 1002 by 7/0123456789abcdef")
        ctx = mp.get_context("spawn")
        for op in ("get", "set", "multi_get64"):
            t0 = _server_cpu_ns(srv.pid)
            ps = [ctx.Process(target=_client, args=(port, op, n, keys)) for _ in range(clients)]
            for q in ps:
                q.start()
            for q in ps:
                q.join()
            # a client's connect and handshake are a few requests more: negligible against n
            per = (_server_cpu_ns(srv.pid) - t0) / (clients * n)
            print(f"tcpstore/service {op}: {per:.0f} ns/request ({clients} clients x {n})")
    finally:
        srv.stdin.close()
        srv.wait(timeout=30)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--service-time", action="store_true",
                   help="measure the server's CPU time per request instead (see above)")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--workers", default="4,16")
    p.add_argument("--tsv", action="store_true")
    args = p.parse_args()
    if args.service_time:
        service_time(args.clients, args.requests)
        return 0
    sup.load_holdfast()
    server = sup.start_server()
    scratch = tempfile.mkdtemp(prefix="holdfast-torch-bench-", dir="/dev/shm"
                               if os.path.isdir("/dev/shm") else None)
    rows = []
    try:
        for w in (int(x) for x in args.workers.split(",")):
            for sub in ("case", "bare"):
                os.makedirs(os.path.join(scratch, f"{sub}-{w}"), exist_ok=True)
            a, b = row(server.port, w, args.reps, scratch)
            rows.append((f"torch_store/notice->saved/processes/tcpstore/{w}", a,
                         f"bare broadcast/wait/processes/tcpstore/{w}", b))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name, a, bname, b in rows:
        ma, mb = statistics.median(a), statistics.median(b)
        if args.tsv:
            print(f"{name}\t{ma:.0f}\t{bname}\t{mb:.0f}\t{ma / mb:.2f}")
        else:
            print(f"{name:50s} median {ma / 1e6:8.2f} ms  min {min(a) / 1e6:8.2f} ms\n"
                  f"  {bname:48s} median {mb / 1e6:8.2f} ms  min {min(b) / 1e6:8.2f} ms"
                  f"  ratio {ma / mb:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
