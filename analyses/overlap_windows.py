"""overlap_windows: communication, compute and their overlap per rank and window — a Python analysis.

Reads: events, ranks, runs

Definitions (DESIGN.md, "Overlap"), on unions of intervals so nothing is counted twice:
comm = |∪ comm intervals|, compute = |∪ compute intervals|, overlap = |comm ∩ compute|,
overlap_ratio = overlap / comm (as HTA defines it; NULL, never NaN, when comm = 0),
exposed_comm = comm − overlap. Intervals are events of class 'comm' / 'compute' with
dur_ns >= 0 (see tracekit.ingest.linkpass). A window is the whole trace (grp = -1) or one
profiler step (grp = step; GPU work belongs to the step that launched it).

How: each run's comm and compute events are streamed from DuckDB in (rank, start) order
(DuckDB's sort, within its memory budget, spilling beyond it), and
:class:`tracekit.intervals.UnionLengths` sweeps them batch by batch (the union-length sweep
documented there; equal starts may come in any order). Memory stays bounded by DuckDB's
budget and the number of windows, not the number of events, which a window function over a
rank's whole trace (a DuckDB window materialises its partition) could not give. The same
numbers as summing e − s over the islands of the views comm_islands, compute_islands and
overlap_islands (overlap.sql), which tests check.

One row per (run_id, rank, grp) with any comm or compute, plus a whole-trace row for every rank:

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


BATCH_ROWS = 65_536
"""Rows per batch streamed from DuckDB's scan into the sort, and from the sort into the sweep."""

_SPANS = """
SELECT rank, step, ts_ns AS s, ts_ns + dur_ns AS e, class = 'comm' AS in_a
FROM events
WHERE run_id = ? AND class IN ('comm', 'compute') AND ts_ns IS NOT NULL AND dur_ns >= 0
"""


def run_lengths(con, run_id: str) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
    """(windows as (rank, grp) tuples, comm_ns, compute_ns, overlap_ns) of one run, windows ascending.

    The spans come sorted by (rank, start) from DuckDB, BATCH_ROWS at a time.
    """
    import pyarrow.compute as pc

    from tracekit.intervals import UnionLengths

    acc = UnionLengths()
    for b in con.sql(_SPANS + " ORDER BY rank, s", params=[run_id]).to_arrow_reader(BATCH_ROWS):
        rank = b.column(0).to_numpy().astype(np.int64)
        step = pc.fill_null(b.column(1), 0).to_numpy().astype(np.int64)
        m = b.column(1).is_valid().to_numpy(zero_copy_only=False)
        s, e = b.column(2).to_numpy(), b.column(3).to_numpy()
        in_a = b.column(4).to_numpy(zero_copy_only=False).astype(bool)
        acc.add((rank, np.full(len(rank), -1, dtype=np.int64)), s, e, in_a)
        if m.any():
            acc.add((rank[m], step[m]), s[m], e[m], in_a[m])
    return acc.result()


def create(con) -> None:
    """Create the table ``overlap_windows`` on ``con`` (an :class:`tracekit.store.AnalysisConnection`)
    from its ``events`` and ``ranks`` views. A run whose scan runs out of DuckDB's memory is swept
    again with a larger budget (``con.raise_budget``); past the largest one the
    OutOfMemoryException propagates."""
    import duckdb

    cols: dict[str, list] = {k: [] for k in ("run_id", "rank", "grp", "cm", "cp", "ov")}
    for (run_id,) in con.execute("SELECT DISTINCT run_id FROM runs ORDER BY run_id").fetchall():
        while True:
            try:
                wins, cm, cp, ov = run_lengths(con, run_id)
                break
            except duckdb.OutOfMemoryException:
                if not con.raise_budget():
                    raise
        cols["run_id"] += [run_id] * len(wins)
        cols["rank"] += [w[0] for w in wins]
        cols["grp"] += [w[1] for w in wins]
        cols["cm"] += cm.tolist()
        cols["cp"] += cp.tolist()
        cols["ov"] += ov.tolist()
    con.execute(
        """
        CREATE OR REPLACE TABLE overlap_windows AS
        WITH len AS (
            SELECT unnest(?::VARCHAR[]) AS run_id, unnest(?::INTEGER[]) AS rank, unnest(?::BIGINT[]) AS grp,
                   unnest(?::BIGINT[]) AS cm, unnest(?::BIGINT[]) AS cp, unnest(?::BIGINT[]) AS ov
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
        """,
        [cols["run_id"], cols["rank"], cols["grp"], cols["cm"], cols["cp"], cols["ov"]],
    )
