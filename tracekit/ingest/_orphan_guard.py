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
