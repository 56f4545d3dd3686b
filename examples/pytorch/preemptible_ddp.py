#!/usr/bin/env python3
"""preemptible_ddp — holdfast in a real PyTorch job: DDP under torchrun, preempted, restarted.

    python examples/pytorch/preemptible_ddp.py [--kv=torch|file:///dir|etcd://host:port]
        [--workers 4] [--grace SECONDS] [--kill] [--preempt worker|torchrun] [--hang sleep|stop]
        [--device cpu|cuda] [--steps 48] [--seed 7] [--dir DIR [--keep]]
        [--reference computed|launch] [--local-dir DIR [--new-node]]
        [--save-policy every|auto [--min-interval S]]

Run it with a Python that has torch and holdfast_torch installed (examples/pytorch/README.md:
pip install -r examples/pytorch/requirements.txt, then pip install --no-build-isolation
./packaging/python; tests/pytorch/run.sh makes such an environment). The driver starts the job
with the real `torchrun` (`--nproc-per-node=N --max-restarts=2`, static rendezvous on one node:
the agent hosts the TCPStore the workers share). Each worker trains a small deterministic model
with DistributedDataParallel (gloo on the CPU; --device cuda: NCCL, one GPU per worker) on
synthetic data read through a holdfast multiprocess file cache in DataLoader worker processes,
every step inside holdfast's preemption handler, whose coordination store is the job's own c10d
store by default (--kv=torch). Every task also saves a periodic checkpoint every 5 steps into its
own directory, <run dir>/ckpt/rank-<k>.

Default: the driver sends SIGTERM to a random worker at a random step. Every worker checkpoints
at one agreed step and exits with the preset's code (42); torchrun restarts the worker group,
which agrees on the newest checkpoint all of them hold, restores it and finishes.

--preempt torchrun: the SIGTERM goes to the torchrun process itself (what Kubernetes and scancel
do): the agent forwards it to every worker and SIGKILLs them --shutdown-timeout seconds later
(30 by default). Every worker saves at one agreed step and exits; torchrun exits; the driver
launches torchrun again (same default run id "none"), which restores that step and finishes.
With --grace G the preset is Kubernetes' (exit 143) with grace G, and torchrun's window is G
too: the workers train on and make a final save that must land before the agent's SIGKILL.

--kill: the driver SIGKILLs a random worker (no notice) after some periodic checkpoints. The
survivors' next collective fails inside the step; the agent sees the dead worker and SIGTERMs
the others, which is a notice: the survivors agree, the dead task never answers, and every
survivor's handler raises AgreementTimeout naming it (within ack_timeout, 5 s, well below the
agent's 30 s between SIGTERM and SIGKILL). torchrun restarts the group, which resumes from the
newest periodic checkpoint every task holds; the steps after it run twice (reported).

--hang sleep|stop: the workers run with Handler(hang_policy="restart", hang_timeout=3) and gloo's
timeout at 60 s (>= 10 x the hang bound, so gloo cannot end the step first). sleep: the victim's
step sleeps forever (after its forward pass) at a step after some periodic checkpoints; stop: the
driver SIGSTOPs the victim there. The others wait in the all-reduce; a watcher finds its step
past the bound and records one verdict, every worker that learns it exits 75, torchrun restarts
the group (the SIGSTOPped worker is ended by torchrun's SIGTERM, then SIGKILL 30 s later), and
the new launch resumes from the newest checkpoint every task holds. The driver checks one
verdict, stall -> verdict <= bound + one period + 1 s, and prints stall -> verdict, verdict ->
every worker gone and torchrun restart -> first step on its verdict line.

--local-dir DIR: two tiers (CheckpointManager(local_dir=...)): each task saves to
DIR/ckpt/rank-<k> first and a background thread copies each checkpoint to the checkpoint
directory above (the durable tier). --new-node: the victim's restarted worker empties its local
tier first (a replacement node) and must restore the agreed step from the durable tier.
--save-policy auto: the periodic saves come at the interval holdfast's save_interval_policy picks
(from the measured save cost and the run history; at least --min-interval seconds apart), decided
by task 0 and broadcast, so every task saves the same steps (checked).

Without --dir the run directory is a fresh $TMPDIR/holdfast-ddp-XXXXXX (/tmp without TMPDIR) that
the driver removes when the run ends, whatever the verdict, unless --keep; torchrun's logs
(--log-dir) and the cache directory DDP makes for inductor ($TORCHINDUCTOR_CACHE_DIR, unless set)
go in the run directory too, so a run leaves nothing in $TMPDIR. A --dir of your own is never
removed.

Then the driver checks the final model and optimizer state against an uninterrupted run, bit for
bit: by default the uninterrupted job computed in the driver's own process (every worker's
gradient of every step, averaged in rank order as the workers' DDP communication hook does);
with --reference=launch (the default with --device cuda), a second launch of the same job with no
signal. It checks that every step ran exactly once (--kill, --hang: at least once, twice only
after the checkpoint the restart resumed from), prints a timeline,
the per-step cost of wrapping a step in the handler, and `verdict: PASS` or `verdict: FAIL`
(exit status 0 only on PASS).

The workers are this same script under torchrun; to run it by hand:

    torchrun --nproc-per-node=4 --max-restarts=2 examples/pytorch/preemptible_ddp.py \\
        --worker --dir /tmp/ddp-run

(Not --standalone: that picks the c10d rendezvous, whose workers' store rank 0 hosts, so the
store, and with it --kv=torch, dies with rank 0. torchrun's default static rendezvous has the
agent host the store.)
"""

import os
import shutil
import subprocess
import sys
import time

_STARTED = time.time()

import argparse  # noqa: E402
import datetime  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import stat  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import holdfast_torch as holdfast  # noqa: E402  (installed: examples/pytorch/README.md)

_IMPORTED = time.time()

# ---------------------------------------------------------------------------------------------
# The job: everything here is deterministic, so a preempted run and an uninterrupted one can be
# compared bit for bit.

IN, HIDDEN, OUT = 16, 32, 4
SHARD = 128               # samples per worker
BATCH = 16                # samples per worker per step: an epoch is 8 steps
STEPS_PER_EPOCH = SHARD // BATCH
CKPT_EVERY = 5            # periodic checkpoints
STEP_SLEEP = 0.03         # the rest of a real step's compute
ACK_TIMEOUT = 5.0         # seconds; the agent waits 30 s between SIGTERM and SIGKILL
COLLECTIVE_TIMEOUT = 20   # seconds: init_process_group(timeout=...)
HANG_TIMEOUT = 3.0        # --hang: the step's hang floor (Handler(hang_timeout=...)), seconds
HANG_PERIOD = 0.5         # --hang: the detector's longest look-away (Handler(hang_period=...))
HANG_WARMUP = 10          # --hang: steps timed before the learned bound (a short test job)
HANG_COLLECTIVE_TIMEOUT = 60   # --hang: gloo's timeout, >= 10 x the hang bound: gloo cannot
                               # fail first and pass the case without the detector
HANG_EXIT = 75            # --hang: what every worker exits with (hang_policy="restart")
HANG_ALLOWANCE = 1.0      # --hang: the scheduling allowance of stall -> verdict (a loaded 2-core
                          # machine's wake-up latency, and a survivor's step begun after the stall)


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, OUT))


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def make_sample(seed, rank, i):
    """Sample i of worker `rank`'s shard, as bytes (what the cache stores)."""
    g = torch.Generator().manual_seed(seed * 1000003 + rank * 65537 + i)
    x = torch.randn(IN, generator=g)
    w = torch.arange(IN * OUT, dtype=torch.float32).reshape(OUT, IN) / (IN * OUT) - 0.5
    y = torch.tanh(w @ x) + 0.01 * torch.randn(OUT, generator=g)
    return torch.cat([x, y]).numpy().tobytes()


def batch_indices(seed, rank, step):
    """The shard indices of `step`: a fresh permutation per epoch."""
    epoch, pos = divmod(step, STEPS_PER_EPOCH)
    g = torch.Generator().manual_seed(seed * 7919 + rank * 104729 + epoch)
    perm = torch.randperm(SHARD, generator=g)
    return perm[pos * BATCH:(pos + 1) * BATCH].tolist()


class CachedShard(torch.utils.data.Dataset):
    """A worker's shard, read through the holdfast cache (DataLoader workers share it)."""

    def __init__(self, cache, seed, rank, fills, hits):
        self.cache, self.seed, self.rank, self.fills, self.hits = cache, seed, rank, fills, hits

    def __len__(self):
        return SHARD

    def __getitem__(self, i):
        data = self.cache.get(i)
        if data is None:
            data = make_sample(self.seed, self.rank, i)
            self.cache.put(i, data)
            with self.fills.get_lock():
                self.fills.value += 1
        else:
            with self.hits.get_lock():
                self.hits.value += 1
        t = torch.frombuffer(bytearray(data), dtype=torch.float32)
        return t[:IN], t[IN:]


def loader_worker_init(worker_id):
    """DataLoader worker_init_fn.

    - torchrun (2.x) sends its SIGTERM to each worker's whole process group (os.killpg), so the
      loader workers get it too; dying of it, they would make the DataLoader raise "DataLoader
      worker ... is killed by signal: Terminated" in the trainer in the middle of its agreement.
      They ignore it: a loader worker exits by itself when its trainer is gone.
    - The loader workers are forked from a trainer whose gloo connections (and store
      connection) are open; their copies would keep a SIGKILLed trainer's connections open
      until its loader workers notice their parent is gone (up to 5 s), so its peers'
      collectives would not fail at once. They close them: the loader needs none."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=fd)
        except (OSError, ValueError):
            continue
        if s.family in (socket.AF_INET, socket.AF_INET6):
            s.close()
        else:
            s.detach()


class StepBatches(torch.utils.data.Sampler):
    """The batches of steps [start, stop), in order."""

    def __init__(self, seed, rank, start, stop):
        self.seed, self.rank, self.start, self.stop = seed, rank, start, stop

    def __iter__(self):
        for s in range(self.start, self.stop):
            yield batch_indices(self.seed, self.rank, s)

    def __len__(self):
        return self.stop - self.start


def short_error(e):
    """The gist of a gloo error: "Read error [127.0.0.1]:5678: Connection reset by peer"."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    text = text.split("when running the callback: ")[-1]
    text = re.sub(r"^RuntimeError: ", "", text)
    return re.sub(r"^\[[^\]]*gloo[^\]]*\] ", "", text)


def line(text):
    """One timeline line in one write(2): lines of concurrent workers never interleave."""
    sys.stdout.flush()
    os.write(1, (text + "\n").encode())


def ordered_allreduce(world):
    """A DDP communication hook: the gradient average as ((g0 + g1) + g2 ...) / world, summed in
    rank order after an all-gather. Unlike a ring all-reduce, whose order of summation depends on
    where an element falls in the bucket (and DDP rebuilds its buckets after the first step of
    every process), this gives the same bits in a resumed process as in an uninterrupted one,
    and the driver can compute the same bits in one process."""
    def hook(state, bucket):
        t = bucket.buffer()
        parts = [torch.empty_like(t) for _ in range(world)]
        fut = dist.all_gather(parts, t, async_op=True).get_future()

        def reduce(done):
            done.wait()  # raises the all-gather's error (a lost peer) into backward()
            out = parts[0].clone()
            for p in parts[1:]:
                out += p
            return out.div_(world)
        return fut.then(reduce)
    return hook


def batch(seed, rank, step):
    """Step `step`'s batch of worker `rank`, built as the DataLoader builds it (no cache)."""
    rows = [torch.frombuffer(bytearray(make_sample(seed, rank, i)), dtype=torch.float32)
            for i in batch_indices(seed, rank, step)]
    return torch.stack([r[:IN] for r in rows]), torch.stack([r[IN:] for r in rows])


def reference_state(seed, world, steps):
    """The uninterrupted job computed in one process: every worker's gradient of every step,
    averaged exactly as ordered_allreduce averages them."""
    torch.set_num_threads(1)
    model = make_model(seed)
    optimizer = make_optimizer(model)
    loss_fn = torch.nn.MSELoss()
    params = list(model.parameters())
    for s in range(steps):
        grads = []
        for r in range(world):
            x, y = batch(seed, r, s)
            for p in params:
                p.grad = None
            loss_fn(model(x), y).backward()
            grads.append([p.grad.clone() for p in params])
        for i, p in enumerate(params):
            out = grads[0][i].clone()
            for g in grads[1:]:
                out += g[i]
            p.grad = out.div_(world)
        optimizer.step()
    return model, optimizer


def state_bytes(model, optimizer):
    """Every tensor of the model and optimizer state, in a fixed order, as raw bytes."""
    parts = []
    for name, t in sorted(model.state_dict().items()):
        parts.append((name, t.detach().contiguous().numpy().tobytes()))
    for pid, st in sorted(optimizer.state_dict()["state"].items()):
        for name, t in sorted(st.items()):
            if torch.is_tensor(t):
                parts.append((f"opt.{pid}.{name}", t.contiguous().numpy().tobytes()))
    return parts


def digest(parts):
    h = hashlib.sha256()
    for name, b in parts:
        h.update(name.encode())
        h.update(b)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# The worker: one process of the job (started by the elastic agent, or by torchrun).

class Worker:
    def __init__(self, a):
        self.a = a
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.launch = a.launch     # which torchrun launch of the driver (0, then 1 after
        self.first = self.launch == 0 and self.restart == 0   # --preempt torchrun relaunches)
        self.device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
                       if a.device == "cuda" else torch.device("cpu"))
        self.t0 = a.t0 if a.t0 else time.time()
        self.label = a.label
        for sub in ("progress", "steps", "events", "cache"):
            os.makedirs(os.path.join(a.dir, sub), exist_ok=True)
        self.lost = None           # a collective's failure, caught inside the step
        self.periodic = False      # the save callable is running for a periodic checkpoint

    def say(self, text):
        line(f"[{time.time() - self.t0:7.3f} s] worker {self.rank}: {text}")

    def path(self, sub, name):
        return os.path.join(self.a.dir, sub, f"{self.label}-{name}")

    def progress(self, step):
        tmp = self.path("progress", f"rank-{self.rank}.tmp")
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()} {self.launch * 100 + self.restart} {step}\n")
        os.replace(tmp, self.path("progress", f"rank-{self.rank}"))

    def event(self, **kw):
        kw.update(rank=self.rank, restart=self.restart, launch=self.launch, first=self.first,
                  pid=os.getpid(), t=time.time() - self.t0)
        with open(self.path("events", f"rank-{self.rank}.jsonl"), "a") as f:
            f.write(json.dumps(kw) + "\n")

    def main(self):
        a = self.a
        torch.set_num_threads(1)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # torch.distributed's init_process_group, with a store prefix per torchrun restart (see
        # holdfast_torch.init_process_group: without it the restarted gloo group fails)
        collective = HANG_COLLECTIVE_TIMEOUT if a.hang != "none" else COLLECTIVE_TIMEOUT
        holdfast.init_process_group("nccl" if self.device.type == "cuda" else "gloo",
                                    timeout=datetime.timedelta(seconds=collective))
        model = make_model(a.seed).to(self.device)
        optimizer = make_optimizer(model)

        def save(directory, step):
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step}, os.path.join(directory, "state.pt"))
            if not self.periodic:
                self.say(f"saved checkpoint of step {step} (the step all workers agreed on)")

        def restore(directory, step):
            state = torch.load(os.path.join(directory, "state.pt"), map_location=self.device)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])

        # Every task writes its own checkpoint directory; the handler restores the newest step
        # all of them hold (its restore agreement) and saves there at the agreed step.
        ckpt_dir = "ckpt" if self.label == "run" else f"ckpt-{self.label}"
        # On the CPU a staged save (state=): save() copies the tensors into holdfast's staging
        # memory and returns, and the library writes them meanwhile (docs/saving.md). CUDA
        # tensors are not staged by this version: there the callables above save with torch.
        saving = (dict(state={"model": model, "optimizer": optimizer})
                  if self.device.type == "cpu" else dict(save=save, restore=restore))
        ckpt = holdfast.CheckpointManager(
            os.path.join(a.dir, ckpt_dir, f"rank-{self.rank}"), max_to_keep=3, **saving,
            **self.two_tier_options(ckpt_dir))
        grace = a.grace if a.grace > 0 else None
        hang = {}
        if a.hang != "none":  # every worker exits with HANG_EXIT once a verdict is recorded
            def on_hang(v):
                self.event(kind="hang", verdict=v, collective_timeout=collective)
                self.say(f"hang verdict: task {v['task']} in {v['phase']} at step {v['step']} "
                         f"for {v['elapsed_s']:.1f} s (bound {v['bound_s']:.1f} s; recorded by "
                         f"task {v['recorder']}); exiting with {HANG_EXIT} for torchrun to "
                         f"restart the group")
            # [snippet hang]
            hang = dict(hang_policy=a.hang_policy, hang_timeout=a.hang_timeout,
                        hang_period=HANG_PERIOD, hang_warmup_steps=HANG_WARMUP,
                        hang_exit_code=HANG_EXIT, on_hang=on_hang)
            # [/snippet hang]
        h = holdfast.Handler(preset=a.preset, store=a.kv, checkpoints=ckpt,
                             ack_timeout=ACK_TIMEOUT, grace=grace,
                             grace_margin=min(3.0, a.grace / 4) if grace else 3.0, **hang)
        # Setting up DDP and the DataLoader's processes is no step: no hang bound until the
        # first run() (a loaded machine takes seconds to fork the loader workers).
        h.pause_hang_detection()
        start = h.total_run_calls
        if h.restored_step is not None:
            self.say(f"restored checkpoint of step {h.restored_step} "
                     f"(restart {self.restart}, pid {os.getpid()}), resuming")
        else:
            self.say(f"started fresh (restart {self.restart}, pid {os.getpid()})")
        self.event(kind="start", restored=h.restored_step)
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        ddp.register_comm_hook(None, ordered_allreduce(self.world))
        loss_fn = torch.nn.MSELoss()

        # Training data through the holdfast cache, in DataLoader worker processes (fork).
        mp = torch.multiprocessing.get_context("fork")
        fills, hits = mp.Value("q", 0), mp.Value("q", 0)
        cache = holdfast.Cache(SHARD, dir=os.path.join(a.dir, "cache"))
        loader = torch.utils.data.DataLoader(
            CachedShard(cache, a.seed, self.rank, fills, hits),
            batch_sampler=StepBatches(a.seed, self.rank, start, a.steps), num_workers=2,
            multiprocessing_context=mp, worker_init_fn=loader_worker_init)
        batches = iter(loader)
        log = os.open(self.path("steps", f"rank-{self.rank}.log"),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

        def train_step(x, y, step):
            try:
                x, y = x.to(self.device), y.to(self.device)
                loss = loss_fn(ddp(x), y)
                if self.first and a.hang != "none" and self.rank == a.victim and step == a.hang_step:
                    self.stall(step)  # the others wait for this worker in backward's all-gather
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # DDP's all-reduce of the gradients
                optimizer.step()
            except RuntimeError as e:  # a collective failed: some peer is gone
                self.lost = e
                return None
            return loss.item()

        code = 0
        try:
            self.progress(start - 1)
            while h.total_run_calls < a.steps:
                s = h.total_run_calls
                x, y = next(batches)
                h.run(train_step, x, y, s)
                if s == start and not self.first:
                    self.event(kind="first_step", step=s)
                if self.lost is not None:
                    self.name_the_missing(h, s)
                if h.last_status == "saved":
                    self.say(f"saved at the agreed step {s}; training on through the grace period")
                    self.round_summary(h, "first")
                os.write(log, f"{s}\n".encode())
                self.progress(s)
                if a.save_policy == "auto":  # task 0 decides, every rank saves the same step
                    self.periodic = True
                    try:
                        if s + 1 < a.steps and ckpt.save_if_due(s + 1):
                            self.event(kind="periodic", step=s + 1)
                    finally:
                        self.periodic = False
                elif (s + 1) % CKPT_EVERY == 0 and s + 1 < a.steps:
                    self.periodic = True
                    try:
                        ckpt.save(s + 1)
                    finally:
                        self.periodic = False
                    if self.rank == 0:
                        self.say(f"periodic checkpoint of step {s + 1} (each task: ckpt/rank-<k>)")
                time.sleep(STEP_SLEEP)
            model.cpu()  # the checks compare CPU bytes (a no-op on the CPU)
            for st in optimizer.state.values():
                for k, v in st.items():
                    if torch.is_tensor(v):
                        st[k] = v.cpu()
            state = state_bytes(model, optimizer)
            if self.rank == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                           os.path.join(a.dir, f"final-{self.label}.pt"))
            self.event(kind="finish", digest=digest(state))
            ckpt.note_clean_end()
            self.say(f"finished {a.steps} steps (cache: {fills.value} fills, {hits.value} hits)")
        except holdfast.Preempted as p:
            # Saved at the agreed step. The agent SIGTERMs the rest of the group once the first
            # worker exits: ignore it now, we are leaving anyway.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            code = p.code
            ckpt.note_notice()
            self.event(kind="preempted", step=h.total_run_calls, code=code)
            self.say(f"exiting with {code} (preempted; saved at step {h.total_run_calls})")
            self.round_summary(h, "final" if a.grace > 0 else "first")
        except holdfast.AgreementTimeout as e:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            code = 3
            self.event(kind="timeout", missing=list(e.missing_tasks), message=str(e))
            self.say(f"AgreementTimeout: task(s) {list(e.missing_tasks)} never answered "
                     f"({e}); exiting with {code}")
            self.round_summary(h, "first")
        except holdfast.PeerError as e:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            code = 4
            self.event(kind="peer_error", origin=e.origin_task, message=str(e))
            self.say(f"PeerError from task {e.origin_task}: {e.message}; exiting with {code}")
        except RuntimeError as e:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            code = 5
            self.event(kind="error", message=str(e))
            self.say(f"step failed: {short_error(e)}; exiting with {code}")
        finally:
            del batches
            os.close(log)
            h.close()
            dist.destroy_process_group()
        return code

    def stall(self, step):
        """--hang: this worker's step never ends. sleep: it sleeps (releasing the GIL, as a stuck
        collective or a wedged device does) until its watcher thread ends the process; stop: it
        tells the driver where it is and waits to be frozen with SIGSTOP (never ended by itself:
        torchrun's SIGTERM, then its SIGKILL 30 s later, ends it)."""
        self.event(kind="stall", step=step, how=self.a.hang)
        if self.a.hang == "sleep":
            self.say(f"step {step}: sleeping forever inside the step (--hang sleep)")
            while True:
                time.sleep(0.1)
        self.say(f"step {step}: waiting inside the step for the driver's SIGSTOP (--hang stop)")
        marker = self.path("progress", "stall")
        with open(marker + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {step}\n")
        os.replace(marker + ".tmp", marker)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the SIGSTOP lands here; SIGKILL ends it
            time.sleep(0.005)
        self.say("no SIGSTOP came within 30 s; going on")

    # [snippet two-tier-options]
    def two_tier_options(self, ckpt_dir):
        """--local-dir: two tiers, <local dir>/<ckpt dir>/rank-<k> first, copied in the background
        to the checkpoint directory (the durable tier). --new-node: the restarted victim worker
        empties its local tier first, as a replacement node would find it. --save-policy auto:
        save_if_due (task 0's save_interval_policy, broadcast to every rank)."""
        a, o = self.a, {}
        if a.local_dir:
            local = os.path.join(a.local_dir, ckpt_dir, f"rank-{self.rank}")
            if a.new_node and not self.first and self.rank == a.victim:
                held = sorted(os.listdir(local)) if os.path.isdir(local) else []
                shutil.rmtree(local, ignore_errors=True)
                self.event(kind="new_node", removed=held)
                self.say(f"new node: local tier {local} emptied ({len(held)} entries removed)")
            o.update(local_dir=local, local_max_to_keep=2, durable_wait=10.0)
        if a.save_policy == "auto":
            o.update(save_policy="auto", mtbi_prior_s=a.mtbi_prior, min_interval_s=a.min_interval,
                     max_interval_s=max(a.min_interval, 3600.0))
        return o
    # [/snippet two-tier-options]

    def name_the_missing(self, h, step):
        """A collective failed inside step `step`: some peer is gone. Under the elastic agent
        the others get SIGTERM at once (the agent saw a worker die), which is a notice: the
        handler's agreement names the task that never answers. Raises what it recorded
        (AgreementTimeout, or PeerError), else the collective's own error. Never saves: this
        worker's state is past a failed step."""
        self.say(f"step {step}: a collective failed ({short_error(self.lost)}); asking the "
                 f"handler who is gone")
        deadline = time.monotonic() + ACK_TIMEOUT + 10
        while time.monotonic() < deadline:
            state = h.state
            if state == "failed":
                h.save_checkpoint_if_preempted()  # raises the recorded failure
                break
            if state not in ("idle", "noticed", "claimed", "acked"):
                break  # every task answered (nobody is gone): no verdict to wait for
            time.sleep(0.05)
        raise self.lost

    def round_summary(self, h, phase):
        """The claimant prints what the store holds for the round (claim, acks, outcome) of the
        first save, or of the final save of the grace path."""
        try:
            r = h.round_summary(0)
        except holdfast.Error:
            return
        prefix = "" if phase == "first" else "final_"
        claim = r[prefix + "claim"]
        if not claim or claim.get("by") != self.rank:
            return
        acks = " ".join(f"{t}@{v}" for t, v in sorted(r[prefix + "acks"].items()))
        acks = acks or "(each erased once the step was agreed)"
        out = r[prefix + "outcome"] or {}
        if out.get("kind") == "step":
            outcome = f"agreed step {out['step']} = max + 1"
        elif out.get("kind") == "timeout":
            outcome = f"timeout: no answer from task(s) {out['missing']}"
        else:
            outcome = out.get("text", "none yet")
        what = "checkpoint" if phase == "first" else "final save"
        line(f"[{time.time() - self.t0:7.3f} s] store: {what}: worker {self.rank} claimed; acks "
             f"(task@run counter): {acks}; outcome: {outcome}")


# ---------------------------------------------------------------------------------------------
# The driver.

class Timeline:
    def __init__(self):
        self.t0 = time.time()

    def __call__(self, text):
        line(f"[{time.time() - self.t0:7.3f} s] {text}")


class AgentLog:
    """torchrun's own log (its stderr): all of it to <dir>/agent.log, the agent's decisions on
    the timeline."""

    def __init__(self, timeline, path, pid_names):
        self.timeline, self.file, self.pid_names = timeline, open(path, "a"), pid_names
        self.marks = []  # (seconds since the timeline's start, "sigterm"|"restart"|"exit:<code>")

    def feed(self, stream):
        for raw in stream:
            msg = raw.rstrip("\n")
            self.file.write(msg + "\n")
            self.file.flush()
            failed = re.search(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)",
                               msg)
            if failed:
                code, rank, pid = (int(v) for v in failed.groups())
                self.marks.append((time.time() - self.timeline.t0, f"exit:{code}"))
                how = (f"was killed by {signal.Signals(-code).name}" if code < 0 else
                       f"exited with {code}")
                self.timeline(f"torchrun: group stopped; the first worker to end was worker "
                              f"{rank} (pid {pid}): it {how}")
            elif re.search(r"Sending process (\d+) closing signal", msg):
                pid = int(re.search(r"Sending process (\d+)", msg).group(1))
                self.marks.append((time.time() - self.timeline.t0, "sigterm"))
                self.timeline(f"torchrun: SIGTERM -> {self.pid_names(pid)} (pid {pid}), still "
                              f"running")
            elif "will restart worker group" in msg:
                left = re.search(r"(\d+)/(\d+) attempts left", msg)
                self.marks.append((time.time() - self.timeline.t0, "restart"))
                self.timeline("torchrun: restarting the worker group"
                              + (f" ({left.group(1)} of {left.group(2)} restarts left before "
                                 f"this one)" if left else ""))
            elif "Received" in msg and "death signal" in msg:
                self.timeline(f"torchrun: {msg.split('] ')[-1].strip()}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command():
    """The torchrun beside this interpreter (a virtual environment's bin/), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "torchrun")
    found = here if os.path.exists(here) else shutil.which("torchrun")
    if not found:
        sys.exit("preemptible_ddp: no torchrun beside this Python or on PATH")
    return found


def launch(a, timeline, label, log, max_restarts, launch_index=0, started=None):
    """`torchrun --nproc-per-node=N --max-restarts=R` on this script's --worker mode: the static
    rendezvous (torchrun's default on one node), whose TCPStore the agent itself hosts, so the
    workers' store (and the handler's keys in it) outlives any worker. Returns torchrun's exit
    status; `started(process)` is called once it runs."""
    cmd = [torchrun_command(), f"--nproc-per-node={a.workers}", f"--max-restarts={max_restarts}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--monitor-interval=0.2",
           f"--log-dir={os.path.join(a.dir, 'torchrun')}"]  # not a torchelastic_* dir in $TMPDIR
    if a.grace > 0 and a.preempt == "torchrun":  # the agent's window is the preset's grace
        cmd.append(f"--shutdown-timeout={a.grace:g}")
    cmd += [os.path.abspath(__file__), "--worker", "--label", label, "--dir", a.dir,
            "--steps", str(a.steps), "--seed", str(a.seed), "--kv", a.kv_url(label),
            "--grace", str(a.grace), "--t0", repr(timeline.t0), "--preset", a.preset,
            "--device", a.device, "--launch", str(launch_index), "--hang", a.hang,
            "--hang-step", str(a.hang_step), "--victim", str(a.victim),
            "--hang-timeout", repr(a.hang_timeout), "--hang-policy", a.hang_policy]
    if a.local_dir:
        cmd += ["--local-dir", a.local_dir] + (["--new-node"] if a.new_node else [])
    if a.save_policy == "auto":
        cmd += ["--save-policy", "auto", "--min-interval", repr(a.min_interval),
                "--mtbi-prior", repr(a.mtbi_prior)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    reader = threading.Thread(target=log.feed, args=(proc.stderr,), daemon=True)
    reader.start()
    if started:
        started(proc)
    code = proc.wait()
    reader.join()
    return code


def load_state(path, seed):
    """state_bytes of a saved {"model": ..., "optimizer": ...}."""
    saved = torch.load(path)
    model = make_model(seed)
    model.load_state_dict(saved["model"])
    optimizer = make_optimizer(model)
    optimizer.load_state_dict(saved["optimizer"])
    return state_bytes(model, optimizer)


def read_events(a, label):
    out = []
    for r in range(a.workers):
        p = os.path.join(a.dir, "events", f"{label}-rank-{r}.jsonl")
        if os.path.exists(p):
            with open(p) as f:
                out += [json.loads(line) for line in f if line.strip()]
    return out


def read_progress(a, label, rank):
    try:
        with open(os.path.join(a.dir, "progress", f"{label}-rank-{rank}")) as f:
            pid, restart, step = (int(v) for v in f.read().split())
        return pid, restart, step
    except (OSError, ValueError):
        return None


def step_counts(a, label):
    counts = []
    for r in range(a.workers):
        c = [0] * a.steps
        p = os.path.join(a.dir, "steps", f"{label}-rank-{r}.log")
        if os.path.exists(p):
            with open(p) as f:
                for line in f:
                    s = int(line)
                    if 0 <= s < a.steps:
                        c[s] += 1
        counts.append(c)
    return counts


def measure_overhead(a):
    """Median over 5 runs of (h.run(noop) - noop()) per call, in a 1-task handler."""
    d = os.path.join(a.dir, "overhead")
    ckpt = holdfast.CheckpointManager(os.path.join(d, "ckpt"), save=lambda d, s: None,
                                      restore=lambda d, s: None)
    n, runs = 200000, []
    with holdfast.Handler(store="file://" + os.path.join(d, "kv"), checkpoints=ckpt, task=0,
                          num_tasks=1, run_id="overhead", restart=0) as h:
        def noop():
            pass
        run = h.run
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n):
                noop()
            direct = (time.perf_counter() - t) / n
            t = time.perf_counter()
            for _ in range(n):
                run(noop)
            wrapped = (time.perf_counter() - t) / n
            runs.append((direct, wrapped))
    return (statistics.median(w - d for d, w in runs), statistics.median(d for d, _ in runs),
            statistics.median(w for _, w in runs), n)


def alive(pid):
    """Whether process `pid` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def hang_monitor(a, tl, stop, out):
    """--hang: freezes the victim with SIGSTOP once it waits inside its step (--hang stop), and
    notes when each worker of the first launch ends (out["gone"][rank], seconds on the
    timeline)."""
    marker = os.path.join(a.dir, "progress", "run-stall")
    pids, gone = {}, {}
    out["gone"] = gone
    while not stop.wait(0.005):
        if len(pids) < a.workers:
            for r in range(a.workers):
                p = read_progress(a, "run", r)
                if p and p[1] == 0:
                    pids.setdefault(r, p[0])
        if a.hang == "stop" and "stall" not in out and os.path.exists(marker):
            try:
                with open(marker) as f:
                    pid, step = (int(v) for v in f.read().split())
            except (OSError, ValueError):
                continue
            os.kill(pid, signal.SIGSTOP)
            out.update(stall=time.time() - tl.t0, stall_step=step)
            tl(f"driver: SIGSTOP -> worker {a.victim} (pid {pid}) inside its step {step}")
        for r, pid in pids.items():
            if r not in gone and not alive(pid):
                gone[r] = time.time() - tl.t0
                tl(f"driver: worker {r} (pid {pid}) of the first launch is gone")
        if len(gone) == a.workers:
            return


def hang_checks(a, check, events, hung, log, victim):
    """--hang: one verdict, learned by every worker that could; stall -> verdict within the bound
    plus one period (+ HANG_ALLOWANCE); the exit code torchrun saw; the timings, in
    hung["summary"] for the verdict line."""
    first = [e for e in events if e["first"]]
    stalls = [e for e in first if e["kind"] == "stall"]
    if a.hang == "sleep" and stalls:
        hung.setdefault("stall", stalls[0]["t"])
    check("stall" in hung, f"worker {victim} stalled inside its step {a.hang_step} ("
          + ("it slept" if a.hang == "sleep" else "the driver's SIGSTOP") + ")")
    learned = {e["rank"]: e for e in first if e["kind"] == "hang"}
    verdicts = {json.dumps(e["verdict"], sort_keys=True) for e in learned.values()}
    need = [r for r in range(a.workers) if a.hang == "sleep" or r != victim]
    check(len(verdicts) == 1 and all(r in learned for r in need),
          f"one verdict ({len(verdicts)} distinct), learned by workers {sorted(learned)} of "
          f"{need} (the restart policy acts on it, then exits {HANG_EXIT})")
    if not verdicts or "stall" not in hung:
        return
    v = json.loads(verdicts.pop())
    recorded = learned.get(v["recorder"], min(learned.values(), key=lambda e: e["t"]))["t"]
    stall_to_verdict = recorded - hung["stall"]
    limit = v["bound_s"] + HANG_PERIOD + HANG_ALLOWANCE
    check(v["phase"] == "step" and stall_to_verdict <= limit
          and v["elapsed_s"] <= v["bound_s"] + HANG_PERIOD + HANG_ALLOWANCE,
          f"verdict: task {v['task']} hung in {v['phase']} at step {v['step']}, recorded by task "
          f"{v['recorder']}; stall -> verdict {stall_to_verdict:.2f} s on the driver's clock, "
          f"elapsed {v['elapsed_s']:.2f} s, both <= bound {v['bound_s']:.2f} s + period "
          f"{HANG_PERIOD:g} s + allowance {HANG_ALLOWANCE:g} s = {limit:.2f} s")
    timeouts = {e["collective_timeout"] for e in learned.values()}
    check(all(t >= 10 * v["bound_s"] for t in timeouts),
          f"gloo's timeout {sorted(timeouts)} s >= 10 x the bound: the detector, not gloo, ended "
          f"the step")
    exits = [m for _, m in log.marks if m.startswith("exit:")]
    check(bool(exits) and exits[0] == f"exit:{HANG_EXIT}",
          f"torchrun saw the first worker end with {exits[0][5:] if exits else 'nothing'} "
          f"(expected {HANG_EXIT}) and restarted the group")
    gone = hung.get("gone", {})
    all_gone = max(gone.values()) if len(gone) == a.workers else None
    starts = [e["t"] for e in events if e["kind"] == "first_step" and not e["first"]]
    first_step = max(starts) if len(starts) == a.workers else None
    sigterms = [t for t, m in log.marks if m == "sigterm" and t >= recorded]
    text = f"; stall -> verdict {stall_to_verdict:.2f} s (bound {v['bound_s']:.2f} s)"
    if all_gone is not None:
        text += f", verdict -> every worker gone {all_gone - recorded:.2f} s"
        if a.hang == "stop" and sigterms and victim in gone:
            # SIGKILL, unless a SIGCONT from outside the job woke it first (then its watcher,
            # overdue, ended it with the verdict: it logged it)
            how = "continued by a SIGCONT not the driver's, it exited itself" \
                if victim in learned else "SIGKILL"
            text += (f" (the stopped worker: torchrun's SIGTERM -> gone "
                     f"{gone[victim] - sigterms[0]:.2f} s, {how})")
        if first_step is not None:
            text += f", torchrun restart -> first step {first_step - all_gone:.2f} s"
    check(all_gone is not None and first_step is not None,
          "every worker of the first launch ended, and every worker of the restarted one ran a "
          "step")
    hung["summary"] = text


def driver(a):
    """Runs the job in a.dir: a fresh $TMPDIR/holdfast-ddp-* when none was given, removed at the
    end (any verdict, or an exception) unless --keep."""
    made = not a.dir
    if made:
        a.dir = tempfile.mkdtemp(prefix="holdfast-ddp-")
    a.dir_note = ("" if not made else " (kept: --keep)" if a.keep else
                  " (removed at the end; --keep keeps it)")
    try:
        return drive(a)
    finally:
        if made and not a.keep:
            shutil.rmtree(a.dir, ignore_errors=True)


def drive(a):
    tl = Timeline()
    os.makedirs(a.dir, exist_ok=True)
    # DDP (in the workers and in this process's reference) makes inductor's cache directory,
    # $TMPDIR/torchinductor_<user>: in the run directory it goes with the run (unless chosen).
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(a.dir, "torchinductor"))
    rng = random.Random()
    victim = rng.randrange(a.workers) if a.victim < 0 else a.victim
    a.victim = victim  # --new-node: the workers know which one is replaced
    if a.kill or a.hang != "none":
        target = rng.randrange(2 * CKPT_EVERY + 2, a.steps - CKPT_EVERY)
    else:
        target = rng.randrange(a.steps // 4, a.steps // 2 + 1)
    a.hang_step = target
    sig = signal.SIGKILL if a.kill else signal.SIGTERM
    url = a.kv
    expected_code = 42 if a.preset == "generic" else 143

    def kv_url(label):
        if url.startswith("etcd://") and "/" not in url[len("etcd://"):]:
            return url + "/holdfast-example/" + os.path.basename(a.dir) + "-" + label
        return url
    a.kv_url = kv_url

    print(f"(torch and holdfast_torch imported in {_IMPORTED - _STARTED:.1f} s)", flush=True)
    print(f"holdfast {holdfast._ext.holdfast_version} for PyTorch {torch.__version__}: "
          f"{a.workers} workers (DDP, "
          f"{'NCCL, one GPU each' if a.device == 'cuda' else 'gloo, CPU'}) under torchrun, "
          f"{a.steps} steps, run directory {a.dir}{a.dir_note}, coordination: {a.kv}", flush=True)
    whom = "torchrun itself" if a.preempt == "torchrun" else f"worker {victim}"
    how = {"sleep": f"worker {victim}'s step {target} sleeps forever",
           "stop": f"SIGSTOP worker {victim} inside its step {target}"}.get(a.hang)
    plan = (f"{how} (hang_policy={a.hang_policy}, hang_timeout={a.hang_timeout:g} s, gloo timeout "
            f"{HANG_COLLECTIVE_TIMEOUT} s)" if how else
            f"{'SIGKILL (no notice)' if a.kill else 'SIGTERM'} {whom} when worker {victim} "
            f"reaches step {target}")
    print(f"plan: {plan}; reference: "
          + ("an uninterrupted launch" if a.reference == "launch" else
             "the uninterrupted job computed in this process") + "\n", flush=True)

    def name_of(pid):
        for label in ("run", "reference"):
            for r in range(a.workers):
                p = read_progress(a, label, r)
                if p and p[0] == pid:
                    return f"worker {r}"
        return "a worker"

    log = AgentLog(tl, os.path.join(a.dir, "agent.log"), name_of)

    # The preempted run, with the driver's signal sent from a thread watching the progress files.
    sent = {}
    hung = {}  # --hang: the driver's times (hang_monitor)
    stop = threading.Event()
    agent = {}

    def preempt():
        if a.hang != "none":
            return hang_monitor(a, tl, stop, hung)
        while not stop.wait(0.01):
            p = read_progress(a, "run", victim)
            if p and p[1] == 0 and p[2] + 1 >= target:
                if a.preempt == "torchrun":
                    agent["proc"].send_signal(sig)
                    sent.update(pid=agent["proc"].pid, step=p[2])
                    tl(f"driver: {sig.name} -> torchrun (pid {agent['proc'].pid}; worker "
                       f"{victim} has run steps 0..{p[2]})")
                    return
                os.kill(p[0], sig)
                sent.update(pid=p[0], step=p[2])
                tl(f"driver: {sig.name} -> worker {victim} (pid {p[0]}; it has run steps "
                   f"0..{p[2]})")
                return

    tl(f"driver: torchrun --nproc-per-node={a.workers} --max-restarts=2")
    watcher = threading.Thread(target=preempt, daemon=True)
    watcher.start()
    code = launch(a, tl, "run", log, max_restarts=2, started=lambda p: agent.update(proc=p))
    stop.set()
    watcher.join()
    first_code = code
    if a.preempt == "torchrun":
        tl(f"driver: torchrun exited with {code}; launching it again (same run id)")
        code = launch(a, tl, "run", log, max_restarts=2, launch_index=1)
    launched_ok = code == 0
    run_done = time.time()
    tl("driver: the job finished" if launched_ok else
       f"driver: the job did not finish (torchrun exited with {code})")

    ref_ok, launched_ref = True, None
    if a.reference == "launch":
        tl("driver: reference: launching the same job again, with no signal")
        ref_ok = launch(a, tl, "reference", log, max_restarts=0) == 0
        if ref_ok:
            launched_ref = load_state(os.path.join(a.dir, "final-reference.pt"), a.seed)
        else:
            tl("driver: the reference failed")
    computed_ref = None
    if a.device == "cpu":
        tl("driver: reference: the uninterrupted job computed in this process (every worker's "
           "gradient of every step, averaged as the workers' all-reduce does)")
        computed_ref = state_bytes(*reference_state(a.seed, a.workers, a.steps))
        tl("driver: reference computed")

    # ---- checks
    checks = []

    def check(ok, text):
        checks.append(ok)
        print(f"check: {text}{'' if ok else '  <-- FAIL'}", flush=True)

    print(flush=True)
    events = read_events(a, "run")
    if a.hang != "none":
        hang_checks(a, check, events, hung, log, victim)
    else:
        check(bool(sent), f"the driver sent {sig.name} to worker {victim}"
              + (f" after its step {sent['step']}" if sent else " (never: it did not get that far)"))
    check(launched_ok and ref_ok, "the job finished" if a.reference == "computed" else
          "the job and the reference launch both finished")
    restarted = [e for e in events if e["kind"] == "start" and not e["first"]]
    if a.preempt == "torchrun":
        check(first_code != 0, f"the first torchrun ended on the driver's SIGTERM (exit status "
              f"{first_code}) and a second launch ran")
    if a.hang != "none":
        restored = {e["restored"] for e in restarted}
        check(len(restarted) == a.workers and len(restored) == 1 and None not in restored,
              f"after torchrun's restart every worker resumed from one periodic checkpoint: "
              f"step {sorted(restored, key=str)}")
    elif a.kill:
        survivors = [r for r in range(a.workers) if r != victim]
        named = {e["rank"]: e for e in events if e["first"]
                 and e["kind"] in ("timeout", "peer_error", "error")}
        names_victim = [r for r in survivors if r in named and named[r]["kind"] == "timeout"
                        and named[r]["missing"] == [victim]]
        check(len(names_victim) == len(survivors),
              f"{len(names_victim)} of {len(survivors)} surviving workers raised "
              f"AgreementTimeout naming the dead worker {victim} instead of hanging"
              + "".join(f"; worker {r}: {named[r]['kind']}" for r in survivors
                        if r not in names_victim and r in named))
        restored = {e["restored"] for e in restarted}
        check(len(restarted) == a.workers and len(restored) == 1 and None not in restored,
              f"after the restart every worker resumed from one periodic checkpoint: "
              f"step {sorted(restored, key=str)}")
    else:
        pre = [e for e in events if e["kind"] == "preempted" and e["first"]]
        steps = {e["step"] for e in pre}
        codes = {e["code"] for e in pre}
        finished_in_grace = all(e["kind"] != "preempted" for e in events) and a.grace > 0
        if finished_in_grace:
            check(True, "training finished within the grace period; nothing to restart")
        else:
            check(len(pre) == a.workers and len(steps) == 1 and codes == {expected_code},
                  f"{len(pre)} of {a.workers} workers saved at one agreed step {sorted(steps)} "
                  f"and exited with {sorted(codes)} (the preset's code: {expected_code})")
            restored = {e["restored"] for e in restarted}
            check(len(restarted) == a.workers and restored == steps,
                  f"after the agent's restart every worker restored step "
                  f"{sorted(restored, key=str)}")
    check_two_tiers(a, events, restarted, victim, check)
    finals = {e["digest"] for e in events if e["kind"] == "finish"}
    check(len(finals) == 1, f"the {a.workers} replicas ended with identical state "
          f"({len(finals)} distinct digests)")
    got = None
    try:
        got = load_state(os.path.join(a.dir, "final-run.pt"), a.seed)
    except (OSError, RuntimeError, KeyError) as e:
        print(f"final model: cannot read it ({e})", flush=True)
    want = launched_ref if a.reference == "launch" else computed_ref
    same = got is not None and want is not None and got == want
    if got is not None:
        w0 = torch.frombuffer(bytearray(dict(got)["0.weight"]), dtype=torch.float32)[0].item()
        print(f"final model: 0.weight[0]={w0!r} ... sha256 {digest(got)[:16]} "
              f"(reference {digest(want)[:16] if want else 'none'})", flush=True)
    if a.reference == "launch" and computed_ref is not None:
        check(launched_ref == computed_ref, "the launched reference equals the one computed in "
              "one process, bit for bit")
    check(same, "final model and optimizer state "
          + ("equal an uninterrupted run, bit for bit" if same else "DIFFER FROM the reference"))
    counts = step_counts(a, "run")
    total = sum(map(sum, counts))
    missing = sum(c.count(0) for c in counts)
    twice = sum(sum(1 for v in c if v > 1) for c in counts)
    if a.kill or a.hang != "none":
        resumed = min((e["restored"] for e in restarted if e["restored"] is not None),
                      default=a.steps)
        early = [s for c in counts for s, v in enumerate(c) if v > 1 and s < resumed]
        check(missing == 0 and not early, f"{total} steps ran in total for workers x steps = "
              f"{a.workers * a.steps}: every step at least once; {twice} worker-steps ran twice, "
              + ("all of them after the checkpoint the group resumed from" if not early else
                 f"{len(early)} of them BEFORE the checkpoint the group resumed from"))
    else:
        check(missing == 0 and twice == 0 and total == a.workers * a.steps,
              f"{total} steps ran in total; expected workers x steps = {a.workers * a.steps}"
              + (", each exactly once" if twice == 0 and missing == 0 else
                 f" — {missing} never ran, {twice} ran twice"))
    wall = run_done - tl.t0
    print(f"wall time: the preempted job {wall:.1f} s, with the reference and checks "
          f"{time.time() - tl.t0:.1f} s", flush=True)
    if a.hang != "none":  # kept short (the CI case's time): no overhead measurement
        ok = all(checks)
        print(f"verdict: {'PASS' if ok else 'FAIL'}{hung.get('summary', '')}", flush=True)
        return 0 if ok else 1
    added, direct, wrapped, n = measure_overhead(a)
    print(f"overhead: h.run(step) adds {added * 1e6:.2f} us per step over calling the step "
          f"directly ({wrapped * 1e9:.0f} ns vs {direct * 1e9:.0f} ns; median of 5 runs of {n} "
          f"calls)", flush=True)
    ok = all(checks)
    print(f"verdict: {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


def check_two_tiers(a, events, restarted, victim, check):
    """--save-policy auto: every rank saved the same periodic steps in each launch. --new-node:
    the replaced worker started with an empty local tier and restored the agreed step, which
    only the durable tier held for it."""
    if a.save_policy == "auto":
        by_rank = {}
        for e in events:
            if e["kind"] == "periodic":
                by_rank.setdefault((e["launch"], e["restart"], e["rank"]), []).append(e["step"])
        runs = {}
        for (launch, restart, rank), steps in by_rank.items():
            runs.setdefault((launch, restart), {})[rank] = steps
        same = all(len(ranks) == a.workers and len({tuple(v) for v in ranks.values()}) == 1
                   for ranks in runs.values())
        check(bool(runs) and same, "save_policy auto: every rank saved the same periodic steps "
              + "; ".join(f"run {launch}.{restart}: {sorted(ranks.get(0, []))}"
                          for (launch, restart), ranks in sorted(runs.items())))
    if a.new_node:
        new = [e for e in events if e["kind"] == "new_node" and e["rank"] == victim]
        mine = [e for e in restarted if e["rank"] == victim]
        agreed = {e["restored"] for e in restarted}
        check(len(new) == 1 and len(mine) == 1 and mine[0]["restored"] is not None
              and agreed == {mine[0]["restored"]},
              f"new node: worker {victim} restarted with an empty local tier "
              f"({len(new[0]['removed']) if new else '?'} entries removed) and restored step "
              f"{mine[0]['restored'] if mine else None} from the durable tier, the step every "
              f"worker restored ({sorted(agreed, key=str)})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kv", default="torch",
                   help="torch (the job's c10d store), file:///dir or etcd://host:port")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--grace", type=float, default=0.0, help="grace period in seconds")
    p.add_argument("--kill", action="store_true", help="SIGKILL a worker instead (no notice)")
    p.add_argument("--preempt", choices=("worker", "torchrun"), default="worker",
                   help="send the SIGTERM to a worker (default) or to torchrun itself")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: gloo (default); cuda: NCCL, one GPU per worker")
    p.add_argument("--preset", default=None, help=argparse.SUPPRESS)
    p.add_argument("--launch", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--dir", default="")
    p.add_argument("--keep", action="store_true",
                   help="keep the run directory the driver made (without --dir)")
    p.add_argument("--victim", type=int, default=-1, help="which worker (default: random)")
    p.add_argument("--hang", choices=("none", "sleep", "stop"), default="none",
                   help="sleep: the victim's step sleeps forever; stop: the driver SIGSTOPs the "
                        "victim inside its step (hang_policy=restart: torchrun restarts the job)")
    p.add_argument("--hang-timeout", type=float, default=HANG_TIMEOUT,
                   help="--hang: Handler(hang_timeout=...), seconds")
    p.add_argument("--hang-step", type=int, default=-1, help=argparse.SUPPRESS)
    # "none" shows that the hang cases fail without the detector (checked by hand, not in CI)
    p.add_argument("--hang-policy", choices=("restart", "none"), default="restart",
                   help=argparse.SUPPRESS)
    p.add_argument("--reference", choices=("computed", "launch"), default="computed",
                   help="computed: the uninterrupted job computed in this process (default); "
                        "launch: launch it again with no signal (and check both agree)")
    p.add_argument("--local-dir", default="",
                   help="two tiers: save here first (node-local), copy to --dir in the background")
    p.add_argument("--new-node", action="store_true",
                   help="with --local-dir: the restarted victim worker starts with an empty "
                        "local tier (a replacement node) and restores from the durable tier")
    p.add_argument("--save-policy", choices=("every", "auto"), default="every",
                   help=f"every: a periodic save every {CKPT_EVERY} steps; auto: at the "
                        "interval holdfast's save_interval_policy picks (task 0 decides)")
    p.add_argument("--min-interval", type=float, default=30.0,
                   help="--save-policy auto: never save more often (seconds)")
    p.add_argument("--mtbi-prior", type=float, default=86400.0,
                   help="--save-policy auto: the prior mean time between interruptions (s)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--label", default="run", help=argparse.SUPPRESS)
    p.add_argument("--t0", type=float, default=0.0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.kv != "torch" and not (a.kv.startswith("file://") or a.kv.startswith("etcd://")):
        p.error("--kv takes torch, file:///dir or etcd://host:port")
    if a.workers < 1 or a.steps < 4 * CKPT_EVERY or a.victim >= a.workers:
        p.error(f"--workers takes 1 or more, --steps {4 * CKPT_EVERY} or more, --victim less "
                f"than --workers")
    if a.kill and a.workers < 2:
        p.error("--kill needs 2 or more workers (survivors to name the dead one)")
    if a.kill and a.preempt == "torchrun":
        p.error("--kill and --preempt torchrun are separate modes")
    if a.hang != "none" and (a.kill or a.preempt == "torchrun" or a.grace > 0 or a.workers < 2):
        p.error("--hang needs 2 or more workers and is a mode of its own (no --kill, --grace, "
                "--preempt torchrun)")
    if a.new_node and (not a.local_dir or a.kill or a.preempt == "torchrun"):
        p.error("--new-node needs --local-dir, and the default preemption (a worker's SIGTERM)")
    if a.preset is None:  # --preempt torchrun with a grace: Kubernetes' preset, sized to torchrun
        a.preset = "k8s" if a.preempt == "torchrun" and a.grace > 0 else "generic"
    if a.device == "cuda" and not a.worker:
        a.reference = "launch"  # GPU kernels do not match the CPU reference bit for bit
    if a.worker:
        if not a.dir:
            p.error("--worker needs --dir")
        code = Worker(a).main()
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip the interpreter's teardown of torch (seconds on a busy machine): the agent
        # restarts the group only once every worker has exited.
        os._exit(code)
    return driver(a)


if __name__ == "__main__":
    sys.exit(main())
