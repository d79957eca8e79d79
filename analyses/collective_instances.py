"""collective_instances: one row per collective call, matched across ranks — a Python analysis.

Depends on: instance_rows, collectives

The rows and their columns are those of the macro ``collective_instance_rows`` (see
analyses/instance_rows.sql for every column, its unit and its definition). This module
only builds the table part by part: the calls are split by a hash of their key (run_id,
pg_name, seq) into ``ceil(rows / PART_ROWS)`` parts, each computed by one statement. The
holistic aggregates (mode, median, count DISTINCT) keep per-instance state outside DuckDB's
memory budget; one part at a time, that state covers about PART_ROWS collectives rows
whatever the size of the run. On a ×64 replica of hta_ddp_v100 (129k calls, 32 MB budget)
the table took +145 MiB built in one statement, +43 MiB in eight parts.

A table, computed once per connection: the fit, the verdicts, the waits and the report all
read it.
"""

from __future__ import annotations

DEPENDS = ("instance_rows", "collectives")
CREATES = ("collective_instances",)

PART_ROWS = 16_384
"""Collectives rows per part (on average: a hash decides which part a call falls in)."""


def create(con) -> None:
    """Create the table ``collective_instances`` on ``con`` (needs the macro collective_instance_rows)."""
    (rows,) = con.execute("SELECT count(*) FROM collectives WHERE op IS NOT NULL AND seq IS NOT NULL").fetchone()
    parts = max(1, -(-rows // PART_ROWS))
    con.execute("CREATE OR REPLACE TABLE collective_instances AS SELECT * FROM collective_instance_rows(?, 0)", [parts])
    for part in range(1, parts):
        con.execute("INSERT INTO collective_instances SELECT * FROM collective_instance_rows(?, ?)", [parts, part])
