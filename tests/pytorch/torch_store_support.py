"""Shared by tests/pytorch/test_*.py and benchmarks/torch_store_bench.py: the tests' case runner
(check, run_cases, exit_now), a TCPStore server, a counting TCP proxy in front of it, and worker
processes that run the extension's Handler over that store (store="torch").

Run as a script, this file is a worker: `python torch_store_support.py worker '<json config>'`.
A worker reports on stdout, one JSON object a line ({"ev": ...}); the parent steers it with
lines on its stdin (no store traffic of its own, so the proxy counts only the handler's; a
worker blocked reading stdin costs no CPU). Times are time.monotonic_ns() (CLOCK_MONOTONIC,
the same in every process).
"""

import datetime
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def check(cond, what):
    """A test's assertion: AssertionError(what) unless cond."""
    if not cond:
        raise AssertionError(what)


def case_list():
    """A test file's cases and the decorator that adds one: `CASES, case = sup.case_list()`."""
    cases = []

    def case(fn):
        cases.append(fn)
        return fn

    return cases, case


def readable(fd, timeout):
    """Whether `fd` turns readable within `timeout` seconds."""
    r, _, _ = select.select([fd], [], [], timeout)
    return bool(r)


def run_cases(cases, argv):
    """Runs the cases named in argv (all when none), printing PASS/FAIL with each one's time and
    a traceback for each failure; the last line is "N passed, M failed". Returns the exit code."""
    chosen = [c for c in cases if not argv or c.__name__ in argv]
    passed = failed = 0
    for c in chosen:
        t0 = time.monotonic()
        try:
            c()
            passed += 1
            print(f"PASS {c.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL {c.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def exit_now(code):
    """Flushes and exits without the interpreter's teardown: threads the cases left (watches in a
    wait on servers this process hosts, a handler's helpers) would log after the summary line."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def load_holdfast():
    """The installed holdfast_torch package (tests/pytorch/run.sh installs its wheel)."""
    import holdfast_torch
    return holdfast_torch


def start_server(use_libuv=True):
    """A TCPStore server on a free loopback port (its port: .port)."""
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         use_libuv=use_libuv, timeout=datetime.timedelta(seconds=60))


def connect(port, timeout=60, use_libuv=True):
    """A TCPStore client of the server (or proxy) on `port`."""
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", port, is_master=False, use_libuv=use_libuv,
                         timeout=datetime.timedelta(seconds=timeout))


def claim_key(run_id, restart=0, round_=0):
    """Where torch_kv keeps the claim of `round_` (its prefix, then the handler's key)."""
    return f"holdfast-kv/{run_id}/{restart}/holdfast/{run_id}/ctl/r{round_}/claim"


class CountingProxy:
    """A TCP proxy in front of a TCPStore server that counts what clients send it.

    Each request of c10d's TCPStore client is one send() (its SendBuffer flushes once), so
    with requests spaced in time each read on the proxy's client side is one request:
    `requests` counts those reads (calibrate() checks the assumption), `bytes` the bytes.
    """

    def __init__(self, upstream_port):
        self.upstream = upstream_port
        self.requests = 0
        self.bytes = 0
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def counts(self):
        with self._lock:
            return self.requests, self.bytes

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src, dst, count):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if count:
                    with self._lock:
                        self.requests += 1
                        self.bytes += len(data)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def calibrate(self):
        """Checks that spaced requests count one each: 20 check() calls, then a wait that
        times out (WAIT and CANCEL_WAIT). Returns (counted checks, counted for the wait).

        No pause is needed before a count: _pump counts a read before it forwards it, so once
        a request's answer is back its read is counted, and a client that waits for each
        answer (check; wait, which sends CANCEL_WAIT on its timeout and reads the answer)
        spaces its requests. The first check is not counted: it is answered after whatever
        the connection sent on its own (c10d's validation and ping) was read."""
        c = connect(self.port)
        c.check(["calibrate/first"])
        r0, _ = self.counts()
        for i in range(20):
            c.check([f"calibrate/{i}"])
        r1, _ = self.counts()
        try:
            c.wait(["calibrate/missing"], datetime.timedelta(milliseconds=100))
        except Exception:  # torch.distributed.DistStoreError: the timeout
            pass
        r2, _ = self.counts()
        del c
        return r1 - r0, r2 - r1


# ---- threads seen asleep (as tests/support/thread_state.hpp) ---------------------------------

# The calls a c10d client's wait sleeps in: its Socket::waitForInput is a poll() (seen once on
# x86_64: a watch thread in its wait reads 7 in /proc/self/task/<tid>/syscall; before a
# follow() it sleeps on its condition variable, futex, 202). aarch64 has only ppoll.
POLL_SYSCALLS = {"x86_64": (7, 271), "aarch64": (73,)}.get(os.uname().machine, ())


def thread_ids(pid="self"):
    """The thread ids of process `pid` (entries of /proc/<pid>/task)."""
    return {int(t) for t in os.listdir(f"/proc/{pid}/task")}


def native_threads(before):
    """This process's threads not in `before` (from thread_ids()) and not Python's own
    (threading's native_id): the threads the extension started since."""
    python = {t.native_id for t in threading.enumerate()}
    return thread_ids() - set(before) - python


def sleeping_syscall(tid, pid="self"):
    """The system call thread `tid` of process `pid` sleeps in (its state S), or None when it
    is running, asleep outside a call, gone or unreadable."""
    where = f"/proc/{pid}/task/{tid}"
    try:
        with open(where + "/stat") as f:
            stat = f.read()
        if stat[stat.rindex(")") + 2] != "S":  # the name may hold spaces and parentheses
            return None
        with open(where + "/syscall") as f:
            first = f.read().split()[0]  # "running" while it runs
        return int(first)
    except (OSError, IndexError, ValueError):
        return None


def wait_asleep_in(tids, syscalls=None, pid="self", count=1, every=False, timeout=10.0,
                   what="a thread"):
    """Waits, a look every millisecond until `timeout` s, until `count` of the threads `tids`
    (a set, or a callable giving it at each look) of process `pid` sleep in one of `syscalls`
    (default POLL_SYSCALLS: in a c10d wait), with `every`, all of them; returns those. Raises
    AssertionError naming what each thread was doing otherwise."""
    syscalls = POLL_SYSCALLS if syscalls is None else syscalls
    if not syscalls:
        raise AssertionError(f"no poll system call numbers known for {os.uname().machine}")
    deadline = time.monotonic() + timeout
    while True:
        current = tids() if callable(tids) else tids
        states = {t: sleeping_syscall(t, pid) for t in current}
        asleep = {t for t, nr in states.items() if nr in syscalls}
        if len(asleep) >= count and (not every or asleep == set(current)):
            return asleep
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"{what}: not {'all, ' if every else ''}{count} of threads {sorted(current)} "
                f"of process {pid} asleep in "
                f"system calls {list(syscalls)} within {timeout} s (each in: {states})")
        time.sleep(0.001)


def eventually(cond, timeout=10.0, what="the condition"):
    """Waits, a look every millisecond until `timeout` s, until cond() is true; returns its
    value, or raises AssertionError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.001)


def watch_and_thread(kv, prefix):
    """kv.watch(prefix) and the tid of the thread it started (see native_threads)."""
    before = thread_ids()
    w = kv.watch(prefix)
    deadline = time.monotonic() + 10.0
    while True:
        new = native_threads(before)
        if len(new) == 1:
            return w, new.pop()
        if time.monotonic() >= deadline:
            raise AssertionError(f"watch({prefix!r}): not one new thread but {sorted(new)}")
        time.sleep(0.001)


# ---- worker processes -----------------------------------------------------------------------


class Worker:
    """A worker process (this file as a script, or `script`: another test file's worker) and
    the events it printed."""

    def __init__(self, config, script=None):
        self.config = config
        self.task = config.get("task", 0)
        env = dict(os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, script or os.path.abspath(__file__), "worker", json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env)
        self.events = queue.Queue()
        self.stderr = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                self.stderr.append(line)
        self.events.put({"ev": "eof"})

    def _read_err(self):
        for line in self.proc.stderr:
            self.stderr.append(line)

    def expect(self, *kinds, timeout=60.0):
        """The next event of one of `kinds` (others are skipped); raises on EOF or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"task {self.task}: no {kinds} within {timeout} s; "
                                   f"stderr: {''.join(self.stderr)[-2000:]}")
            try:
                e = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if e["ev"] in kinds:
                return e
            if e["ev"] in ("eof", "error"):
                raise RuntimeError(f"task {self.task}: {e} before {kinds}; "
                                   f"stderr: {''.join(self.stderr)[-2000:]}")

    def send(self, line):
        """Writes one line to the worker's stdin (go, start <ns>, stop)."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def signal(self, sig):
        try:
            self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _command(expected):
    """The next line of stdin, split; its first word must be `expected`."""
    words = sys.stdin.readline().split()
    if not words or words[0] != expected:
        raise RuntimeError(f"expected '{expected}' on stdin, got {words}")
    return words


def _emit(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _report(cfg, **event):
    """Emits the event, with cfg["quiet"] only once "report" comes on stdin: the parent's
    reader threads then stay asleep while the other workers are still on their way."""
    if cfg.get("quiet"):
        _command("report")
    _emit(**event)


def _worker(cfg):
    """One worker: for each rep, waits for "go" on stdin, builds a Handler over the store at
    cfg["port"] (store="torch"), reports ready, then, by cfg["mode"]:
      train: waits for "start <ns>" on stdin, then steps of cfg["step"] s on a grid shared by
             all workers from that time, until Preempted (reports saved: step, t),
             AgreementTimeout (reports timeout: missing, t) or, with cfg["watch_stop"], until
             the file <dir>/stop exists;
      close: idles cfg["idle"] s in steps, then reports how long close() took;
      bare:  no handler (the baseline broadcast): task 0 waits for SIGTERM and sets the key
             bare/<rep>; the others block in wait([bare/<rep>]) on their own client; each
             reports the time (saved: t).
    With cfg["quiet"], saved is reported when "report" comes on stdin (see _report). The
    Handler's watch_interval is cfg["watch_interval"] (default 0.1 s, the Handler's).
    """
    mode = cfg.get("mode", "train")
    task, num_tasks, d = cfg["task"], cfg["num_tasks"], cfg["dir"]
    if mode == "bare" and task == 0:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    hf = None if mode == "bare" else load_holdfast()
    import torch.distributed as dist  # noqa: F401  (loaded before "loaded")
    store = connect(cfg["port"])
    _emit(ev="loaded")
    previous = None
    for rep in range(cfg.get("reps", 1)):
        _command("go")
        if previous is not None:
            previous.close()
            previous = None
        if mode == "bare":
            key = f"bare/{cfg['run_id']}/{rep}"
            if task == 0:
                _emit(ev="ready", rep=rep)
                signal.sigwait({signal.SIGTERM})
                store.set(key, "stop")
            else:
                _emit(ev="ready", rep=rep)
                store.wait([key], datetime.timedelta(seconds=60))
            _report(cfg, ev="saved", rep=rep, task=task, t=time.monotonic_ns())
            continue
        saved = {}

        def save(directory, step):
            saved.setdefault("t", time.monotonic_ns())
            saved.setdefault("step", step)
            with open(os.path.join(directory, "state"), "w") as f:
                f.write(str(step))

        def restore(directory, step):
            pass

        ckpt = hf.CheckpointManager(os.path.join(d, f"ckpt-{rep}", f"rank-{task}"),
                                    save=save, restore=restore)
        try:
            h = hf.Handler(preset="generic", store="torch", torch_store=store, task=task,
                           num_tasks=num_tasks, run_id=f"{cfg['run_id']}-{rep}", restart=0,
                           checkpoints=ckpt, ack_timeout=cfg.get("ack_timeout", 30.0),
                           restore_timeout=cfg.get("restore_timeout", 600.0),
                           watch_interval=cfg.get("watch_interval", 0.1))
        except hf.AgreementTimeout as e:
            _emit(ev="timeout", rep=rep, where="restore", missing=list(e.missing_tasks),
                  t=time.monotonic_ns())
            continue
        _emit(ev="ready", rep=rep)
        previous = h
        step = cfg.get("step", 0.001)
        if mode == "close":
            end = time.monotonic() + cfg.get("idle", 1.0)
            while time.monotonic() < end:
                h.run(time.sleep, step)
            t0 = time.monotonic()
            h.close()
            _emit(ev="closed", rep=rep, close_s=time.monotonic() - t0)
            previous = None
            continue
        start = int(_command("start")[1])
        stop = os.path.join(d, "stop")
        step_ns = int(step * 1e9)
        step_end = start
        try:
            while True:
                step_end += step_ns
                h.run(lambda: time.sleep(max(0, step_end - time.monotonic_ns()) / 1e9))
                if cfg.get("watch_stop") and os.path.exists(stop):
                    break
        except hf.Preempted:
            _report(cfg, ev="saved", rep=rep, task=task, step=saved.get("step"), t=saved.get("t"))
        except hf.AgreementTimeout as e:
            _emit(ev="timeout", rep=rep, where="round", missing=list(e.missing_tasks),
                  t=time.monotonic_ns())
    if previous is not None:
        previous.close()
    _emit(ev="done")
    if cfg.get("pause"):
        while True:
            time.sleep(3600)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "worker":
    try:
        _worker(json.loads(sys.argv[2]))
    except Exception as e:  # reported to the parent, which fails the case
        import traceback
        _emit(ev="error", error=f"{type(e).__name__}: {e}", trace=traceback.format_exc())
        sys.exit(1)
