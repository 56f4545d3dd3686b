#!/usr/bin/env python3
"""torch_staged_save_bench — what a staged save (CheckpointManager(state=...), issue 45) costs the
training thread, beside the limit and DCP, in one run. Run by hand (docs/saving.md):

    build/pytorch-env/bin/python benchmarks/torch_staged_save_bench.py \\
        [--sizes 256,1024] [--reps 5] [--dir DIR] [--workers 2,4] [--skip NAME,...]

The state: a state_dict of 200 CPU tensors, float32 and bf16 alternately, every fourth one
non-contiguous (a transposed view), --sizes MiB in all. Sections (each figure the median of
--reps runs after one warm-up; the cases of a section interleaved run by run):

  blocked   the training thread's blocked time of one save: holdfast staged (save() returns once
            the state is copied into its reused staging area), a bare copy of the same tensors
            into buffers allocated once (the limit: copy_ into preallocated tensors),
            dcp.async_save with one DefaultStager kept and passed as async_stager= (DCP's best:
            its staging memory reused; synchronous staging, so the call returns once staged),
            dcp.async_save with its defaults, and torch.save (the whole write). Ratios against
            the bare copy and against DCP's best.
  first     the first save of a fresh CheckpointManager after restore() (a relaunch: the staging
            area is sized at restore) against a later save of the same manager.
  commit    until the local tier holds the committed step (save() then wait_until_finished())
            against a bare write + fsync + rename of the same bytes (one file per tensor
            group, as holdfast's three files: written from the tensors, fsynced, the directory
            fsynced, renamed, the parent fsynced).
  step      the step time while the background write runs: a step of four 1024x1024 mm at
            torch.set_num_threads(1) right after save() returned, against the same step with
            no save; interleaved A/B, median of 9; and the same at torch's default threads.
  memory    the staging area against the state; resident memory after save 50 minus after
            save 5 (50 saves to /dev/shm), as a share of the state.
  preempt   the preemption save: --workers processes of 256 MiB each (file:// store, the
            generic preset), from the notice (SIGTERM to every task at once) to every task
            committed locally, against the same number of processes each writing its own
            256 MiB bare (write + fsync + rename) at once (started by a file they poll every
            0.5 ms).

Sizes above the machine's memory fail early. Files go to --dir (default: a fresh temp dir on
the disk under /tmp), removed at the end.
"""

import argparse
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import torch

import holdfast_torch as holdfast  # noqa: E402  (installed: examples/pytorch/README.md)


def make_state(size_mib, seed=1):
    g = torch.Generator().manual_seed(seed)
    per = size_mib * (1 << 20) // 200 // 256 * 256  # bytes per tensor, a multiple of 256
    state = {}
    for i in range(200):
        if i % 2:
            t = torch.rand(per // 4, generator=g)
        else:
            t = torch.rand(per // 2, generator=g).to(torch.bfloat16)
        state[f"layer{i}.weight"] = t.view(64, -1).t() if i % 4 == 0 else t
    return state


def nbytes(state):
    return sum(t.untyped_storage().nbytes() for t in state.values())


def med(xs):
    return statistics.median(xs)


def line(name, value, base_name=None, base=None, unit="s"):
    text = f"  {name:<44} {value:9.4f} {unit}"
    if base is not None:
        text += f"   {base_name:<30} {base:9.4f} {unit}   ratio {value / base:6.3f}"
    print(text, flush=True)


def fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bare_save(state, parent, name):
    """The state's bytes in three files, each fsynced; the directory fsynced, renamed, the
    parent fsynced."""
    tmp, dst = os.path.join(parent, "." + name), os.path.join(parent, name)
    os.mkdir(tmp)
    tensors = list(state.values())
    for f in range(3):
        path = os.path.join(tmp, f"part{f}.bin")
        with open(path, "wb", buffering=0) as out:
            for t in tensors[f::3]:  # the storage's bytes, no copy
                raw = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
                out.write(raw.numpy().data)
            os.fsync(out.fileno())
    fsync_path(tmp, True)
    os.rename(tmp, dst)
    fsync_path(parent, True)
    return dst


def section_blocked(state, base, reps):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    size = nbytes(state)
    limit = {k: torch.empty_like(v) for k, v in state.items()}  # allocated once
    for v in limit.values():
        v.zero_()
    ckpt = holdfast.CheckpointManager(os.path.join(base, "holdfast"), state=lambda: state,
                                      load_state=lambda s: None, max_to_keep=1)
    store = dist.FileStore(os.path.join(base, "pg-store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                          use_async_staging=False, use_non_blocking_copy=False))
    times = {k: [] for k in ("holdfast", "bare", "dcp-kept", "dcp-default", "torch.save")}

    def dcp_call(path, **kw):
        t0 = time.perf_counter()
        r = dcp.async_save(state, checkpoint_id=path, **kw)
        staged = getattr(r, "staging_completion", None)
        if staged is not None:
            staged.result()  # the training thread may change the state only after this
        t1 = time.perf_counter()
        (getattr(r, "upload_completion", None) or r).result()
        shutil.rmtree(path)
        return t1 - t0

    try:
        for i in range(reps + 1):
            t0 = time.perf_counter()
            ckpt.save(i + 1)
            t1 = time.perf_counter()
            ckpt.wait_until_finished()
            t2 = time.perf_counter()
            for k, v in state.items():
                limit[k].copy_(v)
            t3 = time.perf_counter()
            kept = dcp_call(os.path.join(base, f"dcp-kept-{i}"), async_stager=stager)
            default = dcp_call(os.path.join(base, f"dcp-default-{i}"))
            t4 = time.perf_counter()
            path = os.path.join(base, f"torch-{i}.pt")
            torch.save(state, path)
            t5 = time.perf_counter()
            os.unlink(path)
            gc.collect()
            if i:
                times["holdfast"].append(t1 - t0)
                times["bare"].append(t3 - t2)
                times["dcp-kept"].append(kept)
                times["dcp-default"].append(default)
                times["torch.save"].append(t5 - t4)
    finally:
        stager.close()
        dist.destroy_process_group()
    m = {k: med(v) for k, v in times.items()}
    print(f"blocked ({size >> 20} MiB, 200 tensors):", flush=True)
    line("holdfast staged save()", m["holdfast"], "bare copy (buffers once)", m["bare"])
    line("holdfast staged save()", m["holdfast"], "dcp.async_save, kept stager", m["dcp-kept"])
    line("dcp.async_save, kept DefaultStager", m["dcp-kept"], "bare copy (buffers once)",
         m["bare"])
    line("dcp.async_save, defaults", m["dcp-default"], "bare copy (buffers once)", m["bare"])
    line("torch.save", m["torch.save"], "bare copy (buffers once)", m["bare"])


def section_first(state, base, reps):
    c = holdfast.CheckpointManager(os.path.join(base, "holdfast"), state=lambda: state,
                                   load_state=lambda s: None, max_to_keep=1)
    if c.latest_step is None:
        c.save(1)
    del c  # waits for its commit, releases the directory
    gc.collect()
    first, later = [], []
    for _ in range(reps):
        c = holdfast.CheckpointManager(os.path.join(base, "holdfast"), state=lambda: state,
                                       load_state=lambda s: None, max_to_keep=1)
        step = c.restore()
        t0 = time.perf_counter()
        c.save(step + 1)
        first.append(time.perf_counter() - t0)
        c.wait_until_finished()
        t0 = time.perf_counter()
        c.save(step + 2)
        later.append(time.perf_counter() - t0)
        c.wait_until_finished()
        del c
        gc.collect()
    print(f"first save after a restore ({nbytes(state) >> 20} MiB):", flush=True)
    line("first save() after restore()", med(first), "a later save()", med(later))


def section_commit(state, base, reps):
    d = os.path.join(base, "commit")
    os.makedirs(os.path.join(base, "bare"), exist_ok=True)
    c = holdfast.CheckpointManager(d, state=lambda: state, load_state=lambda s: None,
                                   max_to_keep=0)
    ours, bare = [], []
    for i in range(reps + 1):
        for which in ((0, 1) if i % 2 else (1, 0)):  # ABBA: each follows the other as often
            os.sync()  # no writeback left over from the case before (untimed)
            t0 = time.perf_counter()
            if which == 0:
                c.save(i + 1)
                c.wait_until_finished()
            else:
                p = bare_save(state, os.path.join(base, "bare"), f"b{i}")
            t1 = time.perf_counter()
            if which:
                shutil.rmtree(p)
            if i:
                (ours if which == 0 else bare).append(t1 - t0)
    del c
    shutil.rmtree(d)
    print(f"until the local tier holds the step ({nbytes(state) >> 20} MiB):", flush=True)
    line("save() + wait_until_finished()", med(ours), "bare write+fsync+rename", med(bare))


def section_step(state, base):
    a, b = torch.rand(1024, 1024), torch.rand(1024, 1024)

    def step():
        t0 = time.perf_counter()
        x = a
        for _ in range(4):
            x = torch.mm(x, b)
        return time.perf_counter() - t0

    c = holdfast.CheckpointManager(os.path.join(base, "step"), state=lambda: state,
                                   load_state=lambda s: None, max_to_keep=1)
    for threads in (1, DEFAULT_THREADS):
        torch.set_num_threads(threads)
        step()
        with_save, alone = [], []
        for i in range(10):
            c.save(2 * i + 1)
            w = step()  # while the background write runs
            c.wait_until_finished()
            n = step()
            if i:
                with_save.append(w)
                alone.append(n)
        print(f"step time, four 1024x1024 mm at {threads} thread(s), "
              f"{nbytes(state) >> 20} MiB written meanwhile:", flush=True)
        line("step while the background write runs", med(with_save), "the step alone",
             med(alone))
    torch.set_num_threads(1)


def rss():
    with open("/proc/self/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1]) * 1024
    return 0


def section_memory(state):
    root = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=root) as d:
        c = holdfast.CheckpointManager(d, state=lambda: state, load_state=lambda s: None,
                                       max_to_keep=2)
        after5 = 0
        for i in range(1, 51):
            c.save(i)
            c.wait_until_finished()
            if i == 5:
                after5 = rss()
        grew = rss() - after5
        size = nbytes(state)
        print(f"memory ({size >> 20} MiB):", flush=True)
        line("staging area / state", c.staging_capacity / size, unit="x")
        line("resident after save 50 - after save 5", 100.0 * grew / size, unit="%")
        del c


WORKER = textwrap.dedent("""
    import os, sys, time, torch
    import holdfast_torch as hf
    mode, d, task, n, mib = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(1)
    state = {f"t{i}": torch.full((mib * (1 << 20) // 200 // 4,), float(i)) for i in range(200)}
    go = os.path.join(d, "go")
    if mode == "bare":
        sys.path.insert(0, sys.argv[6])
        from torch_staged_save_bench import bare_save
        print("ready", flush=True)
        while not os.path.exists(go):
            time.sleep(0.0005)
        bare_save(state, os.path.join(d, "bare"), f"task{task}")
        print("done", time.time(), flush=True)
        sys.exit(0)
    ckpt = hf.CheckpointManager(os.path.join(d, f"ckpt-{task}"), state=lambda: state,
                                load_state=lambda s: None)
    with hf.Handler(store="file://" + os.path.join(d, "kv"), checkpoints=ckpt, task=task,
                    num_tasks=n, run_id="bench", restart=0, watch_interval=0.005) as h:
        ckpt.save(0)  # the staging area sized, as after a restore
        ckpt.wait_until_finished()
        print("ready", flush=True)
        while not os.path.exists(os.path.join(d, "start")):  # the tasks train in step, as DDP's
            time.sleep(0.0005)
        try:
            while True:
                h.run(time.sleep, 0.01)
        except hf.Preempted:
            print("done", time.time(), flush=True)
            raise
""")


def section_preempt(base, workers, reps, mib=256):
    here = os.path.dirname(os.path.abspath(__file__))
    print(f"preemption save, {mib} MiB per worker, notice to every task committed locally:",
          flush=True)
    for n in workers:
        res = {"holdfast": [], "bare": []}
        for r in range(reps):
            for mode in ("holdfast", "bare"):
                d = os.path.join(base, f"preempt-{n}-{r}-{mode}")
                os.makedirs(os.path.join(d, "bare"))
                procs = [subprocess.Popen([sys.executable, "-c", WORKER, mode, d, str(t), str(n),
                                           str(mib), here], stdout=subprocess.PIPE, text=True)
                         for t in range(n)]
                for p in procs:
                    if p.stdout.readline().strip() != "ready":
                        raise SystemExit(f"a {mode} worker did not start")
                open(os.path.join(d, "start"), "w").close()
                os.sync()  # the holdfast workers' first save is on the disk, as the bare ones'
                time.sleep(0.5)
                t0 = time.time()
                if mode == "holdfast":  # the notice: SIGTERM to every task, as a scheduler sends
                    for p in procs:
                        p.send_signal(signal.SIGTERM)
                else:
                    open(os.path.join(d, "go"), "w").close()
                ends = []
                for p in procs:
                    out = p.stdout.readline().split()
                    p.wait(120)
                    if len(out) != 2 or out[0] != "done":
                        raise SystemExit(f"a {mode} worker did not finish: {out}")
                    ends.append(float(out[1]))
                res[mode].append(max(ends) - t0)
                shutil.rmtree(d)
        line(f"{n} workers: holdfast", med(res["holdfast"]), f"{n} workers each bare, at once",
             med(res["bare"]))


DEFAULT_THREADS = torch.get_num_threads()  # torch's default, before main() sets 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="256,1024")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", default="")
    p.add_argument("--workers", default="2,4")
    p.add_argument("--skip", default="", help="sections to leave out: blocked,first,commit,"
                   "step,memory,preempt")
    a = p.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    torch.set_num_threads(1)
    base = tempfile.mkdtemp(prefix="holdfast-staged-bench-", dir=a.dir or None)
    print(f"torch {torch.__version__}, holdfast {holdfast.__version__}, {os.cpu_count()} CPUs, "
          f"dir {base}, median of {a.reps}", flush=True)
    try:
        for mib in (int(s) for s in a.sizes.split(",")):
            state = make_state(mib)
            if "blocked" not in skip:
                section_blocked(state, base, a.reps)
                gc.collect()
            if "first" not in skip:
                section_first(state, base, a.reps)
            if "commit" not in skip:
                section_commit(state, base, a.reps)
            if "step" not in skip:
                section_step(state, base)
            if "memory" not in skip:
                section_memory(state)
            shutil.rmtree(os.path.join(base, "holdfast"), ignore_errors=True)
            del state
            gc.collect()
        if "preempt" not in skip:
            section_preempt(base, [int(w) for w in a.workers.split(",")], a.reps)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
