"""The one launcher of worker processes (``run``, ``shard --run``, ``calibrate``): spawn or
join, watch, end, diagnose.

``launch(worker, world, args)`` starts ``world`` processes (multiprocessing's forkserver
context: torch is imported once, in the server), each named ``pipeplan-wRANK``, ended with
this process (``PR_SET_PDEATHSIG``) and joined to a process group through a
private rendezvous file (``rendezvous.py``: sockets on loopback only); each calls
``worker(ctx, *args)`` (``ctx``: a ``Worker``, its rank, world size and ``progress``) and
reports its result, or its error in one line. The launcher watches the reports, typed
messages (``Progress``, ``Done``, ``Failed``), until every worker reported and ended; a
worker that raised or died, no rank progressing for ``hang_s`` or the wall-clock
``timeout_s`` ends the run: every worker process is ended (also on Ctrl-C or SIGTERM, which
reach the launcher as exceptions) and the failure at the root (``Failure``) is put in words
by the caller's ``diagnose``.

Join: under torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set),
``launch(..., join=True)`` spawns nothing: this process joins torchrun's group
(``joined_from_env``), runs the worker as its rank and gathers every rank's result; torchrun,
not this launcher, then watches and ends the processes.
"""

from __future__ import annotations

import os
import queue as queue_mod
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..errors import PipeplanError, interrupts_deferred
from .rendezvous import join_local_group, local_rendezvous, loopback_interface

#: seconds a worker may take, beyond the hang timeout, for each step of its set-up (spawn and
#: import torch, join the process group, build its part) before it counts as stuck
STARTUP_GRACE_S = 30.0
#: the progress labels of those set-up steps (any other label ends the grace)
SETUP_STEPS = ("started", "joined the process group")
PROGRESS_EVERY_S = 0.2  # a rank reports its last progress this often (hang detection is coarser)
#: what a rank reports when its connection to a failed peer drops: a knock-on, not a root
PEER_ERRORS = ("Connection reset", "Connection closed", "Broken pipe", "Connection refused")
#: the environment torchrun (or any launcher of the same protocol) sets for each process
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Progress:
    """A rank did ``label`` at ``when`` (``time.time()``), in its iteration ``step`` (from 1;
    0: before any)."""

    rank: int
    label: str
    when: float
    step: int = 0


@dataclass(frozen=True)
class Done:
    """A rank's result (whatever its worker function returned)."""

    rank: int
    payload: Any


@dataclass(frozen=True)
class Failed:
    """A rank raised; ``text`` is its error in one line."""

    rank: int
    text: str


Message = Progress | Done | Failed


@dataclass(frozen=True)
class Failure:
    """What ended a launch, for the caller to put in words: a rank that ``"raised"`` (``text``:
    its error), ``"died"`` (``exitcode``), ``"hung"`` (``seconds`` without progress, ``text``:
    its last progress) or the launch ``"timed out"`` (``seconds``: the limit, ``pending``: the
    ranks without a result)."""

    kind: str
    rank: int = 0
    text: str = ""
    exitcode: int | None = None
    seconds: float = 0.0
    pending: tuple[int, ...] = ()

    def words(self, what: str, who: str) -> str:
        """The usual line: ``{what} failed: {who} raised ...`` (``who`` names ``self.rank``)."""
        if self.kind == "died":
            return f"{what} failed: {who} died with exit code {self.exitcode}"
        if self.kind == "raised":
            return f"{what} failed: {who} raised {self.text}"
        if self.kind == "hung":
            return (f"{what} failed: {who} made no progress for {self.seconds:.0f} s (last: {self.text}); "
                    "the other ranks wait for it")
        return f"{what} failed: not finished within {self.seconds:g} s"


def one_line_error(e: BaseException, limit: int | None = None) -> str:
    """``Type: message`` with the message's lines joined into one (its first ``limit`` characters)."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {text[:limit]}"


class Worker:
    """What a worker function gets: its ``rank``, the ``world`` size and ``progress(label)``,
    which only notes the label (a message per call would cost the run CPU); a daemon thread
    sends the latest, with the time it was noted, every ``PROGRESS_EVERY_S`` when it changed,
    also while the rank waits in a collective."""

    def __init__(self, rank: int, world: int, results: Any = None) -> None:
        self.rank, self.world, self.results = rank, world, results
        self.step = 0
        self._lock = threading.Lock()
        self.latest: tuple[float, str, int] | None = None
        self.sent: tuple[float, str] | None = None
        if results is not None:
            threading.Thread(target=self._send_loop, daemon=True).start()

    def progress(self, label: str, step: int | None = None) -> None:
        """Note ``label``; ``step``: the rank's iteration from now on (kept when None)."""
        if step is not None:
            self.step = step
        self.latest = (time.time(), label, self.step)

    def flush(self) -> None:
        """Send the latest progress unless it was sent (before the rank reports its result:
        the launcher's bar sees its last step)."""
        with self._lock:
            latest = self.latest
            if latest is not None and latest is not self.sent and self.results is not None:
                self.results.put(Progress(self.rank, latest[1], latest[0], latest[2]))
                self.sent = latest

    def _send_loop(self) -> None:
        while True:
            self.flush()
            time.sleep(PROGRESS_EVERY_S)


@dataclass(frozen=True)
class _Spec:
    """What every spawned process needs besides its rank (picklable: functions by name)."""

    worker: Callable[..., Any]
    args: tuple
    backend: str
    threads: int | None
    join_timeout: timedelta | None
    error_text: Callable[[BaseException], str]
    parent: int
    #: the launcher's import path, working directory and environment at launch (the fork
    #: server holds those of the first launch; a worker takes the current ones)
    sys_path: tuple[str, ...]
    cwd: str
    env: dict[str, str]

    def enter(self, rank: int) -> None:
        """In the worker: die with the launcher, take its surroundings, name the process."""
        die_with_parent(self.parent)
        sys.path[:] = self.sys_path
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.env)
        name_process(f"pipeplan-w{rank}")


def die_with_parent(launcher: int) -> None:
    """Linux: this worker gets SIGKILL when the ``launcher`` ends, however it ends. Its parent
    is multiprocessing's fork server (``PR_SET_PDEATHSIG`` covers that one), which lives on
    while workers hold its pipe: a thread waits for the launcher's end (its pidfd)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    try:
        fd = os.pidfd_open(launcher)
    except (OSError, AttributeError):  # ended already, or no pidfd here (poll instead)
        fd = None
    if not _alive(launcher):
        os._exit(1)

    def wait() -> None:
        if fd is not None:
            select.select([fd], [], [])  # readable once the launcher ended (a zombie too)
        else:
            while _alive(launcher):
                time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="die-with-launcher", daemon=True).start()


def name_process(name: str) -> None:
    """Linux: the name ``ps`` and /proc/PID/comm show (at most 15 bytes)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(15, name.encode()[:15])  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _entry(rank: int, world: int, init_method: str, spec: _Spec, results: Any) -> None:
    """A spawned process: join the group, run the worker, report; on any error, report it in
    one line and exit 1."""
    sys.excepthook = sys.__excepthook__  # the fork server's quiet one is for starting (``quiet_interrupt``)
    spec.enter(rank)
    ctx = Worker(rank, world, results)
    try:
        if spec.threads is not None:
            torch.set_num_threads(spec.threads)
        ctx.progress("started")
        if spec.backend == "nccl":
            torch.cuda.set_device(rank)
        join_local_group(spec.backend, init_method, rank, world, spec.join_timeout)
        ctx.progress("joined the process group")
        payload = spec.worker(ctx, *spec.args)
        ctx.flush()
        results.put(Done(rank, payload))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # report to the launcher, which ends the run
        results.put(Failed(rank, spec.error_text(e)))
        raise SystemExit(1)


def end_all(procs: list) -> None:
    """Terminate every started process still running; kill one that outlives 5 s."""
    procs = [p for p in procs if p.pid is not None]  # started
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.time() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.time()))
        if p.is_alive():
            p.kill()
            p.join(5)


class LaunchFailed(Exception):
    """A launch's workers failed (``failure``); ``launch`` turns it into a ``PipeplanError``."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.kind)
        self.failure = failure


def root_failure(procs: list, results: Any, errors: dict[int, str], settle_s: float = 0.5,
                 wait_s: float = 10.0) -> Failure:
    """The failure at the root: a rank that died without a word first, then the first whose
    error is its own rather than a peer's connection dropping. A peer's report may arrive
    first, so reports are awaited until every worker ended and its reports are read, or one
    of those is in after ``settle_s`` (at most ``wait_s``)."""
    start = time.monotonic()
    while True:
        ended = all(p.exitcode is not None for p in procs)  # before the read: an ended worker's reports are sent
        try:
            msg = results.get(timeout=0.1)
            drained = False
            if isinstance(msg, Failed):
                errors.setdefault(msg.rank, msg.text)
        except queue_mod.Empty:
            drained = True
        silent = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in errors]
        own = [r for r, e in errors.items() if not any(x in e for x in PEER_ERRORS)]
        waited = time.monotonic() - start
        if waited > wait_s or (ended and drained) or (waited > settle_s and (silent or own)):
            break
    if silent or not errors:
        r = (silent or [0])[0]
        return Failure("died", r, exitcode=procs[r].exitcode)
    r = own[0] if own else next(iter(errors))
    return Failure("raised", r, errors[r])


def _stuck(last: dict[int, tuple[float, str, float]], hang_s: float, now: float) -> Failure | None:
    """The rank that stopped first, once no rank progressed for ``hang_s`` (the others wait for it)."""
    quiet = {r: now - t - grace for r, (t, _, grace) in last.items()}
    if min(quiet.values()) <= hang_s:
        return None
    r = max(quiet, key=quiet.__getitem__)
    return Failure("hung", r, last[r][1], seconds=now - last[r][0])


def watch(procs: list, results: Any, hang_s: float | None = None,
          timeout_s: float | None = None, on_progress: Callable[[Progress], None] | None = None) -> dict[int, Any]:
    """Collect the workers' reports until every one reported ``Done`` and ended with exit code
    0: rank -> payload. ``LaunchFailed`` (its ``Failure``) when a worker raised or died, when
    no rank progressed for ``hang_s`` (a rank in a set-up step has ``STARTUP_GRACE_S``
    more) or past ``timeout_s``. ``on_progress``: given each rank's progress (a bar)."""
    start = time.time()
    done: dict[int, Any] = {}
    errors: dict[int, str] = {}
    # rank -> (when it last progressed, what it did, the grace it has for its next step)
    last = {r: (start, "starting", STARTUP_GRACE_S) for r in range(len(procs))}
    while True:
        msg: Message | None
        try:
            msg = results.get(timeout=0.05)
        except queue_mod.Empty:
            msg = None
        if isinstance(msg, Progress):
            last[msg.rank] = (msg.when, msg.label, STARTUP_GRACE_S if msg.label in SETUP_STEPS else 0.0)
            if on_progress is not None:
                on_progress(msg)
        elif isinstance(msg, Failed):
            errors[msg.rank] = msg.text
        elif isinstance(msg, Done):
            done[msg.rank] = msg.payload
        if msg is not None:
            continue
        if errors or any(p.exitcode not in (None, 0) for p in procs):
            raise LaunchFailed(root_failure(procs, results, errors))
        if len(done) == len(procs) and all(p.exitcode == 0 for p in procs):
            return done
        now = time.time()
        stuck = _stuck(last, hang_s, now) if hang_s is not None else None
        if stuck is not None:
            raise LaunchFailed(stuck)
        if timeout_s is not None and now - start > timeout_s:
            pending = tuple(r for r in range(len(procs)) if r not in done)
            raise LaunchFailed(Failure("timed out", seconds=timeout_s, pending=pending))


def launch(worker: Callable[..., Any], world: int, args: tuple = (), *,
           diagnose: Callable[[Failure], str], backend: str = "gloo", threads: int | None = None,
           join_timeout: timedelta | None = None, hang_s: float | None = None, timeout_s: float | None = None,
           error_text: Callable[[BaseException], str] = one_line_error, name: str = "pipeplan-worker",
           join: bool = False, on_progress: Callable[[Progress], None] | None = None) -> dict[int, Any]:
    """Run ``worker(ctx, *args)`` on ``world`` ranks of one process group (``worker`` and
    ``error_text``: module-level functions, ``args`` picklable): rank -> what it returned. A
    failure is a ``PipeplanError`` worded by ``diagnose``; no worker process outlives the
    call. ``join``: under torchrun, join its group instead of spawning (``joined_from_env``).
    ``on_progress``: given the ranks' progress as it arrives (spawned workers only)."""
    if join and torchrun_world() is not None:
        return _run_joined(worker, world, args, backend, threads, diagnose, error_text)
    with interrupts_deferred():  # a Ctrl-C or SIGTERM arrives once the server is started and the queue made:
        ctx = _context(worker)  # one between registering a semaphore of the queue and arranging its
        results = ctx.Queue()  # removal at exit had the resource tracker warn of a leak
    spec = _Spec(worker, tuple(args), backend, threads, join_timeout, error_text, os.getpid(), tuple(sys.path),
                 os.getcwd(), dict(os.environ))
    with local_rendezvous() as init_method:
        procs = [ctx.Process(target=_entry, args=(r, world, init_method, spec, results), daemon=True,
                             name=f"{name}-{r}") for r in range(world)]
        try:
            try:
                for p in procs:
                    p.start()
            except (EOFError, ConnectionError) as e:  # the fork server ended under a worker's start
                time.sleep(0.2)  # a Ctrl-C that ended it reaches this process too: it lands here, as 130
                raise PipeplanError(f"the workers' fork server ended while starting them ({type(e).__name__}); "
                                    "run again") from None
            return watch(procs, results, hang_s, timeout_s, on_progress)
        except LaunchFailed as e:
            raise PipeplanError(diagnose(e.failure)) from None
        finally:
            end_all(procs)
            results.close()
            results.cancel_join_thread()


def _context(worker: Callable[..., Any]):
    """multiprocessing's forkserver context, its server importing torch and the worker's
    module once: each worker then starts in milliseconds instead of importing torch anew
    (the server starts with the first launch of this process and ends with it); a Ctrl-C
    there ends the server or a worker silently (``quiet_interrupt``, imported first)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    # the server is the process's one: whichever launch starts it decides what it preloads, so
    # it preloads the plan executor's modules (torch's pipelining, dynamo) whatever starts it
    ctx.set_forkserver_preload(["pipeplan.runtime.quiet_interrupt", "torch", "torch.distributed", __name__,
                                "torch.distributed.pipelining", "pipeplan.runtime.executor", worker.__module__,
                                *_model_libraries()])
    _start_server()
    return ctx


def _model_libraries() -> list[str]:
    """The model code of Hugging Face transformers that this process loaded (it built an
    ``hf:`` model, which its workers build again): seconds of imports each worker skips."""
    return sorted(m for m in sys.modules if m.startswith("transformers.models.")
                  and m.rsplit(".", 1)[-1].startswith(("configuration_", "modeling_")))


def _start_server() -> None:
    """Start the fork server (when not running) with Ctrl-C blocked, not lost: the blocked
    mask survives exec, so a Ctrl-C before the server imports ``quiet_interrupt`` (which
    unblocks it once its quiet handler is in place) waits there instead of printing a
    traceback; in this process the Ctrl-C held during the spawn arrives when it ends."""
    from multiprocessing import forkserver, resource_tracker

    # the fork server starts the resource tracker first, and that start (Python 3.11) unblocks
    # SIGINT when it returns instead of restoring the mask: start it before blocking
    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


#: ``python -m pipeplan.runtime.launch --help``: what it is, and what torchrun (not pipeplan) binds
LAUNCH_HELP = ("one rank of a plan's run under torchrun. Note: torchrun's own rendezvous store listens on every "
               "interface at --master-port, even with --master-addr 127.0.0.1 (torch's TCPStore binds the wildcard "
               "address); restrict that port with a firewall or a network namespace, or on one machine use "
               "'pipeplan run', which opens no port")


def torchrun_world() -> tuple[int, int] | None:
    """(rank, world size) that torchrun gave this process (``TORCHRUN_ENV`` all set), else None."""
    if not all(os.environ.get(k) for k in TORCHRUN_ENV):
        return None
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError:
        raise PipeplanError(f"RANK={os.environ['RANK']!r} and WORLD_SIZE={os.environ['WORLD_SIZE']!r} "
                            "(torchrun's environment) must be integers") from None


def joined_from_env(backend: str = "gloo", timeout: timedelta | None = None) -> tuple[int, int] | None:
    """Join the process group torchrun set up for this process (``env://``: ``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``): its (rank, world size); None, joining
    nothing, when the environment names no group. A loopback ``MASTER_ADDR`` binds gloo's and
    NCCL's sockets to loopback, as a local launch does."""
    world = torchrun_world()
    if world is None:
        return None
    if os.environ["MASTER_ADDR"] in ("127.0.0.1", "localhost", "::1"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())
        os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback_interface())
    extra = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(backend, init_method="env://", rank=world[0], world_size=world[1], **extra)
    return world


def _run_joined(worker: Callable[..., Any], world: int, args: tuple, backend: str, threads: int | None,
                diagnose: Callable[[Failure], str], error_text: Callable[[BaseException], str]) -> dict[int, Any]:
    """This process as one rank of torchrun's group: run the worker, gather every rank's result
    (torchrun watches the processes: no hang detection or timeout here)."""
    rank, size = torchrun_world()
    if size != world:
        raise PipeplanError(f"torchrun started {size} processes; this run needs {world} (--nproc-per-node)")
    if threads is not None:
        torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    joined_from_env(backend)
    try:
        try:
            payload = worker(Worker(rank, world), *args)
        except Exception as e:
            raise PipeplanError(diagnose(Failure("raised", rank, error_text(e)))) from None
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, payload)
        return dict(enumerate(gathered))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """``torchrun --nnodes N --nproc-per-node G [--node-rank R --master-addr A --master-port P]
    -m pipeplan.runtime.launch PLAN.json --model SPEC [--steps K] [--warmup W] [--device D]
    [--precision P] [--check]``:
    this process as rank node x G + local rank of the plan's run (rank r runs the plan's
    process r, as ``pipeplan run`` numbers them). ``--check``: rank 0 checks the run (every
    rank holds every stage's final state) against one-process training. Exit 0 when the run
    (and the check) passes, 1 on rank 0 when the check fails, 2 with one line on bad input."""
    import argparse

    from ..errors import one_line
    from ..plan import load_plan
    from .check import check_run
    from .executor import RunConfig, run_plan

    class OneLine(argparse.ArgumentParser):
        def error(self, message: str):  # one line, exit 2: no usage block
            print(f"{self.prog}: error: {message}", file=sys.stderr)
            raise SystemExit(2)

    p = OneLine(prog="python -m pipeplan.runtime.launch", description=LAUNCH_HELP)
    p.add_argument("plan")
    p.add_argument("--model", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    try:
        if torchrun_world() is None:
            raise PipeplanError("python -m pipeplan.runtime.launch runs under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, "
                                "MASTER_PORT unset); without it use 'pipeplan run'")
        if min(args.steps, args.threads) < 1 or args.warmup < 0:
            raise PipeplanError("--steps and --threads must be >= 1, --warmup >= 0")
        plan = load_plan(args.plan)
        cfg = RunConfig(spec=args.model, steps=args.steps, warmup=args.warmup, threads=args.threads,
                        device=args.device, precision=args.precision)
        result = run_plan(plan, cfg)
        verdict = "not checked"
        if args.check and os.environ["RANK"] != "0":
            verdict = "checked on rank 0"
        elif args.check:  # every rank holds every stage's final state: rank 0 checks it, once
            check = check_run(plan, args.model, result.params, steps=cfg.warmup + cfg.steps, lr=cfg.lr,
                              seed=cfg.seed, threads=cfg.threads, microbatch=result.microbatch,
                              device=result.device, precision=result.precision)
            verdict = f"check {check.verdict} (largest relative difference {check.max_rel_diff:.2e})"
            if check.verdict != "pass":
                print(f"rank {os.environ['RANK']}: {verdict}", file=sys.stderr)
                return 1
        tl = result.timeline
        devices = sum(tl.resource_is_device)
        print(f"rank {os.environ['RANK']}: {result.processes} processes ({result.device}, {result.precision}), "
              f"{result.measured_s:.4f} s an iteration "
              f"(median), measured timeline of {len(tl)} actions on {devices} devices, {verdict}")
        return 0
    except PipeplanError as e:
        print(f"pipeplan: error: {one_line(str(e))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
