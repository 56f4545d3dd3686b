#!/usr/bin/env python3
"""torch_two_tier_bench — how long a 1 GiB state_dict blocks the training thread when it is saved
through holdfast's two tiers, torch.save, and torch.distributed.checkpoint.async_save; and how
long until each copy is durable. Run by hand (issue 35, item 5; docs/two-tiers.md):

    build/pytorch-env/bin/python benchmarks/torch_two_tier_bench.py \\
        [--size-mib 1024] [--reps 5] [--dir DIR] [--local-dir /dev/shm]

The state: --size-mib of float32 CPU tensors (64 MiB each), saved with torch.save (the holdfast
writer too). Cases, each warmed up once and then run --reps times (median, and min..max):

  holdfast two tiers  CheckpointManager(DIR/durable, local_dir=LOCAL/local) (LOCAL: --local-dir,
                      else DIR: the same disk as the durable tier): blocked = save()
                      (torch.save into the local tier, fsync, rename, pointer); durable = until
                      the background copy to DIR/durable committed (wait_until_finished).
  torch.save          torch.save(state, DIR/durable/...): blocked = the call (no fsync: what a
                      training loop usually does); durable = the call, then fsync of the file
                      and of its directory.
  dcp.async_save      torch.distributed.checkpoint.async_save(state, checkpoint_id=DIR/dcp-...)
                      in a one-process gloo group: blocked = the call (the copy to CPU staging
                      memory); durable = until its future's result (the writer fsyncs).

Both tiers sit on one disk here, and the durable one is not slow: the figure is what the
training thread waits for, not what a slow shared filesystem would add (durable minus blocked
is the part that moved off the training thread). Each case's files are removed between runs.
"""

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

import holdfast_torch as holdfast  # noqa: E402  (installed: examples/pytorch/README.md)


def make_state(size_mib):
    per = 64 * 1024 * 1024 // 4  # floats in 64 MiB
    n = max(1, size_mib // 64)
    g = torch.Generator().manual_seed(1)
    return {f"layer{i}.weight": torch.rand(per, generator=g) for i in range(n)}


def fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bench_holdfast(state, base, reps, local_base):
    durable, local = os.path.join(base, "durable"), os.path.join(local_base or base, "local")

    def save(directory, step):
        torch.save(state, os.path.join(directory, "state.pt"))

    ckpt = holdfast.CheckpointManager(durable, save=save, restore=lambda d, s: None,
                                      max_to_keep=1, local_dir=local, local_max_to_keep=1,
                                      durable_wait=600.0)
    out = []
    for step in range(reps + 1):
        t0 = time.perf_counter()
        ckpt.save(step)
        t1 = time.perf_counter()
        ckpt.wait_until_finished()
        t2 = time.perf_counter()
        if ckpt.unfinished or ckpt.durable_step != step:
            raise RuntimeError(f"holdfast: step {step} not durable: {ckpt.unfinished}")
        if step:  # step 0 is the warm-up
            out.append((t1 - t0, t2 - t0))
    del ckpt
    shutil.rmtree(durable)
    shutil.rmtree(local)
    return out


def bench_torch_save(state, base, reps):
    d = os.path.join(base, "durable-torch")
    os.makedirs(d)
    out = []
    for i in range(reps + 1):
        path = os.path.join(d, f"state-{i}.pt")
        t0 = time.perf_counter()
        torch.save(state, path)
        t1 = time.perf_counter()
        fsync_path(path)
        fsync_path(d, directory=True)
        t2 = time.perf_counter()
        os.unlink(path)
        if i:
            out.append((t1 - t0, t2 - t0))
    shutil.rmtree(d)
    return out


def bench_dcp(state, base, reps):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    store = dist.FileStore(os.path.join(base, "pg-store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    out = []
    try:
        for i in range(reps + 1):
            path = os.path.join(base, f"dcp-{i}")
            t0 = time.perf_counter()
            future = dcp.async_save(state, checkpoint_id=path)
            t1 = time.perf_counter()
            future.result()
            t2 = time.perf_counter()
            shutil.rmtree(path)
            gc.collect()
            if i:
                out.append((t1 - t0, t2 - t0))
    finally:
        dist.destroy_process_group()
    return out


def summary(samples):
    s = sorted(samples)
    return f"{statistics.median(s):7.3f} s ({s[0]:.3f}..{s[-1]:.3f})"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", default="", help="where both tiers go (default: a fresh temp dir)")
    p.add_argument("--local-dir", default="",
                   help="the local tier's parent instead (e.g. /dev/shm: a RAM disk)")
    a = p.parse_args()
    torch.set_num_threads(1)
    base = tempfile.mkdtemp(prefix="holdfast-torch-two-tier-", dir=a.dir or None)
    local = ""
    try:
        state = make_state(a.size_mib)
        size = sum(t.numel() * t.element_size() for t in state.values())
        print(f"torch {torch.__version__}, holdfast {holdfast._ext.holdfast_version}: a "
              f"{size / 2**20:.0f} MiB state_dict of {len(state)} CPU tensors, in {base}; "
              f"median of {a.reps} (after 1 warm-up), min..max", flush=True)
        rows = []
        local = tempfile.mkdtemp(prefix="holdfast-torch-local-", dir=a.local_dir or base)
        print(f"local tier in {local}", flush=True)
        cases = (("holdfast two tiers", lambda *x: bench_holdfast(*x, local)),
                 ("torch.save", bench_torch_save), ("dcp.async_save", bench_dcp))
        for name, fn in cases:
            r = fn(state, base, a.reps)
            rows.append((name, [b for b, _ in r], [d for _, d in r]))
            gc.collect()
            print(f"  {name}: done", flush=True)
        print()
        print(f"| {'save path':<20} | {'training thread blocked':<26} | {'until durable':<26} |")
        print(f"|{'-' * 22}|{'-' * 28}|{'-' * 28}|")
        for name, blocked, durable in rows:
            print(f"| {name:<20} | {summary(blocked):<26} | {summary(durable):<26} |")
        base_blocked = statistics.median(rows[1][1])
        print()
        for name, blocked, _ in rows:
            print(f"{name}: blocked {statistics.median(blocked) / base_blocked:.2f}x torch.save's")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if a.local_dir and local:
            shutil.rmtree(local, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
