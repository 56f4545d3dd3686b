"""CheckpointManager(state=...): the staged save of a state dict (holdfast_torch/state.py,
holdfast_torch.cpp's stage_state, include/holdfast/checkpoint/staging.hpp).

    /path/to/venv/bin/python tests/pytorch/test_staged_save.py [name ...]

Cases: a model of 200+ float32 and bf16 tensors (some non-contiguous, tied weights, views) and
an Adam optimizer round-trips bit for bit into fresh objects, shared storages shared again and
only those; the checkpoint holds the bytes of the call (every tensor changed right after save()
returns, while the background write runs); the files read back with pickle, json and torch
alone (holdfast_torch not importable); the GIL is released during the copy (a Python thread
keeps running); a save called while one is in flight waits for it; resident memory over 50 saves
of 256 MiB grows by at most 2 % of the state, the staging area 1x it; bad states fail naming the
key; the Handler's preemption save (a notice file) after a periodic save still in flight
commits both, whole; two tiers; SIGKILL of a saving process at random points until each phase
(the staged copy, the background write, the commit) was hit: a restarted process restores a
whole step, never a torn one, and nothing is left half-written.

Exits non-zero when a case fails; the last line is "N passed, M failed".
"""

import glob
import json
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_store_support as sup  # noqa: E402

hf = sup.load_holdfast()
import torch  # noqa: E402

CASES, case = sup.case_list()
check = sup.check


class Net(torch.nn.Module):
    """About 210 tensors: 50 blocks of (float32 weight, bias, bf16 weight, a buffer), an
    embedding tied to the output head."""

    def __init__(self, width=16, blocks=50, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.blocks = torch.nn.ModuleList()
        for _ in range(blocks):
            b = torch.nn.Module()
            b.lin = torch.nn.Linear(width, width)
            b.low = torch.nn.Linear(width, width, bias=False).to(torch.bfloat16)
            b.register_buffer("scale", torch.randn(width, width, generator=g).t())  # non-contiguous
            self.blocks.append(b)
        self.embed = torch.nn.Embedding(32, width)
        self.head = torch.nn.Linear(width, 32, bias=False)
        self.head.weight = self.embed.weight  # tied
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g).to(p.dtype))

    def forward(self, x):
        h = self.embed(x).mean(1)
        for b in self.blocks:
            h = torch.tanh(b.lin(h) + b.low(h.to(torch.bfloat16)).float() @ b.scale)
        return self.head(h)


def train(model, opt, steps=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, 32, (4, 5), generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def snapshot(model, opt):
    """Deep copies of every tensor of the state, to compare with later."""
    clone = lambda v: v.detach().clone() if torch.is_tensor(v) else v  # noqa: E731
    m = {k: clone(v) for k, v in model.state_dict().items()}
    o = opt.state_dict()
    st = {k: {n: clone(t) for n, t in s.items()} for k, s in o["state"].items()}
    return m, st


def same_state(model, opt, snap):
    m, st = snap
    for k, v in model.state_dict().items():
        if v.dtype != m[k].dtype or not torch.equal(v, m[k]):
            return f"model tensor {k} differs"
    o = opt.state_dict()["state"]
    if sorted(o) != sorted(st):
        return "optimizer state keys differ"
    for k, s in o.items():
        for n, t in s.items():
            if not (torch.equal(t, st[k][n]) if torch.is_tensor(t) else t == st[k][n]):
                return f"optimizer state {k}.{n} differs"
    return None


def fresh(seed=7):
    model = Net(seed=seed)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


@case
def round_trip_bit_for_bit_with_shared_storages():
    model, opt = fresh(0)
    train(model, opt)
    extra = {"epoch": 3, "name": "run-a", "rng": torch.get_rng_state()}
    check(len(model.state_dict()) >= 200, f"{len(model.state_dict())} tensors")
    with tempfile.TemporaryDirectory() as d:
        ckpt = hf.CheckpointManager(d, state={"model": model, "optim": opt, "extra": extra})
        ckpt.save(10)
        snap = snapshot(model, opt)
        ckpt.wait_until_finished()
        step_dir = os.path.join(d, "step-10")
        check(sorted(os.listdir(step_dir)) ==
              ["holdfast-metadata.json", "index.json", "objects.pkl", "tensors.bin"],
              f"the checkpoint's files: {sorted(os.listdir(step_dir))}")
        del ckpt  # one writer per directory: a relaunch's
        model2, opt2 = fresh(5)
        extra2 = {}
        ckpt2 = hf.CheckpointManager(d, state={"model": model2, "optim": opt2, "extra": extra2})
        check(ckpt2.restore() == 10, "restored step 10")
        why = same_state(model2, opt2, snap)
        check(why is None, f"restored bit for bit: {why}")
        loaded = ckpt2.loaded_state
        check(loaded["extra"]["epoch"] == 3 and loaded["extra"]["name"] == "run-a" and
              torch.equal(loaded["extra"]["rng"], extra["rng"]), f"objects: {loaded['extra']}")
        check(loaded["model"] is None and loaded["optim"] is None,
              "what went into the objects is not kept twice")
        lm = hf.state.load(step_dir)["model"]
        ptr = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
        check(ptr(lm["embed.weight"]) == ptr(lm["head.weight"]), "tied weights share a storage")
        check(ptr(lm["blocks.0.lin.weight"]) != ptr(lm["blocks.0.lin.bias"]),
              "separate tensors do not share one")
        check(not lm["blocks.3.scale"].is_contiguous() and
              lm["blocks.3.scale"].stride() == model.blocks[3].scale.stride(),
              "a non-contiguous tensor keeps its strides")
        check(lm["blocks.1.low.weight"].dtype == torch.bfloat16, "bf16 stays bf16")
        check(model2.head.weight is model2.embed.weight, "the model's tie survives the load")


@case
def checkpoint_holds_the_bytes_of_the_call():
    big = torch.arange(16 << 20, dtype=torch.float32)  # 64 MiB
    views = {"big": big, "slice": big[::3], "small": torch.ones(1000)}
    with tempfile.TemporaryDirectory() as d:
        ckpt = hf.CheckpointManager(d, state=lambda: views,
                                    load_state=lambda s: None)
        for step in range(1, 4):
            expected = big.clone()
            ckpt.save(step)
            big.add_(1000.0)  # changed at once, while the background write runs
            views["small"].mul_(2)
            ckpt.wait_until_finished()
            loaded = hf.state.load(os.path.join(d, f"step-{step}"))
            check(torch.equal(loaded["big"], expected), f"step {step}: the bytes of the call")
            check(torch.equal(loaded["slice"], expected[::3]), "the view too")
            check(loaded["slice"].untyped_storage().data_ptr() ==
                  loaded["big"].untyped_storage().data_ptr(), "a view shares its base again")
        check(ckpt.staging_capacity >= big.numel() * 4, f"staging {ckpt.staging_capacity}")


@case
def readable_with_pickle_json_and_torch_alone():
    model, opt = fresh(2)
    train(model, opt)
    with tempfile.TemporaryDirectory() as d:
        ckpt = hf.CheckpointManager(d, state={"model": model, "optim": opt})
        ckpt.save(4)
        ckpt.wait_until_finished()
        out = os.path.join(d, "reference.pt")
        # The reader is state.py's load(), run from its file with holdfast_torch unimportable.
        reader = textwrap.dedent("""
            import importlib.util, sys, torch
            sys.modules["holdfast_torch"] = None  # importing it would fail
            spec = importlib.util.spec_from_file_location("reader", sys.argv[1])
            m = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(m)
            torch.save(m.load(sys.argv[2]), sys.argv[3])
        """)
        p = subprocess.run([sys.executable, "-c", reader, hf.state.__file__,
                            os.path.join(d, "step-4"), out], capture_output=True, text=True,
                           timeout=120)
        check(p.returncode == 0, f"the reader ran: {p.stderr[-2000:]}")
        state = torch.load(out, weights_only=False)
        model2, opt2 = fresh(9)
        model2.load_state_dict(state["model"])
        opt2.load_state_dict(state["optim"])
        why = same_state(model2, opt2, snapshot(model, opt))
        check(why is None, f"read without holdfast: {why}")
        index = json.load(open(os.path.join(d, "step-4", "index.json")))
        check(index["format"] == "holdfast-state/1" and index["tensors_file"] == "tensors.bin",
              f"the index: {list(index)}")


@case
def gil_released_during_the_copy():
    state = {f"t{i}": torch.full((1 << 20,), float(i)) for i in range(96)}  # 384 MiB
    with tempfile.TemporaryDirectory() as d:
        ckpt = hf.CheckpointManager(d, state=lambda: state, load_state=lambda s: None)
        ckpt.save(1)  # maps and faults in the staging area
        ckpt.wait_until_finished()
        stamps, stop = [], threading.Event()

        def spin():
            while not stop.is_set():
                stamps.append(time.perf_counter())

        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.05)
        t0 = time.perf_counter()
        ckpt.save(2)
        t1 = time.perf_counter()
        stop.set()
        t.join()
        ckpt.wait_until_finished()
        during = [s for s in stamps if t0 <= s <= t1]
        gaps = [b - a for a, b in zip(during, during[1:])]
        blocked = t1 - t0
        # With the GIL held through the copy, the spinning thread would not run at all while
        # save() copies; released, it runs (Python hands the GIL over every 5 ms).
        check(len(during) > 100, f"the other thread ran {len(during)} times in {blocked:.3f} s")
        print(f"save() blocked {blocked:.3f} s; another Python thread ran {len(during)} "
              f"iterations meanwhile, longest gap {max(gaps, default=0):.4f} s", flush=True)


@case
def a_save_while_one_is_in_flight_waits_for_it():
    state = {"w": torch.zeros(8 << 20)}
    with tempfile.TemporaryDirectory() as d:
        ckpt = hf.CheckpointManager(d, state=lambda: state, load_state=lambda s: None,
                                    max_to_keep=0)
        for step in range(1, 6):
            state["w"].fill_(step)
            ckpt.save(step)
        ckpt.wait_until_finished()
        check(ckpt.all_steps() == [1, 2, 3, 4, 5], f"all committed: {ckpt.all_steps()}")
        for step in range(1, 6):
            w = hf.state.load(os.path.join(d, f"step-{step}"))["w"]
            check(bool((w == step).all()), f"step {step} holds its own bytes")


@case
def bad_states_fail_naming_the_key():
    with tempfile.TemporaryDirectory() as d:
        sparse = {"emb": {"w": torch.eye(3).to_sparse()}}
        ckpt = hf.CheckpointManager(d, state=lambda: sparse, load_state=lambda s: None)
        try:
            ckpt.save(1)
            check(False, "a sparse tensor was saved")
        except TypeError as e:
            check("['emb']['w']" in str(e) and "strided" in str(e), f"names the key: {e}")
        lock = threading.Lock()
        ckpt2 = hf.CheckpointManager(os.path.join(d, "b"), state=lambda: {"lock": lock},
                                     load_state=lambda s: None)
        try:
            ckpt2.save(1)
            check(False, "a lock was pickled")
        except TypeError as e:
            check("cannot be pickled" in str(e), f"says why: {e}")
        check(ckpt.all_steps() == [] and ckpt2.all_steps() == [], "nothing saved")
        check(glob.glob(os.path.join(d, "**", ".staging-*"), recursive=True) == [],
              "no staging directory left")
        for bad in (dict(state=3), dict(state={"m": 1}, save=lambda d: None),
                    dict(load_state=lambda s: None)):
            try:
                hf.CheckpointManager(os.path.join(d, "c"), **bad)
                check(False, f"accepted {bad}")
            except TypeError:
                pass


@case
def preemption_save_after_a_periodic_save_in_flight():
    state = {"w": torch.zeros(16 << 20), "step": 0}
    with tempfile.TemporaryDirectory() as d:
        notice = os.path.join(d, "notice")
        ckpt = hf.CheckpointManager(os.path.join(d, "ckpt"), state=lambda: state,
                                    load_state=lambda s: None, max_to_keep=0)
        h = hf.Handler(store="file://" + os.path.join(d, "kv"), checkpoints=ckpt, task=0,
                       num_tasks=1, run_id="staged", restart=0, notice_file=notice,
                       watch_interval=0.01)

        def step(i):
            state["w"].fill_(float(i))
            state["step"] = i

        preempted_at = None
        try:
            for i in range(1, 400):
                h.run(step, i)
                if i == 20:
                    ckpt.save(20)  # a periodic save, left in flight
                    open(notice, "w").close()  # the notice comes while it is
                time.sleep(0.002)
        except hf.Preempted:
            preempted_at = state["step"]
        h.close()
        check(preempted_at is not None, "the notice ended the loop")
        steps = ckpt.all_steps()
        check(20 in steps and steps[-1] > 20, f"the periodic and the preemption save: {steps}")
        for s in steps:
            loaded = hf.state.load(os.path.join(d, "ckpt", f"step-{s}"))
            check(bool((loaded["w"] == loaded["step"]).all()) and loaded["step"] == s,
                  f"step {s} holds its own state ({loaded['step']})")
        check(glob.glob(os.path.join(d, "ckpt", ".staging-*")) == [], "nothing half-done")


@case
def two_tiers_stage_locally_then_copy():
    model, opt = fresh(3)
    train(model, opt)
    with tempfile.TemporaryDirectory() as d:
        ckpt = hf.CheckpointManager(os.path.join(d, "durable"), local_dir=os.path.join(d, "local"),
                                    state={"model": model, "optim": opt}, durable_wait=60)
        ckpt.save(5)
        snap = snapshot(model, opt)
        train(model, opt)  # changed while the local write and the copy run
        ckpt.wait_until_finished()
        check(ckpt.durable_step == 5 and not ckpt.unfinished, f"copied: {ckpt.durable_step}")
        del ckpt
        model2, opt2 = fresh(8)
        ckpt2 = hf.CheckpointManager(os.path.join(d, "durable"),
                                     local_dir=os.path.join(d, "new-node"),
                                     state={"model": model2, "optim": opt2})
        check(ckpt2.restore() == 5, "a new node restores the durable copy")
        why = same_state(model2, opt2, snap)
        check(why is None, f"the durable copy holds the bytes of the call: {why}")
        check(ckpt2.staging_capacity >= sum(t.numel() * t.element_size()
                                            for t in model.state_dict().values()),
              f"the local staging area sized at restore: {ckpt2.staging_capacity}")


def _rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1


@case
def resident_memory_flat_over_50_saves():
    # 256 MiB in 200 tensors, float32 and bf16, every fourth one non-contiguous.
    state = {}
    each = (256 << 20) // 200 // 256 * 256
    for i in range(200):
        if i % 2:
            t = torch.full((each // 4,), float(i))
        else:
            t = torch.full((each // 2,), float(i), dtype=torch.bfloat16)
        state[f"t{i}"] = t.view(-1, 64).t() if i % 4 == 0 else t
    total = sum(t.untyped_storage().nbytes() for t in state.values())
    root = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=root) as d:
        ckpt = hf.CheckpointManager(d, state=lambda: state, load_state=lambda s: None,
                                    max_to_keep=2)
        after5 = 0
        for step in range(1, 51):
            ckpt.save(step)
            state["t1"].add_(1)  # training changes the state
            ckpt.wait_until_finished()
            if step == 5:
                after5 = _rss_bytes()
        after50 = _rss_bytes()
        grew = (after50 - after5) / total
        print(f"resident memory after save 5 {after5 >> 20} MiB, after save 50 {after50 >> 20} "
              f"MiB: {grew * 100:.2f} % of the {total >> 20} MiB state; staging area "
              f"{ckpt.staging_capacity / total:.3f}x the state", flush=True)
        check(grew <= 0.02, f"resident memory grew {grew * 100:.2f} % of the state")
        check(total <= ckpt.staging_capacity <= total + (3 << 20),
              f"staging area {ckpt.staging_capacity} for {total}")


# A saving process for the kill case: state= of 3 tensors, 96 MiB in all, filled with the step;
# the phase (1: inside save() once the save before it committed, so the staged copy; 2: after
# save() returned, until its commit was waited for; 0: between) in a shared file the parent
# reads after the kill.
SAVER = textwrap.dedent("""
    import mmap, os, sys, torch
    import holdfast_torch as hf
    d, board = sys.argv[1], sys.argv[2]
    f = open(board, "r+b")
    mark = mmap.mmap(f.fileno(), 1)
    state = {"a": torch.zeros(16 << 20), "b": torch.zeros(8 << 20, dtype=torch.bfloat16),
             "c": torch.zeros(4 << 20, dtype=torch.float64).t(), "step": 0}
    def fill(s):
        state["a"].fill_(s); state["b"].fill_(s); state["c"].fill_(s); state["step"] = s
    ckpt = hf.CheckpointManager(d, state=lambda: state, load_state=lambda s: None, max_to_keep=2)
    step = (ckpt.restore() or 0) + 1
    fill(step)
    print("up", flush=True)
    while True:
        mark[0] = 1
        ckpt.save(step)
        mark[0] = 2
        step += 1
        fill(step)  # training changes the state at once
        ckpt.wait_until_finished()
        mark[0] = 0
""")


def classify(d, board):
    """Where a kill landed, read before any restart sweeps: copy, write, commit or between."""
    with open(board, "rb") as f:
        mark = f.read(1)
    if mark == b"\x01":
        return "copy"
    if mark == b"\x00":
        return "between"
    staging = glob.glob(os.path.join(d, ".staging-*"))
    for s in staging:
        if not os.path.exists(os.path.join(s, "holdfast-metadata.json")):
            return "write"
    if staging:
        return "commit"
    try:
        latest = json.load(open(os.path.join(d, "latest"))).get("latest")
    except (OSError, ValueError):
        latest = None
    named = {os.path.basename(p) for p in glob.glob(os.path.join(d, "step-*"))}
    if latest is not None and any(n > latest for n in named if n != latest and
                                  int(n.split("-")[1]) > int(latest.split("-")[1])):
        return "commit"  # renamed, not yet named by the pointer
    return "between"


def _in_phase(d, board, phase):
    """Whether the saver is in `phase` now (the board, the staging directory's files)."""
    with open(board, "rb") as f:
        mark = f.read(1)
    if phase == "copy":
        return mark == b"\x01"
    if mark != b"\x02":
        return False
    staging = glob.glob(os.path.join(d, ".staging-*"))
    with_meta = [s for s in staging if os.path.exists(os.path.join(s, "holdfast-metadata.json"))]
    if phase == "write":
        return bool(staging) and not with_meta and any(
            os.path.exists(os.path.join(s, "tensors.bin")) for s in staging)
    return bool(with_meta)  # commit: the metadata written, the syncs and the rename to come


@case
def sigkill_in_each_phase_never_leaves_a_torn_step():
    phases = ["copy", "write", "commit"]
    seen = {p: 0 for p in phases + ["between"]}
    with tempfile.TemporaryDirectory() as root:
        d = os.path.join(root, "ckpt")
        board = os.path.join(root, "board")
        kills = 0
        # Each kill aims at a phase: the parent watches the board and the directory and sends
        # SIGKILL the moment the saver is in it; where it landed is read again after the kill.
        while kills < 12 and (kills < 6 or min(seen[p] for p in phases) == 0):
            aim = phases[kills % 3]
            with open(board, "wb") as f:
                f.write(b"\0")
            p = subprocess.Popen([sys.executable, "-c", SAVER, d, board], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            if p.stdout.readline().strip() != "up":
                p.kill()
                check(False, f"the saver did not start: {p.stderr.read()[-3000:]}")
            deadline = time.monotonic() + 20
            while not _in_phase(d, board, aim) and time.monotonic() < deadline:
                pass
            p.send_signal(signal.SIGKILL)
            p.wait(30)
            kills += 1
            where = classify(d, board)
            seen[where] += 1
            # A restarted process: the writer reopens (its sweep), every step is whole.
            ckpt = hf.CheckpointManager(d, state=lambda: {}, load_state=lambda s: None,
                                        max_to_keep=2)
            for s in ckpt.all_steps():
                loaded = hf.state.load(os.path.join(d, f"step-{s}"))
                ok = loaded["step"] == s and all(bool((loaded[k] == s).all()) for k in "abc")
                check(ok, f"kill {kills} (aimed at {aim}, in {where}): step {s} is whole")
            check(ckpt.restore() == (ckpt.all_steps() or [None])[-1], "restore: the newest")
            left = [n for n in os.listdir(d) if not (n == "latest" or n.startswith("step-") or
                                                     "lock" in n)]
            check(left == [], f"kill {kills} (in {where}): left behind: {left}")
            del ckpt
        print(f"{kills} kills: {seen}", flush=True)
        check(min(seen[p] for p in phases) > 0, f"every phase was hit: {seen}")


if __name__ == "__main__":
    sup.exit_now(sup.run_cases(CASES, sys.argv[1:]))
