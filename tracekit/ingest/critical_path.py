"""One rank's critical-path tables, at ingest, from the events file its link pass wrote.

The critical path (tracekit/analyses/critical_path.py documents the graph, the walk and every
column) is walked per window (profiler step; the whole trace without steps) over the window's nodes:
the events that do or wait for work. Every edge of the graph but one joins two nodes of one rank;
the collective edge joins a collective span to its instance's last arrival on another rank. So:

* a run of one rank has no collective edge (an instance's only call is its own last arrival): its
  paths are final here, and the rank writes them (``rank_critical_path``,
  ``rank_critical_path_summary``);
* a rank of a run of several ranks writes its nodes instead (``critical_path_nodes``: what the walk
  needs of each, with the name and class its path rows show), and the analysis walks every rank's
  nodes of a window at once with the collective edges, reading no events.

Every rank writes ``rank_steps``: per step its events and its own span (first start, last end of
its timed events, any class), which critical_path_summary.window_ns is.

The events are read back column by column, a row group at a time (no events row is held); the
nodes are kept as numpy arrays (~50 B each) until the windows are walked one by one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracekit.store import (CRITICAL_PATH_NODES_SCHEMA, RANK_CRITICAL_PATH_SCHEMA, RANK_CRITICAL_PATH_SUMMARY_SCHEMA,
                            RANK_STEPS_SCHEMA)
from tracekit.timeline import critical_path as cp

_COLUMNS = ["event_id", "track_kind", "device", "track", "category", "class", "ts_ns", "dur_ns",
            "launch_event_id", "step"]
_STRINGS = ["track_kind", "category", "class"]


def _ints(col) -> tuple[np.ndarray, np.ndarray]:
    """(values with 0 for nulls, validity) of an int64 Arrow array."""
    if col.null_count:
        return pc.fill_null(col, 0).to_numpy(), col.is_valid().to_numpy(zero_copy_only=False)
    return col.to_numpy(), np.ones(len(col), bool)


def _codes(col, table: dict, default: int) -> np.ndarray:
    """Per row of a dictionary-encoded string column: ``table[value]`` (``default`` for other
    values and nulls), int64."""
    lut = np.array([table.get(v, default) for v in col.dictionary.to_pylist()] + [default], np.int64)
    idx = col.indices
    i = pc.fill_null(idx, len(col.dictionary)).to_numpy(zero_copy_only=False) if idx.null_count else \
        idx.to_numpy(zero_copy_only=False)
    return lut[i]


def _distinct_rows(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of equal-length int64 columns ``cols``: (a row index of each, in the rows'
    lexicographic order; per row, the number of its distinct row in that order). One ``lexsort``,
    where ``np.unique(..., axis=0)`` would sort the rows as byte strings."""
    order = np.lexsort(cols[::-1])
    new = np.ones(len(order), bool)
    if len(order) > 1:
        new[1:] = False
        for c in cols:
            s = c[order]
            new[1:] |= s[1:] != s[:-1]
    inv = np.empty(len(order), np.int64)
    inv[order] = np.cumsum(new) - 1
    return order[new], inv


class _Nodes:
    """The rank's nodes (numpy columns: ~50 B a node) and its steps' counts and spans. A node's track is kept as the number of its (kind, device, track) among the distinct
    ones seen (``tracks``), renumbered in their order at the end."""

    _DTYPES = {"rid": np.int64, "event_id": np.int64, "gpu": bool, "track": np.int32, "ts_ns": np.int64,
               "end_ns": np.int64, "class": np.int8, "launch": np.int64, "step": np.int64, "step_ok": bool}

    def __init__(self, capacity: int):
        # one array per column for every row of the file (np.empty: memory is taken only as the
        # nodes fill it), so no part is copied again and no freed batch leaves holes between them
        self.cols = {k: np.empty(capacity, t) for k, t in self._DTYPES.items()}
        self.n = 0
        self.tracks: dict = {}  # (kind, device is null, device, track is null, track) → its number
        self.steps: dict = {}  # step (None: outside every step) → [events, first start, last end]

    def add(self, b: pa.RecordBatch, row0: int) -> None:
        ts, ts_ok = _ints(b.column("ts_ns"))
        dur, dur_ok = _ints(b.column("dur_ns"))
        step, step_ok = _ints(b.column("step"))
        timed = ts_ok & dur_ok & (dur >= 0)
        end = ts + dur
        self._count(step, step_ok, timed, ts, end)
        kind_col = b.column("track_kind")
        cat = _codes(b.column("category"), {"gpu_user_annotation": 1, "runtime": 2}, 0)
        cls = _codes(b.column("class"), {c: i + 1 for i, c in enumerate(cp.CLASSES)}, 0)
        gpu = _codes(kind_col, {"gpu_stream": 1}, 0).astype(bool)
        work = np.isin(cls, [cp.CLASSES.index(c) + 1 for c in ("compute", "comm", "sync")])
        node = timed & ((gpu & (cat != 1)) | (cat == 2) | work)
        if not node.any():
            return
        sel = np.flatnonzero(node)
        kinds = kind_col.dictionary.to_pylist() + [None]  # a null kind: the last entry
        idx = kind_col.indices
        kind = (pc.fill_null(idx, len(kinds) - 1) if idx.null_count else idx).to_numpy(zero_copy_only=False)[sel]
        dev, dev_ok = _ints(b.column("device"))
        trk, trk_ok = _ints(b.column("track"))
        key = [kind.astype(np.int64), (~dev_ok[sel]).astype(np.int64), dev[sel], (~trk_ok[sel]).astype(np.int64),
               trk[sel]]
        first, inv = _distinct_rows(key)
        num = np.array([self.tracks.setdefault((kinds[k], bool(dn), d, bool(tn), t), len(self.tracks))
                        for k, dn, d, tn, t in zip(*(c[first].tolist() for c in key))], np.int32)
        launch, launched = _ints(b.column("launch_event_id"))
        got = {"rid": sel + row0, "event_id": b.column("event_id").to_numpy()[sel], "gpu": gpu[sel],
               "track": num[inv.reshape(-1)], "ts_ns": ts[sel], "end_ns": end[sel], "class": cls[sel],
               "launch": np.where(launched[sel], launch[sel], -1), "step": step[sel], "step_ok": step_ok[sel]}
        a, z = self.n, self.n + len(sel)
        for k, v in got.items():
            self.cols[k][a:z] = v
        self.n = z

    def _count(self, step, step_ok, timed, ts, end) -> None:
        """Per step of the batch (None for the rows of no step): events, and first start and last
        end of the timed ones, merged into self.steps."""
        big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
        for ok in (True, False):
            m = np.flatnonzero(step_ok == ok)
            if not len(m):
                continue
            key = step[m] if ok else np.zeros(len(m), np.int64)
            o = m[np.argsort(key, kind="stable")]
            k = step[o] if ok else np.zeros(len(o), np.int64)
            first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
            n = np.diff(np.r_[first, len(o)])
            lo = np.minimum.reduceat(np.where(timed[o], ts[o], big), first)
            hi = np.maximum.reduceat(np.where(timed[o], end[o], small), first)
            for kk, c, a, z in zip(k[first].tolist(), n.tolist(), lo.tolist(), hi.tolist()):
                s = self.steps.setdefault(kk if ok else None, [0, None, None])
                s[0] += c
                if a <= z:
                    s[1] = a if s[1] is None else min(s[1], a)
                    s[2] = z if s[2] is None else max(s[2], z)

    def columns(self) -> dict:
        """Every node's columns (module docstring of tracekit.timeline.critical_path, but the
        arrivals and ``rank``), with ``rid`` (its row in the events file), ``step`` and ``step_ok``."""
        # the tracks in (kind, device, track) order, NULLs last; a kind sorts by its position among
        # the rank's kinds (sorted as DuckDB sorts VARCHAR), a null kind last
        names = sorted({k[0] for k in self.tracks if k[0] is not None})
        pos = {k: i for i, k in enumerate(names)}
        order = sorted(self.tracks, key=lambda k: (pos.get(k[0], len(names)), k[1], k[2], k[3], k[4]))
        tid = np.zeros(len(order), np.int64)
        for i, k in enumerate(order):
            tid[self.tracks[k]] = i + 1
        out = {k: v[:self.n] for k, v in self.cols.items()}
        self.cols = {}
        out["tid"] = tid.astype(np.int32)[out.pop("track")]
        return out


def _batches(events_file: Path, columns: list[str], strings: list[str]):
    """The events file's ``columns`` (``strings`` dictionary-encoded), a row group at a time as
    record batches, in file order (a row group's worth of memory: reading the file's batches
    through one reader holds several row groups' buffers)."""
    f = pq.ParquetFile(str(events_file), read_dictionary=strings)
    for i in range(f.metadata.num_row_groups):
        yield from f.read_row_group(i, columns=columns, use_threads=False).to_batches()


def _read(events_file: Path) -> _Nodes:
    nodes = _Nodes(pq.read_metadata(str(events_file)).num_rows)
    row0 = 0
    for b in _batches(events_file, _COLUMNS, _STRINGS):
        nodes.add(b, row0)
        row0 += b.num_rows
    return nodes


def _take(events_file: Path, rid: np.ndarray, columns: list[str]) -> pa.Table:
    """The ``columns`` (strings) of the events file's rows ``rid`` (ascending, distinct), in that
    order; only the row groups holding one of them are read."""
    f = pq.ParquetFile(str(events_file), read_dictionary=columns)
    out, row0 = [], 0
    for i in range(f.metadata.num_row_groups):
        n = f.metadata.row_group(i).num_rows
        lo, hi = np.searchsorted(rid, [row0, row0 + n])
        if hi > lo:
            t = f.read_row_group(i, columns=columns, use_threads=False)
            out.append(t.take(pa.array(rid[lo:hi] - row0)))
        row0 += n
    if not out:
        return pa.table({c: pa.array([], pa.string()) for c in columns})
    return pa.table({c: pa.concat_arrays([x.column(c).combine_chunks().cast(pa.string()) for x in out]) for c in columns})


ROWS_PER_PART = 1 << 18
"""Rows of rank_critical_path or critical_path_nodes built and handed to ``write`` at once (the
tables of a long trace are written in parts, not held whole)."""


def rank_tables(events_file: Path, run_id: str, rank: int, final: bool, write) -> dict[str, pa.Table]:
    """The critical-path tables of one rank whose events file is ``events_file``, each of its store
    schema (tracekit.store). ``write(name, tables)`` receives the two that can be long as an
    iterator of tables (about ROWS_PER_PART rows each, whole windows; none for an empty table): with
    ``final`` (a run of one rank whose calls cannot meet in one instance: no collective edge)
    ``rank_critical_path``, its final paths in (step, pos) order, else
    ``critical_path_nodes``, the walk's input. Returns the others: ``rank_steps``, and
    ``rank_critical_path_summary`` (empty unless ``final``). Memory: ~50 B per node, one window's
    walk and one part of rows. Errors of the file propagate."""
    nodes = _read(events_file)
    steps = nodes.steps
    has_steps = any(k is not None for k in steps)
    keys = sorted(steps, key=lambda k: (k is not None, k if k is not None else 0))
    out = {"rank_steps": pa.table({
        "run_id": pa.array([run_id] * len(keys), pa.string()), "rank": pa.array([rank] * len(keys), pa.int32()),
        "step": pa.array(keys, pa.int64()), "events": pa.array([steps[k][0] for k in keys], pa.int64()),
        "first_ns": pa.array([steps[k][1] for k in keys], pa.int64()),
        "last_ns": pa.array([steps[k][2] for k in keys], pa.int64())}, schema=RANK_STEPS_SCHEMA)}
    c = nodes.columns()
    del nodes
    if not final:
        write("critical_path_nodes", _node_parts(events_file, run_id, rank, c))
        out["rank_critical_path_summary"] = RANK_CRITICAL_PATH_SUMMARY_SCHEMA.empty_table()
        return out
    windows = _windows(c) if has_steps else [(None, np.arange(len(c["rid"])))] if len(c["rid"]) else []
    sums: list = []
    write("rank_critical_path", _path_parts(events_file, run_id, rank, c, windows, sums))
    out["rank_critical_path_summary"] = _summary(run_id, rank, sums)
    return out


def _windows(c: dict) -> list[tuple]:
    """(step, the rows of ``c`` with that step) of every step holding nodes, in step order (the
    nodes of no step belong to no window); the rows as int32 positions where they fit."""
    key = c["step"].copy()
    key[~c["step_ok"]] = np.iinfo(np.int64).max  # last, then left out
    order = np.argsort(key, kind="stable")
    key = key[order]
    inside = int(np.searchsorted(key, np.iinfo(np.int64).max))
    if len(order) < 2**31:
        order = order.astype(np.int32)
    key, order = key[:inside], order[:inside]
    cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
    firsts = key[np.r_[0, cuts]].tolist() if inside else []
    del key
    return [(s, order[a:b]) for s, a, b in zip(firsts, np.r_[0, cuts], np.r_[cuts, inside])]


def _node_parts(events_file: Path, run_id: str, rank: int, c: dict):
    """critical_path_nodes of the rank's nodes ``c`` (in file order), ROWS_PER_PART rows at a time."""
    for a in range(0, len(c["rid"]), ROWS_PER_PART):
        sl = slice(a, a + ROWS_PER_PART)
        n = len(c["rid"][sl])
        named = _take(events_file, c["rid"][sl], ["name", "class"])
        yield pa.table({
            "run_id": pa.repeat(pa.scalar(run_id, pa.string()), n), "rank": pa.array(np.full(n, rank), pa.int32()),
            "step": pa.array(c["step"][sl], pa.int64(), mask=~c["step_ok"][sl]),
            "event_id": pa.array(c["event_id"][sl], pa.int64()), "gpu": pa.array(c["gpu"][sl]),
            "tid": pa.array(c["tid"][sl].astype(np.int64), pa.int64()), "ts_ns": pa.array(c["ts_ns"][sl], pa.int64()),
            "end_ns": pa.array(c["end_ns"][sl], pa.int64()),
            "launch_event_id": pa.array(c["launch"][sl], pa.int64(), mask=c["launch"][sl] < 0),
            "name": named.column("name"), "class": named.column("class")}, schema=CRITICAL_PATH_NODES_SCHEMA)


def _path_parts(events_file: Path, run_id: str, rank: int, c: dict, windows: list, sums: list):
    """rank_critical_path of the rank's windows (step or None, the rows of ``c`` in it), in (step,
    pos) order, in parts of about ROWS_PER_PART rows; each window's path summary is appended to
    ``sums`` (step, tracekit.timeline.critical_path.paths' per-path arrays)."""
    held, n = [], 0
    for step, sel in windows:
        m = len(sel)
        launch = c["launch"][sel]
        w, at = cp.window({**{k: c[k][sel] for k in ("event_id", "gpu", "tid", "ts_ns", "end_ns", "class")},
                           "launch": launch, "launched": launch >= 0, "rank": np.full(m, rank, np.int64), "arrived": np.zeros(m, bool),
                           "last_rank": np.full(m, -1, np.int64), "last_eid": np.full(m, -1, np.int64),
                           "last_ns": np.zeros(m, np.int64)})
        p = cp.paths(w)
        node = p["node"]
        held.append((step, {"pos": p["pos"].astype(np.int32), "event_id": w.eid[node], "start_ns": w.s[node],
                            "end_ns": w.e[node], "on_path": p["on_path"], "gap": p["gap"],
                            "edge": p["edge"].astype(np.int8), "rid": c["rid"][sel][at][node]}))
        sums.append((step, {k: p[k] for k in ("start_ns", "end_ns", "parts", "lengths", "other_ranks")}))
        n += len(node)
        del w, at, p
        if n >= ROWS_PER_PART:
            yield _rows_table(events_file, run_id, rank, held)
            held, n = [], 0
    if held:
        yield _rows_table(events_file, run_id, rank, held)


def _rows_table(events_file: Path, run_id: str, rank: int, held: list) -> pa.Table:
    """rank_critical_path rows of windows' paths (``held``: step, per path row arrays), in order."""
    def cat(key):
        return np.concatenate([h[key] for _, h in held])

    rid = cat("rid")
    have = cp._distinct(rid)
    named = _take(events_file, have, ["name", "class"])
    at = pa.array(np.searchsorted(have, rid))
    n = len(rid)
    step = np.concatenate([np.full(len(h["pos"]), 0 if s is None else s, np.int64) for s, h in held])
    no_step = np.concatenate([np.full(len(h["pos"]), s is None) for s, h in held])
    return pa.table({
        "run_id": pa.repeat(pa.scalar(run_id, pa.string()), n), "rank": pa.array(np.full(n, rank), pa.int32()),
        "step": pa.array(step, pa.int64(), mask=no_step), "pos": pa.array(cat("pos"), pa.int32()),
        "event_rank": pa.array(np.full(n, rank), pa.int32()), "event_id": pa.array(cat("event_id"), pa.int64()),
        "name": named.column("name").take(at), "class": named.column("class").take(at),
        "start_ns": pa.array(cat("start_ns"), pa.int64()), "end_ns": pa.array(cat("end_ns"), pa.int64()),
        "on_path_ns": pa.array(cat("on_path"), pa.int64()), "gap_ns": pa.array(cat("gap"), pa.int64()),
        "edge": pa.DictionaryArray.from_arrays(pa.array(cat("edge")), pa.array(cp.KINDS)).cast(pa.string())},
        schema=RANK_CRITICAL_PATH_SCHEMA)


def _summary(run_id: str, rank: int, sums: list) -> pa.Table:
    """rank_critical_path_summary of the windows' paths (``sums``: step, per path arrays)."""
    if not sums:
        return RANK_CRITICAL_PATH_SUMMARY_SCHEMA.empty_table()

    def cat(key):
        return np.concatenate([p[key] for _, p in sums])

    k = sum(len(p["lengths"]) for _, p in sums)
    step = np.concatenate([np.full(len(p["lengths"]), 0 if s is None else s, np.int64) for s, p in sums])
    no_step = np.concatenate([np.full(len(p["lengths"]), s is None) for s, p in sums])
    parts = cat("parts")
    return pa.table({
        "run_id": pa.repeat(pa.scalar(run_id, pa.string()), k), "rank": pa.array(np.full(k, rank), pa.int32()),
        "step": pa.array(step, pa.int64(), mask=no_step),
        "start_ns": pa.array(cat("start_ns"), pa.int64()), "end_ns": pa.array(cat("end_ns"), pa.int64()),
        **{p: pa.array(parts[:, i], pa.int64()) for i, p in enumerate(cp.PARTS)},
        "path_events": pa.array(cat("lengths"), pa.int64()), "other_ranks": pa.array(cat("other_ranks"), pa.int32())},
        schema=RANK_CRITICAL_PATH_SUMMARY_SCHEMA)
