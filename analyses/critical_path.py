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
(tests/test_critical_path.py checks it against networkx's dag_longest_path on one rank).

Limits: dependencies the trace does not record are only inferred (cross_stream, host: the
latest-ending candidate, which may be an unrelated stream or thread), and host waits on anything
but a sync call or another thread's node (locks, data loading, the network) show as launch/CPU or
idle; a rank's several GPUs are taken as one device. A collective whose last arriving span lies
in another window (step) is not followed. Clocks across hosts are taken as aligned
(ranks.clock_offset_ns is already applied to the store's times).

Memory: one window's nodes of every rank at a time (numpy arrays, ~110 B per node measured on
hta_ddp_v100's steps), plus the run's collective rows; the walk visits only the nodes on a path
(time per path event, not per node: ~15 µs).

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
                          arrival was theirs): this rank's step waiting on a straggler's work, ns
idle_ns          BIGINT   gaps on this rank before a GPU op whose stream and launch were ready
                          (launch latency, unrecorded waits), ns
path_events      BIGINT   events on the path
other_ranks      INTEGER  distinct ranks other than rank on the path
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np

CLASSES = ("compute", "comm", "memory", "cpu", "sync", "other")
_SYNC = CLASSES.index("sync") + 1
_COMPOSITION = {"compute": "compute_ns", "comm": "exposed_comm_ns", "memory": "memory_ns",
                "cpu": "launch_cpu_ns", "sync": "sync_other_ns", "other": "sync_other_ns"}
PARTS = ("compute_ns", "exposed_comm_ns", "memory_ns", "launch_cpu_ns", "sync_other_ns",
         "straggler_ns", "idle_ns")
"""The composition columns of critical_path_summary, in order; they sum to length_ns."""

# tie order between predecessors ready at the same time: the higher wins
_PRIORITY = {"collective": 4, "sync": 3, "stream": 2, "thread": 2, "launch": 1, "cross_stream": 0, "host": 0}

# every rank's nodes of one window in one statement (a statement per rank and window cost ~0.2 s
# each at 1,024 ranks: each scans the run's events); tid numbers the tracks within each rank
_NODES = """
SELECT rank, event_id, track_kind = 'gpu_stream' AS gpu,
       dense_rank() OVER (PARTITION BY rank ORDER BY track_kind, device, track) AS tid,
       ts_ns, ts_ns + dur_ns AS end_ns, coalesce(list_position(?, class), 0)::TINYINT AS class,
       coalesce(launch_event_id, -1) AS launch
FROM events
WHERE run_id = ? AND step IS NOT DISTINCT FROM ? AND ts_ns IS NOT NULL AND dur_ns >= 0
  AND ((track_kind = 'gpu_stream' AND category IS DISTINCT FROM 'gpu_user_annotation')  -- a label, not work
       OR category = 'runtime' OR class IN ('compute', 'comm', 'sync'))
ORDER BY rank, tid, end_ns, ts_ns, event_id
"""


class _Ends:
    """A subset of a window's nodes in (end, start, event_id) order, to find the one that ended
    last by a given time."""

    def __init__(self, w: "_Window", members: np.ndarray, order: np.ndarray):
        """order: an array over all the window's nodes, shared by disjoint subsets; this subset
        writes its members' ranks in it."""
        pos = np.flatnonzero(members)
        self.pos = pos[np.lexsort((w.eid[pos], w.s[pos], w.e[pos]))]
        self.e = w.e[self.pos]
        self.order = order
        order[self.pos] = np.arange(len(self.pos))
        # the walk asks one time at a time: bisect on lists costs ~0.3 µs, np.searchsorted ~3 µs
        self._e, self._pos = self.e.tolist(), self.pos.tolist()

    def last_by(self, t: int, i: int | None) -> int | None:
        """The position of the member ending last at or before t, among those before member i in
        this order (so a zero-length node never precedes itself or a tie after it; i = None: no
        such limit); None if none."""
        k = bisect_right(self._e, t)
        if i is not None:
            k = min(k, int(self.order[i]))
        return self._pos[k - 1] if k >= 1 else None


class _Window:
    """One rank's nodes in one window (the columns of _NODES as numpy arrays)."""

    def __init__(self, rank: int, t: dict, rows: slice):
        """t: the columns of _NODES as numpy arrays; rows: this rank's part of them."""
        self.rank = rank
        self.eid = t["event_id"][rows]
        self.gpu = t["gpu"][rows]
        self.tid = t["tid"][rows]
        self.s = t["ts_ns"][rows]
        self.e = t["end_ns"][rows]
        self.cls = t["class"][rows]  # 1-based index into CLASSES, 0: none
        self.launch = t["launch"][rows]
        self._by_eid = np.argsort(self.eid, kind="stable")
        self._eid_sorted = self.eid[self._by_eid].tolist()
        self._by_eid = self._by_eid.tolist()
        in_track, in_kind = np.empty(len(self.eid), np.int64), np.empty(len(self.eid), np.int64)
        bounds = np.flatnonzero(np.r_[True, self.tid[1:] != self.tid[:-1]]) if len(self.tid) else []
        self._tracks = {int(self.tid[b]): _Ends(self, self.tid == self.tid[b], in_track) for b in bounds}
        self._gpu = _Ends(self, self.gpu, in_kind)
        self._cpu = _Ends(self, ~self.gpu, in_kind)
        # stream order: each GPU op's previous op on its stream by start (-1: none). Not "the op
        # ending last before its start": with programmatic dependent launch (sm_90+) an op starts
        # before its predecessor ends, and the ingest keeps both whole (same_stream_overlaps)
        self._stream_prev = np.full(len(self.eid), -1, np.int64)
        g = np.flatnonzero(self.gpu)
        if len(g):
            g = g[np.lexsort((self.eid[g], self.s[g], self.tid[g]))]
            same = self.tid[g][1:] == self.tid[g][:-1]
            self._stream_prev[g[1:][same]] = g[:-1][same]
        self._stream_prev = self._stream_prev.tolist()
        # launch call's event_id → the GPU op it launched ending last (sorted ids, their ops)
        ops = np.flatnonzero(self.gpu & (self.launch >= 0))
        ops = ops[np.lexsort((self.e[ops], self.launch[ops]))]
        last = np.r_[self.launch[ops][1:] != self.launch[ops][:-1], True] if len(ops) else np.zeros(0, bool)
        self._launch_ids, self._launch_ops = self.launch[ops][last].tolist(), ops[last].tolist()

    def __len__(self) -> int:
        return len(self.eid)

    def pos(self, event_id: int) -> int | None:
        """The position of event_id among the nodes, or None."""
        k = bisect_left(self._eid_sorted, event_id)
        if k < len(self._eid_sorted) and self._eid_sorted[k] == event_id:
            return self._by_eid[k]
        return None

    def last(self) -> int:
        """The node ending last (latest start on ties)."""
        return int(np.lexsort((self.s, self.e))[-1])

    def preds(self, i: int):
        """[(ready_ns, kind, (self, position))] of node i's predecessors in this window (the
        collective edge, which may lead to another rank's window, is added by :func:`walk`)."""
        s, gpu = int(self.s[i]), bool(self.gpu[i])
        found = [((self._gpu if gpu else self._cpu).last_by(s, i), "cross_stream" if gpu else "host")]
        if not gpu:
            found.append((self._tracks[int(self.tid[i])].last_by(s, i), "thread"))
        out = [(int(self.e[j]), kind, (self, j)) for j, kind in found if j is not None]
        if gpu and self._stream_prev[i] >= 0:  # ready when it ended, or when this op started (PDL)
            j = self._stream_prev[i]
            out.append((min(int(self.e[j]), s), "stream", (self, j)))
        if gpu and self.launch[i] >= 0:
            k = self.pos(int(self.launch[i]))
            if k is not None and k != i and not self._blocking(k, i):
                out.append((min(int(self.e[k]), s), "launch", (self, k)))
        if not gpu and self.cls[i] == _SYNC:
            g = self._gpu.last_by(int(self.e[i]), None)  # i is no GPU member: nothing excluded
            if g is not None and self.e[g] > s:
                out.append((int(self.e[g]), "sync", (self, g)))
        g = None if gpu else self._launched(int(self.eid[i]))
        if g is not None and self._blocking(i, g):
            out.append((int(self.e[g]), "sync", (self, g)))
        return out

    def _launched(self, event_id: int) -> int | None:
        """The position of the GPU op ending last among those launched by event_id, or None."""
        k = bisect_left(self._launch_ids, event_id)
        if k < len(self._launch_ids) and self._launch_ids[k] == event_id:
            return self._launch_ops[k]
        return None

    def _blocking(self, call: int, op: int) -> bool:
        """Whether launch call `call` returned only after its GPU op `op` ended (a blocking
        cudaMemcpy, pageable cudaMemcpyAsync): then op → call is an edge and call → op is not."""
        return bool(self.s[call] < self.e[op] <= self.e[call])


def _last_arrivals(con, run_id: str) -> dict[tuple[int, int], tuple[int, int, int]]:
    """(rank, event_id) of a collective span → (rank, event_id, start_ns) of its instance's last
    arriving span, for the spans that arrived before it (lowest rank on ties, as the straggler)."""
    rows = con.execute(
        """
        SELECT rank, event_id, last_rank, last_eid, last_ns FROM (
            SELECT rank, event_id, ts_ns,
                   first(rank ORDER BY ts_ns DESC, rank) OVER w AS last_rank,
                   first(event_id ORDER BY ts_ns DESC, rank) OVER w AS last_eid,
                   max(ts_ns) OVER w AS last_ns
            FROM _instance_calls WHERE run_id = ?
            WINDOW w AS (PARTITION BY pg_name, win, seq)
        ) WHERE last_ns > ts_ns
        """,
        [run_id],
    ).fetchall()
    return {(r, e): (lr, le, ln) for r, e, lr, le, ln in rows}


def walk(windows, rank: int, arrivals) -> tuple[list[dict], dict]:
    """The critical path ending at `rank`'s last node of one window.

    windows: callable rank → _Window (of this window); arrivals: as :func:`_last_arrivals`.
    Returns (path rows, earliest first, with event_rank, event_id, on_path_ns, gap_ns, edge;
    summary dict with start_ns, end_ns and the PARTS).
    """
    w = windows(rank)
    i = w.last()
    end = cursor = int(w.e[i])
    parts = dict.fromkeys(PARTS, 0)
    rows: list[dict] = []
    seen: set[tuple[int, int]] = set()
    edge = "end"
    while True:
        seen.add((w.rank, int(w.eid[i])))
        s = int(w.s[i])
        cands = w.preds(i)
        arr = arrivals.get((w.rank, int(w.eid[i])))
        if arr is not None:
            ow = windows(arr[0])
            k = ow.pos(arr[1]) if ow is not None else None
            if k is not None:
                cands.append((arr[2], "collective", (ow, k)))
        cands = [c for c in cands if c[0] <= cursor and (c[2][0].rank, int(c[2][0].eid[c[2][1]])) not in seen]
        best = max(cands, key=lambda c: (c[0], _PRIORITY[c[1]])) if cands else None
        seg = min(max(s, best[0]) if best else s, cursor)
        ready = min(best[0], seg) if best else seg
        own = w.rank == rank
        parts[_COMPOSITION.get(CLASSES[w.cls[i] - 1] if w.cls[i] else "other", "sync_other_ns") if own
              else "straggler_ns"] += cursor - seg
        if best is not None and seg > ready:
            parts[gap_part(best[1]) if own else "straggler_ns"] += seg - ready
        rows.append({"event_rank": w.rank, "event_id": int(w.eid[i]), "on_path_ns": cursor - seg,
                     "gap_ns": seg - ready, "edge": edge})
        cursor = ready
        if best is None:
            break
        edge = best[1]
        w, i = best[2]
    rows.reverse()
    return rows, {"start_ns": cursor, "end_ns": end, **parts}


def _steps(con, run_id: str) -> list:
    """The windows of a run: its profiler steps, else [None] (the whole trace)."""
    steps = [s for (s,) in con.execute(
        "SELECT DISTINCT step FROM events WHERE run_id = ? AND step IS NOT NULL ORDER BY step", [run_id]).fetchall()]
    return steps or [None]


_NODE_TYPES = {"event_id": np.int64, "gpu": bool, "tid": np.int64, "ts_ns": np.int64, "end_ns": np.int64,
               "class": np.int8, "launch": np.int64}


def _window_rows(con, run_id: str, step) -> tuple[dict, dict[int, slice]]:
    """Every rank's nodes of one window: (the columns of _NODES as numpy arrays, rank → its rows)."""
    t = con.execute(_NODES, [list(CLASSES), run_id, step]).fetchnumpy()
    cols = {c: np.asarray(t[c], dtype=typ) for c, typ in _NODE_TYPES.items()}
    rank = np.asarray(t["rank"], dtype=np.int64)
    bounds = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1], True]) if len(rank) else np.zeros(1, np.int64)
    return cols, {int(rank[a]): slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])}


def run_paths(con, run_id: str):
    """Per window (profiler step) of one run, (path rows, summary rows) of every rank: dicts with
    the columns of _PATH_COLS and _SUMMARY_COLS (see the module docstring). A generator, so that
    one window's paths are held at a time."""
    arrivals = _last_arrivals(con, run_id)
    ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM events WHERE run_id = ? ORDER BY rank",
                                       [run_id]).fetchall()]
    for step in _steps(con, run_id):
        rows_of = _window_rows(con, run_id, step)
        cache: dict[int, _Window] = {}

        def windows(r, rows_of=rows_of, cache=cache):
            if r not in cache:
                if r not in rows_of[1]:
                    return None
                cache[r] = _Window(r, rows_of[0], rows_of[1][r])
            return cache[r]

        path, summary = [], []
        for rank in ranks:
            if windows(rank) is None:
                continue
            rows, summ = walk(windows, rank, arrivals)
            for n, row in enumerate(rows):
                path.append({"run_id": run_id, "rank": rank, "step": step, "pos": n, **row})
            summary.append({"run_id": run_id, "rank": rank, "step": step, **summ,
                            "path_events": len(rows),
                            "other_ranks": len({r["event_rank"] for r in rows} - {rank})})
        yield path, summary


_PATH_COLS = {"run_id": "VARCHAR", "rank": "INTEGER", "step": "BIGINT", "pos": "INTEGER",
              "event_rank": "INTEGER", "event_id": "BIGINT", "on_path_ns": "BIGINT", "gap_ns": "BIGINT",
              "edge": "VARCHAR"}
_SUMMARY_COLS = {"run_id": "VARCHAR", "rank": "INTEGER", "step": "BIGINT", "start_ns": "BIGINT",
                 "end_ns": "BIGINT", **{p: "BIGINT" for p in PARTS}, "path_events": "BIGINT",
                 "other_ranks": "INTEGER"}


_ARROW = {"VARCHAR": "string", "INTEGER": "int32", "BIGINT": "int64"}


def _append(con, name: str, cols: dict[str, str], rows: list[dict]) -> None:
    """Append `rows` to the temporary table `name` (created empty, with the given column types,
    on the first call of a connection's build) through Arrow."""
    import pyarrow as pa

    tbl = pa.table({c: pa.array([r[c] for r in rows], type=getattr(pa, _ARROW[t])()) for c, t in cols.items()})
    con.register(f"{name}_arrow", tbl)
    try:
        con.execute(f"INSERT INTO {name} SELECT * FROM {name}_arrow")
    finally:
        con.unregister(f"{name}_arrow")


def create(con) -> None:
    """Create the tables ``critical_path`` and ``critical_path_summary`` on ``con`` (needs the
    view _instance_calls of instance_rows)."""
    for name, cols in (("_cp_rows", _PATH_COLS), ("_cp_summary", _SUMMARY_COLS)):
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ({', '.join(f'{c} {t}' for c, t in cols.items())})")
    for (run_id,) in con.execute("SELECT DISTINCT run_id FROM runs ORDER BY run_id").fetchall():
        for path, summary in run_paths(con, run_id):
            _append(con, "_cp_rows", _PATH_COLS, path)
            _append(con, "_cp_summary", _SUMMARY_COLS, summary)
    con.execute(
        """
        CREATE OR REPLACE TABLE critical_path AS
        SELECT p.run_id, p.rank, p.step, p.pos, p.event_rank, p.event_id, e.name, e.class,
               e.ts_ns AS start_ns, e.ts_ns + e.dur_ns AS end_ns, p.on_path_ns, p.gap_ns, p.edge
        FROM _cp_rows p JOIN events e ON e.run_id = p.run_id AND e.rank = p.event_rank AND e.event_id = p.event_id
        ORDER BY p.run_id, p.rank, p.step, p.pos
        """
    )
    con.execute(
        f"""
        CREATE OR REPLACE TABLE critical_path_summary AS
        WITH win AS (
            SELECT run_id, rank, step, max(ts_ns + dur_ns) - min(ts_ns) AS window_ns
            FROM events WHERE ts_ns IS NOT NULL AND dur_ns >= 0 GROUP BY ALL
        )
        SELECT s.run_id, s.rank, s.step, s.start_ns, s.end_ns, s.end_ns - s.start_ns AS length_ns,
               w.window_ns, {", ".join("s." + p for p in PARTS)}, s.path_events, s.other_ranks
        FROM _cp_summary s LEFT JOIN win w ON w.run_id = s.run_id AND w.rank = s.rank
                                           AND w.step IS NOT DISTINCT FROM s.step
        ORDER BY s.run_id, s.step, s.rank
        """
    )
    con.execute("DROP TABLE _cp_rows")
    con.execute("DROP TABLE _cp_summary")


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
is asked for (``analyze --critical-path``, ``export --critical-path``): its walk is plain Python, tens of µs per event on a path
(benchmarks/README.md), the largest cost of ``analyze`` on a big trace."""


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
