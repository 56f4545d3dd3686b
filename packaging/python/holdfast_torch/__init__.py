"""holdfast for PyTorch: the preemption handler, checkpoints and the multiprocess file cache.

Installed with pip from the repository (packaging/python/README.md), which compiles the C++ part
(holdfast_torch._C, from packaging/python/holdfast_torch.cpp) once, against the torch of that
environment:

    pip install --no-build-isolation ./packaging/python

Importing it compiles nothing. It re-exports the extension's classes with Python-side defaults
read from torchrun's environment:

    import holdfast_torch as holdfast

    holdfast.init_process_group("gloo")   # torch.distributed's, made safe for torchrun restarts
    ckpt = holdfast.CheckpointManager(f"ckpt/rank-{rank}", save=save_fn, restore=restore_fn)
    with holdfast.Handler(preset="generic", store="torch", checkpoints=ckpt) as h:
        while h.total_run_calls < steps:
            h.run(train_step)

`__version__` is the library's (include/holdfast/version.hpp); `TORCH_VERSION` the torch it was
built for. Imported under another torch it raises ImportError naming both (the extension's C++
ABI is that torch's): reinstall it under the torch you run. CI tests the torch pinned in
examples/pytorch/requirements.txt.

Log lines go to logging.getLogger("holdfast"): INFO for what the job did (the restored step, a
notice and its source, each agreed step, each save with its bytes and seconds), WARNING for a
timeout, a fallback to an older checkpoint, a hang verdict. Nothing is configured here: Python
shows the warnings and no INFO line until the application configures logging.

Exceptions (each carries holdfast's message; Error and its subclasses also `errno`,
`operation` and `path`):
    Error                 any holdfast failure (a store, a checkpoint, the cache)
    AgreementTimeout      tasks did not answer within ack_timeout: `missing_tasks`
    AgreementUnreachable  this worker could not reach the store to read or record an outcome
    PeerError             another worker's step raised: `origin_task`, `type_name`, `message`
    CorruptCache          a cache slot that cannot be trusted: `slot`
    FormatError           malformed input (a store URL, a file)
    HangDetected          a hang verdict recorded for the job (hang_policy="report", during an
                          agreement round): `task`, `phase`, `step`, `elapsed_s`, `bound_s`
    Preempted             not an Error: a SystemExit raised after the agreed checkpoint, with the
                          preset's exit `code` (42 generic, 143 k8s/slurm/gce/aws); uncaught,
                          the interpreter exits with that code after running `finally` blocks.
"""

import atexit
import inspect
from collections.abc import Mapping
import logging
import os
import select
import threading

__all__ = [
    "Handler", "CheckpointManager", "Cache", "Error", "AgreementTimeout",
    "AgreementUnreachable", "PeerError", "CorruptCache", "FormatError", "Preempted", "HangDetected",
    "init_process_group", "load_extension", "TORCH_VERSION", "__version__",
]


def _built_with():
    """(library version, torch version) the package was built with: _build_info.py, which
    packaging/python/setup.py writes into the build; ImportError outside an installed package."""
    try:
        from . import _build_info as info
    except ImportError:
        raise ImportError(
            f"holdfast_torch at {os.path.dirname(os.path.abspath(__file__))} is a source "
            "directory, not an installed package (no _build_info.py, no compiled extension): "
            "install it with pip install --no-build-isolation ./packaging/python") from None
    return info.VERSION, info.TORCH_VERSION


__version__, TORCH_VERSION = _built_with()


def _check_torch_version():
    """The extension is bound to the C++ ABI of the torch it was compiled against: under any
    other torch it would fail to load with an undefined symbol, or load and misbehave."""
    import torch
    if torch.__version__ != TORCH_VERSION:
        raise ImportError(
            f"holdfast_torch {__version__} was built for torch {TORCH_VERSION}, and this is torch "
            f"{torch.__version__} ({os.path.dirname(torch.__file__)}): reinstall holdfast_torch "
            "in this environment (pip install --no-build-isolation ./packaging/python, from "
            "holdfast's repository) or run it under torch " + TORCH_VERSION)


class Error(Exception):
    """A holdfast failure; `errno`, `operation` and `path` as holdfast::error has them."""
    errno = None
    operation = ""
    path = ""


class AgreementTimeout(Error):
    """Some tasks never answered the agreement: `missing_tasks` (a list of task ids)."""
    missing_tasks = ()


class AgreementUnreachable(Error):
    """This worker could not reach the store to read or record an agreement's outcome."""


class PeerError(Error):
    """Another worker's step raised: `origin_task`, `type_name`, `message`."""
    origin_task = -1
    type_name = ""
    message = ""


class CorruptCache(Error):
    """A cache file that cannot be trusted; `slot` names the bad entry."""
    slot = 0


class FormatError(Error):
    """Malformed input: a store URL, a pointer file, a cache header."""


class HangDetected(Error):
    """A task stayed in a step, a save or the restore past its hang bound: `task` (the one that
    hung), `phase` ("step", "save", "restore", "frozen", "start"), `step` (None: unknown),
    `elapsed_s`,
    `bound_s`. Raised by Handler.run on every worker with hang_policy="report" when the verdict
    ends an agreement round; hang_policy="restart" exits the process instead."""
    task = -1
    phase = ""
    step = None
    elapsed_s = 0.0
    bound_s = 0.0


class Preempted(SystemExit):
    """Raised by Handler.run after the agreed checkpoint; `code` is the preset's exit code."""


_check_torch_version()  # before the extension is loaded: under another torch it would not link
from . import _C as _ext  # noqa: E402
from . import state as _state_format  # noqa: E402  (the staged save's format: state=)

_ext._set_exception_classes({
    "Error": Error, "AgreementTimeout": AgreementTimeout,
    "AgreementUnreachable": AgreementUnreachable, "PeerError": PeerError,
    "CorruptCache": CorruptCache, "FormatError": FormatError, "Preempted": Preempted,
    "HangDetected": HangDetected,
})


def load_extension():
    """The compiled extension, holdfast_torch._C (built when the package was installed)."""
    return _ext


# ---- Log lines: logging.getLogger("holdfast") -------------------------------------------------
# The extension queues the library's lines (any thread, no GIL taken); they are handed to the
# logger here, in order: by a thread of this process that waits for them without the GIL, at
# each Handler start and exit, at interpreter exit, and before on_hang (hang_policy="restart"
# _exits). Nothing is configured here: with no logging configuration Python shows warnings
# (logging.lastResort, on stderr) and no INFO line; logging.basicConfig(level=logging.INFO)
# shows what the job did.

_logger = logging.getLogger("holdfast")
_log_lock = threading.Lock()
_log_pump_pid = None


def _emit_log():
    """Hands the extension's queued lines to logging.getLogger("holdfast"), oldest first."""
    with _log_lock:
        for level, line in _ext._log_take():
            _logger.log(level, line)


def _log_pump(fd):
    waiter = select.poll()  # not select(): a descriptor past FD_SETSIZE (1024) is refused there
    waiter.register(fd, select.POLLIN)
    while True:
        try:
            waiter.poll()  # the queue's eventfd: readable once a line came
            os.read(fd, 8)
        except (BlockingIOError, InterruptedError):  # nothing to read after all
            pass
        except Exception:  # the interpreter is going
            return
        try:
            _emit_log()
        except Exception:  # a handler of the application's that raised: the next lines go on
            pass


def _start_log_pump():
    """The thread that hands lines over as they come: one per process, started by the first
    Handler or CheckpointManager (a forked child starts its own). It waits in poll(), not in
    the extension: a daemon thread that the interpreter ends at exit must not be in C++."""
    global _log_pump_pid
    if _log_pump_pid == os.getpid():
        return
    _log_pump_pid = os.getpid()
    threading.Thread(target=_log_pump, args=(_ext._log_fd(),), name="holdfast-log",
                     daemon=True).start()


def _log_after_fork():
    global _log_lock
    _log_lock = threading.Lock()  # the parent's log thread may have held these at the fork
    _ext._log_after_fork()


_ext._set_log_emitter(_emit_log)
atexit.register(_emit_log)
os.register_at_fork(after_in_child=_log_after_fork)


def _agent_store(timeout):
    """A client of the torchrun agent's TCPStore (static rendezvous), or None outside torchrun."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    import torch.distributed as dist
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False, timeout=timeout)


_LAUNCH = None  # this process's launch number, once agreed (_launch_number)
_LAUNCH_KEYS = "holdfast/launch/"


def _launch_number(agent, timeout):
    """The number of this launch of the worker group, the same in every task, fresh in the
    agent's store: task 0 takes it from a counter there (store.add) and hands it to each task.

    Not TORCHELASTIC_RESTART_COUNT: every node's agent counts its own restarts, so a node
    relaunched alone (restart 0) runs beside a node whose agent restarted its group (restart 1),
    and the agent's store still holds the keys of every earlier launch. The hand-off is immune
    to those keys: each task publishes a fresh nonce (its own random value) under
    launch/hello/<rank> and waits for the answer under launch/mailbox/<nonce>, a key nobody
    wrote before; task 0 answers every nonce it sees under hello/<rank> (a stale one, left by a
    dead task of an earlier launch, is answered too and never read) until every task confirmed
    under launch/<n>/ready/<rank>, keys only this launch can write. Computed once per process;
    `timeout` (a timedelta) bounds the wait (RuntimeError naming the tasks that never came).
    """
    global _LAUNCH
    if _LAUNCH is not None:
        return _LAUNCH
    import time
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    deadline = time.monotonic() + timeout.total_seconds()
    if rank != 0:
        nonce = f"{os.getpid()}-{os.urandom(8).hex()}"
        agent.set(f"{_LAUNCH_KEYS}hello/{rank}", nonce)
        n = int(agent.get(f"{_LAUNCH_KEYS}mailbox/{nonce}").decode())  # waits (store timeout)
        agent.set(f"{_LAUNCH_KEYS}{n}/ready/{rank}", nonce)
        _LAUNCH = n
        return n
    n = int(agent.add(f"{_LAUNCH_KEYS}counter", 1))
    answered, pending = {}, set(range(1, world))
    while pending:
        for r in sorted(pending):
            hello = f"{_LAUNCH_KEYS}hello/{r}"
            if agent.check([hello]):
                nonce = agent.get(hello).decode()
                if answered.get(r) != nonce:
                    agent.set(f"{_LAUNCH_KEYS}mailbox/{nonce}", str(n))
                    answered[r] = nonce
            if agent.check([f"{_LAUNCH_KEYS}{n}/ready/{r}"]):
                pending.discard(r)
        if pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"holdfast_torch: launch {n}: tasks {sorted(pending)} never "
                                   f"joined within {timeout.total_seconds():g} s")
            time.sleep(0.005)  # polls the agent's store (a remote state)
    _LAUNCH = n
    return n


def init_process_group(backend=None, timeout=None, **kwargs):
    """torch.distributed.init_process_group, made safe for torchrun's restarts.

    Under torchrun (static rendezvous, the default on one node and with --nnodes=N and a
    --master-addr) the agent's TCPStore outlives the worker group, and torch gives the restarted
    workers that same store with no per-restart prefix (torch/distributed/rendezvous.py trusts
    "a new TCPStore for every retry"; StaticTCPRendezvous keeps one): the new gloo group reads
    the dead group's addresses under default_pg/ and fails with "Gloo connectFullMesh failed
    ... Connection refused" (pytorch issue 135712 is the same stale-key bug with the c10d
    rendezvous). This gives every launch of the group its own prefix, holdfast/launch-<n>/, on
    a client of the agent's store, n being the launch number every task agrees on
    (_launch_number: not the restart count, which differs between nodes when one node is
    relaunched alone); elsewhere it is init_process_group unchanged. Extra keyword arguments go
    to torch's init_process_group.
    """
    import datetime
    import torch.distributed as dist
    if timeout is None:
        timeout = datetime.timedelta(minutes=10)
    agent = _agent_store(timeout)
    if agent is None or "store" in kwargs or "init_method" in kwargs:
        return dist.init_process_group(backend, timeout=timeout, **kwargs)
    store = dist.PrefixStore(f"holdfast/launch-{_launch_number(agent, timeout)}/pg", agent)
    return dist.init_process_group(backend, timeout=timeout, store=store,
                                   rank=int(os.environ["RANK"]),
                                   world_size=int(os.environ["WORLD_SIZE"]), **kwargs)


def _launch_channel(timeout):
    """A store every task of this launch shares, fresh for each: the torchrun agent's store
    under the launch number's prefix, else the default process group's store."""
    import torch.distributed as dist
    agent = _agent_store(timeout)
    if agent is not None:
        return dist.PrefixStore(f"holdfast/launch-{_launch_number(agent, timeout)}/incarnation",
                                agent)
    if dist.is_available() and dist.is_initialized():
        return dist.PrefixStore("holdfast/incarnation", dist.distributed_c10d._get_default_store())
    return None


def _torch_incarnation(timeout_s):
    """store="torch" under torchrun: the launch number (the same in every task), else None (the
    restart count, as before)."""
    import datetime
    timeout = datetime.timedelta(seconds=timeout_s)
    agent = _agent_store(timeout)
    return None if agent is None else _launch_number(agent, timeout)


def _take_incarnation(url, run_id, task, timeout_s):
    """This launch's incarnation for a store that outlives launches (file://, etcd://): task 0
    takes a fresh number from the store (holdfast/kv/incarnation.hpp) and hands it to the others
    through the launch's own store. Without one (no torchrun, no process group), the restart
    count, as before."""
    import datetime
    channel = _launch_channel(datetime.timedelta(seconds=timeout_s))
    if channel is None:
        return None
    if task == 0:
        n = _ext.take_incarnation(url, run_id, f"task0/pid{os.getpid()}/{os.urandom(4).hex()}")
        channel.set("number", str(n))
    return int(channel.get("number").decode())


class _HeldSignals:
    """The preset's notice signals while the start runs in Python (the launch-number hand-off
    waits for task 0), before the extension installs its own notice: each delivery is recorded
    instead of taking the default action (death), and raised again once the handler's notice is
    installed, so the first run() acts on it. Only signals at SIG_DFL, only on the main thread
    (where Python handlers run); a handler of the application's own is left alone."""

    def __init__(self, preset):
        import signal
        import threading
        self._signal, self._old, self.seen = signal, {}, []
        if threading.current_thread() is not threading.main_thread():
            return
        nums = [signal.SIGTERM] + ([signal.SIGUSR1] if preset == "slurm" else [])
        for n in nums:
            if signal.getsignal(n) is signal.SIG_DFL:
                self._old[n] = signal.signal(n, lambda signum, frame: self.seen.append(signum))

    def release(self):
        """The earlier dispositions back (before the extension installs its notice, which
        chains to what it finds)."""
        for n, old in self._old.items():
            self._signal.signal(n, old)
        self._old = {}

    def redeliver(self):
        for n in dict.fromkeys(self.seen):
            os.kill(os.getpid(), n)


def _env_int(name, default):
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def _adapt(fn, what):
    """fn(directory) or fn(directory, step), called as f(directory, step)."""
    if fn is None:
        raise TypeError(f"CheckpointManager needs a {what} callable")
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
        two = len(params) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)
    except (TypeError, ValueError):
        two = True
    return fn if two else (lambda directory, step: fn(directory))


class _AutoSave:
    """CheckpointManager's save_policy="auto": when to save, decided on one task for all.

    Task 0 of the process group (or the only task) keeps holdfast's save_interval_policy
    (_ext._SavePolicy: Daly's interval from the measured blocking cost of its saves and the
    mean time between interruptions learned from the run history in the durable directory,
    holdfast-run-history.json, with the prior mtbi_prior_s; clamped to [min_interval_s,
    max_interval_s]). save_if_due(step) asks it and, when torch.distributed is initialized with
    more than one rank, broadcasts its answer from rank 0 of `group` (one integer per call, on
    the group's device): every rank gets the same answer at the same call, so all save the same
    step. Call it at the same point of every rank's loop (where the loop's own collectives
    already keep the ranks in step).
    """

    def _init_save_policy(self, save_policy, mtbi_prior_s, min_interval_s, max_interval_s, group):
        if save_policy not in (None, "auto"):
            raise ValueError(f"save_policy takes None or 'auto', not {save_policy!r}")
        self._group = group
        self._auto = save_policy == "auto"
        self._policy = None
        if self._auto and self._rank() == 0:
            self._policy = _ext._SavePolicy(self.directory, float(mtbi_prior_s),
                                            float(min_interval_s), float(max_interval_s))

    @property
    def save_policy(self):
        """The deciding task's _SavePolicy (interval, mtbi, save_cost), None elsewhere."""
        return self._policy

    def _rank(self):
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(self._group)
        return _env_int("RANK", 0)

    def _agree(self, due):
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()) or \
                dist.get_world_size(self._group) < 2:
            return due
        import torch
        device = "cpu"
        if dist.get_backend(self._group) == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        flag = torch.tensor([1 if due else 0], dtype=torch.int64, device=device)
        dist.broadcast(flag, src=dist.get_global_rank(self._group, 0) if self._group else 0,
                       group=self._group)
        return bool(flag.item())

    def save_if_due(self, step):
        """save_policy="auto": saves `step` when task 0's policy says a save is due (the same
        answer on every rank); True when it saved. Task 0 times the save (the blocking part:
        with two tiers the local save) and records it in the policy and the run history."""
        if not self._auto:
            raise RuntimeError("save_if_due needs CheckpointManager(save_policy='auto')")
        import time
        if not self._agree(self._policy is not None and self._policy.should_save()):
            return False
        t = time.perf_counter()
        self.save(step)
        if self._policy is not None:
            self._policy.record_save(time.perf_counter() - t)
        return True

    def note_notice(self):
        """After Preempted (the preemption save committed): this run ended with a notice, in
        the run history the policy learns from (task 0; a no-op elsewhere)."""
        if self._policy is not None:
            self._policy.note_notice()

    def note_clean_end(self):
        """When the training finished: this run ended on purpose (task 0; a no-op elsewhere)."""
        if self._policy is not None:
            self._policy.note_clean_end()


class CheckpointManager(_ext.CheckpointManager, _AutoSave):
    """holdfast's checkpoint_manager on `directory`, saving a state dict or written and read by
    Python callables.

    state={"model": model, "optimizer": opt, ...}: a staged save (docs/saving.md). save(step)
    takes each value's state_dict() (a value without one is saved as it is), copies every
    tensor's bytes into holdfast's staging area with the GIL released (each storage once: tied
    weights and views stay shared) and returns; a background thread of the C++ library writes
    and commits the checkpoint, never taking the GIL. The checkpoint holds the bytes the tensors
    had when save() was called. A save called while one is in flight waits for it (as does the
    handler's preemption save: the one in flight is finished first). A restore loads each value
    that has load_state_dict() in place; `loaded_state` is the dict as loaded, those values
    replaced by None (no second copy of the state is kept). state= may
    also be a callable returning the dict, with load_state=callable(dict) for the restore. The
    format (holdfast_torch.state) is three files any torch reads without holdfast; CPU tensors
    only in this version. async_save is ignored (a staged save always commits in the background).

    save(directory, step) fills a fresh checkpoint directory (e.g. torch.save of the state
    dicts); restore(directory, step) loads one. Both may also take only the directory. Each
    checkpoint is published whole (fsync, rename, then the `latest` pointer); the newest
    `max_to_keep` are kept. Give every task its own directory (e.g. ckpt/rank-<k>): owner
    ("task <RANK>" by default under torchrun, else none) is recorded in the directory's writer
    lock, and a CheckpointManager of another owner on a directory in use fails at once naming
    both tasks (it waited 30 s for a lock that was not going to be released); the same owner
    waits for it (a predecessor of that rank still finishing).

    local_dir: two tiers (holdfast::two_tier_checkpoints; durable_dir= is another name for
    `directory`, the durable tier): save() writes to local_dir (a
    node-local disk or RAM disk; keeps local_max_to_keep) and returns; one background thread
    copies each checkpoint to `directory` (the durable tier: the run's shared directory; keeps
    max_to_keep). The handler's preemption save waits for its copy at most durable_wait
    seconds (what the grace period leaves after the local save); restore reads either tier (a
    new node, its local_dir empty, reads `directory`). async_save is ignored there.

    save_policy="auto": save_if_due(step) saves at the interval holdfast's save_interval_policy
    chooses (see _AutoSave; mtbi_prior_s, min_interval_s, max_interval_s), decided on
    task 0 and the same on every rank; note_notice() / note_clean_end() end the run's entry in
    its history.
    """

    def __init__(self, directory=None, save=None, restore=None, max_to_keep=3, async_save=False,
                 *, state=None, load_state=None, local_dir=None, durable_dir=None,
                 local_max_to_keep=2, durable_wait=20.0, save_policy=None,
                 mtbi_prior_s=86400.0, min_interval_s=30.0, max_interval_s=86400.0, group=None,
                 owner=None):
        if durable_dir is not None:  # the durable tier's name for `directory`
            if directory is not None and os.fspath(directory) != os.fspath(durable_dir):
                raise TypeError("CheckpointManager: directory and durable_dir differ")
            directory = durable_dir
        if directory is None:
            raise TypeError("CheckpointManager needs a directory (or durable_dir)")
        self._io = None
        stage = None
        if state is not None:
            if save is not None or restore is not None:
                raise TypeError("CheckpointManager takes state= or save=/restore=, not both")
            if not isinstance(state, Mapping) and not callable(state):
                raise TypeError("state= takes a dict of state_dict() holders (model, optimizer, "
                                "...) or a callable returning the state dict")
            if load_state is not None and not callable(load_state):
                raise TypeError("load_state= takes a callable(dict)")
            # Not bound methods of self: the extension holds these, and a reference back to
            # self would be a cycle Python's collector cannot see (the lock never released).
            self._io = _StateIO(state, load_state)
            stage, save, restore = self._io.stage, None, self._io.restore
        elif load_state is not None:
            raise TypeError("load_state= goes with state=")
        _start_log_pump()
        super().__init__(os.fspath(directory), save and _adapt(save, "save"),
                         _adapt(restore, "restore"), max_to_keep, async_save,
                         os.fspath(local_dir) if local_dir else "", int(local_max_to_keep),
                         float(durable_wait), _checkpoint_owner(owner), stage)
        self._init_save_policy(save_policy, mtbi_prior_s, min_interval_s, max_interval_s, group)


    @property
    def loaded_state(self):
        """state=: the dict the last restore loaded (None before one, and with load_state=),
        each value loaded into its object (load_state_dict) replaced by None, so no second
        copy of the state is kept."""
        return self._io.loaded if self._io is not None else None


class _StateIO:
    """CheckpointManager(state=...)'s stage and restore callables (holdfast_torch.state)."""

    def __init__(self, state, load_state):
        self.state, self.load_state, self.loaded = state, load_state, None

    def state_dict(self):
        """The dict a staged save writes: state() or each value's state_dict()."""
        if isinstance(self.state, Mapping):
            return {k: v.state_dict() if callable(getattr(v, "state_dict", None)) else v
                    for k, v in self.state.items()}
        out = self.state()
        if not isinstance(out, Mapping):
            raise TypeError(f"state() returned {type(out).__name__}, not a dict")
        return out

    def stage(self, step):
        return _state_format.flatten(self.state_dict())

    def restore(self, directory, step):
        loaded = _state_format.load(directory)
        if isinstance(self.state, Mapping):
            for k, v in self.state.items():
                if not callable(getattr(v, "load_state_dict", None)):
                    continue
                if k not in loaded:
                    raise KeyError(f"holdfast: the checkpoint '{directory}' (step {step}) holds "
                                   f"no {k!r} (it holds {sorted(map(str, loaded))})")
                v.load_state_dict(loaded[k])
                loaded[k] = None  # in the object now: not a second copy held here
        elif self.load_state is not None:
            self.load_state(loaded)
            loaded = None  # load_state has it
        self.loaded = loaded


def _checkpoint_owner(owner):
    """CheckpointManager's owner: as given, else "task <RANK>" where torchrun set RANK."""
    if owner is not None:
        return str(owner)
    rank = os.environ.get("RANK")
    return f"task {rank}" if rank not in (None, "") else ""


_STORES = ("'torch', 'file:///dir' (or '/dir': an absolute path), "
           "'etcd://host:port[,host:port...][/prefix]' or 'etcds://...'")


def _check_store(store):
    """A store= value Handler can open, else ValueError listing every accepted form."""
    ok = isinstance(store, str) and (
        store == "torch" or store.startswith("/") or
        store.lower().startswith(("file://", "etcd://", "etcds://")))
    if not ok:
        raise ValueError(f"store takes {_STORES}, not {store!r}")


def _seconds(name, value):
    """`value` as a float (seconds, or a factor), else ValueError naming the parameter."""
    if isinstance(value, bool):
        raise ValueError(f"{name} takes a number, not {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} takes a number (seconds: 30, not '30s'), not {value!r}") from None


class Handler(_ext.Handler):
    """The preemption handler around each training step (holdfast::preemption_handler).

    preset:     "generic" (SIGTERM, exit 42), "k8s"/"kubernetes" (SIGTERM, 143, grace 30 s),
                "slurm" (SIGUSR1 or SIGTERM, 143, grace 120 s), "gce" (maintenance event, 143),
                "aws" (spot instance action, 143, grace 120 s), "detect" (from the environment).
    store:      "torch" (the job's own c10d store: torch_store, else the default process
                group's), "file:///shared/dir" (or "/shared/dir"), or
                "etcd://host:port[,host:port...][/prefix]".
    task, num_tasks, run_id, restart: default to torchrun's RANK, WORLD_SIZE,
                TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT; keys are scoped by
                (run_id, incarnation), so each restart of the worker group agrees afresh.
                Under torchrun the restart count is not shared: each node's agent counts its
                own, so a node relaunched alone is at 0 beside one at 1. store="torch": the
                incarnation is the launch number every task agrees on (_launch_number: task
                0 takes it from a counter in the agent's store and hands it to each task),
                else the restart count (no agent store). A URL store outlives launches, and a
                relaunched torchrun keeps its run id and counts restarts from 0 again: there
                task 0 takes a fresh incarnation from the store (a counter) and hands it to
                the others through the launch's own store (the agent's store under the launch
                number, else the process group's), so no launch reads the keys an earlier one
                left. incarnation=N sets it yourself.
    notice_file: a path whose appearance is a notice too (besides the preset's signals): what
                an sbatch trap for --signal=B:USR1@N writes (docs in examples/pytorch/README).
    checkpoints: a CheckpointManager; the handler restores from it at construction (after
                agreeing with every task on the newest step all of them hold) and saves
                through it at the agreed step.
    ack_timeout: seconds to wait for every task's answer to a notice.
    start_timeout: seconds the start may take to reach the store at all (10): an etcd nobody
                listens on, or one that never answers, fails the construction by then with
                AgreementUnreachable carrying the store's own error (its URL) and errno.
    restore_timeout: seconds the start waits for every task's checkpoints (600: ranks may
                start minutes apart; a warning every 10 s names who is there and who not);
                then AgreementTimeout names the tasks that never came, and this bound.
                Waiting for task 0's launch number (under torchrun) has the same bound.
    grace:      seconds of training after a notice (None: the preset's); grace_margin: the
                final save is claimed this much earlier than measured.
    hang_policy: what a hang verdict does (holdfast/handler/hang.hpp; each is its own handler
                type in the extension): "report" (default: a warning and on_hang on every
                worker; during an agreement round run() raises HangDetected), "restart" (the
                same, then every worker exits with hang_exit_code, 75 by default, which torchrun
                treats as a failure and restarts the group from the newest checkpoint every
                task holds; the hung worker's own watcher thread ends it even while its step is
                stuck), "none" (no detection compiled in).
    hang_timeout: seconds; a step is hung past max(hang_multiplier x the longest recent step,
                hang_timeout), and during the first hang_warmup_steps steps past 2 x
                hang_timeout (the first steps do one-time work: DDP's buckets, allocators,
                the first collectives); saves and restores keep their own floors (5 and 10
                minutes) unless hang_timeout is longer. None: the C++ defaults (60 s for a
                step, 10 minutes in the warm-up).
    hang_multiplier, hang_warmup_steps: the learned bound's factor (5.0) and the steps timed
                before it applies (10). hang_period: seconds, the watcher's longest look-away
                (a verdict is recorded within the bound plus one period). hang_exit_code: what
                "restart" exits with.
    on_hang:    called once per verdict on every worker that learns it, with a dict {task,
                phase, step, elapsed_s, bound_s, recorder}, on a thread of its own holding the
                GIL (the handler waits for it at most 5 s, then goes on: "restart" exits); its
                exceptions are printed, never raised. Keep it short (a log line, a file).
    pause_hang_detection(): no bound until the next run() (an evaluation between steps).
    learned_hang_bounds(): {step_s, save_s, restore_s, steps, step_bound_s, save_bound_s,
                restore_bound_s}: what the detector measured and the bounds in force now.

    A value it cannot use fails at construction, before any wait: ValueError naming the
    parameter for a store= of no accepted form (the message lists them, "torch" included) and
    for a duration or factor that is not a number (grace=30, not "30s"); holdfast.Error naming
    the path for a notice_file that could never appear (its directory missing or not one).

    run(step_fn, *args, **kwargs) returns step_fn's result; raises Preempted (SystemExit with
    the preset's code) after the agreed save, PeerError when another task's step raised,
    AgreementTimeout naming tasks that did not answer. Use it from one thread.
    """

    def __init__(self, preset="generic", store="torch", torch_store=None, task=None,
                 num_tasks=None, run_id=None, restart=None, checkpoints=None, ack_timeout=180.0,
                 grace=None, grace_margin=3.0, watch_interval=0.1, store_poll=0.01,
                 notice_file=None, incarnation=None, hang_policy="report", hang_timeout=None,
                 hang_multiplier=5.0, hang_warmup_steps=100, hang_period=1.0, hang_exit_code=75,
                 on_hang=None, start_timeout=10.0, restore_timeout=600.0):
        if checkpoints is None:
            raise TypeError("Handler needs checkpoints=CheckpointManager(...)")
        if hang_policy not in ("report", "restart", "none"):
            raise ValueError(f"hang_policy takes 'report', 'restart' or 'none', not {hang_policy!r}")
        if on_hang is not None and not callable(on_hang):
            raise TypeError("on_hang must be callable (or None)")
        _check_store(store)
        (ack_timeout, start_timeout, restore_timeout, grace_margin, watch_interval, store_poll,
         hang_multiplier, hang_period) = (
            _seconds(name, value) for name, value in (
                ("ack_timeout", ack_timeout), ("start_timeout", start_timeout),
                ("restore_timeout", restore_timeout), ("grace_margin", grace_margin),
                ("watch_interval", watch_interval), ("store_poll", store_poll),
                ("hang_multiplier", hang_multiplier), ("hang_period", hang_period)))
        grace = None if grace is None else _seconds("grace", grace)
        hang_timeout = None if hang_timeout is None else _seconds("hang_timeout", hang_timeout)
        task = _env_int("RANK", 0) if task is None else int(task)
        num_tasks = _env_int("WORLD_SIZE", 1) if num_tasks is None else int(num_tasks)
        if run_id is None:
            run_id = os.environ.get("TORCHELASTIC_RUN_ID") or "default"
        run_id = str(run_id).replace("/", "_") or "default"
        restart = _env_int("TORCHELASTIC_RESTART_COUNT", 0) if restart is None else int(restart)
        held = _HeldSignals(preset)  # a notice while the hand-off waits is not lost
        try:
            # The hand-off waits for task 0 (ranks may start minutes apart): the start's bound
            # for peers, restore_timeout, as the restore agreement's.
            if incarnation is None and store != "torch":
                incarnation = _take_incarnation(store, run_id, task, restore_timeout)
            elif incarnation is None and torch_store is None:
                incarnation = _torch_incarnation(restore_timeout)
        finally:
            held.release()
        if incarnation is not None:
            restart = int(incarnation)
        if store == "torch" and torch_store is None:
            import torch.distributed as dist
            if not dist.is_initialized():
                raise RuntimeError("store='torch' needs torch_store=..., or "
                                   "torch.distributed.init_process_group() first")
            torch_store = dist.distributed_c10d._get_default_store()
        _start_log_pump()
        try:
            super().__init__(preset, store, torch_store if store == "torch" else None, task,
                             num_tasks, run_id, restart, checkpoints, ack_timeout, grace,
                             grace_margin, watch_interval, store_poll,
                             os.fspath(notice_file) if notice_file else "", hang_policy,
                             hang_timeout, hang_multiplier, int(hang_warmup_steps), hang_period,
                             int(hang_exit_code), on_hang, start_timeout, restore_timeout)
        finally:
            _emit_log()  # the start's lines (the restored step, a timeout) before it returns
        held.redeliver()  # the extension's notice is installed: it records them

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(failed=exc[0] is not None)  # a failure writes no liveness "done"
        _emit_log()
        return False


Cache = _ext.Cache
