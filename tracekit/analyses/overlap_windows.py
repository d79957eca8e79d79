"""overlap_windows: communication, compute and their overlap per rank and window — a Python analysis.

Reads: overlap_summary, span_overlap, ranks, runs (events and collectives only for a run stored without
the summaries)

Definitions (DESIGN.md, "Overlap"), on unions of intervals so nothing is counted twice:
comm = |∪ comm intervals|, compute = |∪ compute intervals|, overlap = |comm ∩ compute|,
overlap_ratio = overlap / comm (as HTA defines it; NULL, never NaN, when comm = 0),
exposed_comm = comm − overlap. Intervals are events of class 'comm' / 'compute' with
dur_ns >= 0 (see tracekit.ingest.linkpass). A window is the whole trace (grp = -1) or one
profiler step (grp = step; GPU work belongs to the step that launched it).

How: the lengths are computed once per rank, at ingest, by
:func:`tracekit.timeline.intervals.rank_overlap_summary` (the union-length sweep
:class:`tracekit.timeline.intervals.UnionLengths` over the rank's comm and compute rows), and stored as the
run's ``overlap_summary`` (per rank and window) and ``span_overlap`` (per comm event) tables;
this module reads them, so analyze does not scan the events for overlap. A run ingested before
those tables existed gets the same rows from the same function here, its ranks' comm and compute
events read from the ``events`` view (CHUNK_EVENTS at a time, as gpu_time_breakdown reads them;
memory: those rows, ~50 B each). The same numbers as summing e − s over the islands of the views
comm_islands, compute_islands and overlap_islands (overlap_islands.sql), which tests check.

_overlap_summary (a view): the stored overlap_summary rows and those computed here, the columns
of tracekit.store.OVERLAP_SUMMARY_SCHEMA (pipeline_bubbles reads its recv and first/last columns);
_span_overlap (a view): likewise for span_overlap (collective_overlap in overlap.sql reads it).

overlap_windows: one row per (run_id, rank, grp) with any comm or compute, plus a whole-trace row
for every rank:

run_id          VARCHAR  run
rank            INTEGER  global rank
grp             BIGINT   -1 = whole trace, else the profiler step number
comm_ns         BIGINT   |∪ comm|, ns
compute_ns      BIGINT   |∪ compute|, ns
overlap_ns      BIGINT   |comm ∩ compute|, ns
exposed_comm_ns BIGINT   comm − overlap, ns
overlap_ratio   DOUBLE   overlap / comm; NULL when comm = 0
"""

from __future__ import annotations

import numpy as np


_EVENTS = """
SELECT rank, event_id, ts_ns, dur_ns, step, class = 'comm' AS is_comm, CASE WHEN class = 'comm' THEN name END AS name
FROM events
WHERE run_id = $1 AND rank BETWEEN $2 AND $3 AND class IN ('comm', 'compute')
ORDER BY rank
"""
"""The comm and compute events of ranks $2..$3 of run $1, grouped by rank (a run without summaries)."""


def _read(con, run_id: str, lo: int, hi: int):
    """_EVENTS as a pyarrow table; a read that runs out of DuckDB's memory is run again with a larger
    budget (``con.raise_budget``); past the largest one the OutOfMemoryException propagates."""
    import duckdb

    while True:
        try:
            return con.sql(_EVENTS, params=[run_id, lo, hi]).to_arrow_table()
        except duckdb.OutOfMemoryException:
            if not con.raise_budget():
                raise


def _computed(con, run_ids: list[str]):
    """(overlap_summary rows, span_overlap rows) as pyarrow tables for runs stored without them,
    from their events, by :func:`tracekit.timeline.intervals.rank_overlap_summary` per rank."""
    import pyarrow as pa

    from tracekit.timeline.intervals import rank_overlap_summary
    from tracekit.store import OVERLAP_SUMMARY_SCHEMA, SPAN_OVERLAP_SCHEMA

    from .gpu_time_breakdown import _by_rank, _rank_chunks

    wins, spans = [OVERLAP_SUMMARY_SCHEMA.empty_table()], [SPAN_OVERLAP_SCHEMA.empty_table()]
    for run_id in run_ids:
        keys = con.execute("SELECT run_id, rank, count(*) FROM events WHERE run_id = ? "
                           "AND class IN ('comm', 'compute') GROUP BY ALL ORDER BY rank", [run_id]).fetchall()
        recv = con.execute("SELECT rank, event_id FROM collectives WHERE run_id = ? AND op = 'recv'",
                           [run_id]).fetchnumpy()
        for _, lo, hi in _rank_chunks(keys):
            ev = _read(con, run_id, lo, hi)
            for rank, (a, b) in _by_rank(ev).items():
                t = ev.slice(a, b - a)
                is_comm = t.column("is_comm").to_numpy(zero_copy_only=False).astype(bool)
                w, sp = rank_overlap_summary(run_id, rank, t, is_comm, t.column("name").filter(pa.array(is_comm)),
                                             recv["event_id"][recv["rank"] == rank].astype(np.int64))
                wins.append(w)
                spans.append(sp)
    return pa.concat_tables(wins), pa.concat_tables(spans)


def create(con) -> None:
    """Create ``overlap_windows`` (a table) and the views ``_overlap_summary``, ``_span_overlap`` on
    ``con`` (an :class:`tracekit.store.AnalysisConnection`) from the store's summaries, computing
    them from ``events`` for the runs stored without (module docstring)."""
    both = {"overlap_summary", "span_overlap"}
    missing = sorted(r for r, tables in con.run_tables.items() if not both <= tables)
    wins, spans = _computed(con, missing)
    con.execute("CREATE OR REPLACE TEMP TABLE _summary_missing (run_id VARCHAR)")
    if missing:
        con.executemany("INSERT INTO _summary_missing VALUES (?)", [[r] for r in missing])
    for stored, tab in (("overlap_summary", wins), ("span_overlap", spans)):
        con.register("_summary_part", tab)
        con.execute(f"CREATE OR REPLACE TEMP TABLE _{stored}_computed AS SELECT * FROM _summary_part")
        con.unregister("_summary_part")
        # a run with one file but not the other (a partly copied run folder): all computed, none stored
        con.execute(f"CREATE OR REPLACE VIEW _{stored} AS SELECT * FROM {stored} "
                    f"WHERE run_id NOT IN (SELECT run_id FROM _summary_missing) "
                    f"UNION ALL SELECT * FROM _{stored}_computed")
    con.execute(
        """
        CREATE OR REPLACE TABLE overlap_windows AS
        WITH len AS (
            SELECT run_id, rank, grp, comm_ns AS cm, compute_ns AS cp, overlap_ns AS ov
            FROM _overlap_summary WHERE spans > 0
        ),
        keys AS (
            SELECT run_id, rank, grp FROM len
            UNION SELECT run_id, rank, -1::BIGINT FROM ranks
        )
        SELECT k.run_id, k.rank, k.grp,
               coalesce(l.cm, 0) AS comm_ns,
               coalesce(l.cp, 0) AS compute_ns,
               coalesce(l.ov, 0) AS overlap_ns,
               coalesce(l.cm, 0) - coalesce(l.ov, 0) AS exposed_comm_ns,
               CASE WHEN coalesce(l.cm, 0) > 0 THEN coalesce(l.ov, 0) / l.cm END AS overlap_ratio
        FROM keys k
        LEFT JOIN len l USING (run_id, rank, grp)
        """
    )
