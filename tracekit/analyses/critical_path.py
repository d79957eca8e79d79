"""critical_path: the chain of dependent work that determines each rank's step length, across ranks — a Python analysis.

Reads: rank_critical_path, rank_critical_path_summary, critical_path_nodes, rank_steps (stored at
ingest), _instance_calls, collective_instances

The DAG. Nodes are the events of one window (a profiler step, events.step; the whole trace when a
run has no steps) that do or wait for work: every GPU op (kernel, memcpy, memset, GPU sync), and on
CPU threads the runtime calls (launches, synchronizations) and the events classed compute or comm
(on CPU-only runs: the top-level aten ops and the gloo spans). Edges, each with the time it makes
its successor ready:
- stream order: on one GPU stream, the op before it by start (ready = its end, or the op's own start
  when it started first: programmatic dependent launch on sm_90+, which the ingest keeps whole);
- thread order: the same on a CPU thread, nested events skipped (ready = its end; the time between
  two CPU nodes is host code, so a gap after this edge counts as launch/CPU);
- launch: the runtime call that launched a GPU op (events.launch_event_id; ready = the call's end,
  or the op's start when the op started first), unless the call returned only after the op ended
  (then the call waited for the op: the synchronization edge below, the other way);
- synchronization: a CPU sync call (class sync) waits for the GPU op on its rank that ended last
  before the call returned, and a runtime call whose own GPU op ended before the call returned (a
  blocking cudaMemcpy, pageable cudaMemcpyAsync) waits for that op (ready = the op's end, when
  after the call's start);
- inferred, where the trace does not record the dependency: a GPU op also depends on the op of
  its rank's other streams that ended last at or before its start (cross_stream: the CUDA event
  waits between a compute and an NCCL stream, which Kineto records as cudaStreamWaitEvent calls
  without their event), and a CPU node on the node of the rank's other threads that ended last
  before it (host: e.g. the main thread blocked in backward() while the autograd thread launches);
  both lose every tie, so they are taken only when nothing recorded explains a later start;
- collective: an instance cannot finish before its last arrival (DESIGN.md, "Matching collectives
  across ranks"): each rank's collective span (collectives.event_id) depends on the start of the
  last-arriving rank's span of the same instance (_instance_calls: run, pg, window, seq), when that
  start is after its own (ready = the last arrival).

The algorithm (a backward walk, the standard way to take a longest path of a replayed schedule):
start from the rank's node that ends last in the window; at each node choose the predecessor
whose ready time is latest (ties: collective, synchronization, stream/thread, launch, then the
inferred ones), credit the node with [max(start, ready), cursor), credit the gap between the
predecessor's ready time and the node's start (launch/CPU after a thread or host edge: host code
between calls; idle after a stream, launch or cross_stream edge: the op was launched and its stream
free, and nothing recorded held it back: launch latency or an unrecorded wait), move the cursor
to the ready time and repeat, until a node has no predecessor in the window. The credited pieces tile [start_ns, end_ns) exactly, so the
composition sums to length_ns. Where every event starts at its latest predecessor's ready time
plus its own delay, this is the longest path of the DAG with node weight = delay + duration
(tests/analyses/test_critical_path.py checks it against networkx's dag_longest_path on one rank).

Limits: dependencies the trace does not record are only inferred (cross_stream, host: the
latest-ending candidate, which may be an unrelated stream or thread), and host waits on anything
but a sync call or another thread's node (locks, data loading, the network) show as launch/CPU or
idle; a rank's several GPUs are taken as one device. A collective whose last arriving span lies
in another window (step) is not followed. Clocks across hosts are taken as aligned
(ranks.clock_offset_ns is already applied to the store's times).

How it is computed: at ingest, per rank (tracekit.ingest.critical_path, the walk's code in
tracekit.timeline.critical_path). Per window, every node's candidate predecessors, one per edge rule,
are computed for all nodes at once in numpy (sorting and searchsorted per rank, kind or track; the
launch and last-arrival rows by one (rank, event_id) index), and so is the one the walk takes when
nothing on the path rules it out (the usual choice). Every rank's path is then listed at once as
arrays by following the usual choices (pointer doubling:
:func:`tracekit.timeline.critical_path.walks`); only a path where the usual choice is ready after
the cursor or already on the path is walked node by node (:func:`tracekit.timeline.critical_path.walk`),
re-choosing among that node's candidates. A run of one rank whose calls cannot meet in one instance
has no collective edge, so its paths are final at ingest and stored (rank_critical_path,
rank_critical_path_summary): this module reads them. A run of several ranks, or a lone rank whose
calls may meet (tracekit.ingest.assemble._may_meet_itself), stores each rank's nodes
(critical_path_nodes); this module walks them, window by window with every
rank's nodes of the window at once (one statement per CHUNK_NODES nodes), with the collective edges
from _instance_calls: it reads no events. window_ns comes from the stored rank_steps. Memory: one
window's nodes of every rank at a time (~0.3 kB per node with the candidates), plus the computed
paths as Arrow tables until the tables are created.

critical_path: one row per event on each path, in path order.

run_id       VARCHAR  run
rank         INTEGER  the rank whose step the path explains (its last event ends the path)
step         BIGINT   profiler step number; NULL for the whole trace of a run without steps
pos          INTEGER  position on the path, 0 = the earliest event
event_rank   INTEGER  the rank the event ran on (differs from rank after a collective edge)
event_id     BIGINT   events.event_id on event_rank
name         VARCHAR  event name
class        VARCHAR  events.class (compute / comm / memory / sync / cpu / other)
start_ns     BIGINT   event start, ns on the run clock
end_ns       BIGINT   event end, ns
on_path_ns   BIGINT   the part of the event credited to the path, ns (0 for a span the path only
                      passes through, e.g. the last arrival's own collective span)
gap_ns       BIGINT   the gap credited before this event's part (between its ready time and its
                      credited start), ns
edge         VARCHAR  how the next event on the path depends on this one: stream, thread, launch,
                      sync, collective, cross_stream, host (the last two inferred); 'end' for the
                      last event

critical_path_summary: one row per (run, rank, step) with GPU or CPU work: the path's length and
composition. The composition columns sum to length_ns.

run_id           VARCHAR  run
rank             INTEGER  rank whose step this is
step             BIGINT   profiler step number; NULL for the whole trace of a run without steps
start_ns         BIGINT   start of the path's first credited piece, ns on the run clock
end_ns           BIGINT   end of the rank's last event in the step (the path's end), ns
length_ns        BIGINT   end_ns − start_ns, ns
window_ns        BIGINT   the rank's own step span (first start to last end of its events in the
                          step, any class), ns, for comparison; length_ns may exceed it when the
                          path starts on another rank
compute_ns       BIGINT   this rank's compute on the path, ns
exposed_comm_ns  BIGINT   this rank's communication on the path (after the last arrival: nothing
                          hid it), ns
memory_ns        BIGINT   this rank's memcpy/memset on the path, ns
launch_cpu_ns    BIGINT   this rank's CPU on the path: runtime calls, CPU ops, host code between
                          calls and launch latency, ns
sync_other_ns    BIGINT   this rank's sync and other-class events on the path, ns
straggler_ns     BIGINT   path time on other ranks (entered through a collective whose last
                          arrival was theirs, late by that collective's skew however small): this
                          rank's step waiting on the last arriver's work, ns (the report's "other ranks")
idle_ns          BIGINT   gaps on this rank before a GPU op whose stream and launch were ready
                          (launch latency, unrecorded waits), ns
path_events      BIGINT   events on the path
other_ranks      INTEGER  distinct ranks other than rank on the path
"""

from __future__ import annotations

import numpy as np

from tracekit.timeline import critical_path as _tcp
from tracekit.timeline.critical_path import _COMPOSITION, _KINDS, CLASSES, PARTS  # noqa: F401  (CLASSES, PARTS: this module's API too)

# the last arriving span of each collective span's instance, for the spans that arrived before it
# (lowest rank on ties, as the straggler); one row per span
_ARRIVALS = """
CREATE OR REPLACE TEMP TABLE _cp_arrivals AS
SELECT rank, event_id, last_rank, last_eid, last_ns FROM (
    SELECT rank, event_id, ts_ns,
           first(rank ORDER BY ts_ns DESC, rank) OVER w AS last_rank,
           first(event_id ORDER BY ts_ns DESC, rank) OVER w AS last_eid,
           max(ts_ns) OVER w AS last_ns
    FROM _instance_calls c WHERE run_id = ?
      -- a mismatched instance (collective_instances.mismatched) gives no collective edge
      AND NOT EXISTS (SELECT 1 FROM collective_instances i WHERE i.run_id = c.run_id AND i.pg_name = c.pg_name
                      AND i.win = c.win AND i.seq = c.seq AND i.mismatched)
    WINDOW w AS (PARTITION BY pg_name, win, seq)
) WHERE last_ns > ts_ns
QUALIFY row_number() OVER (PARTITION BY rank, event_id ORDER BY last_ns DESC, last_rank, last_eid) = 1
"""

CHUNK_NODES = 1 << 17
"""Nodes per statement of _NODES (consecutive steps, or one bigger step): its sort stays within
the connection's memory budget (benchmarks/README.md, "Critical path")."""


# a run of several ranks: its stored nodes (critical_path_nodes) with each collective span's last
# arrival (_cp_arrivals), read once; class: 1 + the position of events.class in CLASSES (0: none)
_STORED_NODES = """
CREATE OR REPLACE TEMP TABLE _cp_nodes AS
SELECT n.step, n.rank, n.event_id, n.gpu, n.tid, n.ts_ns, n.end_ns,
       coalesce(list_position(?::VARCHAR[], n.class), 0)::TINYINT AS class,
       coalesce(n.launch_event_id, -1) AS launch, n.launch_event_id IS NOT NULL AS launched,
       a.last_rank IS NOT NULL AS arrived, coalesce(a.last_rank, -1) AS last_rank,
       coalesce(a.last_eid, -1) AS last_eid, coalesce(a.last_ns, 0) AS last_ns, n.name, n.class AS class_name
FROM critical_path_nodes n LEFT JOIN _cp_arrivals a ON a.rank = n.rank AND a.event_id = n.event_id
WHERE n.run_id = ?
"""

# the nodes of _cp_nodes of a chunk of windows (consecutive steps, or the whole trace of a run
# without steps), in step order
_STORED_CHUNK = """
SELECT * FROM _cp_nodes WHERE step BETWEEN ? AND ? OR step IS NULL AND ?::BOOLEAN ORDER BY step
"""

def _chunks(con, nodes: str, steps: str, params: list | None = None) -> list[tuple]:
    """(first step, last step, whole trace?) of each statement reading a run's nodes: consecutive
    steps of up to CHUNK_NODES nodes, or the whole trace of a run without steps. ``nodes``: the
    node table with the start of its WHERE clause (``T WHERE`` or ``T WHERE cond AND``);
    ``steps``: a count (``count(...) FROM ...``) that is 0 when the run has no steps."""
    if not con.execute(f"SELECT {steps}", params or []).fetchall()[0][0]:  # no steps: one window
        return [(None, None, True)]
    counts = con.execute(f"SELECT step, count(*) FROM {nodes} step IS NOT NULL "
                         "GROUP BY step ORDER BY step").fetchall()
    if not counts:
        return []
    out, first, n = [], None, 0
    for step, k in counts:
        if first is not None and n + k > CHUNK_NODES:
            out.append((first, last, False))
            first, n = None, 0
        first = step if first is None else first
        last, n = step, n + k
    return out + [(first, last, False)]


def _chunk_windows(con, params: list, whole: bool, query: str):
    """The windows of one statement ``query`` (a run's nodes of a chunk of :func:`_chunks`, in step
    order; ``params``: its parameters), one at a time in step order: (step, Arrow table of its rows)."""
    import duckdb
    import pyarrow as pa

    steps = not whole
    while True:  # the sort runs before the first batch: retried as AnalysisConnection.execute
        try:
            reader = con.sql(query, params=params).to_arrow_reader(1 << 16)
            batch = reader.read_next_batch()
            break
        except StopIteration:
            return
        except duckdb.OutOfMemoryException:
            if not getattr(con, "raise_budget", lambda: False)():
                raise
    def window(held):
        t = pa.Table.from_batches([x for x, _ in held])
        return t.column("step")[0].as_py(), t

    held, done = [], set()  # the current window's pieces (batch slice, step); the steps yielded
    while True:
        step = batch.column("step").to_numpy(zero_copy_only=False) if steps else np.zeros(batch.num_rows)
        cuts = np.flatnonzero(step[1:] != step[:-1]) + 1
        for a, b in zip(np.r_[0, cuts], np.r_[cuts, batch.num_rows]):
            if held and step[a] != held[-1][1]:
                done.add(held[-1][1])
                yield window(held)
                held = []
            if step[a] in done:  # a step seen before: the stream is out of order (a bug)
                raise RuntimeError(f"critical_path: step {step[a]} came twice in the node stream")
            held.append((batch.slice(a, b - a), step[a]))
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
    if held:
        yield window(held)


def _stored_windows(con, run_id: str):
    """The windows of a run of several ranks from its stored nodes (_cp_nodes), one at a time in
    step order: (step, Arrow table of its rows of _cp_nodes)."""
    chunks = _chunks(con, "_cp_nodes WHERE", "count(*) FROM rank_steps WHERE run_id = ? AND step IS NOT NULL", [run_id])
    for lo, hi, whole in chunks:
        yield from _chunk_windows(con, [lo, hi, whole], whole, _STORED_CHUNK)


_WINDOW_COLS = ("rank", "event_id", "gpu", "tid", "ts_ns", "end_ns", "class", "launch", "launched", "arrived",
                "last_rank", "last_eid", "last_ns")


def run_paths(con, run_id: str):
    """Per window (profiler step) of a run of several ranks (its stored nodes in _cp_nodes, with
    _cp_arrivals), in step order: (path rows, summary rows) of every rank with nodes in it, as
    Arrow tables with the columns of _PATH_COLS and _SUMMARY_COLS (module docstring). A generator,
    so that one window's nodes are held at a time."""
    import pyarrow as pa

    for step, t in _stored_windows(con, run_id):
        w, at = _tcp.window({k: t.column(k).to_numpy() for k in _WINDOW_COLS})
        p = _tcp.paths(w)
        node = p["node"]
        src = pa.array(at[node])
        n, k = len(node), len(p["lengths"])
        rows = pa.table({
            "run_id": pa.array([run_id] * n, pa.string()), "rank": pa.array(p["rank"], pa.int32()),
            "step": pa.array([step] * n, pa.int64()), "pos": pa.array(p["pos"], pa.int32()),
            "event_rank": pa.array(w.rank[node], pa.int32()), "event_id": pa.array(w.eid[node]),
            "name": t.column("name").take(src), "class": t.column("class_name").take(src),
            "start_ns": pa.array(w.s[node]), "end_ns": pa.array(w.e[node]),
            "on_path_ns": pa.array(p["on_path"]), "gap_ns": pa.array(p["gap"]),
            "edge": pa.DictionaryArray.from_arrays(pa.array(p["edge"].astype(np.int8)),
                                                   pa.array(_KINDS)).cast(pa.string())})
        summary = pa.table({
            "run_id": pa.array([run_id] * k, pa.string()), "rank": pa.array(p["path_rank"], pa.int32()),
            "step": pa.array([step] * k, pa.int64()), "start_ns": pa.array(p["start_ns"]),
            "end_ns": pa.array(p["end_ns"]), **{c: pa.array(p["parts"][:, i]) for i, c in enumerate(PARTS)},
            "path_events": pa.array(p["lengths"]), "other_ranks": pa.array(p["other_ranks"], pa.int32())})
        yield rows, summary


_PATH_COLS = {"run_id": "VARCHAR", "rank": "INTEGER", "step": "BIGINT", "pos": "INTEGER",
              "event_rank": "INTEGER", "event_id": "BIGINT", "name": "VARCHAR", "class": "VARCHAR",
              "start_ns": "BIGINT", "end_ns": "BIGINT", "on_path_ns": "BIGINT", "gap_ns": "BIGINT",
              "edge": "VARCHAR"}
_SUMMARY_COLS = {"run_id": "VARCHAR", "rank": "INTEGER", "step": "BIGINT", "start_ns": "BIGINT",
                 "end_ns": "BIGINT", **{p: "BIGINT" for p in PARTS}, "path_events": "BIGINT",
                 "other_ranks": "INTEGER"}
_ARROW = {"VARCHAR": "string", "INTEGER": "int32", "BIGINT": "int64"}


def _concat(tables: list, cols: dict[str, str]):
    """The Arrow tables, one after the other (no rows: the columns `cols`, DuckDB types)."""
    import pyarrow as pa

    if tables:
        return pa.concat_tables(tables)
    return pa.table({c: pa.array([], getattr(pa, _ARROW[t])()) for c, t in cols.items()})


def _key_order(tables: list):
    """One run's path rows (the tables of :func:`run_paths`, in step order; in each, rank then
    pos order) as one Arrow table in critical_path's key order (rank, step, pos) (a stable sort
    by rank, skipped when the rows are in that order already)."""
    import pyarrow as pa

    t = pa.concat_tables(tables)
    rank = t.column("rank").to_numpy()
    if len(rank) and np.any(rank[1:] < rank[:-1]):
        t = t.take(np.argsort(rank, kind="stable"))
    return t


def create(con) -> None:
    """Create the views ``critical_path`` and ``critical_path_summary`` on ``con``: the stored paths of
    the runs of one rank, and those of the runs of several ranks walked here from their stored nodes
    (needs the view _instance_calls of instance_rows; the paths are held as Arrow tables, ~60 B per
    path row, until every run is walked). Reads no events."""
    import duckdb

    con.require_stored(("rank_critical_path", "rank_critical_path_summary", "critical_path_nodes", "rank_steps"))
    paths, summaries = [], []
    for (run_id,) in con.execute("SELECT DISTINCT run_id FROM critical_path_nodes ORDER BY run_id").fetchall():
        con.execute(_ARRIVALS, [run_id])
        con.execute(_STORED_NODES, [list(CLASSES), run_id])
        run_rows = []
        for rows, summary in run_paths(con, run_id):
            run_rows.append(rows)
            summaries.append(summary)
        if run_rows:
            paths.append(_key_order(run_rows))
        for name in ("_cp_nodes", "_cp_arrivals"):
            con.execute(f"DROP TABLE IF EXISTS {name}")
    for name, tables, cols in (("_cp_rows", paths, _PATH_COLS), ("_cp_sums", summaries, _SUMMARY_COLS)):
        con.register(name, _concat(tables, cols))
    keep = str(con.execute("SELECT current_setting('preserve_insertion_order')").fetchone()[0]).lower() in ("true", "1")
    changed = False
    try:
        # the rows are in key order already (_key_order): kept so. A connection whose configuration
        # is locked (tracekit sql) keeps its setting: the rows are the same, their order DuckDB's
        if not keep:
            try:
                con.execute("SET preserve_insertion_order = true")
                changed = True
            except duckdb.Error:
                pass
        con.execute(f"CREATE OR REPLACE TABLE _cp_walked AS SELECT "
                    f"{', '.join(f'{c}::{t} AS {c}' for c, t in _PATH_COLS.items())} FROM _cp_rows")
        con.execute(f"CREATE OR REPLACE TABLE _cp_walked_summary AS SELECT "
                    f"{', '.join(f'{c}::{t} AS {c}' for c, t in _SUMMARY_COLS.items())} FROM _cp_sums")
    finally:
        if changed:
            con.execute("SET preserve_insertion_order = false")
        for name in ("_cp_rows", "_cp_sums"):
            con.unregister(name)
    cols = ", ".join(_PATH_COLS)
    con.execute(f"CREATE OR REPLACE VIEW critical_path AS SELECT {cols} FROM rank_critical_path "
                f"UNION ALL SELECT {cols} FROM _cp_walked")
    con.execute(
        f"""
        CREATE OR REPLACE VIEW critical_path_summary AS
        SELECT s.run_id, s.rank, s.step, s.start_ns, s.end_ns, s.end_ns - s.start_ns AS length_ns,
               w.last_ns - w.first_ns AS window_ns, {", ".join("s." + p for p in PARTS)}, s.path_events, s.other_ranks
        FROM (SELECT {", ".join(_SUMMARY_COLS)} FROM rank_critical_path_summary
              UNION ALL SELECT {", ".join(_SUMMARY_COLS)} FROM _cp_walked_summary) s
        LEFT JOIN rank_steps w ON w.run_id = s.run_id AND w.rank = s.rank AND w.step IS NOT DISTINCT FROM s.step
        ORDER BY s.run_id, s.step, s.rank
        """
    )


def gap_part(prev_edge: str) -> str:
    """The composition part of a gap, from the edge that led back to the event before it."""
    return "launch_cpu_ns" if prev_edge in ("thread", "host") else "idle_ns"


def path_segments(con, run_id: str) -> list[dict]:
    """The pieces that tile each path of ``run_id``, in time order, rebuilt from critical_path and
    critical_path_summary: one dict per (rank, step) with ``rank``, ``step``, ``start_ns``,
    ``end_ns`` and ``segments``, a list of [start_ns, end_ns, part, name, event_rank] (part: one of
    PARTS without ``_ns``; name: the event's, or 'idle' / 'host code' for a gap). Zero-length
    pieces are left out. Needs the critical_path tables on ``con``."""
    starts = {(r, s): (a, b) for r, s, a, b in con.execute(
        "SELECT rank, step, start_ns, end_ns FROM critical_path_summary WHERE run_id = ?", [run_id]).fetchall()}
    out: dict[tuple, dict] = {}
    prev_edge = None
    for rank, step, name, cls, ev_rank, on_path, gap, edge in con.execute(
            "SELECT rank, step, name, class, event_rank, on_path_ns, gap_ns, edge FROM critical_path "
            "WHERE run_id = ? ORDER BY rank, step NULLS FIRST, pos", [run_id]).fetchall():
        key = (rank, step)
        if key not in out:
            out[key] = {"rank": rank, "step": step, "start_ns": starts[key][0], "end_ns": starts[key][1],
                        "segments": []}
            cursor = starts[key][0]
        segs = out[key]["segments"]
        own = ev_rank == rank
        if gap:
            part = gap_part(prev_edge) if own else "straggler_ns"
            segs.append([cursor, cursor + gap, part[:-3], "host code" if gap_part(prev_edge) == "launch_cpu_ns" else "idle",
                         ev_rank])
            cursor += gap
        if on_path:
            part = _COMPOSITION.get(cls, "sync_other_ns") if own else "straggler_ns"
            segs.append([cursor, cursor + on_path, part[:-3], name, ev_rank])
            cursor += on_path
        prev_edge = edge
    return list(out.values())


def critical_path_wanted(want: bool | None) -> tuple[bool, str | None]:
    """(build it?, why not): ``want`` when given, else True (the paths are computed at ingest: any
    run's report has them, whatever its size)."""
    if want is False:
        return False, "left out (--no-critical-path)"
    return True, None


def path_strips(con, run_id: str, first: int) -> list[dict]:
    """The first ``first`` paths of ``run_id`` (ordered by step, NULL first, then rank) as time
    strips: one dict per (rank, step) with ``rank``, ``step``, ``start_ns``, ``end_ns`` and
    ``segments``, a list of [start_ns, end_ns, part, name, pieces, event_rank]: the pieces of
    :func:`path_segments` (ns on the run clock; part: one of PARTS without ``_ns``) with consecutive
    touching pieces of one part and one event_rank merged into one; ``name`` is that of the merged
    pieces' longest (the first of equal ones), ``pieces`` how many were merged.

    The same value as merging :func:`path_segments`' pieces path by path, computed as arrays from
    the rows of the selected paths only (a gap's part reads the edge of the row before it in
    (rank, step, pos) order over all of the run's paths, as :func:`path_segments` does). Needs the
    critical_path tables on ``con``."""
    keys = con.execute(
        "SELECT rank, step, start_ns, end_ns FROM critical_path_summary s WHERE run_id = ? AND EXISTS ("
        "SELECT 1 FROM critical_path p WHERE p.run_id = s.run_id AND p.rank = s.rank "
        "AND p.step IS NOT DISTINCT FROM s.step) ORDER BY step NULLS FIRST, rank LIMIT ?",
        [run_id, int(first)]).fetchall()
    if not keys:
        return []
    con.execute("CREATE OR REPLACE TEMP TABLE _cp_strip_keys (rank INTEGER, step BIGINT, start_ns BIGINT, "
                "k INTEGER)")
    con.executemany("INSERT INTO _cp_strip_keys VALUES (?, ?, ?, ?)",
                    [[r, s, a, i] for i, (r, s, a, _b) in enumerate(keys)])
    # one row per piece source (a critical_path row of a selected path), in path order; host: the
    # edge of the row before it over every path of the run is 'thread' or 'host' (before a path's
    # first row: the last row of the path before it in (rank, step) order); part: of an own event
    comp = " ".join(f"WHEN '{c}' THEN {_STRIP_PARTS.index(p[:-3])}" for c, p in _COMPOSITION.items())
    t = con.execute(f"""
        WITH keys AS (SELECT DISTINCT rank, step FROM critical_path WHERE run_id = ?),
        prev AS (SELECT rank, step, lag(rank) OVER w AS prank, lag(step) OVER w AS pstep,
                        row_number() OVER w AS i
                 FROM keys WINDOW w AS (ORDER BY rank, step NULLS FIRST)),
        sel AS (SELECT k.*, p.prank, p.pstep, p.i FROM _cp_strip_keys k
                JOIN prev p ON p.rank = k.rank AND p.step IS NOT DISTINCT FROM k.step),
        before AS (SELECT s.k, arg_max(c.edge, c.pos) AS edge FROM sel s JOIN critical_path c
                   ON c.run_id = ? AND c.rank = s.prank AND c.step IS NOT DISTINCT FROM s.pstep
                   WHERE s.i > 1 GROUP BY s.k),
        r AS (
            SELECT k.k, p.pos, p.event_rank, coalesce(p.event_rank = p.rank, false) AS own, p.name,
                   CASE p.class {comp} ELSE {_STRIP_PARTS.index("sync_other")} END AS part,
                   coalesce(p.on_path_ns, 0) AS on_path, coalesce(p.gap_ns, 0) AS gap,
                   CASE WHEN p.pos = min(p.pos) OVER (PARTITION BY k.k) THEN b.edge
                        ELSE lag(p.edge) OVER (PARTITION BY k.k ORDER BY p.pos) END AS prev_edge,
                   k.start_ns
            FROM critical_path p
            JOIN _cp_strip_keys k ON p.run_id = ? AND k.rank = p.rank AND k.step IS NOT DISTINCT FROM p.step
            LEFT JOIN before b ON b.k = k.k)
        SELECT k, event_rank IS NULL AS no_ev, coalesce(event_rank, 0) AS ev, own, name, part, on_path, gap,
               coalesce(prev_edge IN ('thread', 'host'), false) AS host, start_ns
        FROM r ORDER BY k, pos""", [run_id, run_id, run_id]).fetchnumpy()
    con.execute("DROP TABLE IF EXISTS _cp_strip_keys")
    n = len(t["k"])
    own, host = (np.asarray(t[c], bool) for c in ("own", "host"))
    # pieces: row i gives a gap piece (2i) then an event piece (2i + 1); zero-length ones dropped
    length = np.empty(2 * n, np.int64)
    length[0::2], length[1::2] = t["gap"], t["on_path"]
    straggler, idle, cpu = (_STRIP_PARTS.index(x) for x in ("straggler", "idle", "launch_cpu"))
    part = np.empty(2 * n, np.int64)
    part[0::2] = np.where(own, np.where(host, cpu, idle), straggler)
    part[1::2] = np.where(own, np.asarray(t["part"], np.int64), straggler)
    # name: the row's (its index) for an event piece; -1 'idle', -2 'host code' for a gap
    name = np.empty(2 * n, np.int64)
    name[0::2] = np.where(host, -2, -1)
    name[1::2] = np.arange(n)
    ev = np.repeat(np.asarray(t["ev"], np.int64), 2)
    no_ev = np.repeat(np.asarray(t["no_ev"], bool), 2)
    pk = np.repeat(np.asarray(t["k"], np.int64), 2)
    # start of each piece: the path's start + the lengths of the pieces before it on the path
    before = np.cumsum(length) - length
    first_of = np.searchsorted(pk, pk, side="left")
    s = np.repeat(np.asarray(t["start_ns"], np.int64), 2) + before - before[first_of]
    e = s + length
    keep = length != 0
    s, e, part, name, ev, no_ev, pk, length = (x[keep] for x in (s, e, part, name, ev, no_ev, pk, length))
    # merged runs: a piece starts a new one unless it continues the previous one of its path
    m = len(s)
    new = np.ones(m, bool)
    new[1:] = ((pk[1:] != pk[:-1]) | (part[1:] != part[:-1]) | (no_ev[1:] != no_ev[:-1])
               | (~no_ev[1:] & (ev[1:] != ev[:-1])) | (s[1:] != e[:-1]))
    run = np.cumsum(new) - 1
    starts_at = np.flatnonzero(new)
    ends_at = np.append(starts_at[1:], m) - 1
    # the longest piece of each merged run, the first of equal ones
    order = np.lexsort((np.arange(m), -length, run))
    longest = order[np.searchsorted(run[order], np.arange(len(starts_at)))]
    names = _objects(t["name"])
    out = [{"rank": r, "step": st, "start_ns": a, "end_ns": b, "segments": []} for r, st, a, b in keys]
    for a, z, lo in zip(starts_at.tolist(), ends_at.tolist(), longest.tolist()):
        nm = name[lo]
        out[int(pk[a])]["segments"].append([int(s[a]), int(e[z]), _STRIP_PARTS[part[a]],
                                            names[nm] if nm >= 0 else ("idle", "host code")[-1 - nm], z - a + 1,
                                            None if no_ev[a] else int(ev[a])])
    return out


_STRIP_PARTS = tuple(p[:-3] for p in PARTS)
"""The parts of a strip's pieces: PARTS without ``_ns``."""


def _objects(col) -> np.ndarray:
    """A fetchnumpy column as an object array, NULLs (masked) as None."""
    if isinstance(col, np.ma.MaskedArray):
        vals = col.data.astype(object)
        vals[np.ma.getmaskarray(col)] = None
        return vals
    return np.asarray(col).astype(object)
