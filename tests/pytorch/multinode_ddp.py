#!/usr/bin/env python3
"""multinode_ddp — the PyTorch job across two nodes (issue 33 item 3), as tests/pytorch/run.sh
runs it:

    python tests/pytorch/multinode_ddp.py --harness build/pytorch-tools/multinode_up --kv etcd
    python tests/pytorch/multinode_ddp.py --harness build/pytorch-tools/multinode_up --kv torch

The nodes are network namespaces made by the C++ harness (tests/support/multinode.hpp, through
its tool tests/support/multinode_up.cpp: it prints the nodes, their addresses and the 3-member
etcd as JSON and tears everything down when its stdin closes, so also when this driver dies).
Each node runs the real torchrun (`ip netns exec <node> torchrun --nnodes=2 --nproc-per-node=2
--node-rank=K --master-addr=<node 0> --master-port=P --max-restarts=1`, static rendezvous: node
0's agent hosts the TCPStore), with examples/pytorch/preemptible_ddp.py's worker: 4 workers, DDP
over gloo, holdfast's handler on each step.

--kv etcd (holdfast over the 3-member etcd, all three endpoints):
  phase 0  both nodes launched; SIGTERM to node 1's torchrun (a preempted node 1): all 4 workers
           save at one agreed step S1 and exit 42.
  phase 1  node 0's agent restarts its group (TORCHELASTIC_RESTART_COUNT=1) and node 1 is
           relaunched alone (a fresh torchrun, restart 0): the 4 workers form one group, agree
           on one launch number and restore S1 (the case that fails when each node names its
           launch by its own restart count). Then SIGTERM to node 0's torchrun (the node hosting
           the TCPStore): all 4 save at one step S2 and exit 42; node 0's agent, and with it the
           store, is gone, so node 1's agent cannot restart its group: the driver stops it, as
           a scheduler tearing the job down does.
  phase 2  both nodes relaunched: the 4 workers restore S2 and finish.
  Checks: one agreed step per phase, each worker saved once per phase; every restart restored
  that step; every step ran exactly once on every worker; the final model and optimizer state
  equal the uninterrupted job's (computed in this process), bit for bit.

--kv torch (the handler's store is the job's own c10d store, the TCPStore on node 0): SIGTERM to
node 0's torchrun, and what follows is checked against what examples/pytorch/README.md says.

Prints a timeline and `verdict: PASS` or `verdict: FAIL` (exit status 0 only on PASS). Where the
harness cannot make namespaces: a failure with CI=true, else `verdict: SKIP` (exit 0).
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(REPO, "examples", "pytorch")
sys.path.insert(0, EXAMPLE)  # preemptible_ddp's definitions (holdfast_torch is installed)

NODES = 2
PER_NODE = 2
WORKERS = NODES * PER_NODE
MASTER_PORT = 29400
PHASE_TIMEOUT = 150.0  # seconds: a bound on each wait (a hang is a failure, not a wait)
CASE_TIMEOUT = 300.0   # seconds: a bound on all of a case's waits together
_CASE_DEADLINE = time.monotonic() + CASE_TIMEOUT


class Timeline:
    def __init__(self):
        self.t0 = time.time()

    def __call__(self, text):
        sys.stdout.flush()
        os.write(1, f"[{time.time() - self.t0:7.3f} s] {text}\n".encode())


class Harness:
    """The nodes: multinode_up's JSON; close() (or this process's death) tears them down."""

    def __init__(self, tool):
        self.proc = subprocess.Popen([tool, str(NODES)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.info = json.loads(self.proc.stdout.readline() or '{"error": "no output"}')

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Job:
    """The torchrun agents of one run directory, one per node and launch."""

    def __init__(self, a, hx, tl):
        self.a, self.hx, self.tl = a, hx, tl
        self.procs = {}  # (node, launch) -> Popen of torchrun
        nodes = hx.info["nodes"]
        self.master = nodes[0]["address"]
        self.torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")

    def launch(self, node, launch):
        n = self.hx.info["nodes"][node]
        a = self.a
        cmd = ["ip", "netns", "exec", n["ns"], self.torchrun, f"--nnodes={NODES}",
               f"--nproc-per-node={PER_NODE}", f"--node-rank={node}",
               f"--master-addr={self.master}", f"--master-port={MASTER_PORT}",
               "--max-restarts=1", "--monitor-interval=0.2",
               os.path.join(EXAMPLE, "preemptible_ddp.py"), "--worker", "--label", "run",
               "--dir", a.dir, "--steps", str(a.steps), "--seed", str(a.seed), "--kv", a.kv_url,
               "--grace", "0", "--t0", repr(self.tl.t0), "--preset", "generic",
               "--device", "cpu", "--launch", str(launch)]
        env = dict(os.environ, GLOO_SOCKET_IFNAME=n["interface"])
        log = open(os.path.join(a.dir, f"torchrun-node{node}-launch{launch}.log"), "w")
        self.procs[(node, launch)] = subprocess.Popen(cmd, env=env, stdout=log,
                                                      stderr=subprocess.STDOUT)
        log.close()
        self.tl(f"driver: launch {launch}: torchrun on node {node} ({n['ns']}, {n['address']}, "
                f"--node-rank={node}, pid {self.procs[(node, launch)].pid})")
        return self.procs[(node, launch)]

    def running(self):
        return [k for k, p in self.procs.items() if p.poll() is None]

    def kill_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def read_events(a):
    out = []
    for r in range(WORKERS):
        p = os.path.join(a.dir, "events", f"run-rank-{r}.jsonl")
        if os.path.exists(p):
            with open(p) as f:
                out += [json.loads(line) for line in f if line.strip()]
    return out


def read_progress(a, rank):
    """(pid, launch, restart, step) of worker `rank`'s last step, or None."""
    try:
        with open(os.path.join(a.dir, "progress", f"run-rank-{rank}")) as f:
            pid, code, step = (int(v) for v in f.read().split())
        return pid, code // 100, code % 100, step
    except (OSError, ValueError):
        return None


def wait_until(what, pred, timeout, tl, poll=0.02):
    """Waits (bounded) for an observed state: a progress file, an event, a process's exit."""
    deadline = min(time.monotonic() + timeout, _CASE_DEADLINE)
    while not pred():
        if time.monotonic() > deadline:
            tl(f"driver: TIMEOUT after {timeout:.0f} s waiting for {what}")
            return False
        time.sleep(poll)  # polls files and processes the workers change
    return True


def of_phase(events, kind, pairs):
    """Events of `kind` whose (launch, restart) is one of `pairs` (per node: {rank: pair})."""
    return [e for e in events
            if e["kind"] == kind and (e["launch"], e["restart"]) == pairs[e["rank"]]]


def step_counts(a):
    counts = []
    for r in range(WORKERS):
        c = [0] * a.steps
        p = os.path.join(a.dir, "steps", f"run-rank-{r}.log")
        if os.path.exists(p):
            with open(p) as f:
                for line in f:
                    s = int(line)
                    if 0 <= s < a.steps:
                        c[s] += 1
        counts.append(c)
    return counts


class Checks:
    def __init__(self):
        self.ok = []

    def __call__(self, ok, text):
        self.ok.append(bool(ok))
        print(f"check: {text}{'' if ok else '  <-- FAIL'}", flush=True)
        return ok


def preempt_when(job, a, tl, node, launch, rank, pair, target):
    """SIGTERMs node `node`'s torchrun of `launch` once worker `rank` (running as `pair`) has
    run step `target`; returns (step it had run, time sent) or None."""
    proc = job.procs[(node, launch)]
    seen = {}

    def reached():
        p = read_progress(a, rank)
        if p and (p[1], p[2]) == pair and p[3] >= target:
            seen["step"] = p[3]
            return True
        return proc.poll() is not None  # the launch ended first: reported below

    if not wait_until(f"worker {rank} to reach step {target}", reached, PHASE_TIMEOUT, tl) \
            or "step" not in seen:
        tl(f"driver: worker {rank} never reached step {target} "
           f"(torchrun on node {node}: {proc.poll()})")
        return None
    proc.send_signal(signal.SIGTERM)
    sent = time.time()
    tl(f"driver: SIGTERM -> torchrun on node {node} (worker {rank} has run steps "
       f"0..{seen['step']})")
    return seen["step"], sent


def saved_round(a, checks, events, pairs, what, sent):
    """Checks one preemption round: every worker saved once, at one step, with code 42."""
    pre = of_phase(events, "preempted", pairs)
    steps = {e["step"] for e in pre}
    ranks = sorted(e["rank"] for e in pre)
    codes = {e["code"] for e in pre}
    checks(ranks == list(range(WORKERS)) and len(steps) == 1 and codes == {42},
           f"{what}: workers {ranks} saved at one agreed step {sorted(steps)} and exited with "
           f"{sorted(codes)} (each worker once; 42 expected)")
    if pre and sent:
        last = max(e["t"] for e in pre) + a.t0 - sent
        print(f"figure: {what}: SIGTERM -> every worker saved and leaving in {last:.2f} s",
              flush=True)
    return steps.pop() if len(steps) == 1 else None


def restored_round(checks, events, pairs, want, what):
    """Every worker started at its expected (launch, restart) and restored `want`. A group that
    failed to form shows up as workers of a later restart (the agent restarted it) or none."""
    starts = of_phase(events, "start", pairs)
    got = {e["rank"]: e["restored"] for e in starts}
    first = min(launch + restart for launch, restart in pairs.values())
    other = sorted((e["rank"], e["launch"], e["restart"]) for e in events if e["kind"] == "start"
                   and e["rank"] not in got and e["launch"] + e["restart"] >= first)
    checks(sorted(got) == list(range(WORKERS)) and set(got.values()) == {want},
           f"{what}: every worker started at its expected (launch, restart) and restored step "
           f"{want}: {dict(sorted(got.items()))}"
           + (f"; started instead at (rank, launch, restart): {other}" if other else ""))


def final_checks(a, checks, events, pairs):
    import preemptible_ddp as ddp  # the job's own definitions
    import torch
    finals = of_phase(events, "finish", pairs)
    checks(len(finals) == WORKERS and len({e["digest"] for e in finals}) == 1,
           f"the {len(finals)} finishing replicas ended with identical state "
           f"({len({e['digest'] for e in finals})} distinct digests)")
    want = ddp.state_bytes(*ddp.reference_state(a.seed, WORKERS, a.steps))
    try:
        saved = torch.load(os.path.join(a.dir, "final-run.pt"))
        model = ddp.make_model(a.seed)
        model.load_state_dict(saved["model"])
        opt = ddp.make_optimizer(model)
        opt.load_state_dict(saved["optimizer"])
        got = ddp.state_bytes(model, opt)
    except (OSError, RuntimeError, KeyError) as e:
        print(f"final model: cannot read it ({e})", flush=True)
        got = None
    checks(got == want, "final model and optimizer state "
           + ("equal the uninterrupted run, bit for bit" if got == want else
              "DIFFER FROM the uninterrupted run"))
    counts = step_counts(a)
    missing = sum(c.count(0) for c in counts)
    twice = sum(sum(1 for v in c if v > 1) for c in counts)
    checks(missing == 0 and twice == 0, f"every step ran exactly once on every worker "
           f"({missing} never, {twice} twice)")


def run_etcd(a, hx, tl, checks):
    job = Job(a, hx, tl)
    rng = random.Random(a.seed_plan)
    try:
        # phase 0: both nodes; node 1 preempted
        p0 = {r: (0, 0) for r in range(WORKERS)}
        t_phase = time.time()
        job.launch(0, 0)
        job.launch(1, 0)
        target = rng.randrange(4, 10)
        got = preempt_when(job, a, tl, 1, 0, 2, (0, 0), target)
        if not checks(got is not None, f"phase 0: node 1 preempted after step {target}"):
            return
        node1 = job.procs[(1, 0)]
        wait_until("node 1's torchrun to exit", lambda: node1.poll() is not None,
                   PHASE_TIMEOUT, tl)
        tl(f"driver: node 1's torchrun exited with {node1.poll()}")
        wait_until("every worker's phase-0 exit event",
                   lambda: len(of_phase(read_events(a), "preempted", p0)) >= WORKERS,
                   a.ack + 30, tl)
        s1 = saved_round(a, checks, read_events(a), p0, "phase 0 (node 1 preempted)", got[1])
        print(f"figure: phase 0 took {time.time() - t_phase:.1f} s", flush=True)
        if s1 is None:
            return

        # phase 1: node 0's agent restarts its group (restart 1); node 1 relaunched alone
        t_phase = time.time()
        job.launch(1, 1)
        p1 = {0: (0, 1), 1: (0, 1), 2: (1, 0), 3: (1, 0)}
        target = s1 + rng.randrange(4, 10)
        got = preempt_when(job, a, tl, 0, 0, 0, (0, 1), target)
        restored_round(checks, read_events(a), p1, s1,
                       "phase 1 (node 0 at restart 1, node 1 relaunched at restart 0)")
        if not checks(got is not None, f"phase 1: the group formed and node 0 was preempted "
                      f"after step {target}"):
            return
        node0 = job.procs[(0, 0)]
        wait_until("node 0's torchrun to exit", lambda: node0.poll() is not None,
                   PHASE_TIMEOUT, tl)
        tl(f"driver: node 0's torchrun exited with {node0.poll()}")
        wait_until("every worker's phase-1 exit event",
                   lambda: len(of_phase(read_events(a), "preempted", p1)) >= WORKERS,
                   a.ack + 30, tl)
        # Node 0's agent (the TCPStore) is gone: node 1's agent cannot form a group again. A
        # scheduler relaunches the whole job; here the driver stops node 1's torchrun first.
        node1 = job.procs[(1, 1)]
        if node1.poll() is None:
            node1.send_signal(signal.SIGTERM)
            tl("driver: SIGTERM -> torchrun on node 1 (its store is gone with node 0)")
        wait_until("node 1's torchrun to exit", lambda: node1.poll() is not None,
                   PHASE_TIMEOUT, tl)
        s2 = saved_round(a, checks, read_events(a), p1, "phase 1 (node 0 preempted)", got[1])
        print(f"figure: phase 1 took {time.time() - t_phase:.1f} s", flush=True)
        if s2 is None:
            return

        # phase 2: both relaunched (a fresh store on node 0)
        t_phase = time.time()
        job.launch(0, 2)
        job.launch(1, 2)
        p2 = {r: (2, 0) for r in range(WORKERS)}
        for k in ((0, 2), (1, 2)):
            wait_until(f"torchrun on node {k[0]} to finish",
                       lambda: job.procs[k].poll() is not None, PHASE_TIMEOUT, tl)
        codes = [job.procs[k].poll() for k in ((0, 2), (1, 2))]
        tl(f"driver: phase 2 torchruns exited with {codes}")
        events = read_events(a)
        restored_round(checks, events, p2, s2, "phase 2 (both nodes relaunched)")
        checks(codes == [0, 0], f"phase 2: the job finished (torchrun exit statuses {codes})")
        print(f"figure: phase 2 took {time.time() - t_phase:.1f} s", flush=True)
        final_checks(a, checks, events, p2)
    finally:
        job.kill_all()


def run_torch(a, hx, tl, checks):
    """store="torch" (the TCPStore node 0's agent hosts): node 0 preempted."""
    job = Job(a, hx, tl)
    rng = random.Random(a.seed_plan)
    try:
        p0 = {r: (0, 0) for r in range(WORKERS)}
        t_phase = time.time()
        job.launch(0, 0)
        job.launch(1, 0)
        target = rng.randrange(4, 10)
        got = preempt_when(job, a, tl, 0, 0, 0, (0, 0), target)
        if not checks(got is not None, f"node 0 preempted after step {target}"):
            return
        codes = []
        for node in (0, 1):
            p = job.procs[(node, 0)]
            wait_until(f"node {node}'s torchrun to exit", lambda: p.poll() is not None,
                       PHASE_TIMEOUT, tl)
            codes.append(p.poll())
            tl(f"driver: node {node}'s torchrun exited with {p.poll()}")
        events = read_events(a)
        s1 = saved_round(a, checks, events, p0, "store='torch', node 0 preempted", got[1])
        # Node 0's agent served the store until its own workers had left, then exited; node 1's
        # agent cannot form a group again. Either its restart fails at once (its rendezvous
        # finds the store gone) or its restarted workers time out connecting to node 0's address
        # (their init timeout): which, depends on when node 0's agent exits. Both end the same.
        with open(os.path.join(a.dir, "torchrun-node1-launch0.log")) as f:
            node1_log = f.read()
        lost = f"failed to connect/validate to host {job.master}:{MASTER_PORT}" in node1_log
        rejoined = [e for e in events if e["kind"] == "start" and e["launch"] == 0
                    and e["restart"] > 0]
        checks(codes[1] not in (0, None) and not rejoined,
               f"node 1's agent could not restart its group (no worker of a later restart "
               f"started: {len(rejoined)}) and exited with {codes[1]} (non-zero): "
               + ("its restarted workers timed out reaching the store on node 0" if lost else
                  "its restart failed at once, the store gone")
               + "; only a relaunch of every node recovers")
        print(f"figure: store='torch': node 0 preempted -> node 1's torchrun gave up in "
              f"{time.time() - got[1]:.1f} s", flush=True)
        print(f"figure: phase 0 took {time.time() - t_phase:.1f} s", flush=True)
        if s1 is None:
            return
        t_phase = time.time()
        job.launch(0, 1)
        job.launch(1, 1)
        p1 = {r: (1, 0) for r in range(WORKERS)}
        for k in ((0, 1), (1, 1)):
            wait_until(f"torchrun on node {k[0]} to finish",
                       lambda: job.procs[k].poll() is not None, PHASE_TIMEOUT, tl)
        codes = [job.procs[k].poll() for k in ((0, 1), (1, 1))]
        tl(f"driver: relaunch: torchruns exited with {codes}")
        events = read_events(a)
        restored_round(checks, events, p1, s1, "both nodes relaunched")
        checks(codes == [0, 0], f"the relaunched job finished (torchrun exit statuses {codes})")
        print(f"figure: phase 1 took {time.time() - t_phase:.1f} s", flush=True)
        final_checks(a, checks, events, p1)
    finally:
        job.kill_all()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--harness", required=True, help="the multinode_up tool")
    p.add_argument("--kv", choices=("etcd", "torch"), default="etcd")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--plan-seed", dest="seed_plan", type=int, default=None)
    p.add_argument("--keep-logs", default="", help="copy the torchrun logs here")
    a = p.parse_args()
    a.ack = 5.0
    tl = Timeline()
    a.t0 = tl.t0
    hx = Harness(a.harness)
    try:
        info = hx.info
        if "unavailable" in info:
            print(f"multinode_ddp: {info['unavailable']}", flush=True)
            if os.environ.get("CI") == "true":
                print("verdict: FAIL (CI=true: the multi-node cases must run)", flush=True)
                return 1
            print("verdict: SKIP", flush=True)
            return 0
        if "error" in info:
            print(f"multinode_ddp: the harness failed: {info['error']}", flush=True)
            print("verdict: FAIL", flush=True)
            return 1
        a.dir = os.path.join(info["shared_dir"], "run")
        os.makedirs(a.dir)
        a.kv_url = "torch" if a.kv == "torch" else info["etcd_url"] + "/holdfast-multinode-ddp"
        names = ", ".join(n["ns"] + " " + n["address"] for n in info["nodes"])
        tl(f"driver: {NODES} nodes ({names}), etcd {info['etcd_url']}; {WORKERS} workers, "
           f"{a.steps} steps, store {a.kv_url}")
        checks = Checks()
        t = time.time()
        (run_etcd if a.kv == "etcd" else run_torch)(a, hx, tl, checks)
        print(f"figure: the whole case took {time.time() - t:.1f} s", flush=True)
        ok = bool(checks.ok) and all(checks.ok)
        if a.keep_logs:
            import shutil
            os.makedirs(a.keep_logs, exist_ok=True)
            for name in os.listdir(a.dir):
                if name.endswith(".log"):
                    shutil.copy(os.path.join(a.dir, name), a.keep_logs)
        if not ok:
            for name in sorted(os.listdir(a.dir)):
                if name.endswith(".log"):
                    with open(os.path.join(a.dir, name)) as f:
                        tail = f.read()[-3000:]
                    print(f"---- {name} (tail)\n{tail}", flush=True)
        print(f"verdict: {'PASS' if ok else 'FAIL'}", flush=True)
        return 0 if ok else 1
    finally:
        hx.close()


if __name__ == "__main__":
    sys.exit(main())
