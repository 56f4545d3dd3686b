"""The README's training script (examples/pytorch/train.py) under the real torchrun, as a user runs
it: copied into an empty directory outside the repository (DIR/app) and started there, with the
installed holdfast_torch (nothing of the clone on sys.path). An uninterrupted run, then a run
whose worker gets SIGTERM mid-training. The preempted
run must restart (torchrun's restart), restore the agreed step on every worker, finish, and end
with the same final state, bit for bit.

    python tests/pytorch/readme_script_test.py --dir DIR     (a python with holdfast_torch)
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "pytorch", "train.py")
STEPS = 80
WORKERS = 2  # the sum of two gradients does not depend on the order: bit-exact runs


def torchrun(run_dir, port):
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [exe if os.path.exists(exe) else shutil.which("torchrun"),
            f"--nproc-per-node={WORKERS}", "--max-restarts=3", f"--master-port={port}",
            "train.py", "--dir", run_dir, "--steps", str(STEPS)]


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workers_of(agent_pid):
    """The pids whose parent is the torchrun process."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == agent_pid:
                out.append(int(name))
    return out


def run(app, run_dir, preempt):
    os.makedirs(run_dir, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(torchrun(run_dir, free_port()), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=app)
    victim = None
    if preempt:
        marker = os.path.join(run_dir, "ckpt", "rank-0")
        deadline = time.monotonic() + 300
        while not os.path.isdir(marker) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(random.uniform(0.5, 1.5))  # some steps in (80 steps take about 4 s)
        kids = workers_of(proc.pid)
        if kids:
            victim = random.choice(kids)
            os.kill(victim, signal.SIGTERM)
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out, victim


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    a = p.parse_args()
    failures = []

    def check(ok, what):
        print(f"check: {what}{'' if ok else '  <-- FAIL'}", flush=True)
        if not ok:
            failures.append(what)

    app = os.path.join(a.dir, "app")  # an empty directory outside the repository, and train.py
    os.makedirs(app)
    shutil.copy(SCRIPT, app)
    check(not os.path.realpath(app).startswith(os.path.realpath(REPO) + os.sep),
          f"{app} is outside the repository {REPO}")
    code, out, _ = run(app, os.path.join(a.dir, "uninterrupted"), preempt=False)
    ref = re.findall(r"final state sha256 (\w+)", out)
    check(code == 0 and len(ref) == 1, f"the uninterrupted run finished (torchrun exit {code})")
    code, out2, victim = run(app, os.path.join(a.dir, "preempted"), preempt=True)
    print(out2[-3000:], flush=True)
    got = re.findall(r"final state sha256 (\w+)", out2)
    restored = sorted(set(re.findall(r"rank (\d+): restored step (\d+)", out2)))
    steps = {s for _, s in restored}
    check(victim is not None, f"SIGTERM sent to worker pid {victim}")
    check(code == 0, f"torchrun restarted the group and finished (exit {code})")
    check(len(restored) == WORKERS and len(steps) == 1,
          f"every worker restored one agreed step: {restored}")
    check(len(got) == 1 and got == ref, f"final state equals the uninterrupted run's: {got} vs {ref}")
    print("verdict: " + ("PASS" if not failures else "FAIL"), flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
