"""The PyTorch extension's notice sources (packaging/python/holdfast_torch.cpp): every preset's
notices and the notice file reach the one Config the extension compiles (any_notice), wake the
handler, and end run() with holdfast.Preempted carrying the preset's exit code after one save at
the agreed step. One task over a file:// store, in this process; the signal presets only (gce and
aws poll a metadata server, which a test must not reach). And a SIGTERM while the start still runs
in Python (the launch-number hand-off), in a child process: saved and exited 42, not killed.

    /path/to/venv/bin/python tests/pytorch/test_notice_sources.py [name ...]

Exits non-zero when a case fails; the last line is "N passed, M failed".
"""

import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_store_support as sup  # noqa: E402

hf = sup.load_holdfast()

CASES, case = sup.case_list()
NOTICE_AT = 5      # the step after which the notice comes
MAX_STEPS = 2000   # 2 ms each: a notice must end the loop long before


check = sup.check


_launches = iter(range(1 << 30))  # a fresh incarnation for every handler


def preempted_by(preset, notify, notice_file=None):
    """Runs steps until Preempted; `notify(directory)` after NOTICE_AT steps. Returns the exit
    code, the steps run and the steps saved."""
    with tempfile.TemporaryDirectory() as d:
        saved = []
        ckpt = hf.CheckpointManager(os.path.join(d, "ckpt"),
                                    save=lambda path, step: saved.append(step),
                                    restore=lambda path, step: None)
        with hf.Handler(preset=preset, store="file://" + os.path.join(d, "kv"), checkpoints=ckpt,
                        task=0, num_tasks=1, run_id="notice", restart=next(_launches), grace=0,
                        notice_file=notice_file and os.path.join(d, notice_file)) as h:
            steps = 0
            try:
                while steps < MAX_STEPS:
                    h.run(time.sleep, 0.002)
                    steps += 1
                    if steps == NOTICE_AT:
                        notify(d)
            except hf.Preempted as e:
                return e.code, steps, saved
        return None, steps, saved


_EARLY = r'''
import os, signal, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import torch_store_support as sup
hf = sup.load_holdfast()
def handoff(*args):  # the launch-number hand-off under torchrun, waiting for task 0
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)
    return 7
hf._take_incarnation = handoff
with tempfile.TemporaryDirectory() as d:
    saved = []
    ckpt = hf.CheckpointManager(os.path.join(d, "ckpt"), save=lambda p, s: saved.append(s),
                                restore=lambda p, s: None)
    h = hf.Handler(preset="generic", store="file://" + os.path.join(d, "kv"), checkpoints=ckpt,
                   task=0, num_tasks=1, run_id="early", grace=0)
    try:
        for _ in range(2000):
            h.run(time.sleep, 0.002)
    except hf.Preempted as e:
        print("preempted", e.code, saved, flush=True)
        h.close()
        sys.exit(e.code)
    print("no notice", flush=True)
'''


@case
def a_sigterm_while_the_start_hands_off_the_launch_number_is_acted_on():
    # Before the extension's notice is installed (the hand-off under torchrun waits for task 0),
    # a SIGTERM took the default action: the worker died (-15) without a save.
    import subprocess
    r = subprocess.run([sys.executable, "-c", _EARLY, os.path.dirname(os.path.abspath(__file__))],
                       capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    check(r.returncode == 42, f"exit {r.returncode}: {out[-2000:]}")
    check("preempted 42 [" in r.stdout and "[]" not in r.stdout, out[-2000:])


def signal_self(signum):
    return lambda d: os.kill(os.getpid(), signum)


def create(name):
    def notify(d):
        with open(os.path.join(d, name), "w") as f:
            f.write("preempted\n")
    return notify


def expect(result, code):
    got, steps, saved = result
    check(got == code, f"Preempted({got}) after {steps} steps, expected Preempted({code})")
    check(NOTICE_AT <= steps < MAX_STEPS, f"{steps} steps")
    check(saved == [steps], f"saved {saved}, expected one save at the last step ({steps})")


@case
def generic_sigterm_exits_42():
    expect(preempted_by("generic", signal_self(signal.SIGTERM)), 42)


@case
def kubernetes_sigterm_exits_143():
    expect(preempted_by("k8s", signal_self(signal.SIGTERM)), 143)


@case
def slurm_sigusr1_exits_143():
    expect(preempted_by("slurm", signal_self(signal.SIGUSR1)), 143)


@case
def a_notice_file_is_a_notice_beside_the_generic_signals():
    expect(preempted_by("generic", create("notice"), notice_file="notice"), 42)


@case
def a_notice_file_is_a_notice_beside_the_slurm_signals():
    expect(preempted_by("slurm", create("notice"), notice_file="notice"), 143)


@case
def an_unknown_preset_is_named():
    with tempfile.TemporaryDirectory() as d:
        ckpt = hf.CheckpointManager(os.path.join(d, "ckpt"), save=lambda p, s: None,
                                    restore=lambda p, s: None)
        try:
            hf.Handler(preset="azure", store="file://" + os.path.join(d, "kv"), checkpoints=ckpt,
                       task=0, num_tasks=1, run_id="notice", restart=next(_launches))
        except ValueError as e:
            check("azure" in str(e), f"the error does not name the preset: {e}")
            return
        raise AssertionError("preset='azure' was accepted")


if __name__ == "__main__":
    sup.exit_now(sup.run_cases(CASES, sys.argv[1:]))
