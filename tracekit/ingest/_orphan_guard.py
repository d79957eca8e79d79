"""No process of an ingest outlives the command: the local pool's processes die with it.

The local engine's pool (tracekit.ingest.engine.LocalEngine) is a ``forkserver`` pool: the command
starts a fork server, which forks the workers. When the command is killed (kill -9, SIGTERM with
no handler, a crash), nothing tells either of them, and a worker waiting for its next task would
wait forever, holding the caller's pipes open. Two guards, both in this module:

* **the fork server** dies with the command: it imports this module first (multiprocessing's
  forkserver *preload*), with :data:`PARENT_ENV` set to the command's pid, and the import asks
  Linux for ``SIGKILL`` when its parent dies (``prctl(PR_SET_PDEATHSIG)``, through ctypes; the
  parent is the thread that started it, :func:`start_forkserver`);
* **each worker** (:func:`guard_worker`, the pool's initializer) dies with the fork server (the
  same prctl: the fork server is its parent) and, in case the fork server was started without the
  guard, with the command itself: a daemon thread waits on a pidfd of the command's pid
  (``os.pidfd_open``, Linux 5.3+) or, without one, checks every :data:`POLL_S` s that the pid
  still exists, and kills the worker when it ends.

The workers stay in the command's process group and session, so Ctrl-C at a terminal reaches
them as it reaches the command. Outside Linux only the watchdog thread applies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_ENV = "TRACEKIT_FORKSERVER_PARENT"
POLL_S = 0.5


def die_with_parent(expected_parent: int | None = None) -> bool:
    """Ask Linux to SIGKILL this process when its parent (thread) ends; True when set. With
    ``expected_parent``, exit at once if the parent is already another process (it died before
    the request was made)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)
    return True


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def watch_pid(pid: int) -> threading.Thread:
    """A daemon thread that kills this process when process ``pid`` ends."""
    def wait_pidfd(fd: int) -> None:
        import select

        p = select.poll()
        p.register(fd, select.POLLIN)
        while not p.poll():  # readable once the process has ended
            pass
        _kill_self()

    def poll_pid() -> None:
        import time

        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                _kill_self()
            except PermissionError:  # alive, owned by another user (pid reused): stop here
                _kill_self()
            time.sleep(POLL_S)

    target, args = poll_pid, ()
    if hasattr(os, "pidfd_open"):
        try:
            target, args = wait_pidfd, (os.pidfd_open(pid),)
        except OSError:  # an older kernel, or the process has already ended
            pass
    t = threading.Thread(target=target, args=args, name="tracekit-parent-watch", daemon=True)
    t.start()
    return t


def guard_worker(command_pid: int) -> None:
    """The pool's initializer: this worker dies with its fork server and with the command."""
    die_with_parent()
    try:
        os.kill(command_pid, 0)
    except ProcessLookupError:
        os._exit(1)
    watch_pid(command_pid)


def start_forkserver(ctx) -> None:
    """Start ``ctx``'s fork server (a multiprocessing forkserver context) from this thread with
    this module as its preload, so that it dies with this process (see the module docstring).
    A fork server already running is kept as it is (its workers still watch this process)."""
    from multiprocessing import forkserver

    ctx.set_forkserver_preload([__name__])
    old = os.environ.get(PARENT_ENV)
    os.environ[PARENT_ENV] = str(os.getpid())
    try:
        forkserver.ensure_running()
    finally:
        if old is None:
            os.environ.pop(PARENT_ENV, None)
        else:
            os.environ[PARENT_ENV] = old


if os.environ.get(PARENT_ENV) and os.environ.get(PARENT_ENV) == str(os.getppid()):
    # imported as a fork server's preload, its parent the command that started it
    die_with_parent(int(os.environ[PARENT_ENV]))


# -- a local Ray instance's processes -----------------------------------------------------------
# Ray starts its own processes (GCS server, raylet, dashboard and runtime-env agents) for an
# instance ``ray.init()`` starts; ``ray.shutdown()`` stops them, but a command killed with -9 never
# calls it, and some of them (the agents) outlive it. A reaper process, started once the instance
# is up, notes them while the command runs and kills those still alive once it has ended.

def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks since boot) of a live process from /proc; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            rest = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (None if rest[0] == b"Z" else (int(rest[1]), int(rest[19])))


def _children(pids: set[int]) -> list[int]:
    """Every live descendant of ``pids`` (a walk of /proc)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(int(d))) is not None:
            kids.setdefault(st[0], []).append(int(d))
    out, todo = [], list(pids)
    while todo:
        for c in kids.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def ray_processes() -> list[tuple[int, int]]:
    """(pid, start time) of this process's descendants (from /proc; empty elsewhere): after
    ``ray.init()`` started a local instance, its processes."""
    if not os.path.isdir("/proc"):
        return []
    return [(pid, st[1]) for pid in _children({os.getpid()}) if (st := _stat(pid)) is not None]


REAP_TAG_ENV = "TRACEKIT_REAP_TAG"
"""Set in the environment while ``ray.init()`` starts an instance (:func:`reap_tag`): each process
the instance starts inherits it, so the reaper finds one that was orphaned before it was noted."""


def _tagged(tag: str) -> list[int]:
    """Live processes whose initial environment holds ``REAP_TAG_ENV=tag`` (from /proc)."""
    want = f"{REAP_TAG_ENV}={tag}".encode()
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as fh:
                    if want in fh.read().split(b"\0"):
                        out.append(int(d))
            except OSError:
                continue
    return out


@contextlib.contextmanager
def reap_tag(reaper):
    """Within the block, the processes started inherit the reaper's tag (:data:`REAP_TAG_ENV`); the
    environment is restored after it, so later children of the caller are not the reaper's."""
    if reaper is None:
        yield
        return
    old = os.environ.get(REAP_TAG_ENV)
    os.environ[REAP_TAG_ENV] = reaper.tag
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(REAP_TAG_ENV, None)
        else:
            os.environ[REAP_TAG_ENV] = old


def start_reaper(victims: list[tuple[int, int]]):
    """A detached process that kills ``victims`` (pid, start time) once this process has ended;
    returns its Popen (kill it after a clean ``ray.shutdown()``). Started before ``ray.init()``,
    with no victim, it notes the instance's processes as they start. Its own session, no stdio: it
    holds none of the caller's pipes."""
    import json
    import subprocess
    import uuid

    tag = f"{os.getpid()}-{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from tracekit.ingest._orphan_guard import _reap; _reap()",
         str(os.getpid()), json.dumps(victims), tag],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        close_fds=True)
    proc.tag = tag
    return proc


def _reap() -> None:
    """The reaper's body (:func:`start_reaper`): while the command runs, note every process
    descended from it or from a victim (every :data:`POLL_S` s: Ray starts some after ``init``
    returns); once it has ended, SIGKILL each noted process whose pid still names the same process
    (same start time), and any process holding the reaper's tag (:func:`reap_tag`: one orphaned
    before it was noted), and again any they started meanwhile, until none is left (20 rounds at most)."""
    import json
    import time

    command, victims = int(sys.argv[1]), json.loads(sys.argv[2])
    tag = sys.argv[3] if len(sys.argv) > 3 else None
    me = os.getpid()
    known = {pid: started for pid, started in victims}
    while _stat(command) is not None:
        for pid in _children({command} | set(known)):
            if pid != me and pid not in known and (st := _stat(pid)) is not None:
                known[pid] = st[1]
        time.sleep(POLL_S)
    for _ in range(20):  # a noted process may start another before it is killed: note and kill again
        for pid in _children(set(known)) + (_tagged(tag) if tag else []):
            if pid != me and pid not in known and (st := _stat(pid)) is not None:
                known[pid] = st[1]
        alive = [pid for pid, started in known.items() if (st := _stat(pid)) is not None and st[1] == started]
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(POLL_S)
