"""gpu_time_breakdown: where each rank's GPU time goes, per whole trace and per profiler step, as
parts that sum exactly to the window — a Python analysis.

Reads: gpu_breakdown_summary, gpu_launcher_summary, ranks, runs (events only for a run stored without
those summaries)

The definitions (GPU work, windows, the seven labels of the sweep and their rules, the three idle
classes after HTA's idle-time breakdown, the launchers of a GPU op) and the numpy that computes them
are in tracekit/timeline/gpu.py, used by the ingest and here. The rows are computed once per rank,
at ingest (tracekit.ingest.assemble, from the rows the link pass writes), and stored as the run's
``gpu_breakdown_summary`` (per rank and window) and ``gpu_launcher_summary`` (per rank, launcher kind
and name) tables; this module reads them, so analyze does not read every GPU op and CPU range. A
run stored without both files (ingested before them, or one damaged: tracekit.store.SUMMARY_TABLES)
gets the same rows from the same functions here, its ranks read from the ``events`` view: per chunk
of consecutive ranks (up to CHUNK_EVENTS events) one scan of the GPU ops and the candidate
launchers together and, only when some GPU op has a launch link, one join for their launch calls;
memory grows with one chunk's GPU ops and CPU ranges (benchmarks/README.md has the figures). The
per-op tables gpu_launchers and gpu_idle_gaps are analyses/gpu_launchers.py (built only when a
statement names them). A run without GPU tracks (CPU-only gloo traces) has no rows.

_gpu_breakdown_summary, _gpu_launcher_summary (views): the stored rows of those tables and the rows
computed here, the columns of tracekit.store.GPU_BREAKDOWN_SUMMARY_SCHEMA /
GPU_LAUNCHER_SUMMARY_SCHEMA (gpu_time_by_launcher in kernel_summary.sql sums the second over ranks).

gpu_time_breakdown: one row per rank and window; the seven parts before idle_host_wait_ns sum to
window_ns, and the three idle classes sum to idle_ns.

run_id              VARCHAR  run
rank                INTEGER  global rank
grp                 BIGINT   -1 = whole trace, else the profiler step number
window_start_ns     BIGINT   start of the window's first GPU work, ns
window_end_ns       BIGINT   end of its last GPU work, ns
window_ns           BIGINT   window_end_ns − window_start_ns, ns
compute_only_ns     BIGINT   compute and no communication, ns
comm_exposed_ns     BIGINT   communication with no compute under it, ns
comm_hidden_ns      BIGINT   communication overlapped by compute, ns
memory_ns           BIGINT   memcpy/memset and no compute or communication, ns
sync_ns             BIGINT   sync events only, ns
other_ns            BIGINT   other GPU events only, ns
idle_ns             BIGINT   no GPU activity, ns
idle_host_wait_ns   BIGINT   idle gaps classed host_wait (gpu_idle_gaps), ns
idle_kernel_wait_ns BIGINT   idle gaps classed kernel_wait, ns
idle_other_ns       BIGINT   idle gaps classed other, ns
idle_fraction       DOUBLE   idle_ns / window_ns; NULL when window_ns = 0
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
    rank's CPU ranges with their names, which as plain strings were most of the module's peak."""
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


def _by_rank(tab) -> dict[int, tuple[int, int]]:
    """rank → (first row, end row) of a table grouped by its ``rank`` column."""
    r = tab.column("rank").to_numpy()
    b = np.flatnonzero(np.r_[True, r[1:] != r[:-1], True]) if len(r) else np.zeros(1, np.int64)
    return {int(r[x]): (int(x), int(y)) for x, y in zip(b[:-1], b[1:])}




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
    # chunks by the ranks' event counts as stored (ranks.events; a scan counting them cost 0.4 s at
    # 1,024 ranks)
    keys = con.execute("SELECT run_id, rank, coalesce(events, 0) FROM ranks WHERE list_contains(?, run_id) "
                       "ORDER BY run_id, rank", [run_ids]).fetchall()
    chunks = _rank_chunks(keys)
    for j, (run_id, lo, hi) in enumerate(chunks):
        lo = chunks[j - 1][2] + 1 if j and chunks[j - 1][0] == run_id else -2**31
        hi = hi if j + 1 < len(chunks) and chunks[j + 1][0] == run_id else 2**31 - 1
        # a chunk's ranks in one scan (a statement per rank cost ~0.1 s apiece at 1,024 ranks)
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


def create(con) -> None:
    """Create the table ``gpu_time_breakdown`` and the views ``_gpu_breakdown_summary``,
    ``_gpu_launcher_summary`` on ``con`` (an
    :class:`tracekit.store.AnalysisConnection`) from the store's GPU summaries, computing them from
    ``events`` for the runs stored without both (module docstring)."""
    from tracekit.timeline.gpu import summaries
    from tracekit.store import GPU_BREAKDOWN_SUMMARY_SCHEMA, GPU_LAUNCHER_SUMMARY_SCHEMA

    both = {"gpu_breakdown_summary", "gpu_launcher_summary"}
    missing = sorted(r for r, tables in con.run_tables.items() if not both <= tables)
    for stored, schema in (("gpu_breakdown_summary", GPU_BREAKDOWN_SUMMARY_SCHEMA),
                           ("gpu_launcher_summary", GPU_LAUNCHER_SUMMARY_SCHEMA)):
        con.register("_gpu_empty", schema.empty_table())
        con.execute(f"CREATE OR REPLACE TEMP TABLE _{stored}_computed AS SELECT * FROM _gpu_empty")
        con.unregister("_gpu_empty")
    from tracekit.errors import BadInputError

    for run_id, gpu, rg, lt, ls, le in _chunks(con, missing):
        try:
            wins, sums = summaries(gpu_arrays(gpu), (lt, ls, le), range_arrays(rg))
        except ValueError as exc:  # tracekit.timeline.gpu.sweep: a stray GPU timestamp
            raise BadInputError(f"run {run_id}: {exc}: the GPU time breakdown cannot be computed "
                                "(a GPU event's timestamp far from the others?)") from None
        del gpu, rg
        _insert(con, "_gpu_breakdown_summary_computed", wins, run_id)
        _insert(con, "_gpu_launcher_summary_computed", sums, run_id)
    con.execute("CREATE OR REPLACE TEMP TABLE _gpu_summary_missing AS SELECT unnest(?::VARCHAR[]) AS run_id", [missing])
    for stored in both:
        # a run with one file but not the other (a partly copied run folder): all computed, none stored
        con.execute(f"CREATE OR REPLACE VIEW _{stored} AS SELECT * FROM {stored} "
                    f"WHERE run_id NOT IN (SELECT run_id FROM _gpu_summary_missing) "
                    f"UNION ALL SELECT * FROM _{stored}_computed")
    con.execute("""
        CREATE OR REPLACE TABLE gpu_time_breakdown AS
        SELECT run_id, rank, grp, window_start_ns, window_end_ns,
               (window_end_ns - window_start_ns)::BIGINT AS window_ns,
               compute_only_ns, comm_exposed_ns, comm_hidden_ns, memory_ns, sync_ns, other_ns, idle_ns,
               idle_host_wait_ns, idle_kernel_wait_ns, idle_other_ns,
               CASE WHEN window_end_ns > window_start_ns
                    THEN idle_ns / (window_end_ns - window_start_ns) END AS idle_fraction
        FROM _gpu_breakdown_summary ORDER BY run_id, rank, grp""")
