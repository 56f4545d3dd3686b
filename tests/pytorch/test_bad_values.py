"""A Handler given a value it cannot use fails at once, naming the parameter and what it takes
(issue 44, item 4): store= lists every accepted form, 'torch' included (an absolute path is a
directory store, as for the artifact store); grace= and the other
durations name themselves (not "could not convert string to float"); a notice file that could
never appear is refused, naming the path. One task over a file:// store. And (issue 44, item 2)
an etcd nobody listens on fails the start within start_timeout, naming its URL and errno.

    /path/to/venv/bin/python tests/pytorch/test_bad_values.py [name ...]

Exits non-zero when a case fails; the last line is "N passed, M failed".
"""

import errno
import os
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_store_support as sup  # noqa: E402

hf = sup.load_holdfast()

CASES, case = sup.case_list()
check = sup.check
FAST = 5.0  # seconds: a refusal never waits for the store or for peers


def refused(d, exc, **kw):
    """The exception Handler(**kw) raises (over a file:// store in `d` unless kw names one),
    checked to be an `exc` raised within FAST seconds."""
    ckpt = hf.CheckpointManager(os.path.join(d, "ckpt"), save=lambda d, s: None,
                                restore=lambda d, s: None)
    args = dict(store="file://" + os.path.join(d, "kv"), checkpoints=ckpt, task=0, num_tasks=1,
                run_id="bad", restart=0)
    args.update(kw)
    t0 = time.monotonic()
    try:
        with hf.Handler(**args):
            pass
    except exc as e:
        took = time.monotonic() - t0
        check(took < FAST, f"{kw}: refused after {took:.1f} s")
        return str(e)
    raise AssertionError(f"Handler({kw}) was accepted")


@case
def a_bad_store_lists_every_accepted_form_torch_included():
    with tempfile.TemporaryDirectory() as d:
        for bad in ("toch", "tmp/kv", "redis://h:1", ""):
            msg = refused(d, ValueError, store=bad)
            for form in ("store", "'torch'", "file://", "etcd://", "etcds://", repr(bad)):
                check(form in msg, f"store={bad!r}: {form} not in {msg!r}")


@case
def an_absolute_path_is_a_directory_store_as_for_the_artifact_store():
    # One rule with store::create: '/dir' is the directory file:///dir names (it was refused).
    with tempfile.TemporaryDirectory() as d:
        ckpt = hf.CheckpointManager(os.path.join(d, "ckpt"), save=lambda d, s: None,
                                    restore=lambda d, s: None)
        with hf.Handler(store=os.path.join(d, "kv"), checkpoints=ckpt, task=0, num_tasks=1,
                        run_id="plain", restart=0):
            pass
        check(os.path.isdir(os.path.join(d, "kv")), f"no store directory in {os.listdir(d)}")


@case
def a_second_rank_on_one_checkpoint_directory_fails_at_once_naming_both():
    # Before: it waited 30 s for the writer lock, then named a pid; the other rank's start
    # failed after ack_timeout with "no answer from tasks 0".
    with tempfile.TemporaryDirectory() as d:
        ckpt = os.path.join(d, "ckpt")
        kw = dict(save=lambda d, s: None, restore=lambda d, s: None)
        saved = os.environ.get("RANK")
        try:
            os.environ["RANK"] = "0"  # as torchrun sets it: the default owner
            first = hf.CheckpointManager(ckpt, **kw)
            os.environ["RANK"] = "1"
            t0 = time.monotonic()
            try:
                hf.CheckpointManager(ckpt, **kw)
                raise AssertionError("rank 1 opened rank 0's checkpoint directory")
            except hf.Error as e:
                took = time.monotonic() - t0
                msg = str(e)
                check(took < 2.0, f"refused after {took:.1f} s")
                check("held by task 0" in msg, msg)
                check("task 1 opened the checkpoint directory of task 0" in msg, msg)
                check("a directory of its own" in msg and ckpt in msg, msg)
            del first
        finally:
            if saved is None:
                os.environ.pop("RANK", None)
            else:
                os.environ["RANK"] = saved


@case
def a_bad_duration_names_its_parameter():
    with tempfile.TemporaryDirectory() as d:
        for name, bad in (("grace", "30s"), ("ack_timeout", "3m"), ("hang_timeout", "1h"),
                          ("grace_margin", None), ("watch_interval", True),
                          ("start_timeout", "10s"), ("restore_timeout", "10m")):
            msg = refused(d, ValueError, **{name: bad})
            check(msg.startswith(name + " takes a number"), f"{name}={bad!r}: {msg!r}")
            check(repr(bad) in msg, f"{name}={bad!r}: the value not in {msg!r}")
        msg = refused(d, ValueError, grace="30s")
        check("could not convert" not in msg, msg)


@case
def a_notice_file_that_could_never_appear_is_refused():
    with tempfile.TemporaryDirectory() as d:
        missing = os.path.join(d, "no-such-dir", "preempt")
        msg = refused(d, hf.Error, notice_file=missing)
        check(missing in msg, f"the path not in {msg!r}")
        check(os.path.join(d, "no-such-dir") in msg, f"the directory not in {msg!r}")
        open(os.path.join(d, "file"), "w").close()
        msg = refused(d, hf.Error, notice_file=os.path.join(d, "file", "preempt"))
        check("not a directory" in msg, msg)


@case
def an_etcd_nobody_listens_on_fails_the_start_in_seconds_naming_it():
    # Before: 360 s (twice ack_timeout), ending in "Connection refused): No route to host".
    with socket.socket() as s:  # a loopback port nobody listens on: bound, then released
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"etcd://127.0.0.1:{port}/job"
    with tempfile.TemporaryDirectory() as d:
        ckpt = hf.CheckpointManager(os.path.join(d, "ckpt"), save=lambda d, s: None,
                                    restore=lambda d, s: None)
        t0 = time.monotonic()
        try:
            hf.Handler(store=url, checkpoints=ckpt, task=0, num_tasks=2, run_id="start",
                       incarnation=1, start_timeout=1.5)
            raise AssertionError("constructed against a store nobody listens on")
        except hf.AgreementUnreachable as e:
            took = time.monotonic() - t0
            msg = str(e)
            check(1.4 <= took < 4.0, f"failed after {took:.1f} s (start_timeout 1.5 s)")
            check(e.errno == errno.ECONNREFUSED, f"errno {e.errno}: {msg!r}")
            check(f"127.0.0.1:{port}" in msg, f"the URL not in {msg!r}")
            check("start_timeout" in msg and "No route to host" not in msg, msg)


if __name__ == "__main__":
    sup.exit_now(sup.run_cases(CASES, sys.argv[1:]))
