"""overlap_windows: communication, compute and their overlap per rank and window — a Python analysis.

Reads: overlap_summary, span_overlap, ranks

Definitions (DESIGN.md, "Overlap"), on unions of intervals so nothing is counted twice:
comm = |∪ comm intervals|, compute = |∪ compute intervals|, overlap = |comm ∩ compute|,
overlap_ratio = overlap / comm (as HTA defines it; NULL, never NaN, when comm = 0),
exposed_comm = comm − overlap. Intervals are events of class 'comm' / 'compute' with
dur_ns >= 0 (see tracekit.ingest.linkpass). A window is the whole trace (grp = -1) or one
profiler step (grp = step; GPU work belongs to the step that launched it).

How: the lengths are computed once per rank, at ingest only, by
:func:`tracekit.timeline.intervals.rank_overlap_summary` (the union-length sweep
:class:`tracekit.timeline.intervals.UnionLengths` over the rank's comm and compute rows), and stored as the
run's ``overlap_summary`` (per rank and window) and ``span_overlap`` (per comm event) tables; this
module reads them and never scans the events. Every ingest path writes both files (empty for a run
without events); a run stored without one, or holding one damaged, is refused with one line, "ingest
it again with --replace" (:meth:`tracekit.store.AnalysisConnection.require_stored`), rather than
upgraded here: a second door to the same numbers is what this avoids. The same numbers as summing
e − s over the islands of the views comm_islands, compute_islands and overlap_islands
(overlap_islands.sql), which tests check.

_overlap_summary, _span_overlap (views): the stored overlap_summary and span_overlap rows, defined
once every run of the connection is checked to hold both files; the columns of
tracekit.store.OVERLAP_SUMMARY_SCHEMA / SPAN_OVERLAP_SCHEMA (pipeline_bubbles reads the recv and
first/last columns of the first, collective_overlap in overlap.sql the second).

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


def create(con) -> None:
    """Create ``overlap_windows`` (a table) and the views ``_overlap_summary``, ``_span_overlap`` on
    ``con`` (an :class:`tracekit.store.AnalysisConnection`) from the store's summaries. Raises
    StoreError (one line) for a run stored without them or with one damaged (module docstring)."""
    con.require_stored(("overlap_summary", "span_overlap"))
    for stored in ("overlap_summary", "span_overlap"):
        con.execute(f"CREATE OR REPLACE VIEW _{stored} AS SELECT * FROM {stored}")
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
