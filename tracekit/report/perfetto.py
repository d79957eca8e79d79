"""Merged multi-rank trace export in the Chrome trace-event JSON format (Perfetto UI, chrome://tracing).

:func:`export_perfetto` writes one JSON object ``{"traceEvents": [...], ...}`` for a run:

- one *process* per rank (``pid`` = rank, named ``rank N`` by ``process_name`` metadata events),
  one *thread* (track) per CPU thread and per GPU stream, named by ``thread_name`` metadata;
- every event as a complete slice (``ph: "X"``) on the run's common clock. Timestamps are
  microseconds with exactly the nanosecond precision of the store (at most 3 decimals):
  times are shifted by the run's origin (``otherData.time_origin_ns``, a whole microsecond) so
  that a double holds them exactly;
- every collective carries its instance id (``pg:seq``; ``pg:seq@wN`` in profiler window N > 0),
  op, bytes, wait, sync time and verdict in ``args``; flow arrows (``ph: "s"`` → ``ph: "f"``,
  binding to the enclosing slice) chain the instance's ranks in the order their slices start (the order of arrival when a call starts with
  its span, so the last arrow then ends at the straggler).

The run's critical paths (analyses/critical_path.py) come as one more process, ``critical path``
(pid = the highest rank + 1, sorted first), one thread per rank whose steps' paths it draws
(``rank N's path``; a step's path that starts, on another rank, before the rank's previous one
ended goes to an overflow thread): a slice per piece of the path (``cat`` ``critical_path``): the part of an
event on the path, named as the event, or a gap (``idle`` / ``host code``), with ``args`` part
(critical_path_summary's column without ``_ns``), event_rank (the rank the event ran on),
path_rank, step. The pieces of a path
tile it, so they never overlap on their track.

Slices on one track never partially overlap: the trace-event format lets ``X`` events on one
thread nest, not cross. Events are laid out per track with :func:`nest_lanes`; one that would cross
an earlier slice moves to an overflow track (``… (overflow 1)``) under the same thread's name, so
nothing is cut or lost. The store has already clipped overlapping GPU kernels on a stream at
ingest (``events.clipped``); that shows in the slice's ``args.clipped_ns``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from tracekit.store import Store

FLOW_CATEGORY = "collective"


@dataclass
class ExportStats:
    """What :func:`export_perfetto` wrote: counts for the CLI's summary line."""

    run_id: str
    path: str
    processes: int = 0
    tracks: int = 0
    slices: int = 0
    overflow_slices: int = 0
    collectives: int = 0
    instances_linked: int = 0
    flows: int = 0
    path_slices: int = 0
    time_origin_ns: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def nest_lanes(starts: Sequence[int], ends: Sequence[int]) -> list[int]:
    """Lane per interval so that the intervals of one lane nest properly (never partially overlap).

    starts, ends: ns (end >= start), in any order. Lane 0 is the track itself; lanes 1, 2, …
    are overflow tracks for intervals that cross one already placed. Intervals are taken by
    (start, longest first); each goes to the first lane where it either starts after everything
    open there has ended or lies entirely inside the innermost open interval.
    Returns a list parallel to the input.
    """
    order = sorted(range(len(starts)), key=lambda i: (starts[i], -(ends[i] - starts[i]), i))
    stacks: list[list[int]] = []  # per lane, the ends of the open (enclosing) intervals
    lanes = [0] * len(starts)
    for i in order:
        s, e = starts[i], ends[i]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                lanes[i] = lane
                break
        else:
            stacks.append([e])
            lanes[i] = len(stacks) - 1
    return lanes


def _us(ns: int) -> float:
    """ns (an int, already shifted to the origin) → µs; the double's repr has at most 3 decimals."""
    return ns / 1000


def _track_label(kind: str, device, track) -> str:
    if kind == "gpu_stream":
        return f"GPU {device} · stream {track}"
    if kind == "cpu_thread":
        return f"CPU thread {track}"
    return f"{kind} {device}/{track}"


def _collective_args(con, run_id: str) -> dict[tuple[int, int], dict]:
    """(rank, event_id) → the args of that rank's collective call."""
    cur = con.execute(
        """
        SELECT c.rank, c.event_id, c.pg_name, ic.win, c.seq, c.op, c.dtype, c.size_bytes, c.wire_bytes, c.group_size,
               c.peer, c.algo, c.approx, w.wait_ns, i.sync_time_ns, i.straggler, i.ranks_seen, i.complete,
               v.verdict, coalesce(v.efficiency, v.efficiency_link) AS efficiency
        FROM collectives c
        LEFT JOIN collective_waits w
               ON w.run_id = c.run_id AND w.rank = c.rank AND w.event_id = c.event_id
              AND w.pg_name = c.pg_name AND w.seq = c.seq
        -- the call's profiler window (an instance is (pg, win, seq)); none for a copy the matching dropped
        LEFT JOIN __instance_calls ic ON ic.run_id = c.run_id AND ic.rank = c.rank AND ic.event_id = c.event_id
        LEFT JOIN collective_instances i ON i.run_id = c.run_id AND i.pg_name = c.pg_name AND i.win = ic.win
              AND i.seq = c.seq
        LEFT JOIN collective_verdicts v ON v.run_id = c.run_id AND v.pg_name = c.pg_name AND v.win = ic.win
              AND v.seq = c.seq
        WHERE c.run_id = ?
        """,
        [run_id],
    )
    cols = [d[0] for d in cur.description]
    out = {}
    for rec in cur.fetchall():
        r = dict(zip(cols, rec))
        if r["op"] is None or r["seq"] is None:
            args = {"collective": "unattributed (no collective metadata)"}
        else:
            args = {
                "instance": _instance_label(r["pg_name"], r["win"], r["seq"]),
                "op": r["op"],
                "size_bytes": r["size_bytes"],
                "wire_bytes": r["wire_bytes"],
                "dtype": r["dtype"],
                "group_size": r["group_size"],
                "wait_us": None if r["wait_ns"] is None else _us(int(r["wait_ns"])),
                "sync_time_us": None if r["sync_time_ns"] is None else round(float(r["sync_time_ns"]) / 1000, 3),
                "verdict": r["verdict"],
                "efficiency": None if r["efficiency"] is None else round(float(r["efficiency"]), 4),
                "straggler": r["straggler"],
                "ranks_seen": r["ranks_seen"],
                "complete": r["complete"],
            }
            if r["peer"] is not None:
                args["peer"] = r["peer"]
            if r["algo"]:
                args["algo"] = r["algo"]
            if r["approx"]:
                args["size_approx"] = True
        out[(int(r["rank"]), int(r["event_id"]))] = args
    return out


def _instances(con, run_id: str) -> list[tuple[str, list[tuple[int, int, int]]]]:
    """Matched instances seen by >= 2 ranks: (:func:`_instance_label`, [(ts_ns, rank, event_id) in arrival
    order])."""
    rows = con.execute(
        """
        SELECT w.pg_name, w.win, w.seq, w.ts_ns, w.rank, w.event_id
        FROM collective_waits w JOIN collective_instances i USING (run_id, pg_name, win, seq)
        WHERE w.run_id = ? AND i.ranks_seen > 1
        ORDER BY w.pg_name, w.win, w.seq, w.ts_ns, w.rank
        """,
        [run_id],
    ).fetchall()
    out: dict[tuple, list] = {}
    for pg, win, seq, ts, rank, eid in rows:
        out.setdefault((pg, win, seq), []).append((int(ts), int(rank), int(eid)))
    return [(_instance_label(pg, win, seq), calls) for (pg, win, seq), calls in out.items()]


def _instance_label(pg, win, seq) -> str:
    """An instance's name in the trace: ``pg:seq``, or ``pg:seq@wN`` in profiler window N > 0 (windows
    concatenated in one file restart seq: instance_rows.sql)."""
    return f"{pg}:{seq}" + (f"@w{win}" if win else "")


def export_perfetto(
    store: Store | str | os.PathLike | None, out_path: str | os.PathLike, run_id: str | None = None,
    critical_path: bool | None = None,
) -> ExportStats:
    """Write run ``run_id`` (default: the newest) as one Chrome/Perfetto JSON file at ``out_path``.

    ``critical_path``: add the critical-path process (True, or None: the default) or not (False).

    The file is written to a temporary name beside ``out_path`` and renamed, so a failure leaves
    no half-written file. Returns :class:`ExportStats`. Raises StoreError for an empty store or an
    unknown run, BadInputError for a run without a timeline (no events: an nccl-tests log);
    OSError when ``out_path`` cannot be written.
    """

    st = store if isinstance(store, Store) else Store(store)
    run_id = st.resolve_run(run_id)
    from tracekit import analyses

    con = analyses.connect(st, run_ids=[run_id])
    try:
        return _write(con, run_id, Path(out_path), critical_path)
    finally:
        con.close()


def _write(con, run_id: str, out: Path, critical_path: bool | None = None) -> ExportStats:
    from tracekit.analyses.critical_path import critical_path_wanted

    stats = ExportStats(run_id=run_id, path=str(out))
    run = con.execute(
        "SELECT workload, backend, world_size, device_name, torch_version, nccl_version FROM runs WHERE run_id = ?",
        [run_id],
    ).fetchone()
    ranks = con.execute(
        "SELECT rank, host, clock_offset_ns FROM ranks WHERE run_id = ? ORDER BY rank", [run_id]
    ).fetchall()
    lo = con.execute("SELECT min(ts_ns) FROM events WHERE run_id = ?", [run_id]).fetchone()[0]
    if lo is None:
        from tracekit.errors import BadInputError

        raise BadInputError(f"run {run_id!r} has no timeline (no events: a benchmark log?): nothing to export")
    origin = 0 if lo is None else (int(lo) // 1000) * 1000
    stats.time_origin_ns = origin
    coll = _collective_args(con, run_id)
    stats.collectives = len(coll)
    where: dict[tuple[int, int], tuple[int, int, int]] = {}  # (rank, event_id) → (pid, tid, start ns)

    from tracekit.errors import FileError
    from tracekit.store import atomic_output

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FileError(out, f"cannot create its folder: {exc.strerror or exc}") from None

    with atomic_output(out) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        first = True

        def emit(ev: dict) -> None:
            nonlocal first
            fh.write("\n" if first else ",\n")
            fh.write(json.dumps(ev, separators=(",", ":"), allow_nan=False))
            first = False

        fh.write('{"traceEvents":[')
        next_tid = 1
        for rank, host, offset in ranks:
            pid = int(rank)
            label = f"rank {rank}" + (f" ({host})" if host else "")
            emit({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
            emit({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
            emit({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0,
                  "args": {"labels": f"clock offset {int(offset or 0) / 1000:g} µs"}})
            stats.processes += 1
            next_tid = _write_rank(con, run_id, pid, origin, coll, where, emit, stats, next_tid)
        pid = max([int(r[0]) for r in ranks], default=-1) + 1
        if critical_path_wanted(critical_path)[0]:
            next_tid = _write_critical_path(con, run_id, pid, origin, emit, stats, next_tid)
        for inst, calls in _instances(con, run_id):
            # chain by the start of each rank's slice (normally the arrival order), so that no
            # arrow points back in time even where a call's start differs from its span's
            placed = sorted(
                (where[(rank, eid)][2], ts, rank, eid) for ts, rank, eid in calls if (rank, eid) in where
            )
            if len(placed) < 2:
                continue
            stats.instances_linked += 1
            for (_, _, ra, ea), (_, _, rb, eb) in zip(placed, placed[1:]):
                stats.flows += 1
                pa_, ta, sa = where[(ra, ea)]
                pb, tb, sb = where[(rb, eb)]
                common = {"name": inst, "cat": FLOW_CATEGORY, "id": stats.flows, "bp": "e"}
                emit({"ph": "s", "pid": pa_, "tid": ta, "ts": _us(sa - origin), **common})
                emit({"ph": "f", "pid": pb, "tid": tb, "ts": _us(sb - origin), **common})
        from tracekit.analyses.hang import hang_marks  # Flight Recorder: where the ranks diverged, if placed

        for mark in hang_marks(con, run_id):
            emit({"ph": "i", "s": "g", "pid": 0, "tid": 0, "ts": _us(mark["ts_ns"] - origin), "name": mark["name"],
                  "cat": "tracekit.hang", "args": mark["args"]})
        other = {
            "run_id": run_id,
            "time_origin_ns": origin,
            "clock": "the run's common clock (ns) minus time_origin_ns, in µs",
            "producer": "tracekit export --perfetto",
        }
        if run is not None:
            for k, v in zip(("workload", "backend", "world_size", "device_name", "torch_version", "nccl_version"), run):
                if v is not None:
                    other[k] = v
        fh.write('\n],"displayTimeUnit":"ns","otherData":')
        fh.write(json.dumps(other, allow_nan=False, default=str))
        fh.write("}\n")
    return stats


def _write_rank(con, run_id, pid, origin, coll, where, emit, stats: ExportStats, next_tid: int) -> int:
    """Emit one rank's tracks and slices; returns the next free tid (tids are unique over the file)."""
    tbl = con.execute(
        """
        SELECT track_kind, device, track, event_id, name, category, class, ts_ns, dur_ns, step,
               coalesce(clipped_ns, 0) AS clipped_ns
        FROM events WHERE run_id = ? AND rank = ?
        ORDER BY track_kind, device, track, ts_ns, dur_ns DESC, event_id
        """,
        [run_id, pid],
    )
    names = [d[0] for d in tbl.description]
    rows = tbl.fetchall()
    cols = {name: [r[c] for r in rows] for c, name in enumerate(names)}
    n = len(rows)
    i = 0
    sort_index = 0
    while i < n:
        key = (cols["track_kind"][i], cols["device"][i], cols["track"][i])
        j = i
        while j < n and (cols["track_kind"][j], cols["device"][j], cols["track"][j]) == key:
            j += 1
        starts = cols["ts_ns"][i:j]
        ends = [s + max(0, d or 0) for s, d in zip(starts, cols["dur_ns"][i:j])]
        lanes = nest_lanes(starts, ends)
        label = _track_label(*key)
        tids = {}
        for lane in sorted(set(lanes)):
            tid = next_tid
            next_tid += 1
            tids[lane] = tid
            name = label if lane == 0 else f"{label} (overflow {lane})"
            emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            emit({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": sort_index}})
            sort_index += 1
            stats.tracks += 1
        for k in range(i, j):
            lane = lanes[k - i]
            tid = tids[lane]
            eid = cols["event_id"][k]
            s = cols["ts_ns"][k]
            args = {"event_id": eid, "class": cols["class"][k]}
            if cols["step"][k] is not None:
                args["step"] = cols["step"][k]
            if cols["clipped_ns"][k]:
                args["clipped_ns"] = cols["clipped_ns"][k]
            c = coll.get((pid, eid))
            if c is not None:
                args.update(c)
                where[(pid, eid)] = (pid, tid, s)
            emit({
                "ph": "X", "pid": pid, "tid": tid, "name": cols["name"][k] or "",
                "cat": cols["category"][k] or "", "ts": _us(s - origin), "dur": _us(ends[k - i] - s), "args": args,
            })
            stats.slices += 1
            if lane:
                stats.overflow_slices += 1
        i = j
    return next_tid


def _write_critical_path(con, run_id, pid, origin, emit, stats: ExportStats, next_tid: int) -> int:
    """Emit the ``critical path`` process (module docstring); returns the next free tid. Nothing
    when the run has no path (no events)."""
    from tracekit.analyses.critical_path import path_segments

    paths = path_segments(con, run_id)
    if not paths:
        return next_tid
    emit({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "critical path"}})
    emit({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}})
    emit({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0,
          "args": {"labels": "per rank and step: the chain of dependencies that ends its last event"}})
    lanes: dict[int, list[list[int]]] = {}  # rank → [[tid, end of its last path]]; overlapping paths get a lane each
    for p in sorted(paths, key=lambda p: (p["rank"], p["start_ns"])):
        rank = p["rank"]
        lane = next((ln for ln in lanes.setdefault(rank, []) if ln[1] <= p["start_ns"]), None)
        if lane is None:
            n = len(lanes[rank])
            lane = [next_tid, 0]
            lanes[rank].append(lane)
            name = f"rank {rank}'s path" + (f" (overflow {n})" if n else "")
            emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": next_tid, "args": {"name": name}})
            emit({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": next_tid,
                  "args": {"sort_index": 1000 * rank + n}})
            next_tid += 1
            stats.tracks += 1
        lane[1] = p["end_ns"]
        for s, e, part, name, ev_rank in p["segments"]:
            args = {"part": part, "event_rank": ev_rank, "path_rank": rank}
            if p["step"] is not None:
                args["step"] = p["step"]
            emit({"ph": "X", "pid": pid, "tid": lane[0], "name": name or "", "cat": "critical_path",
                  "ts": _us(s - origin), "dur": _us(e - s), "args": args})
            stats.path_slices += 1
    return next_tid
