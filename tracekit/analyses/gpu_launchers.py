"""gpu_launchers, gpu_idle_gaps: one row per GPU op with the CPU op / record_function range that
launched it, and one row per idle gap of each GPU time window — a Python analysis, built only when a
statement names one of them (tracekit.analyses: a late module; the reports read neither).

Reads: events, ranks

The definitions (GPU ops and work, windows, idle gaps and their classes, launchers) and the numpy
are tracekit/timeline/gpu.py's; the rows are read from the events per chunk of consecutive ranks
(:func:`_chunks`: one scan of the GPU ops and candidate launchers together, and only when some GPU op
has a launch link one join for their launch calls; memory: one chunk's GPU ops and CPU ranges). The
launchers summed per rank and name are gpu_time_by_launcher (kernel_summary.sql), the gaps summed
per class gpu_time_breakdown's idle_*_ns.

gpu_idle_gaps: one row per idle gap of a window (a table).

run_id      VARCHAR  run
rank        INTEGER  global rank
grp         BIGINT   -1 = whole trace, else the profiler step number
s           BIGINT   gap start (end of the GPU work before it), ns
e           BIGINT   gap end (start of the GPU work after it), ns
idle_ns     BIGINT   e − s, ns
launch_ts_ns BIGINT  earliest CPU launch (runtime call start) of the spans starting at e, ns; NULL when none is linked
idle_class  VARCHAR  host_wait / kernel_wait / other (tracekit/timeline/gpu.py)

gpu_launchers: one row per GPU op (events on GPU tracks, track_kind = 'gpu_stream', other than
gpu_user_annotation ranges: kernels, memcpy, memset, sync, whatever their duration; a table).

run_id          VARCHAR  run
rank            INTEGER  global rank
event_id        BIGINT   the GPU op (events.event_id)
launch_event_id BIGINT   its runtime launch call; NULL when not linked
cpu_op_id       BIGINT   innermost cpu_op enclosing the launch (events.event_id); NULL when none
cpu_op          VARCHAR  its name
annotation_id   BIGINT   innermost user_annotation (record_function) enclosing the launch; NULL when none
annotation      VARCHAR  its name
"""

from __future__ import annotations

import numpy as np

from tracekit.timeline.gpu import NONE as _NONE

_READ = """
SELECT rank, CASE WHEN track_kind = 'gpu_stream' THEN 2 ELSE (category = 'user_annotation')::INTEGER END::TINYINT AS kind,
       event_id, track, ts_ns AS s, dur_ns,
       CASE class WHEN 'compute' THEN 0 WHEN 'comm' THEN 1 WHEN 'memory' THEN 2 WHEN 'sync' THEN 3
                  ELSE CASE WHEN class IS NULL THEN 5 ELSE 4 END END::TINYINT AS k,
       step, launch_event_id, CASE WHEN track_kind = 'cpu_thread' THEN name END AS name
FROM events
WHERE run_id = $1 AND rank BETWEEN $2 AND $3
  AND ((track_kind = 'gpu_stream' AND category IS DISTINCT FROM 'gpu_user_annotation')
       OR (track_kind = 'cpu_thread' AND dur_ns > 0 AND ts_ns IS NOT NULL
           AND (category = 'cpu_op' OR (category = 'user_annotation' AND name NOT LIKE 'ProfilerStep#%'))))
"""
"""One scan of ranks $2..$3: their GPU ops (kind 2; class code k as :func:`sweep` takes it) and their
candidate launchers (kind 0 = cpu_op, 1 = user_annotation other than ProfilerStep#N, with a name),
in no particular order."""

_LAUNCH = """
SELECT q.i, l.track, l.ts_ns AS l_s, l.ts_ns + l.dur_ns AS l_e
FROM _gpu_launch_q q JOIN events l ON l.rank = q.rank AND l.event_id = q.launch_event_id
WHERE l.run_id = $1 AND l.rank BETWEEN $2 AND $3
"""
"""The launch calls (track, start, end) of the linked GPU ops ``_gpu_launch_q`` (i = their row in the
chunk's GPU ops, rank, launch_event_id), read only when some GPU op has a launch link."""


def _read_chunk(con, params) -> "pa.Table":
    """_READ's rows, streamed, each batch's names dictionary-encoded as it comes: a chunk holds a
    rank's CPU ranges with their names, which as plain strings would dominate the module's memory."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = []
    for b in con.sql(_READ, params=params).to_arrow_reader(1 << 16):
        i = b.schema.get_field_index("name")
        parts.append(b.set_column(i, "name", pc.dictionary_encode(b.column(i))))
    if not parts:
        return con.sql(_READ, params=params).to_arrow_table()
    return pa.Table.from_batches(parts)


def _col(tab, name: str, fill=None) -> np.ndarray:
    """A column of a pyarrow table as int64 numpy (nulls → ``fill``; no copy when it has none)."""
    import pyarrow.compute as pc

    c = tab.column(name)
    if c.null_count and fill is not None:
        c = pc.fill_null(c, fill)
    return c.to_numpy().astype(np.int64, copy=False)


CHUNK_EVENTS = 1 << 22
"""Events whose ranks are read together (ranks are taken together up to this many events; a larger
rank alone), so that a job of many small ranks costs a few statements, not several per rank."""


def _rank_chunks(keys):
    """(run_id, first rank, last rank) of consecutive ranks of one run holding up to CHUNK_EVENTS
    events together, from (run_id, rank, events) rows sorted by run and rank."""
    out, cur, n = [], None, 0
    for run_id, rank, cnt in keys:
        if cur is not None and cur[0] == run_id and n + cnt <= CHUNK_EVENTS:
            cur[2], n = rank, n + cnt
            continue
        if cur is not None:
            out.append(tuple(cur))
        cur, n = [run_id, rank, rank], cnt
    if cur is not None:
        out.append(tuple(cur))
    return out


def _chunks(con, run_ids: list[str]):
    """Per chunk of consecutive ranks of the runs ``run_ids`` (_rank_chunks of their ranks' event
    counts, widened to cover every rank number of the run: each events row is read once), the GPU
    ops and candidate launchers: (run_id, gpu, rg, lt, ls, le) with ``gpu`` the GPU ops (_READ rows,
    kind 2) sorted by rank, then step (NULL first), ``rg`` the candidate launchers (kind 0 / 1) and
    ``lt``, ``ls``, ``le`` the GPU ops' launch calls' track, start and end (int64, _NONE when not
    linked)."""
    import pyarrow as pa

    if not run_ids:
        return
    # chunks by the ranks' event counts as stored (ranks.events), not counted by a scan of the events
    keys = con.execute("SELECT run_id, rank, coalesce(events, 0) FROM ranks WHERE list_contains(?, run_id) "
                       "ORDER BY run_id, rank", [run_ids]).fetchall()
    chunks = _rank_chunks(keys)
    for j, (run_id, lo, hi) in enumerate(chunks):
        lo = chunks[j - 1][2] + 1 if j and chunks[j - 1][0] == run_id else -2**31
        hi = hi if j + 1 < len(chunks) and chunks[j + 1][0] == run_id else 2**31 - 1
        # a chunk's ranks in one scan, not a statement per rank
        t = _read_chunk(con, [run_id, lo, hi])
        kind = t.column("kind").to_numpy()
        rg = t.select(["rank", "kind", "event_id", "track", "s", "dur_ns", "name"]).filter(pa.array(kind < 2))
        gpu = t.select(["rank", "event_id", "s", "dur_ns", "k", "step", "launch_event_id"])
        del t
        # GPU ops by rank, then step (NULL first): the step windows come grouped
        g = np.flatnonzero(kind == 2)
        del kind
        step = gpu.column("step").take(pa.array(g))
        order = g[np.lexsort((_col(pa.table({"step": step}), "step", 0),
                              step.is_valid().to_numpy(zero_copy_only=False),
                              gpu.column("rank").take(pa.array(g)).to_numpy()))]
        del g, step
        gpu = gpu.take(pa.array(order))
        del order
        n = len(gpu)
        lt, ls, le = (np.full(n, _NONE, dtype=np.int64) for _ in range(3))
        linked = np.flatnonzero(gpu.column("launch_event_id").is_valid().to_numpy(zero_copy_only=False))
        if len(linked):
            con.register("_gpu_launch_q", pa.table({"i": linked, "rank": gpu.column("rank").take(pa.array(linked)),
                                                    "launch_event_id": gpu.column("launch_event_id").take(pa.array(linked))}))
            lc = con.sql(_LAUNCH, params=[run_id, lo, hi]).to_arrow_table()
            con.unregister("_gpu_launch_q")
            i = _col(lc, "i")
            lt[i], ls[i], le[i] = _col(lc, "track", _NONE), _col(lc, "l_s", _NONE), _col(lc, "l_e", _NONE)
        yield run_id, gpu, rg, lt, ls, le


def gpu_arrays(gpu) -> dict:
    """The GPU ops of :func:`_chunks` as the numpy arrays tracekit.timeline.gpu.breakdown reads."""
    return dict(rank=_col(gpu, "rank"), s=_col(gpu, "s"), dur=_col(gpu, "dur_ns", 0),
                k=gpu.column("k").to_numpy().astype(np.int8), step=_col(gpu, "step", 0),
                step_ok=gpu.column("step").is_valid().to_numpy(zero_copy_only=False))


def range_arrays(rg) -> dict:
    """The candidate launchers of :func:`_chunks` as the arrays tracekit.timeline.gpu.launchers reads
    (and their names, pyarrow)."""
    s = _col(rg, "s")
    return dict(kind=rg.column("kind").to_numpy(), rank=_col(rg, "rank"), track=_col(rg, "track", _NONE), s=s,
                e=s + _col(rg, "dur_ns"), name=rg.column("name"))


def _insert(con, table: str, tab, run_id: str, src: str = "SELECT * FROM _gpu_rank_part") -> None:
    """INSERT ``src`` over the pyarrow table ``tab`` (registered as _gpu_rank_part) into ``table``,
    run_id first."""
    if tab is None or len(tab) == 0:
        return
    con.register("_gpu_rank_part", tab)
    con.execute(f"INSERT INTO {table} SELECT $1, * FROM ({src})", [run_id])
    con.unregister("_gpu_rank_part")


def _launcher_table(gpu, rg, lt, ls, le):
    """gpu_launchers' columns after run_id for the GPU ops ``gpu`` among the candidate launchers
    ``rg`` (as :func:`_chunks` gives them), as a pyarrow table."""
    import pyarrow as pa

    from tracekit.timeline.gpu import NONE, launcher_names, launchers

    r = range_arrays(rg)
    found = launchers(_col(gpu, "rank"), lt, ls, le, r["kind"], r["rank"], r["track"], r["s"], r["e"])
    cols = {"rank": gpu.column("rank"), "event_id": gpu.column("event_id"),
            "launch_event_id": gpu.column("launch_event_id")}
    rid = np.r_[_col(rg, "event_id", NONE), 0]  # index −1 (none found) picks this placeholder, masked to NULL
    for kd, name, label in ((0, "cpu_op_id", "cpu_op"), (1, "annotation_id", "annotation")):
        f = found[kd]
        null = (f < 0) | (rid[f] == NONE)
        cols[name] = pa.array(rid[f], mask=null)
        cols[label] = launcher_names(f, r["name"], null)
    return pa.table(cols)


def create(con) -> None:
    """Create the tables ``gpu_idle_gaps`` and ``gpu_launchers`` on ``con`` from its ``events``."""
    from tracekit.timeline.gpu import breakdown

    con.execute("""
        CREATE OR REPLACE TABLE gpu_idle_gaps (run_id VARCHAR, rank INTEGER, grp BIGINT, s BIGINT, e BIGINT,
            idle_ns BIGINT, launch_ts_ns BIGINT, idle_class VARCHAR)""")
    con.execute("""
        CREATE OR REPLACE TABLE gpu_launchers (run_id VARCHAR, rank INTEGER, event_id BIGINT,
            launch_event_id BIGINT, cpu_op_id BIGINT, cpu_op VARCHAR, annotation_id BIGINT, annotation VARCHAR)""")
    runs = [r for (r,) in con.execute("SELECT DISTINCT run_id FROM ranks ORDER BY 1").fetchall()]
    for run_id, gpu, rg, lt, ls, le in _chunks(con, runs):
        g = gpu_arrays(gpu)
        _, gaps = breakdown(g["rank"], g["s"], g["dur"], g["k"], g["step"], g["step_ok"], ls)
        del g
        _insert(con, "gpu_idle_gaps", gaps, run_id,
                "SELECT rank, grp, s, e, e - s, launch_ts_ns, idle_class::VARCHAR FROM _gpu_rank_part")
        _insert(con, "gpu_launchers", _launcher_table(gpu, rg, lt, ls, le), run_id)
