"""The PyTorch binding's log lines (packaging/python/holdfast_torch): the library's events
reach logging.getLogger("holdfast") with their levels, in order: INFO for the restored step, a
notice and its source, the agreed step, the save's commit (bytes, seconds) and its end; WARNING
for a fallback to an older checkpoint and for a timeout. With logging left unconfigured (the
convention for libraries) a job prints no INFO line, and its warnings still reach stderr. Each
case runs in a child process (its own logging configuration, its own exit); one task over a
file:// store.

    /path/to/venv/bin/python tests/pytorch/test_logging.py [name ...]

Exits non-zero when a case fails; the last line is "N passed, M failed".
"""

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_store_support as sup  # noqa: E402

CASES, case = sup.case_list()
check = sup.check
HERE = os.path.dirname(os.path.abspath(__file__))

# A child: `configure` sets up logging (or not); one start of a Handler over `d`, a notice file
# after 5 steps, run until Preempted; the holdfast records (level, message) as JSON on stdout.
_JOB = r'''
import json, logging, os, sys, time
sys.path.insert(0, sys.argv[1])
d, configure = sys.argv[2], sys.argv[3]
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))
if configure == "capture":
    logging.getLogger("holdfast").addHandler(Keep())
    logging.getLogger("holdfast").setLevel(logging.INFO)
import torch_store_support as sup
hf = sup.load_holdfast()
def save(path, step):
    with open(os.path.join(path, "state.bin"), "wb") as f:
        f.write(b"x" * 4096)
ckpt = hf.CheckpointManager(os.path.join(d, "ckpt"), save=save, restore=lambda p, s: None)
flag = os.path.join(d, "preempt")
code = None
with hf.Handler(preset="generic", store="file://" + os.path.join(d, "kv"), checkpoints=ckpt,
                task=0, num_tasks=1, run_id="log", restart=int(sys.argv[4]), grace=0,
                notice_file=flag) as h:
    first = h.total_run_calls
    try:
        for _ in range(5000):
            h.run(time.sleep, 0.002)
            if h.total_run_calls == first + 5:
                open(flag, "w").close()
    except hf.Preempted as e:
        code = e.code
os.unlink(flag)
print(json.dumps({"code": code, "records": records, "restored": h.restored_step}), flush=True)
'''


def child(script, *args, code=0):
    """Runs `script` in a child Python (this directory and `args` as its argv); checks that it
    exits with `code`."""
    r = subprocess.run([sys.executable, "-c", script, HERE, *args], capture_output=True,
                       text=True, timeout=180)
    check(r.returncode == code, f"the child exited {r.returncode}, expected {code}: "
                                f"{r.stdout[-1500:]} {r.stderr[-1500:]}")
    return r


def last_json(r):
    return json.loads(r.stdout.strip().splitlines()[-1])


def job(d, configure, launch):
    r = child(_JOB, d, configure, str(launch))
    return last_json(r), r.stderr


def index_of(records, level, text):
    for i, (lv, msg) in enumerate(records):
        if lv == level and text in msg:
            return i
    return -1


@case
def the_events_reach_the_holdfast_logger_in_order():
    with tempfile.TemporaryDirectory() as d:
        out, _ = job(d, "capture", 1)
        rec = out["records"]
        check(out["code"] == 42, f"exit code {out['code']}")
        saved = [i for i, (_, m) in enumerate(rec) if " agreed: saving" in m]
        check(len(saved) == 1, f"one agreed step: {rec}")
        step = rec[saved[0]][1].split("step ", 1)[1].split(" ", 1)[0]
        order = [
            index_of(rec, "INFO", "task 0: no checkpoint to restore: starting at step 0"),
            index_of(rec, "INFO", f"task 0: preemption notice from file '{d}/preempt'"),
            index_of(rec, "INFO", f"task 0: step {step} agreed: saving, then exiting"),
            index_of(rec, "INFO", f"checkpoint step {step} committed: '{d}/ckpt/step-{step}', "
                                  "4096 bytes in "),
            index_of(rec, "INFO", f"task 0: step {step} saved in "),
        ]
        check(all(i >= 0 for i in order) and order == sorted(order),
              f"the events, in order: {order}; records: {rec}")
        check(all(lv == "INFO" for lv, _ in rec), f"nothing went wrong, nothing above INFO: {rec}")

        # The relaunch restores that step, and says so.
        out, _ = job(d, "capture", 2)
        check(out["restored"] == int(step), f"restored {out['restored']}, saved {step}")
        check(index_of(out["records"], "INFO", f"task 0: restored step {step} (start: ") >= 0,
              f"the restored step: {out['records']}")


@case
def unconfigured_logging_prints_no_info_line():
    with tempfile.TemporaryDirectory() as d:
        out, err = job(d, "none", 1)
        check(out["code"] == 42, f"exit code {out['code']}")
        for text in ("no checkpoint", "preemption notice", "agreed", "committed", "saved in"):
            check(text not in err, f"an INFO line on stderr ({text!r}): {err[-1500:]}")


# A child: two checkpoints, the newest damaged (one byte flipped), then a restore through a
# fresh manager: the fallback is a WARNING, on stderr with logging unconfigured.
_FALLBACK = r'''
import os, sys
sys.path.insert(0, sys.argv[1])
import torch_store_support as sup
hf = sup.load_holdfast()
d = sys.argv[2]
def save(path, step):
    with open(os.path.join(path, "state.bin"), "wb") as f:
        f.write(bytes([step]) * 1000)
m = hf.CheckpointManager(os.path.join(d, "ckpt"), save=save, restore=lambda p, s: None)
m.save(1)
newest = m.save(2)
del m
with open(os.path.join(newest, "state.bin"), "r+b") as f:
    f.write(b"\xff")
got = []
m = hf.CheckpointManager(os.path.join(d, "ckpt"), save=save, restore=lambda p, s: got.append(s))
print("restored", m.restore(), got, flush=True)
'''


@case
def a_fallback_to_an_older_checkpoint_is_a_warning_on_stderr_unconfigured():
    with tempfile.TemporaryDirectory() as d:
        r = child(_FALLBACK, d)
        check("restored 1 [1]" in r.stdout, f"the older step restored: {r.stdout}")
        check("is corrupt" in r.stderr and "trying the next older complete checkpoint" in r.stderr,
              f"the warning on stderr: {r.stderr[-1500:]}")
        check("read from" not in r.stderr, f"an INFO line on stderr: {r.stderr[-1500:]}")


# A child: task 0 of 2 (task 1 never starts) with a short restore_timeout: the start's timeout
# is a WARNING record before AgreementTimeout reaches the caller.
_TIMEOUT = r'''
import json, logging, os, sys
sys.path.insert(0, sys.argv[1])
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))
logging.getLogger("holdfast").addHandler(Keep())
logging.getLogger("holdfast").setLevel(logging.INFO)
import torch_store_support as sup
hf = sup.load_holdfast()
d = sys.argv[2]
ckpt = hf.CheckpointManager(os.path.join(d, "ckpt"), save=lambda p, s: None,
                            restore=lambda p, s: None)
try:
    hf.Handler(preset="generic", store="file://" + os.path.join(d, "kv"), checkpoints=ckpt,
               task=0, num_tasks=2, run_id="late", restart=1, restore_timeout=1.0)
    error = None
except hf.AgreementTimeout as e:
    error = str(e)
print(json.dumps({"error": error, "records": records}), flush=True)
'''


@case
def a_timeout_at_the_start_is_a_warning_record():
    with tempfile.TemporaryDirectory() as d:
        out = last_json(child(_TIMEOUT, d))
        check(out["error"] and "restore_timeout" in out["error"], f"the error: {out['error']}")
        warnings = [m for lv, m in out["records"] if lv == "WARNING"]
        check(any("restore agreement" in m or "no answer" in m for m in warnings),
              f"a WARNING record of the wait or the timeout: {out['records']}")


# A child: hang_policy="restart" and a step that sleeps (releasing the GIL) past its bound: the
# verdict's WARNING reaches a file handler before the process _exits with hang_exit_code.
_HANG = r'''
import logging, os, sys, time
sys.path.insert(0, sys.argv[1])
d = sys.argv[2]
handler = logging.FileHandler(os.path.join(d, "log"))
handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
logging.getLogger("holdfast").addHandler(handler)
import torch_store_support as sup
hf = sup.load_holdfast()
ckpt = hf.CheckpointManager(os.path.join(d, "ckpt"), save=lambda p, s: None,
                            restore=lambda p, s: None)
h = hf.Handler(preset="generic", store="file://" + os.path.join(d, "kv"), checkpoints=ckpt,
               task=0, num_tasks=1, run_id="hang", restart=1, hang_policy="restart",
               hang_timeout=1.0, hang_period=0.25, hang_warmup_steps=2, hang_exit_code=75)
for _ in range(4):
    h.run(lambda: None)
h.run(time.sleep, 60)
sys.exit(3)
'''


@case
def a_hang_verdict_is_logged_before_the_restart_policy_exits():
    with tempfile.TemporaryDirectory() as d:
        child(_HANG, d, code=75)  # hang_exit_code
        with open(os.path.join(d, "log")) as f:
            log = f.read()
        check("WARNING hang detected: task 0 hung in step " in log, f"the verdict: {log!r}")


if __name__ == "__main__":
    sup.exit_now(sup.run_cases(CASES, sys.argv[1:]))
