"""collective_instances: one row per collective call, matched across ranks — a Python analysis.

Reads: instance_rows, collectives

The rows and their columns are those of the macro ``collective_instance_rows`` (see
analyses/instance_rows.sql for every column, its unit and its definition). This module
only builds the table part by part. The matchable collectives rows (the view _instance_calls) are
evaluated once into the temporary table CALLS; a run with more than PART_ROWS of them has them
ordered by part = hash(run_id, pg_name, seq) % parts, with ``parts = ceil(rows / PART_ROWS)``;
each part is then one statement, whose scan skips the other parts' row groups (DuckDB keeps
min/max per row group), so the build stays linear in the rows. The per-instance state of the
aggregation (the lists of each instance's rows) then holds one part's calls at a time, whatever
the size of the run (its memory by parts: benchmarks/README.md).

A table, computed once per connection: the fit, the verdicts, the waits and the report all
read it. The calls it is built from stay, evaluated once, in the temporary table CALLS (below).
"""

from __future__ import annotations


PART_ROWS = 16_384
"""Collectives rows per part (on average: a hash decides which part a call falls in)."""


CALLS = "__instance_calls"
"""Temporary table, for the connection's lifetime: the rows of the view ``_instance_calls``
evaluated once (its window functions over the collectives), with ``part`` set (0 when the run has
one part). collective_waits and collective_duplicates read it instead of evaluating the view again
(the report reads the waits three times)."""


def create(con) -> None:
    """Create the table ``collective_instances`` on ``con`` (needs the view _instance_calls and the
    macro collective_instance_rows), and the temporary table CALLS it is built from."""
    # the view evaluated once (its window functions over the collectives), then counted
    con.execute(f"CREATE OR REPLACE TEMP TABLE {CALLS} AS SELECT * FROM _instance_calls")
    (rows,) = con.execute(f"SELECT count(*) FROM {CALLS}").fetchone()
    parts = max(1, -(-rows // PART_ROWS))
    if parts > 1:
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE {CALLS} AS "
            f"SELECT * REPLACE (hash(run_id, pg_name, seq) % ? AS part) FROM {CALLS} ORDER BY part",
            [parts],
        )
    con.execute(f"CREATE OR REPLACE TABLE collective_instances AS SELECT * FROM collective_instance_rows('{CALLS}', 0)")
    for part in range(1, parts):
        con.execute(f"INSERT INTO collective_instances SELECT * FROM collective_instance_rows('{CALLS}', ?)", [part])
