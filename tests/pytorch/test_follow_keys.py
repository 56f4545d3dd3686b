"""Decisions beside the rounds over the torch store (store="torch", a real TCPStore), whose watch
can wait only for named keys (issue 42, items 2 and 5): the watch following several keys at once
(a helper thread per key, one eventfd), a hang verdict recorded beside the rounds (ctl/hang,
hang_policy="report") reaching every worker, and a save that raises on one worker reaching the
others as PeerError. The handler's own periodic saves (ctl/save/<k>) are not offered by the
Python Handler; their key is followed here at the watch's level.

    /path/to/venv/bin/python tests/pytorch/test_follow_keys.py [name ...]

Exits non-zero when a case fails; the last line is "N passed, M failed". Run as
`test_follow_keys.py worker '<json config>'` it is one worker process (see _worker). Timing
bounds are as loose as the behaviour they tell apart allows on a loaded 2-core machine.
"""

import errno
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_store_support as sup  # noqa: E402

WORKER = len(sys.argv) == 3 and sys.argv[1] == "worker"
hf = sup.load_holdfast()
ext = hf.load_extension()

CASES, case = sup.case_list()
# The cases' servers, kept until the process ends: watch threads still in a wait on a server
# that closed would log c10d's connection errors.
SERVERS = []


def server():
    """A TCPStore server (torch_store_support.start_server), kept alive (SERVERS)."""
    SERVERS.append(sup.start_server())
    return SERVERS[-1]


check = sup.check
readable = sup.readable


def full_key(run, key):
    """Where torch_kv(run, restart 0) keeps `key`."""
    return f"holdfast-kv/{run}/0/{key}"


# ---- the watch: several keys at once ----------------------------------------------------------


@case
def watch_rings_when_any_followed_key_appears():
    """follow([claim, ctl/save/<k>, ctl/hang]): one thread per key, each asleep in c10d's wait,
    the one eventfd quiet while all are missing; each key rings it alone, the others still
    missing, and reads back (the handler's next periodic decision, a verdict beside the rounds)."""
    port = server().port
    kv = ext._TorchKV(sup.connect(port), "any", 0, 0.01, 30.0)
    other = sup.connect(port)
    before = sup.thread_ids()
    w = kv.watch("holdfast/any/ctl")
    check(w.take(), "the first take reports resync")
    ctl = "holdfast/any/ctl/"
    w.follow([ctl + "r0/claim", ctl + "save/0", ctl + "hang"])
    threads = sup.wait_asleep_in(lambda: sup.native_threads(before), count=3, every=True,
                                 what="a watch thread per followed key in its wait")
    check(len(threads) == 3, f"three keys, three threads: {sorted(threads)}")
    check(not readable(w.fd(), 0.5) and w.due_in() is None, "quiet while every key is missing")
    other.set(full_key("any", ctl + "save/0"), "save 12")
    check(readable(w.fd(), 5.0) and w.take(), "the second key (a periodic decision) rang alone")
    check(kv.try_get(ctl + "save/0") == "save 12", "the decision reads back")
    w.follow([ctl + "r0/claim", ctl + "save/1", ctl + "hang"])  # the next decision
    check(not readable(w.fd(), 0.5), "quiet: the claim, the next decision, the verdict missing")
    other.set(full_key("any", ctl + "hang"), "verdict")
    check(readable(w.fd(), 5.0) and w.take(), "the third key (ctl/hang) rang alone")
    check(kv.try_get(ctl + "hang") == "verdict", "the verdict reads back")
    w.follow([ctl + "r0/claim", ctl + "save/1"])  # the verdict acted on: no longer followed
    check(not readable(w.fd(), 0.5), "quiet: the claim and the next decision missing")
    other.set(full_key("any", ctl + "r0/claim"), "claim")
    check(readable(w.fd(), 5.0) and w.take(), "the first key (the claim) rang")
    w.close()


@case
def watch_following_fewer_keys_does_not_poll():
    """An idle handler follows its claim and ctl/hang; a round's wait follows one key (the
    outcome): the thread still waiting for ctl/hang (up to a 30 s slice) waits for nothing the
    caller needs, so the watch must not fall back to polling every poll interval meanwhile (it
    did: a resync every 10 ms for the rest of the slice, each a read of the followed keys by the
    handler's watcher on the job's store, through every round's wait)."""
    port = server().port
    kv = ext._TorchKV(sup.connect(port), "fewer", 0, 0.01, 30.0)
    other = sup.connect(port)
    before = sup.thread_ids()
    w = kv.watch("ctl")
    w.take()
    w.follow(["ctl/r0/claim", "ctl/hang"])
    sup.wait_asleep_in(lambda: sup.native_threads(before), count=2, every=True,
                       what="both watch threads in their waits")
    other.set(full_key("fewer", "ctl/r0/claim"), "claim")
    check(readable(w.fd(), 5.0) and w.take(), "the claim rang")
    w.follow(["ctl/r0/outcome"])  # the round: one key
    sup.wait_asleep_in(lambda: sup.native_threads(before), count=2, every=True,
                       what="the outcome's wait and the stale one for ctl/hang")
    check(w.due_in() is None, f"due in {w.due_in()} s while every followed key is waited for")
    resyncs, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 0.5:
        due = w.due_in()
        readable(w.fd(), 0.5 if due is None else max(due, 0.0))
        resyncs += w.take()
    check(resyncs == 0, f"{resyncs} resyncs in 0.5 s with nothing new")
    other.set(full_key("fewer", "ctl/r0/outcome"), "outcome")
    check(readable(w.fd(), 5.0) and w.take(), "the outcome rang")
    w.follow(["ctl/r1/claim", "ctl/hang"])  # idle again: ctl/hang's thread still in its wait
    check(w.due_in() is None and not readable(w.fd(), 0.3), "quiet again when idle")
    other.set(full_key("fewer", "ctl/hang"), "verdict")
    check(readable(w.fd(), 5.0) and w.take(), "ctl/hang rang, through the wait it was in")
    w.close()


# ---- the Handler over the store, in worker processes ------------------------------------------


class Run:
    """Worker processes (this file as a worker) over one TCPStore server, stopped at the end."""

    def __init__(self, n, run_id, **cfg):
        self.dir = tempfile.mkdtemp(prefix="holdfast-follow-keys-")
        port = server().port
        self.workers = [sup.Worker(dict(cfg, port=port, task=t, num_tasks=n,
                                        run_id=run_id, dir=self.dir),
                                   script=os.path.abspath(__file__)) for t in range(n)]

    def __enter__(self):
        for w in self.workers:
            w.expect("ready", timeout=120)
        start = time.monotonic_ns() + 50_000_000
        for w in self.workers:
            w.send(f"start {start}")
        return self

    def __exit__(self, *exc):
        for w in self.workers:
            w.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


HANG_TIMEOUT = 1.0  # the step's floor (the warm-up's: 2 s); hang_period 0.1 s


@case
def hang_report_reaches_every_worker():
    """Task 1's step stays past its bound: its watcher records the verdict beside the rounds
    (ctl/hang, hang_policy="report"); on_hang runs on every task with that verdict, task 0
    learning it through its watch within a second of task 1 (it used to follow the claim only,
    and never learned it)."""
    with Run(2, "hang", mode="hang", hung_task=1, hang_step=12) as run:
        got = {1: run.workers[1].expect("on_hang", timeout=20)}
        got[0] = run.workers[0].expect("on_hang", timeout=5)
        for w in run.workers:
            w.send("stop")
        for t, v in sorted(got.items()):
            print(f"    task {t}: on_hang {v['verdict']} {(v['t'] - got[1]['t']) / 1e6:+.1f} ms")
        verdicts = {t: v["verdict"] for t, v in got.items()}
        check(verdicts[0] == verdicts[1], f"every task got the one verdict: {verdicts}")
        v = verdicts[1]
        check(v["task"] == 1 and v["phase"] == "step" and v["step"] == 12 and v["recorder"] == 1,
              f"the verdict names task 1's step 12, recorded by task 1: {v}")
        late = (got[0]["t"] - got[1]["t"]) / 1e9
        check(late <= 1.0, f"task 0 learned it {late:.2f} s after task 1 (bound 1 s)")
        for w in run.workers:
            e = w.expect("done", timeout=20)
            check(e["calls"] == 1, f"task {w.task}: on_hang called {e['calls']} times")


@case
def failed_save_reaches_the_others_as_peer_error():
    """A notice with a grace period: both tasks save at the agreed step and train on; task 1's
    save raises OSError(ENOSPC). Its run() raises it, and task 0's next run() raises PeerError
    naming task 1 within a couple of seconds (the save used to fail outside run()'s error path,
    unpublished: task 0 trained on, heard nothing, towards the grace's final agreement)."""
    with Run(2, "fail", mode="fail", failing_task=1, grace=30.0) as run:
        time.sleep(0.3)
        run.workers[0].signal(signal.SIGTERM)
        raised = run.workers[1].expect("raised", timeout=20)
        check(raised["type"] == "OSError" and raised["errno"] == errno.ENOSPC,
              f"task 1's run() raised its save's OSError(ENOSPC): {raised}")
        e = run.workers[0].expect("raised", timeout=5)
        late = (e["t"] - raised["t"]) / 1e9
        first_line = (e.get("message") or "").splitlines()[:1]
        print(f"    task 0: {e['type']} (origin_task {e.get('origin_task')}: {first_line}) "
              f"{late * 1e3:.0f} ms after task 1's failure")
        check(e["type"] == "PeerError" and e["origin_task"] == 1,
              f"task 0 raised PeerError naming task 1: {e}")
        check("No space left" in e["message"] or "ENOSPC" in e["message"],
              f"the PeerError carries the save's message: {e['message']!r}")
        check(late <= 2.0, f"task 0's PeerError came {late:.2f} s after the failure (bound 2 s)")


# ---- the worker -------------------------------------------------------------------------------


def _worker(cfg):
    """One task over store="torch" (the server at cfg["port"]). Reports ready, waits for
    "start <ns>", then steps of 10 ms on a grid shared by the tasks, by cfg["mode"]:
      hang: hang_policy="report" with short bounds; task cfg["hung_task"]'s step
            cfg["hang_step"] waits until its own on_hang (at most 20 s). Each on_hang call is
            reported (on_hang: verdict, t); "stop" on stdin ends the steps (done: calls).
      fail: grace cfg["grace"] s; task cfg["failing_task"]'s saves raise OSError(ENOSPC).
            Steps until run() raises: reported as raised (type, errno, origin_task, message,
            t), at most 20 s.
    """
    import datetime
    import torch.distributed as dist
    task, mode = cfg["task"], cfg["mode"]
    store = dist.TCPStore("127.0.0.1", cfg["port"], is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    out = threading.Lock()

    def emit(**event):
        with out:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()

    def save(directory, step):
        if mode == "fail" and task == cfg["failing_task"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), directory)
        with open(os.path.join(directory, "state"), "w") as f:
            f.write(str(step))

    ckpt = hf.CheckpointManager(os.path.join(cfg["dir"], f"rank-{task}"), save=save,
                                restore=lambda directory, step: None)
    calls, fired = [], threading.Event()

    def on_hang(v):
        calls.append(v)
        emit(ev="on_hang", verdict={k: v[k] for k in ("task", "phase", "step", "recorder")},
             t=time.monotonic_ns())
        fired.set()

    kw = dict(preset="generic", store="torch", torch_store=store, task=task,
              num_tasks=cfg["num_tasks"], run_id=cfg["run_id"], restart=0, checkpoints=ckpt,
              ack_timeout=10.0)
    if mode == "hang":
        kw.update(hang_policy="report", hang_timeout=HANG_TIMEOUT, hang_warmup_steps=2,
                  hang_period=0.1, on_hang=on_hang)
    else:
        kw.update(grace=cfg["grace"])
    h = hf.Handler(**kw)
    h.pause_hang_detection()  # until the first step: the wait for "start" is no hang
    emit(ev="ready")
    words = sys.stdin.readline().split()
    step_end = int(words[1])
    stop = threading.Event()
    threading.Thread(target=lambda: sys.stdin.readline() and stop.set(), daemon=True).start()
    deadline = time.monotonic() + 20.0
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            if mode == "hang" and task == cfg["hung_task"] and \
                    h.total_run_calls == cfg["hang_step"]:
                h.run(fired.wait, 20.0)
                continue
            step_end += 10_000_000
            h.run(lambda: time.sleep(max(0, step_end - time.monotonic_ns()) / 1e9))
    except Exception as e:  # the case's subject when mode == "fail"
        emit(ev="raised", type=type(e).__name__, errno=getattr(e, "errno", None),
             origin_task=getattr(e, "origin_task", None),
             message=getattr(e, "message", None) or str(e), t=time.monotonic_ns())
    h.close()
    emit(ev="done", calls=len(calls))


if __name__ == "__main__":
    if WORKER:
        try:
            _worker(json.loads(sys.argv[2]))
        except BaseException as e:  # reported to the parent, which fails the case
            import traceback
            sys.stdout.write(json.dumps({"ev": "error", "error": f"{type(e).__name__}: {e}",
                                         "trace": traceback.format_exc()}) + "\n")
            sys.stdout.flush()
        sup.exit_now(0)
    sup.exit_now(sup.run_cases(CASES, sys.argv[1:]))
