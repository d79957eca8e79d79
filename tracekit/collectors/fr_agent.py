"""Flight Recorder inside a rank: dump this rank's ring buffer into the run folder when asked.

Used by the profile agent (``tracekit profile --fr``) and by the collectors' workloads. Flight
Recorder itself is switched on by the environment before the process group exists
(``TORCH_FR_BUFFER_SIZE`` = entries kept per rank; the runner sets it); this module only dumps.

:class:`FrDumper` writes ``<dir>/fr-rank<r>.json`` once, on the first of:

- a request: a file ``<dir>/fr-dump-request`` appears (the runner writes it when the job runs past
  its ``--timeout``). A thread polls for it, so a rank whose main thread is blocked inside a
  collective (or asleep) dumps all the same;
- :meth:`FrDumper.dump` called by the agent at process exit (atexit, an exception that ends the
  job, SIGTERM).

The dump is torch's pickle form (``_dump_fr_trace(includeCollectives=True, includeStackTraces=True)``:
the JSON form has no stacks), loaded here (this process's own bytes) and written as JSON with one
more key, ``tracekit``: {rank, world_size, groups: {pg_name: {desc, ranks}} (the global ranks of
every process group this rank knew: torch's own pg_config is empty on gloo; the watcher thread
notes the groups every second, so a dump after destroy_process_group still has them),
dumped_at_ns (wall clock), reason}. tracekit.ingest.flight_recorder reads it. Nothing here raises into the job.
"""

from __future__ import annotations

import json
import os
import threading
import time

REQUEST_FILE = "fr-dump-request"


def dump_name(rank: int) -> str:
    """The file a rank's dump is written to, in the run folder."""
    return f"fr-rank{rank}.json"


def groups_of_this_rank() -> dict:
    """pg_name → {desc, ranks} for every process group torch.distributed knows in this process."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    out = {}
    for pg, name in list(c10d._world.pg_names.items()):
        try:
            ranks = dist.get_process_group_ranks(pg)
        except Exception:  # noqa: BLE001 - a group this rank is not in
            continue
        out[str(name)] = {"desc": getattr(pg, "group_desc", None), "ranks": [int(r) for r in ranks]}
    return out


def snapshot(rank: int, world_size: int, reason: str, known_groups: dict | None = None) -> dict:
    """This rank's Flight Recorder dump as a dict, with the ``tracekit`` key (module doc).
    ``known_groups``: groups seen earlier (a dump at exit comes after destroy_process_group, which
    forgets them all); the ones torch still knows are added."""
    import pickle

    from torch._C._distributed_c10d import _dump_fr_trace

    dump = pickle.loads(_dump_fr_trace(True, True))
    groups = dict(known_groups or {})
    try:
        groups.update(groups_of_this_rank())
    except Exception:  # noqa: BLE001
        pass
    dump["tracekit"] = {"rank": rank, "world_size": world_size, "groups": groups,
                        "dumped_at_ns": time.time_ns(), "reason": reason}
    return dump


class FrDumper:
    """Dumps this rank's Flight Recorder buffer once into ``out_dir`` (module doc)."""

    def __init__(self, out_dir: str, rank: int, world_size: int, poll_s: float = 0.2):
        self.out_dir, self.rank, self.world_size = out_dir, int(rank), int(world_size)
        self.path = os.path.join(out_dir, dump_name(self.rank))
        self.done = False
        self.error: str | None = None
        self._lock = threading.Lock()
        self.groups: dict = {}
        self._refresh_groups()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(poll_s,), name="tracekit-fr-watch", daemon=True)
        self._thread.start()

    def _refresh_groups(self) -> None:
        """Remember the process groups torch knows now (groups created later are seen by the watcher)."""
        try:
            self.groups.update(groups_of_this_rank())
        except Exception:  # noqa: BLE001
            pass

    def _watch(self, poll_s: float) -> None:
        req = os.path.join(self.out_dir, REQUEST_FILE)
        n = 0
        while not self._stop.wait(poll_s):
            n += 1
            if n % 5 == 0:
                self._refresh_groups()
            if os.path.exists(req):
                try:
                    with open(req) as fh:
                        reason = fh.read().strip() or "request"
                except OSError:
                    reason = "request"
                self.dump(reason)
                return

    def dump(self, reason: str) -> bool:
        """Write the dump (the first call only); True when this call wrote it."""
        with self._lock:
            if self.done:
                return False
            self.done = True
            self._stop.set()
            try:
                data = json.dumps(snapshot(self.rank, self.world_size, reason, self.groups), default=str)
                tmp = self.path + f".tmp{os.getpid()}"
                with open(tmp, "w") as fh:
                    fh.write(data)
                os.replace(tmp, self.path)
                return True
            except Exception as exc:  # noqa: BLE001 - never break the job
                self.error = f"Flight Recorder dump failed: {type(exc).__name__}: {exc}"
                return False
