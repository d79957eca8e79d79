"""critical_path: the chain of dependent work that determines each rank's step length, across ranks — a Python analysis.

Reads: runs, events, _instance_calls (instance_rows)

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

How it is computed: a run's events are read from the store once (a temporary table, which DuckDB
spills beyond the connection's memory budget), its nodes streamed from there window by window
(one statement per CHUNK_NODES nodes); per window, every node's candidate predecessors,
one per edge rule, are computed for all nodes at once in numpy (sorting and searchsorted per rank,
kind or track; the launch and last-arrival rows by one (rank, event_id) index), and so is the one
the walk takes when nothing on the path rules it out (the usual choice). Every rank's path is then
listed at once as arrays by following the usual choices (pointer doubling: :func:`walks`); only a
path where the usual choice is ready after the cursor or already on the path is walked node by
node (:func:`walk`), re-choosing among that node's candidates. The nodes are read without their
names and classes; those are fetched for the path's events only, once per run. Memory: one
window's nodes of every rank at a time (numpy arrays, ~0.3 kB per node with the candidates), plus
the paths as Arrow tables until the tables are created, which are written in key order as built
(no sort). Time per run: one read of its events, then a statement per chunk of windows, per
window work linear in its nodes (times log2 of its longest path, for the doubling) and in its
path events, and one statement for the path events' names (benchmarks/README.md, "Critical
path").

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

CLASSES = ("compute", "comm", "memory", "cpu", "sync", "other")
_SYNC = CLASSES.index("sync") + 1
_COMPOSITION = {"compute": "compute_ns", "comm": "exposed_comm_ns", "memory": "memory_ns",
                "cpu": "launch_cpu_ns", "sync": "sync_other_ns", "other": "sync_other_ns"}
PARTS = ("compute_ns", "exposed_comm_ns", "memory_ns", "launch_cpu_ns", "sync_other_ns",
         "straggler_ns", "idle_ns")
"""The composition columns of critical_path_summary, in order; they sum to length_ns."""

# edge kinds (critical_path.edge) by code, and their tie order between predecessors ready at the
# same time: the higher wins ('end' is no edge)
_KINDS = ("end", "stream", "thread", "launch", "sync", "collective", "cross_stream", "host")
_PRIORITY = np.array([-1, 2, 2, 1, 3, 4, 0, 0], np.int8)
_END, _STREAM, _THREAD, _LAUNCH, _EDGE_SYNC, _COLLECTIVE, _CROSS, _HOST = range(len(_KINDS))
# part of PARTS an own event's time goes to, by events.class code (1-based into CLASSES; 0: none)
_CLASS_PART = np.array([PARTS.index(_COMPOSITION[c]) for c in ("other", *CLASSES)], np.int64)
_LAUNCH_CPU, _STRAGGLER, _IDLE = (PARTS.index(p) for p in ("launch_cpu_ns", "straggler_ns", "idle_ns"))

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
      -- a mismatched instance (collective_instances.mismatched) joins no ranks: no cross-rank edge
      AND NOT EXISTS (SELECT 1 FROM collective_instances i WHERE i.run_id = c.run_id AND i.pg_name = c.pg_name
                      AND i.win = c.win AND i.seq = c.seq AND i.mismatched)
    WINDOW w AS (PARTITION BY pg_name, win, seq)
) WHERE last_ns > ts_ns
QUALIFY row_number() OVER (PARTITION BY rank, event_id ORDER BY last_ns DESC, last_rank, last_eid) = 1
"""

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
# to fetch the names of the path's events only (:func:`_named`) rather than sort every node's
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

CHUNK_NODES = 1 << 17
"""Nodes per statement of _NODES (consecutive steps, or one bigger step): its sort stays within
the connection's memory budget (benchmarks/README.md, "Critical path")."""


def _distinct(a: np.ndarray) -> np.ndarray:
    """The distinct values of `a`, sorted (np.unique's result, by one sort: cheaper than its
    hashing on these int arrays)."""
    a = np.sort(a)
    return a[np.r_[True, a[1:] != a[:-1]]] if len(a) else a


class _Rows:
    """The rows of a window by (rank, event_id), to find many pairs at once (the pairs are
    distinct: an event_id is unique within its rank)."""

    def __init__(self, rank: np.ndarray, eid: np.ndarray):
        self._ranks, self._eids = _distinct(rank), _distinct(eid)
        self._keys, self._rows = np.zeros(0, np.int64), np.zeros(0, np.int64)
        if len(rank):
            keys = self._code(rank, eid)[0]
            self._rows = np.argsort(keys, kind="stable")
            self._keys = keys[self._rows]

    def _code(self, r: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(one int per pair: its rank's and event_id's positions among the rows' distinct ones;
        whether both occur there). Needs a row."""
        i = np.minimum(np.searchsorted(self._ranks, r), len(self._ranks) - 1)
        j = np.minimum(np.searchsorted(self._eids, e), len(self._eids) - 1)
        return i * len(self._eids) + j, (self._ranks[i] == r) & (self._eids[j] == e)

    def find(self, rank: np.ndarray, eid: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """Per query k with ok[k]: the row of (rank[k], eid[k]), else -1."""
        if not len(self._keys):
            return np.full(len(rank), -1, np.int64)
        q, found = self._code(rank, eid)
        at = np.minimum(np.searchsorted(self._keys, q), len(self._keys) - 1)
        return np.where(found & ok & (self._keys[at] == q), self._rows[at], -1)


def _chunks(con) -> list[tuple]:
    """(first step, last step, whole trace?) of each statement of _NODES for the run in
    _cp_events: consecutive steps of up to CHUNK_NODES nodes, or the whole trace of a run
    without steps."""
    if not con.execute("SELECT count(step) FROM _cp_events").fetchall()[0][0]:  # no steps: one window
        return [(None, None, True)]
    counts = con.execute("SELECT step, count(*) FROM _cp_events WHERE node AND step IS NOT NULL "
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


def _windows(con, kinds: list):
    """The windows of the run in _cp_events (its profiler steps, or the whole trace of a run
    without steps), one at a time in step order: (step, Arrow table of its rows of _NODES)."""
    for lo, hi, whole in _chunks(con):
        yield from _chunk_windows(con, [kinds, len(kinds) + 1, list(CLASSES), lo, hi, whole], whole)


def _chunk_windows(con, params: list, whole: bool):
    """The windows of one statement of _NODES, as :func:`_windows`."""
    import duckdb
    import pyarrow as pa

    steps = not whole
    while True:  # the sort runs before the first batch: retried as AnalysisConnection.execute
        try:
            reader = con.sql(_NODES, params=params).to_arrow_reader(1 << 16)
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
    rows = _Rows(c["rank"], c["event_id"])
    cols = {"rank": c["rank"].astype(np.int64), "event_id": c["event_id"], "gpu": c["gpu"], "tid": np.cumsum(new),
            "ts_ns": c["ts_ns"], "end_ns": c["end_ns"], "class": c["class"], "last_ns": c["last_ns"],
            "launch_row": rows.find(c["rank"], c["launch"], c["launched"]),
            "arrival_row": rows.find(c["last_rank"], c["last_eid"], c["arrived"])}
    return _Window(cols), rid, order


class _Ends:
    """Nodes grouped (by rank and kind, or by track) and, within a group, in (end, start,
    event_id) order, to find for many nodes at once the one that ended last by a given time."""

    def __init__(self, group: np.ndarray, w: "_Window"):
        self.order = np.lexsort((w.eid, w.s, w.e, group))  # sorted position → node
        self.at = np.empty_like(self.order)  # node → sorted position
        self.at[self.order] = np.arange(len(self.order))
        self.group = group[self.order]
        # (group, end) as one sortable int: the end's rank among the window's distinct ends
        self._values = w.ends
        self._m = len(w.ends) + 1
        self._keys = self.group * self._m + np.searchsorted(w.ends, w.e[self.order]) + 1

    def last_by(self, group: np.ndarray, t: np.ndarray, before: np.ndarray | None = None) -> np.ndarray:
        """Per query k: the node of group[k] ending last at or before t[k] (-1 if none); with
        `before`, only among the nodes sorted before position before[k] (a member's own position:
        so a zero-length node never precedes itself or a tie after it)."""
        k = np.searchsorted(self._keys, group * self._m + np.searchsorted(self._values, t, "right"), "right")
        if before is not None:
            k = np.minimum(k, before)
        found = k > np.searchsorted(self.group, group)  # some member of the group before k
        return np.where(found, self.order[k - 1], -1)


class _Window:
    """Every rank's nodes of one window (the columns of _NODES as numpy arrays, a row per node)
    and each node's predecessors: the candidates of every edge rule, and the one the walk takes
    when nothing on the path rules it out (the latest ready, then _PRIORITY, then rule order)."""

    RULES = 7  # columns of pred / ready / kind

    def __init__(self, t: dict):
        self.rank, self.eid, self.gpu = t["rank"], t["event_id"], t["gpu"]
        self.s, self.e, self.cls = t["ts_ns"], t["end_ns"], t["class"]
        n = len(self.s)
        rows = np.arange(n)
        new_rank = np.r_[True, self.rank[1:] != self.rank[:-1]] if n else np.zeros(0, bool)
        rank_no = np.cumsum(new_rank) - 1
        track = np.cumsum(new_rank | np.r_[True, t["tid"][1:] != t["tid"][:-1]][:n]) - 1
        self.ends = _distinct(self.e)
        pred = np.full((self.RULES, n), -1, np.int64)
        kind = np.zeros((self.RULES, n), np.int8)
        ready = np.zeros((self.RULES, n), np.int64)
        s, e, gpu = self.s, self.e, self.gpu

        def put(col, ok, j, r, k):
            pred[col] = np.where(ok, j, -1)
            ready[col] = np.where(ok, r, 0)
            kind[col] = k

        # inferred (cross_stream on the GPU, host on the CPU): the node of the rank's same kind
        # (any stream / thread) that ended last at or before the start
        kinds = _Ends(rank_no * 2 + gpu, self)
        j = kinds.last_by(rank_no * 2 + gpu, s, kinds.at)
        put(0, j >= 0, j, e[j], np.where(gpu, _CROSS, _HOST))
        # thread order: the node of the CPU thread ending last at or before the start
        tracks = _Ends(track, self)
        j = tracks.last_by(track, s, tracks.at)
        put(1, ~gpu & (j >= 0), j, e[j], _THREAD)
        # stream order: the op before by start (ready at its end, or this op's start: PDL)
        g = np.flatnonzero(gpu)
        g = g[np.lexsort((self.eid[g], s[g], track[g]))]
        same = track[g][1:] == track[g][:-1]
        j = np.full(n, -1, np.int64)
        j[g[1:][same]] = g[:-1][same]
        put(2, j >= 0, j, np.minimum(e[j], s), _STREAM)
        # launch: the runtime call, unless it returned only after the op ended (it waited for it)
        k = t["launch_row"]
        ok = gpu & (k >= 0) & (k != rows)
        ok &= ~self._blocking(k, rows)
        put(3, ok, k, np.minimum(e[k], s), _LAUNCH)
        # synchronization: a sync call waits for the rank's GPU op that ended last by its end
        j = kinds.last_by(rank_no * 2 + 1, e)
        put(4, ~gpu & (self.cls == _SYNC) & (j >= 0) & (e[j] > s), j, e[j], _EDGE_SYNC)
        # ... and a blocking call for its own GPU op (the one ending last, latest row on ties)
        ops = np.flatnonzero(gpu & (k >= 0))
        ops = ops[np.lexsort((ops, e[ops], k[ops]))]
        last = np.r_[k[ops][1:] != k[ops][:-1], True] if len(ops) else np.zeros(0, bool)
        j = np.full(n, -1, np.int64)
        j[k[ops][last]] = ops[last]
        put(5, ~gpu & (j >= 0) & self._blocking(rows, j), j, e[j], _EDGE_SYNC)
        # collective: the last arrival's span, at its start
        j = t["arrival_row"]
        put(6, j >= 0, j, t["last_ns"], _COLLECTIVE)
        self.pred, self.ready, self.kind = pred, ready, kind
        # the walk's usual choice: latest ready, then priority; the first rule on full ties
        best = np.zeros(n, np.int64)
        for col in range(1, self.RULES):
            b_ready, b_prio = ready[best, rows], _PRIORITY[kind[best, rows]]
            c_ready, c_prio = ready[col], _PRIORITY[kind[col]]
            better = (pred[col] >= 0) & ((pred[best, rows] < 0) | (c_ready > b_ready)
                                         | ((c_ready == b_ready) & (c_prio > b_prio)))
            best[better] = col
        self.usual = (pred[best, rows], ready[best, rows], kind[best, rows])
        self._best = None
        # each rank's start: its node ending last (latest start, then latest row, on ties)
        by_end = np.lexsort((rows, s, e, rank_no))
        self.starts = by_end[np.r_[rank_no[by_end][1:] != rank_no[by_end][:-1], True]] if n else by_end

    @property
    def best(self) -> tuple[list, list, list]:
        """The walk's usual choice per node (``usual``: predecessor, ready time, edge kind) as
        Python lists, for :func:`walk`."""
        if self._best is None:
            self._best = tuple(a.tolist() for a in self.usual)
        return self._best

    def _blocking(self, call: np.ndarray, op: np.ndarray) -> np.ndarray:
        """Whether launch call `call` returned only after its GPU op `op` ended (a blocking
        cudaMemcpy, pageable cudaMemcpyAsync): then op → call is an edge and call → op is not.
        Rows of -1 answer False."""
        ok = (call >= 0) & (op >= 0)
        c, o = np.where(ok, call, 0), np.where(ok, op, 0)
        return ok & (self.s[c] < self.e[o]) & (self.e[o] <= self.e[c])

    def choose(self, i: int, cursor: int, seen: set) -> tuple[int, int, int]:
        """(node, ready, kind) of node i's predecessor ready latest by `cursor` and not on the
        path yet (ties: _PRIORITY, then rule order); node -1 when none is left."""
        best = (-1, 0, _END)
        for col in range(self.RULES):
            j, r, k = int(self.pred[col, i]), int(self.ready[col, i]), int(self.kind[col, i])
            if j >= 0 and r <= cursor and j not in seen and (
                    best[0] < 0 or (r, _PRIORITY[k]) > (best[1], _PRIORITY[best[2]])):
                best = (j, r, k)
        return best


def walk(w: _Window, start: int, end: int) -> tuple[list[int], list[int], list[int]]:
    """The critical path ending at node `start` (its end `end`), walked backward: the nodes, the
    ready time through which each was entered from its predecessor (the cursor: the walk moves it
    there) and the kind of that edge (_END for the first node, whose ready time is its credited
    start, filled in by :func:`_credit`), latest node first."""
    pred, ready, kind = w.best
    nodes, readies, kinds = [], [], []
    seen: set[int] = set()
    i, cursor = start, end
    while True:
        seen.add(i)
        j, r, k = pred[i], ready[i], kind[i]
        if j >= 0 and (r > cursor or j in seen):
            j, r, k = w.choose(i, cursor, seen)
        nodes.append(i)
        if j < 0:
            readies.append(cursor)
            kinds.append(_END)
            return nodes, readies, kinds
        readies.append(r)
        kinds.append(k)
        cursor, i = r, j


def walks(w: _Window) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every rank's critical path of the window (one per node of ``w.starts``, in that order):
    (nodes, ready times, edge kinds: :func:`walk`'s three lists of each path, concatenated;
    the paths' lengths), int64 arrays.

    The same paths as :func:`walk` from each start, computed as arrays where the walk only follows
    each node's usual choice (``w.usual``): that is a chain in the graph where every node points
    to its usual predecessor, so the chain of every start is listed at once by pointer doubling
    (round k adds the nodes 2^k to 2^(k+1) − 1 steps back, from the 2^k-th predecessor of every
    node, itself squared each round). The walk leaves the usual choice only where its ready time
    is after the cursor (the ready time of the edge the walk came through; checked on the listed
    chain, in order) or its node is on the path already (then the chain loops: a node whose
    2^k-th predecessor still exists once 2^k ≥ the nodes is on or leads into a loop); a path
    with either is walked by :func:`walk`. Memory: the window's nodes and the paths' nodes, a few
    int64 each."""
    bp, br, bk = w.usual
    starts = np.asarray(w.starts, np.int64)
    n, k = len(bp), len(starts)
    if not k:
        e = np.zeros(0, np.int64)
        return e, e, e, e
    jump = np.append(np.where(bp >= 0, bp, n), n)  # node → its usual predecessor; n: none (absorbing)
    # loops: a node whose chain is still going after n steps
    far, hops = jump, 1
    while hops < n and np.any(far[starts] != n):
        far, hops = far[far], hops * 2
    loops = far[starts] != n
    # every start's chain, by pointer doubling: (path, position, node) entries
    path = np.flatnonzero(~loops)
    pos, node = np.zeros(len(path), np.int64), starts[path]
    step = jump
    hops = 1
    while True:
        nxt = step[node]
        more = nxt != n
        if not more.any():
            break
        path, pos, node = np.r_[path, path[more]], np.r_[pos, pos[more] + hops], np.r_[node, nxt[more]]
        step, hops = step[step], hops * 2
    order = np.lexsort((pos, path))
    path, pos, node = path[order], pos[order], node[order]
    lengths = np.bincount(path, minlength=k).astype(np.int64)
    first = pos == 0
    ready = br[node]
    # the cursor at each node: the path's end at the first, else the ready time walked through
    cursor = np.where(first, w.e[starts[path]], np.r_[0, ready[:-1]])
    last = np.r_[first[1:], True] if len(node) else first
    bad = np.zeros(k, bool)
    bad[path[(bp[node] >= 0) & (ready > cursor)]] = True
    bad |= loops
    readies = np.where(last, cursor, ready)
    kinds = np.where(last, _END, bk[node]).astype(np.int64)
    if not bad.any():
        return node, readies, kinds, lengths
    # the paths the walk leaves the usual choice on, walked one by one
    cuts = np.cumsum(lengths)[:-1]
    pieces = [list(x) for x in zip(np.split(node, cuts), np.split(readies, cuts), np.split(kinds, cuts))]
    for i in np.flatnonzero(bad):
        pieces[i] = [np.array(x, np.int64) for x in walk(w, int(starts[i]), int(w.e[starts[i]]))]
        lengths[i] = len(pieces[i][0])
    return (*(np.concatenate([p[c] for p in pieces]) for c in range(3)), lengths)


def _credit(w: _Window, ranks: np.ndarray, nodes: np.ndarray, readies: np.ndarray, kinds: np.ndarray,
            lengths: np.ndarray) -> dict:
    """The paths of one window (concatenated walks, latest node first; ranks: each path's rank,
    lengths: its nodes) credited: per node on_path_ns and gap_ns; per path the PARTS and start."""
    first = np.cumsum(lengths) - lengths
    path = np.repeat(np.arange(len(lengths)), lengths)
    starts = w.e[nodes[first]]
    # the cursor when a node is reached: the path's end, then its successor's ready time
    cursor = np.r_[0, readies[:-1]] if len(readies) else readies.copy()
    cursor[first] = starts
    s = w.s[nodes]
    seg = np.minimum(np.where(kinds == _END, s, np.maximum(s, readies)), cursor)
    ready = np.where(kinds == _END, seg, readies)
    on_path, gap = cursor - seg, seg - ready
    own = w.rank[nodes] == ranks[path]
    gap_part = np.where((kinds == _THREAD) | (kinds == _HOST), _LAUNCH_CPU, _IDLE)
    parts = np.zeros((len(lengths), len(PARTS)), np.int64)
    np.add.at(parts, (path, np.where(own, _CLASS_PART[w.cls[nodes]], _STRAGGLER)), on_path)
    np.add.at(parts, (path, np.where(own, gap_part, _STRAGGLER)), gap)
    return {"path": path, "first": first, "on_path": on_path, "gap": gap, "parts": parts,
            "start_ns": ready[first + lengths - 1], "end_ns": starts}


def _arrow(con, query: str, params: list):
    """The result of `query` as an Arrow table (no copy), retried with a raised memory budget as
    tracekit.store.AnalysisConnection.execute retries."""
    import duckdb

    while True:
        try:
            return con.sql(query, params=params).to_arrow_table()
        except duckdb.OutOfMemoryException:
            if not getattr(con, "raise_budget", lambda: False)():
                raise


def run_paths(con, run_id: str):
    """Per window (profiler step) of the run in _cp_events (with its _cp_arrivals), in step order:
    (path rows, summary rows) of every rank with nodes in it, as Arrow tables with the columns of
    _PATH_COLS (but rid, the event's row in _cp_events, in place of name and class: :func:`_named`
    adds them) and _SUMMARY_COLS (module docstring). A generator, so that one window's nodes are
    held at a time."""
    import pyarrow as pa

    kinds = [k for (k,) in con.execute(
        "SELECT DISTINCT track_kind FROM _cp_events WHERE node AND track_kind IS NOT NULL ORDER BY 1").fetchall()]
    for step, rows in _windows(con, kinds):
        w, rid, at = _window(rows)
        nodes, readies, kinds, lengths = walks(w)
        ranks = w.rank[w.starts]
        c = _credit(w, ranks, nodes, readies, kinds, lengths)
        # rows earliest first: each walk reversed; a node's edge is the kind of its successor's
        # edge (the node walked before it), 'end' for the last
        path = c["path"]
        back = np.arange(len(nodes)) - c["first"][path]  # position in the walk
        rev = (c["first"] + lengths - 1)[path] - back
        edge = np.where(back == 0, _END, np.r_[_END, kinds[:-1]])
        ev = nodes[rev]
        n, k = len(ev), len(lengths)
        rows = pa.table({
            "run_id": pa.array([run_id] * n, pa.string()), "rank": pa.array(ranks[path], pa.int32()),
            "step": pa.array([step] * n, pa.int64()), "pos": pa.array(back, pa.int32()),
            "event_rank": pa.array(w.rank[ev], pa.int32()), "event_id": pa.array(w.eid[ev]),
            "rid": pa.array(rid[at[ev]], pa.int64()),
            "start_ns": pa.array(w.s[ev]), "end_ns": pa.array(w.e[ev]),
            "on_path_ns": pa.array(c["on_path"][rev]), "gap_ns": pa.array(c["gap"][rev]),
            "edge": pa.DictionaryArray.from_arrays(pa.array(edge[rev].astype(np.int8)), pa.array(_KINDS)).cast(pa.string())})
        ev_rank = w.rank[nodes]
        ranks_seen = _distinct(ev_rank)  # distinct (path, event rank) pairs, as one int
        pairs = _distinct(path * len(ranks_seen) + np.searchsorted(ranks_seen, ev_rank))
        p_of = pairs // max(len(ranks_seen), 1)
        others = np.bincount(p_of[ranks_seen[pairs % max(len(ranks_seen), 1)] != ranks[p_of]], minlength=k)
        summary = pa.table({
            "run_id": pa.array([run_id] * k, pa.string()), "rank": pa.array(ranks, pa.int32()),
            "step": pa.array([step] * k, pa.int64()), "start_ns": pa.array(c["start_ns"]),
            "end_ns": pa.array(c["end_ns"]), **{p: pa.array(c["parts"][:, i]) for i, p in enumerate(PARTS)},
            "path_events": pa.array(lengths), "other_ranks": pa.array(others, pa.int32())})
        yield rows, summary


_PATH_COLS = {"run_id": "VARCHAR", "rank": "INTEGER", "step": "BIGINT", "pos": "INTEGER",
              "event_rank": "INTEGER", "event_id": "BIGINT", "name": "VARCHAR", "class": "VARCHAR",
              "start_ns": "BIGINT", "end_ns": "BIGINT", "on_path_ns": "BIGINT", "gap_ns": "BIGINT",
              "edge": "VARCHAR"}
_SUMMARY_COLS = {"run_id": "VARCHAR", "rank": "INTEGER", "step": "BIGINT", "start_ns": "BIGINT",
                 "end_ns": "BIGINT", **{p: "BIGINT" for p in PARTS}, "path_events": "BIGINT",
                 "other_ranks": "INTEGER"}
_SPAN_COLS = {"run_id": "VARCHAR", "step": "BIGINT", "rank": "INTEGER", "window_ns": "BIGINT"}
_ARROW = {"VARCHAR": "string", "INTEGER": "int32", "BIGINT": "int64"}


def _concat(tables: list, cols: dict[str, str]):
    """The Arrow tables, one after the other (no rows: the columns `cols`, DuckDB types)."""
    import pyarrow as pa

    if tables:
        return pa.concat_tables(tables)
    return pa.table({c: pa.array([], getattr(pa, _ARROW[t])()) for c, t in cols.items()})


def _key_order(con, tables: list):
    """One run's path rows (the tables of :func:`run_paths`, in step order; in each, rank then
    pos order) as one Arrow table in critical_path's key order (rank, step, pos) (a stable sort
    by rank, skipped when the rows are in that order already), named (:func:`_named`)."""
    import pyarrow as pa

    t = pa.concat_tables(tables)
    rank = t.column("rank").to_numpy()
    if len(rank) and np.any(rank[1:] < rank[:-1]):
        t = t.take(np.argsort(rank, kind="stable"))
    return _named(con, t)


def _named(con, t):
    """The path rows `t` (a column rid: rows of the run's _cp_events) with the columns name and
    class of those events in place of rid: one statement over the path's events only."""
    import pyarrow as pa

    rid = t.column("rid").to_numpy()
    con.register("_cp_rids", pa.table({"rid": _distinct(rid)}))
    try:
        names = _arrow(con, "SELECT rowid AS rid, name, class FROM _cp_events "
                            "WHERE rowid IN (SELECT rid FROM _cp_rids)", [])
    finally:
        con.unregister("_cp_rids")
    have = names.column("rid").to_numpy()
    order = np.argsort(have)
    at = order[np.searchsorted(have, rid, sorter=order)]
    return t.drop_columns(["rid"]).append_column("name", names.column("name").take(at)).append_column(
        "class", names.column("class").take(at))


def create(con) -> None:
    """Create the tables ``critical_path`` and ``critical_path_summary`` on ``con`` (needs the
    view _instance_calls of instance_rows). A run's events are read from the events view once,
    into a temporary table (spilled beyond the connection's memory budget); the paths are held as
    Arrow tables (~60 B per path row) until every run is walked."""
    paths, summaries, spans = [], [], []
    for (run_id,) in con.execute("SELECT DISTINCT run_id FROM runs ORDER BY run_id").fetchall():
        con.execute(_ARRIVALS, [run_id])
        con.execute(_EVENTS, [run_id])
        # each rank's own window span (first start to last end, any class)
        spans.append(_arrow(con, "SELECT ? AS run_id, step, rank, max(end_ns) - min(ts_ns) AS window_ns "
                                 "FROM _cp_events WHERE timed GROUP BY ALL", [run_id]))
        run_rows = []
        for rows, summary in run_paths(con, run_id):
            run_rows.append(rows)
            summaries.append(summary)
        if run_rows:
            paths.append(_key_order(con, run_rows))
    for name in ("_cp_events", "_cp_arrivals"):
        con.execute(f"DROP TABLE IF EXISTS {name}")
    for name, tables, cols in (("_cp_rows", paths, _PATH_COLS), ("_cp_summary", summaries, _SUMMARY_COLS),
                               ("_cp_spans", spans, _SPAN_COLS)):
        con.register(name, _concat(tables, cols))
    import duckdb

    keep = str(con.execute("SELECT current_setting('preserve_insertion_order')").fetchone()[0]).lower() in ("true", "1")
    changed = False
    try:
        # the rows are in key order already (_key_order): kept so, not sorted again. A connection whose
        # configuration is locked (tracekit sql) keeps its setting: the rows are the same, their
        # order DuckDB's
        if not keep:
            try:
                con.execute("SET preserve_insertion_order = true")
                changed = True
            except duckdb.Error:
                pass
        con.execute(
            f"""
            CREATE OR REPLACE TABLE critical_path AS
            SELECT {", ".join(f"{c}::{t} AS {c}" for c, t in _PATH_COLS.items())}
            FROM _cp_rows
            """
        )
        con.execute(
            f"""
            CREATE OR REPLACE TABLE critical_path_summary AS
            SELECT s.run_id, s.rank, s.step, s.start_ns, s.end_ns, s.end_ns - s.start_ns AS length_ns,
                   w.window_ns::BIGINT AS window_ns, {", ".join("s." + p for p in PARTS)}, s.path_events, s.other_ranks
            FROM _cp_summary s LEFT JOIN _cp_spans w ON w.run_id = s.run_id AND w.rank = s.rank
                                                    AND w.step IS NOT DISTINCT FROM s.step
            ORDER BY s.run_id, s.step, s.rank
            """
        )
    finally:
        if changed:
            con.execute("SET preserve_insertion_order = false")
        for name in ("_cp_rows", "_cp_summary", "_cp_spans"):
            con.unregister(name)



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


CRITICAL_PATH_AUTO_EVENTS = 1_000_000
"""Runs with more events (ranks.events summed) leave the critical path out of the report unless it
is asked for (``analyze --critical-path``, ``export --critical-path``): its cost grows with the
events read and the path's length (benchmarks/README.md, "Critical path")."""


def critical_path_wanted(con, run_id: str, want: bool | None) -> tuple[bool, str | None]:
    """(build it?, why not): ``want`` when given, else whether the run has at most
    CRITICAL_PATH_AUTO_EVENTS events."""
    if want is not None:
        return want, None if want else "left out (--no-critical-path)"
    n = con.execute("SELECT coalesce(sum(events), 0) FROM ranks WHERE run_id = ?", [run_id]).fetchone()[0]
    if n <= CRITICAL_PATH_AUTO_EVENTS:
        return True, None
    return False, (f"left out: the run has {n:,} events (> {CRITICAL_PATH_AUTO_EVENTS:,}); "
                   "--critical-path builds it (slow on big traces)")


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
