"""replay: each profiler step's execution graph across ranks, replayed, against the measured step — a Python analysis.

Reads: runs, ranks, events, _instance_calls (instance_rows), collective_instances

The graph is the critical path's (analyses/critical_path.py builds every node's candidate
predecessors, one per edge rule; nothing here builds edges of its own): per window (profiler
step; the whole trace of a run without steps) every node of every rank, and as edges the
recorded candidates (stream order, thread order, launch, sync, blocking call, a collective
span's last arrival) plus an inferred one (cross_stream, host) only where it is ready strictly
later than every recorded start edge of its node (as the critical path, which takes an inferred
edge only when nothing recorded explains a later start). One edge rule is the replay's own,
nesting: a CPU node inside another on its thread (a gloo span inside c10d::allreduce_, a
cudaMemcpy inside aten::to) starts after its parent starts, and the parent ends after it ends
(kind 'nest'; the critical path's thread order skips nested events, which its backward walk does
not need, but a replay that delays a parent must delay what runs inside it). Nesting that loops
with the thread order (events with equal times) is left out of that window, with a note. And a
call named *DeviceSynchronize waits for the last op of each of its rank's streams that ended
during it (the critical path keeps only the op that ended last: enough for its walk, not for a
replay where another stream's work grows). Edge anchors: an edge ready at its
predecessor's end or later is tied to that end (+ the difference), one ready earlier (a PDL
stream edge, a launch call that returned after its op started, a last arrival's start) to the
predecessor's start (+ the difference). Each collective span is tied to the instance
(collective_instances: op, size_bytes, group_size) it belongs to. tracekit.model.whatif holds the
replay (list scheduling) and the edits.

replay_steps: one row per (run, rank, step) with nodes: the unchanged graph replayed.

run_id        VARCHAR  run
rank          INTEGER  rank
step          BIGINT   profiler step; NULL for the whole trace of a run without steps
measured_ns   BIGINT   the rank's measured step: last end − first start of its nodes in the step, ns
replayed_ns   BIGINT   the same span of the replayed graph, ns
error         DOUBLE   (replayed − measured) / measured; NULL when measured is 0
nodes         BIGINT   the rank's nodes in the step
edges         BIGINT   edges into the rank's nodes (every rule, cross-rank ones included)
"""

from __future__ import annotations

import re

import numpy as np

from tracekit.analyses import critical_path as cp
from tracekit.model import whatif as wf
from tracekit.timeline import critical_path as tcp

# The critical path's graph of each window, from the events (the stored paths and nodes hold no
# nesting and no names of every node, which the replay needs):

# a run's events, read once (a statement that reads the events view opens every rank's file: ~0.5
# CPU s at 1,024 ranks, whatever it selects), for the nodes and the ranks' window spans; node: the
# events that do or wait for work (module docstring); last_*: a collective span's last arrival
# (_cp_arrivals)
_EVENTS = """
CREATE OR REPLACE TEMP TABLE _cp_events AS
SELECT e.step, e.rank, e.event_id, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns,
       coalesce(e.ts_ns IS NOT NULL AND e.dur_ns >= 0, false) AS timed,
       timed AND coalesce((e.track_kind = 'gpu_stream' AND e.category IS DISTINCT FROM 'gpu_user_annotation')  -- a label, not work
                          OR e.category = 'runtime' OR e.class IN ('compute', 'comm', 'sync'), false) AS node,
       -- what only a node needs (NULL for the other events: a smaller table)
       CASE WHEN node THEN e.name END AS name, CASE WHEN node THEN e.class END AS class,
       CASE WHEN node THEN e.track_kind END AS track_kind, e.device, e.track, e.launch_event_id,
       a.last_rank, a.last_eid, a.last_ns
FROM events e LEFT JOIN _cp_arrivals a ON a.rank = e.rank AND a.event_id = e.event_id
WHERE e.run_id = ?
"""

# the nodes of every window of the run in _cp_events, window by window (in step order, the nodes of
# a window in no order): the profiler steps, or (? true: a run without steps) the whole trace. One
# statement, streamed, not one per window (each would be bound anew: benchmarks/README.md). kind: the position of track_kind among the run's track kinds in order (NULL last),
# so that (kind, device, track) sort as DuckDB sorts them (NULLs last); rid: the row in _cp_events,
# to fetch the names of the path's events only rather than sort every node's
_NODES = """
SELECT step, rank, event_id, rowid AS rid, track_kind = 'gpu_stream' AS gpu,
       coalesce(list_position(?::VARCHAR[], track_kind), ?::INTEGER) AS kind, device IS NULL AS no_device,
       coalesce(device, 0) AS device, track IS NULL AS no_track, coalesce(track, 0) AS track, ts_ns, end_ns,
       coalesce(list_position(?::VARCHAR[], class), 0)::TINYINT AS class, coalesce(launch_event_id, -1) AS launch,
       launch_event_id IS NOT NULL AS launched, last_rank IS NOT NULL AS arrived, coalesce(last_rank, -1) AS last_rank,
       coalesce(last_eid, -1) AS last_eid, coalesce(last_ns, 0) AS last_ns
FROM _cp_events WHERE node AND (step BETWEEN ? AND ? OR step IS NULL AND ?::BOOLEAN)
ORDER BY step
"""


def _windows(con, kinds: list):
    """The windows of the run in _cp_events (its profiler steps, or the whole trace of a run
    without steps), one at a time in step order: (step, Arrow table of its rows of _NODES)."""
    for lo, hi, whole in cp._chunks(con, "_cp_events WHERE node AND", "count(step) FROM _cp_events"):
        yield from cp._chunk_windows(con, [kinds, len(kinds) + 1, list(tcp.CLASSES), lo, hi, whole], whole, _NODES)


def _window(t) -> tuple:
    """(_Window of one window's nodes, from their rows of _NODES (an Arrow table, in no order);
    the rid column of those rows; the position there of each _Window row)."""
    c = {k: t.column(k).to_numpy() for k in t.column_names if k != "step"}
    rid = c["rid"]
    # (rank, track, end, start, event_id) order, the track as (kind, device, track)
    order = np.lexsort(tuple(c[k] for k in ("event_id", "ts_ns", "end_ns", "track", "no_track", "device",
                                            "no_device", "kind", "rank")))
    c = {k: v[order] for k, v in c.items()}
    track_of = np.stack([c[k].astype(np.int64) for k in ("rank", "kind", "no_device", "device", "no_track", "track")])
    new = np.r_[True, np.any(track_of[:, 1:] != track_of[:, :-1], axis=0)] if len(order) else np.zeros(0, bool)
    rows = tcp._Rows(c["rank"], c["event_id"])
    cols = {"rank": c["rank"].astype(np.int64), "event_id": c["event_id"], "gpu": c["gpu"], "tid": np.cumsum(new),
            "ts_ns": c["ts_ns"], "end_ns": c["end_ns"], "class": c["class"], "last_ns": c["last_ns"],
            "launch_row": rows.find(c["rank"], c["launch"], c["launched"]),
            "arrival_row": rows.find(c["last_rank"], c["last_eid"], c["arrived"])}
    return tcp._Window(cols), rid, order

_START_COLS = (0, 1, 2, 3)  # inferred (cross_stream / host), thread, stream, launch
_END_COLS = (4, 5, 6)  # sync, blocking call, collective

_INSTANCES = """
SELECT c.rank, c.event_id, i.pg_name, i.win, i.seq, i.op, i.size_bytes, i.group_size
FROM _instance_calls c JOIN collective_instances i
  ON i.run_id = c.run_id AND i.pg_name = c.pg_name AND i.win = c.win AND i.seq = c.seq
WHERE c.run_id = ? AND NOT i.mismatched
"""

COLS = {"run_id": "VARCHAR", "rank": "INTEGER", "step": "BIGINT", "measured_ns": "BIGINT", "replayed_ns": "BIGINT",
        "error": "DOUBLE", "nodes": "BIGINT", "edges": "BIGINT"}


def _tracks(rows, order) -> np.ndarray:
    """Per _Window row a track number (rank, track kind, device, track), from the window's rows of
    _NODES and the _Window's order of them."""
    cols = [rows.column(k).to_numpy(zero_copy_only=False)[order].astype(np.int64)
            for k in ("rank", "kind", "no_device", "device", "no_track", "track")]
    if not len(order):
        return np.zeros(0, np.int64)
    return np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _nesting(w, track: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(parent, child) rows of the CPU nodes directly nested in another node of their thread (the
    innermost enclosing one: a stack per thread, in (start, longest first) order)."""
    cpu = np.flatnonzero(~w.gpu.astype(bool))
    cpu = cpu[np.lexsort((cpu, -w.e[cpu], w.s[cpu], track[cpu]))]
    par, chi = [], []
    stack: list[int] = []
    cur = None
    s, e, tr = w.s.tolist(), w.e.tolist(), track.tolist()
    for i in cpu.tolist():
        if tr[i] != cur:
            stack, cur = [], tr[i]
        while stack and e[stack[-1]] <= s[i] and not (s[stack[-1]] == s[i] and e[i] <= e[stack[-1]]):
            stack.pop()
        # (a child ending at its parent's start, zero-length, is the parent's thread predecessor)
        if stack and e[i] <= e[stack[-1]] and e[i] > s[stack[-1]]:
            par.append(stack[-1])
            chi.append(i)
        stack.append(i)
    return np.array(par, np.int64), np.array(chi, np.int64)


def _device_syncs(w, track: np.ndarray, name: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sync call, GPU op) rows: for each CPU node named *DeviceSynchronize, the last op of each
    GPU stream of its rank that ended after the call started and by its end."""
    calls = [i for i in np.flatnonzero(~w.gpu.astype(bool)) if "DeviceSynchronize" in str(name[i])]
    out_s, out_o = [], []
    gpu = np.flatnonzero(w.gpu.astype(bool))
    for i in calls:
        ops = gpu[(w.rank[gpu] == w.rank[i]) & (w.e[gpu] > w.s[i]) & (w.e[gpu] <= w.e[i])]
        if not len(ops):
            continue
        ops = ops[np.lexsort((ops, w.e[ops], track[ops]))]
        last = ops[np.r_[track[ops][1:] != track[ops][:-1], True]]
        out_s += [i] * len(last)
        out_o += last.tolist()
    return np.array(out_s, np.int64), np.array(out_o, np.int64)


def _graph(w, rid, order, names: dict, inst_of: dict, step, rows_table=None) -> wf.Graph:
    """The wf.Graph of one window (a critical_path _Window, its rows' rid and order; with the rows
    themselves, the nesting edges of its CPU nodes too)."""
    n = len(w.s)
    src, dst, rdy, kind = [], [], [], []
    rows = np.arange(n)
    rec_ready = np.full(n, np.iinfo(np.int64).min, np.int64)
    for col in _START_COLS[1:]:
        ok = w.pred[col] >= 0
        rec_ready[ok] = np.maximum(rec_ready[ok], w.ready[col][ok])
    for col in range(tcp._Window.RULES):
        ok = w.pred[col] >= 0
        if col == 0:  # inferred: only where nothing recorded is ready as late
            ok &= w.ready[col] > rec_ready
        src.append(w.pred[col][ok])
        dst.append(rows[ok])
        rdy.append(w.ready[col][ok])
        kind.append(w.kind[col][ok])
    src, dst, rdy, kind = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (src, dst, rdy, kind))
    side = np.where(np.isin(kind, [tcp._EDGE_SYNC, tcp._COLLECTIVE]), wf.END, wf.START).astype(np.int64)
    # a blocking call's own op (rule 5) is a sync edge too: both hold the call's end
    anchor = np.where(rdy >= w.e[src], wf.END, wf.START).astype(np.int64)
    offset = rdy - np.where(anchor == wf.END, w.e[src], w.s[src])
    names_k = [tcp._KINDS[k] for k in kind]
    name = np.array([names.get(int(r)) for r in rid[order]], object)
    track = np.zeros(n, np.int64)
    if rows_table is not None and n:
        # nesting (the replay's own: the critical path's thread order skips nested events, and its
        # backward walk needs no more): a child starts after its parent's start, a parent ends
        # after its child's end
        track = _tracks(rows_table, order)
        par, chi = _nesting(w, track)
        src = np.r_[src, par, chi]
        dst = np.r_[dst, chi, par]
        anchor = np.r_[anchor, np.full(len(par), wf.START), np.full(len(chi), wf.END)]
        side = np.r_[side, np.full(len(par), wf.START), np.full(len(chi), wf.END)]
        offset = np.r_[offset, np.zeros(2 * len(par), np.int64)]
        names_k += ["nest"] * (2 * len(par))
        # a device-wide sync waits for every stream of its rank (the critical path keeps the op that
        # ended last, which is all its walk needs): the last op of each of the rank's streams that
        # ended inside the call
        ds, do = _device_syncs(w, track, name)
        src, dst = np.r_[src, do], np.r_[dst, ds]
        anchor, side = np.r_[anchor, np.full(len(ds), wf.END)], np.r_[side, np.full(len(ds), wf.END)]
        offset = np.r_[offset, np.zeros(len(ds), np.int64)]
        names_k += ["sync"] * len(ds)
    instance = np.array([inst_of.get((int(r), int(e)), -1) for r, e in zip(w.rank, w.eid)], np.int64)
    g = _make(w, name, track, instance, src, dst, anchor, side, offset, names_k, step)
    nest = g.kind == "nest"  # (the device syncs' edges follow time: they cannot loop)
    if nest.any():
        try:
            wf._order(g)
        except ValueError:  # nesting that loops with the thread order (events with equal times): left out
            keep = ~nest
            g = _make(w, name, track, instance, src[keep], dst[keep], anchor[keep], side[keep], offset[keep],
                      [k for k, ok in zip(names_k, keep) if ok], step)
            g.notes.append("the CPU nesting edges loop with the thread order: left out")
    return g


def _make(w, name, track, instance, src, dst, anchor, side, offset, names_k, step) -> wf.Graph:
    """The wf.Graph of a window's nodes (w) and the given edges."""
    n = len(w.s)
    return wf.Graph(rank=w.rank.astype(np.int64), gpu=w.gpu.astype(bool), cls=w.cls.astype(np.int8), name=name,
                    start=w.s.astype(np.int64), end=w.e.astype(np.int64), track=track,
                    instance=instance, src=src.astype(np.int64), dst=dst.astype(np.int64),
                    anchor=anchor.astype(np.int64), side=side.astype(np.int64), offset=offset.astype(np.int64),
                    kind=np.array(names_k, object), origin=int(w.s.min()) if n else 0,
                    step=step)


def graphs(con, run_id: str):
    """The run's graphs, one per window in step order (a generator of wf.Graph); ``graph.instances``
    is the run's list of collective instances (dicts: op, size_bytes, group_size, pg, seq), shared
    by every window's graph. Needs the critical path's inputs on ``con`` (a tracekit.analyses
    connection builds them)."""
    if getattr(con, "analyses", None) is not None:  # else (create): the builder built them first
        con.analyses.ensure(["_instance_calls", "collective_instances"])
    con.execute(cp._ARRIVALS, [run_id])
    con.execute(_EVENTS, [run_id])
    try:
        names = dict(con.execute("SELECT rowid, name FROM _cp_events WHERE node").fetchall())
        instances, inst_of = [], {}
        key_of = {}
        for rank, eid, pg, win, seq, op, size, k in con.execute(_INSTANCES, [run_id]).fetchall():
            key = (pg, win, seq)
            if key not in key_of:
                key_of[key] = len(instances)
                instances.append({"pg": pg, "seq": seq, "op": op, "size_bytes": size, "group_size": k})
            inst_of[(rank, eid)] = key_of[key]
        kinds = [k for (k,) in con.execute("SELECT DISTINCT track_kind FROM _cp_events WHERE node AND "
                                           "track_kind IS NOT NULL ORDER BY 1").fetchall()]
        for step, rows in _windows(con, kinds):
            w, rid, order = _window(rows)
            g = _graph(w, rid, order, names, inst_of, step, rows)
            g.instances = instances
            yield g
    finally:
        for t in ("_cp_events", "_cp_arrivals"):
            con.execute(f"DROP TABLE IF EXISTS {t}")


def measured_ns(g: wf.Graph) -> dict[int, int]:
    """rank → its measured step: last end − first start of its nodes, ns."""
    out = {}
    for r in np.unique(g.rank):
        m = g.rank == r
        out[int(r)] = int(g.end[m].max() - g.start[m].min())
    return out


def create(con) -> None:
    """Create the table ``replay_steps`` (module docstring) on ``con``: every run's windows
    replayed unchanged (tracekit.model.whatif.replay)."""
    import pyarrow as pa

    out = {c: [] for c in COLS}
    for (run_id,) in con.execute("SELECT DISTINCT run_id FROM runs ORDER BY run_id").fetchall():
        for g in graphs(con, run_id):
            rp = wf.replay(g)
            meas, rep = measured_ns(g), rp.step_ns()
            into = np.bincount(g.rank[g.dst], minlength=int(g.rank.max()) + 1) if g.n else []
            for r in sorted(meas):
                out["run_id"].append(run_id)
                out["rank"].append(r)
                out["step"].append(g.step)
                out["measured_ns"].append(meas[r])
                out["replayed_ns"].append(rep[r])
                out["error"].append((rep[r] - meas[r]) / meas[r] if meas[r] else None)
                out["nodes"].append(int((g.rank == r).sum()))
                out["edges"].append(int(into[r]))
    types = {"VARCHAR": pa.string(), "INTEGER": pa.int32(), "BIGINT": pa.int64(), "DOUBLE": pa.float64()}
    t = pa.table({c: pa.array(v, types[COLS[c]]) for c, v in out.items()})
    con.register("_replay_rows", t)
    try:
        con.execute("CREATE OR REPLACE TABLE replay_steps AS SELECT * FROM _replay_rows "
                    "ORDER BY run_id, step, rank")
    finally:
        con.unregister("_replay_rows")


MAX_REPLAY_ERROR = 0.02
"""The unchanged graph's replay must give each rank's measured step within this fraction; a step
beyond it is answered with a range (its graph misses a dependency or its clocks disagree)."""


UNLAUNCHED_SHARE = 0.10
"""A step where more than this share of the GPU ops has no launch edge (launched before the
capture began, or no correlation in the trace) is answered with a range."""


def _limits(world: int | None, ranks: int | None, g: wf.Graph) -> tuple[list[str], np.ndarray]:
    """(why the trace cannot support a single edited number for this window, empty when it can;
    the GPU ops without a launch edge when they make one of those reasons, else an empty array),
    from the run's world size and traced ranks."""
    out = []
    if world and ranks and ranks < world:
        out.append(f"only {ranks} of {world} ranks were traced: the other ranks' arrivals are unknown, so a "
                   "collective's span may be all waiting for them (range: from the edited replay with every "
                   "collective taking no time after its own rank's arrival, to the larger of the edited and "
                   "the unchanged replay)")
    launched = np.zeros(g.n, bool)
    launched[g.dst[g.kind == "launch"]] = True
    loose = np.flatnonzero(g.gpu & ~launched)
    gpu = int(g.gpu.sum())
    if gpu and (~g.gpu).any() and len(loose) > UNLAUNCHED_SHARE * gpu:
        out.append(f"{len(loose):,} of {gpu:,} GPU ops have no launch call in the trace (launched before the "
                   "capture began, or no correlation): they keep their measured start (range: to where they "
                   "would start as soon as their stream allows)")
    else:
        loose = np.zeros(0, np.int64)
    return out, loose


def _parts_delta(a: dict, b: dict) -> dict:
    return {p: b[p] - a[p] for p in a}


def whatif(con, run_id: str, edits: list, model: str | None = None, steps: list | None = None) -> dict:
    """The what-if answer for one run (a JSON-ready dict): per step and rank the measured, replayed
    (unchanged graph) and edited step times (ns), the replayed and edited critical paths'
    composition (PARTS, ns) and its change, the collective instances whose transfer changed
    (before/after ns, and whether they were on the critical path; for the edits that set transfer
    times: --link, --chunk), the edits' names and notes and
    the model used. A step whose unchanged replay misses the measured step of some rank by more
    than MAX_REPLAY_ERROR, or a run whose trace lacks a dependency the replay needs
    (:func:`_limits`), gets ``edited_ns`` None and ``edited_range_ns`` [low, high] with ``limits``
    giving why: the edited replay and, per reason, the unchanged replay (one rank of many), the
    edited replay with the unlaunched GPU ops free to start when their stream allows, the measured
    step (a replay error). Raises BadInputError when the
    run has no nodes (nothing to replay)."""
    from tracekit.errors import BadInputError

    out_steps = []
    # the collectives' changes are listed for the edits that set transfer times (other edits move
    # a tail only as a side effect: no stragglers, a name pattern that matches a collective)
    transfers = any(label.startswith(("transfers", "chunk")) for label, _ in edits)
    # asked before the windows stream (no other statement while their reader is open)
    world, n_ranks = con.execute("SELECT max(r.world_size), (SELECT count(DISTINCT rank) FROM ranks WHERE run_id = ?) "
                                 "FROM runs r WHERE r.run_id = ?", [run_id, run_id]).fetchone()
    seen_steps: list = []
    for g in graphs(con, run_id):
        seen_steps.append(g.step)
        if steps is not None and g.step not in steps:
            continue
        base = wf.replay(g)
        ge = wf.apply(g, edits)
        new = wf.replay(ge)
        meas, rep, edt = measured_ns(g), base.step_ns(), new.step_ns()
        limits, loose = _limits(world, n_ranks, g)
        bounds = {r: [edt[r]] for r in edt}
        if limits and world and n_ranks and n_ranks < world:
            # an untraced rank may hold every collective: the low end frees each collective span's time
            # after its own rank's arrival (its tail: wait and transfer both, neither known here)
            free = ge.copy()
            free.tail[free.instance >= 0] = 0
            for r, v in wf.replay(free).step_ns().items():
                bounds[r].append(v)
            for r in bounds:
                bounds[r].append(rep[r])
        if len(loose):
            gl = ge.copy()
            gl.delay[loose] = 0
            for r, v in wf.replay(gl).step_ns().items():
                bounds[r].append(v)
        worst = max((abs(rep[r] - meas[r]) / meas[r] for r in meas if meas[r]), default=0.0)
        if worst > MAX_REPLAY_ERROR:
            for r in bounds:
                bounds[r].append(meas[r])
            limits.append(f"the unchanged replay misses the measured step by {worst:.1%} (> "
                          f"{MAX_REPLAY_ERROR:.0%}): a dependency is missing or the ranks' clocks disagree")
        ranks = []
        for r in sorted(meas):
            pb, pe = wf.critical_path(base, r), wf.critical_path(new, r)
            row = {"rank": r, "measured_ns": meas[r], "replayed_ns": rep[r],
                   "edited_ns": None if limits else edt[r],
                   "edited_range_ns": [min(bounds[r]), max(bounds[r])] if limits else None,
                   "change_ns": None if limits else edt[r] - rep[r],
                   "path_replayed": pb["parts"], "path_edited": pe["parts"],
                   "path_change": _parts_delta(pb["parts"], pe["parts"])}
            ranks.append(row)
        slow = max(ranks, key=lambda x: x["replayed_ns"])
        on_base = {int(g.instance[i]) for i, _ in wf.critical_path(base, slow["rank"])["nodes"] if g.instance[i] >= 0}
        changed = []
        for k, inst in enumerate(ge.instances if transfers else []):
            members = np.flatnonzero(g.instance == k)
            if not len(members):
                continue
            before, after = int(np.median(g.tail[members])), int(np.median(ge.tail[members]))
            if before == after:
                continue
            # the part of the change the step could show: the member on the slowest rank's path
            changed.append({"pg": inst.get("pg"), "seq": inst.get("seq"), "op": inst.get("op"),
                            "size_bytes": inst.get("size_bytes"), "group_size": inst.get("group_size"),
                            "name": str(g.name[members[0]]), "before_ns": before, "after_ns": after,
                            "change_ns": after - before, "on_critical_path": k in on_base,
                            "model_pick": inst.get("model_pick")})
        step_change = None if limits else slow["edited_ns"] - slow["replayed_ns"]
        total = sum(c["change_ns"] for c in changed)
        on_path = sum(c["change_ns"] for c in changed if c["on_critical_path"])
        out_steps.append({
            "step": g.step, "ranks": ranks, "slowest_rank": slow["rank"], "limits": limits,
            "replay_error": worst, "collectives_changed": changed,
            "explain": {"transfer_change_ns": total, "transfer_change_on_path_ns": on_path,
                        "step_change_ns": step_change,
                        "hidden_ns": None if step_change is None else total - step_change},
            "notes": ge.notes})
    if not out_steps and steps is not None and seen_steps:
        raise BadInputError(f"run {run_id!r}: no step {', '.join(map(str, steps))} (its steps: "
                            f"{', '.join(map(str, sorted(seen_steps, key=lambda x: (x is None, x))))})")
    if not out_steps:
        raise BadInputError(f"run {run_id!r}: no events to replay (no GPU op, runtime call, compute or comm op)")
    # an edit that matched nothing in any step (a misspelt pattern) is refused, not answered unchanged
    counts: dict[str, int] = {}
    why: dict[str, str] = {}
    for st in out_steps:
        for note in st["notes"]:
            m = re.match(r"(.*?): (\d+) (?:ops|spans)\b(?: \((.*)\))?", note)
            if m:
                counts[m[1]] = counts.get(m[1], 0) + int(m[2])
                if m[3]:
                    why.setdefault(m[1], m[3])
    for edit, n in counts.items():
        if not n and edit in why:  # it matched, but nothing it matched can be edited
            raise BadInputError(f"run {run_id!r}: the edit changed nothing in any step ({edit}): {why[edit]}")
        if not n:
            raise BadInputError(f"run {run_id!r}: the edit matched nothing in any step ({edit}): "
                                "check its pattern against the run's op names (tracekit sql)")
    return {"run_id": run_id, "edits": [label for label, _ in edits], "model": model, "steps": out_steps,
            "max_replay_error": MAX_REPLAY_ERROR}
