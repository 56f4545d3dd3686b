"""The PyTorch extension's hang options (packaging/python/holdfast_torch.cpp, __init__.py):
Handler(hang_policy=..., hang_timeout=..., on_hang=...), pause_hang_detection(),
learned_hang_bounds(), and the restart policy ending a process whose training thread holds the
GIL. One task over a file:// store; the restart case in a child process.

    /path/to/venv/bin/python tests/pytorch/test_hang_options.py [name ...]

Exits non-zero when a case fails; the last line is "N passed, M failed". Timing bounds are as
loose as the behaviour they tell apart allows on a loaded 2-core machine.
"""

import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_store_support as sup  # noqa: E402

hf = sup.load_holdfast()
ext = hf.load_extension()

CASES, case = sup.case_list()
PERIOD = 0.25     # hang_period of every case
ALLOWANCE = 1.5   # a loaded machine's wake-up latency on top of the bound + one period


check = sup.check


_launches = iter(range(1 << 30))  # a fresh incarnation for every handler


def handler(d, **kw):
    ckpt = hf.CheckpointManager(os.path.join(d, "ckpt"), save=lambda d, s: None,
                                restore=lambda d, s: None)
    return hf.Handler(store="file://" + os.path.join(d, "kv"), checkpoints=ckpt, task=0,
                      num_tasks=1, run_id="hang", restart=next(_launches), hang_period=PERIOD,
                      hang_warmup_steps=2, **kw)


def noop():
    pass


@case
def report_calls_on_hang_once_with_the_verdict_and_the_job_goes_on():
    """A step that waits past hang_timeout: on_hang gets the verdict (its exception is printed,
    not raised) within the bound + one period; run() returns and the steps go on."""
    seen, fired = [], threading.Event()

    def on_hang(v):
        seen.append(dict(v, at=time.monotonic()))
        fired.set()
        raise ValueError("on_hang's own failure: printed, never raised into the handler")

    with tempfile.TemporaryDirectory() as d, handler(d, hang_policy="report", hang_timeout=1.0,
                                                     on_hang=on_hang) as h:
        for _ in range(4):
            h.run(noop)
        started = []

        def stuck():
            started.append(time.monotonic())
            fired.wait(30)  # the step ends once the verdict is known (observed, not slept)

        h.run(stuck)
        for _ in range(3):
            h.run(noop)
        check(h.total_run_calls == 8, f"the steps went on after the verdict: {h.total_run_calls}")
    check(len(seen) == 1, f"on_hang called once: {seen}")
    v = seen[0]
    check(v["task"] == 0 and v["phase"] == "step" and v["step"] == 4 and v["recorder"] == 0,
          f"the verdict names task 0's step 4: {v}")
    limit = v["bound_s"] + PERIOD + ALLOWANCE
    took = v["at"] - started[0]
    check(1.0 <= v["bound_s"] < 2.0 and v["bound_s"] <= v["elapsed_s"] <= limit and took <= limit,
          f"bound {v['bound_s']} s (the 1 s floor), elapsed {v['elapsed_s']} s, stall -> "
          f"on_hang {took:.2f} s, all <= bound + period + {ALLOWANCE} s = {limit:.2f} s")


@case
def pause_hang_detection_lifts_the_bound_until_the_next_run():
    """Paused, a wait of 3 x (bound + period) between steps is no hang; the next step is watched
    again."""
    fired = threading.Event()
    with tempfile.TemporaryDirectory() as d, handler(d, hang_policy="report", hang_timeout=0.5,
                                                     on_hang=lambda v: fired.set()) as h:
        for _ in range(4):
            h.run(noop)
        h.pause_hang_detection()
        check(not fired.wait(3 * (0.5 + PERIOD)), "a verdict while paused")
        h.run(noop)  # watched again from here
        check(fired.wait(10), "no verdict for the step after the pause")


@case
def learned_hang_bounds_and_the_options_checked():
    with tempfile.TemporaryDirectory() as d:
        with handler(d, hang_policy="report", hang_timeout=2.0) as h:
            first = h.learned_hang_bounds()
            for _ in range(5):
                h.run(noop)
            b = h.learned_hang_bounds()
        check(abs(first["step_bound_s"] - 4.0) < 1e-6,
              f"in the warm-up a step's bound is 2 x hang_timeout: {first}")
        check(b["steps"] == 4 and 0 <= b["step_s"] < 1.0 and abs(b["step_bound_s"] - 2.0) < 1e-6
              and b["save_bound_s"] >= 300 and b["restore_bound_s"] >= 600,
              f"4 steps timed, the step's bound the 2 s floor, saves and restores their own: {b}")
        with handler(d, hang_policy="none", hang_timeout=2.0) as h:
            h.run(noop)
            b = h.learned_hang_bounds()
        check(b["step_bound_s"] is None, f"hang_policy='none' has no bound: {b}")
        for bad, err in ((dict(hang_policy="kill"), ValueError),
                         (dict(hang_timeout=0), ValueError), (dict(on_hang=3), TypeError)):
            try:
                handler(d, **bad).close()
            except err:
                continue
            raise AssertionError(f"{bad} accepted")


CHILD = textwrap.dedent("""
    import ctypes, os, sys, time
    import holdfast_torch as hf
    d = sys.argv[1]
    ckpt = hf.CheckpointManager(os.path.join(d, "ckpt"), save=lambda d, s: None,
                                restore=lambda d, s: None)
    called = os.path.join(d, "on_hang-called")
    h = hf.Handler(store="file://" + os.path.join(d, "kv"), checkpoints=ckpt, task=0,
                   num_tasks=1, run_id="hang", restart=0, hang_policy="restart",
                   hang_timeout=1.0, hang_period=0.25, hang_warmup_steps=2, hang_exit_code=75,
                   on_hang=lambda v: open(called, "w").close())
    for _ in range(4):
        h.run(lambda: None)
    print(time.monotonic(), flush=True)
    # libc's sleep through ctypes.PyDLL: the GIL stays held for 60 s
    h.run(lambda: ctypes.PyDLL(None).sleep(60))
    sys.exit(3)
""")


@case
def restart_exits_while_the_step_holds_the_gil():
    """hang_policy='restart' under a step that never releases the GIL: on_hang cannot run, and
    the watcher exits 75 after waiting for it at most 5 s, not after the step's 60 s."""
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.Popen([sys.executable, "-c", CHILD, d], stdout=subprocess.PIPE, text=True)
        try:
            started = float(p.stdout.readline())
            code = p.wait(45)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        took = time.monotonic() - started
        limit = 1.0 + PERIOD + 5.0 + ALLOWANCE + 1.0  # bound, period, on_hang's wait, slack
        check(code == 75, f"the child exited {code}, expected 75 (hang_exit_code)")
        check(took <= limit, f"stall -> exit {took:.2f} s, over {limit:.2f} s")
        check(not os.path.exists(os.path.join(d, "on_hang-called")),
              "on_hang ran although the step held the GIL")


if __name__ == "__main__":
    sup.exit_now(sup.run_cases(CASES, sys.argv[1:]))
