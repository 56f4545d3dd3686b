"""A preemptible DDP training script: the README's recipe, as users copy it.

    pip install -r examples/pytorch/requirements.txt && pip install --no-build-isolation ./packaging/python
    torchrun --nproc-per-node=4 --max-restarts=3 train.py --dir /tmp/run

Send SIGTERM to any worker (or to torchrun itself, as Kubernetes and scancel do): every worker
saves a checkpoint at one agreed step and exits with the preset's code; torchrun restarts the
group (or you relaunch torchrun), which restores that step and trains on. The last line is the
final state's SHA-256: with 2 workers it equals an uninterrupted run's bit for bit (tests/pytorch
checks it); with more, DDP's all-reduce may sum in another order after a restart.
"""
# [snippet]
import argparse
import hashlib
import os
import signal
import time

import torch
import torch.distributed as dist

import holdfast_torch as holdfast  # pip install --no-build-isolation ./packaging/python

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)             # checkpoints: <dir>/ckpt/rank-<k>
p.add_argument("--steps", type=int, default=60)
p.add_argument("--store", default="torch")         # torch, file:///shared/dir, etcd://host:port
p.add_argument("--preset", default="generic")      # generic (exit 42), k8s, slurm (exit 143)
p.add_argument("--notice-file", default=None)      # a file whose appearance is a notice
p.add_argument("--step-time", type=float, default=0.05)
p.add_argument("--grace", type=float, default=None)  # seconds of training after a notice
a = p.parse_args()

holdfast.init_process_group("gloo")                # torch's, safe across torchrun restarts
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(step):
    g = torch.Generator().manual_seed(step * world + rank)  # the batch of (step, rank)
    x = torch.randn(16, 8, generator=g)
    loss = (ddp(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()  # DDP's all-reduce (with 2 workers a + b == b + a: runs match bit for bit)
    opt.step()
    time.sleep(a.step_time)  # the rest of a real step's work


# A staged save: save() copies the state dicts' tensors and returns; C++ writes them meanwhile.
# [snippet staged]
ckpt = holdfast.CheckpointManager(os.path.join(a.dir, "ckpt", f"rank-{rank}"),
                                  state={"model": model, "opt": opt})
# [/snippet staged]
try:
    with holdfast.Handler(preset=a.preset, store=a.store, checkpoints=ckpt,
                          notice_file=a.notice_file, grace=a.grace) as h:
        if h.restored_step is not None:
            print(f"rank {rank}: restored step {h.restored_step}", flush=True)
        while h.total_run_calls < a.steps:
            h.run(train_step, h.total_run_calls)  # raises holdfast.Preempted after the save
except holdfast.Preempted:
    # Saved. torchrun SIGTERMs the ranks still running once one exits: leave with our code.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise

if rank == 0:
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in model.state_dict().values()))
    print(f"final state sha256 {digest.hexdigest()}", flush=True)
dist.destroy_process_group()
# [/snippet]
