"""The link pass as tracekit 0.1 ran it, in DuckDB SQL: an independent reference for
tracekit.ingest.linkpass (which does the same in numpy).

``reference_link(raw_table, run_id, rank, cpu_only, steps)`` → (events table, spans,
launches, (n_clipped, max_clip, n_skew, max_skew)), from the same staging rows.
Tests only: it holds a whole rank in DuckDB.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

_SYNC_NAME = "(?i)(stream|event|device|context)synchronize|cuda_sync|hip(stream|event|device)synchronize"
CLIP_TOLERANCE_NS = 100
EVENTS_ROW_GROUP = 32_768
STEP_TREE_MAX = 512


def _sql_str(s: str) -> str:
    return "'" + str(s).replace("'", "''") + "'"


def _events_sql(
    run_id: str, rank: int, raw: str, out: Path, cpu_only: bool, step: str, step_join: str = "", pdl: bool = False,
    call_names: tuple = (),
) -> str:
    """COPY statement: raw rows → final events rows (launch link, clipping, class, step).

    Built to stream within LINK_MEMORY_LIMIT: the raw file is scanned once per use
    (no materialised CTE of a whole rank), hash-join build sides hold only runtime
    calls, GPU ops and comm threads, the sync-name regex runs once per distinct
    name, and the profiler step is the expression ``step`` over ``x.step_ts`` (with
    ``step_join`` added to the FROM clause), from :func:`_step_expr`: a binary-search
    CASE tree over the rank's steps instead of an ASOF join that sorts every event.
    """
    src = f"read_parquet({_sql_str(raw)})"
    call_names = "(" + ", ".join(_sql_str(n) for n in call_names) + ")" if call_names else "(NULL)"
    return f"""
    COPY (
      WITH launch AS (
        SELECT correlation, event_id AS launch_id, ts_ns AS launch_ts FROM {src}
        WHERE category IN ('runtime', 'driver') AND correlation IS NOT NULL
        QUALIFY row_number() OVER (PARTITION BY correlation ORDER BY (category = 'runtime') DESC, event_id) = 1
      ),
      comm_threads AS (  -- gloo's worker threads (gloo:send/recv run on the caller's thread)
        SELECT DISTINCT device, track FROM {src}
        WHERE track_kind = 'cpu_thread' AND is_comm AND name NOT IN ('gloo:send', 'gloo:recv')
      ),
      gpu_ops AS (  -- the next op's start on the same GPU stream (kernels, memcpy, memset only)
        SELECT event_id, lead(ts_ns) OVER (PARTITION BY device, track ORDER BY ts_ns, event_id) AS next_ts
        FROM {src} WHERE track_kind = 'gpu_stream' AND category IN ('kernel', 'memcpy', 'memset')
      ),
      cpu_calls AS (  -- CPU-only ranks without gloo spans: the outermost collective CPU op of each call
        SELECT device, track, ts_ns AS cs, ts_ns + dur_ns AS ce, event_id FROM (
          SELECT *, max(ts_ns + dur_ns) OVER (PARTITION BY device, track ORDER BY ts_ns, dur_ns DESC, event_id
                                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
          FROM {src}
          WHERE {str(cpu_only).upper()} AND track_kind = 'cpu_thread' AND NOT coalesce(is_comm, false)
            AND device IS NOT NULL AND track IS NOT NULL
            AND (name = 'record_param_comms' OR name IN {call_names})
            AND NOT EXISTS (SELECT 1 FROM {src} WHERE track_kind = 'cpu_thread' AND is_comm)
        ) WHERE prev_end IS NULL OR ts_ns >= prev_end
      ),
      blocking AS (  -- CPU-only ranks: a thread's collective CPU calls and waits (the time it is blocked)
        SELECT device, track, ts_ns AS bs, ts_ns + dur_ns AS be FROM {src}
        WHERE {str(cpu_only).upper()} AND track_kind = 'cpu_thread' AND device IS NOT NULL AND track IS NOT NULL
          AND NOT coalesce(is_comm, false)
          AND (name LIKE 'c10d::%' OR name LIKE 'nccl:%' OR name LIKE 'rccl:%' OR name LIKE 'gloo:%'
               OR name = 'record_param_comms')
      ),
      sync_names AS (  -- Stream/Event/Device synchronize calls, by name (every match contains one of the ILIKEs)
        SELECT DISTINCT name FROM {src}
        WHERE (name ILIKE '%synchronize%' OR name ILIKE '%cuda_sync%') AND regexp_matches(name, {_sql_str(_SYNC_NAME)})
      ),
      linked AS (
        SELECT r.*, l.launch_id, coalesce(l.launch_ts, r.ts_ns) AS step_ts,
               (ct.track IS NOT NULL) AS on_comm_thread, g.next_ts, (sn.name IS NOT NULL) AS sync_name,
               r.event_id IN (SELECT event_id FROM cpu_calls) AS is_call,
               EXISTS (SELECT 1 FROM blocking c WHERE r.track_kind = 'cpu_thread' AND c.device = r.device
                       AND c.track = r.track AND r.ts_ns < c.be AND c.bs < r.ts_ns + r.dur_ns) AS blocked
        FROM {src} r
        LEFT JOIN launch l ON r.track_kind = 'gpu_stream' AND r.correlation = l.correlation
        LEFT JOIN comm_threads ct ON r.track_kind = 'cpu_thread' AND r.device = ct.device AND r.track = ct.track
        LEFT JOIN gpu_ops g ON r.event_id = g.event_id
        LEFT JOIN sync_names sn ON r.name = sn.name
      ),
      clipped AS (
        SELECT *, (NOT {str(pdl).upper()} AND next_ts IS NOT NULL AND ts_ns + dur_ns - next_ts > {CLIP_TOLERANCE_NS}) AS clipped,
               CASE WHEN NOT {str(pdl).upper()} AND next_ts IS NOT NULL AND ts_ns + dur_ns - next_ts > {CLIP_TOLERANCE_NS}
                    THEN ts_ns + dur_ns - greatest(next_ts, ts_ns) ELSE 0 END AS clipped_ns,
               (next_ts IS NOT NULL AND ts_ns + dur_ns > next_ts) AS overlaps_next
        FROM linked
      )
      SELECT {_sql_str(run_id)} AS run_id, CAST({rank} AS INTEGER) AS rank, x.event_id, x.track_kind,
             x.device, x.track, x.category, x.name, x.ts_ns, x.dur_ns - x.clipped_ns AS dur_ns,
             x.correlation, x.external_id, x.launch_id AS launch_event_id,
             CASE
               WHEN x.is_comm OR x.is_call THEN 'comm'
               WHEN {str(cpu_only).upper()} AND x.name IN ('c10d::send', 'c10d::recv_', 'c10d::recv_any_source_')
                 THEN 'comm'
               WHEN x.category = 'sync' OR x.sync_name THEN 'sync'
               WHEN x.category = 'kernel' THEN 'compute'
               WHEN x.category IN ('memcpy', 'memset') THEN 'memory'
               WHEN x.track_kind = 'gpu_stream' THEN 'other'
               WHEN {str(cpu_only).upper()} AND x.category = 'cpu_op' AND NOT x.on_comm_thread AND NOT x.blocked
                    AND NOT (x.name LIKE 'c10d::%' OR x.name LIKE 'nccl:%' OR x.name LIKE 'rccl:%'
                             OR x.name LIKE 'gloo:%' OR x.name = 'record_param_comms')
                 THEN 'compute'
               ELSE 'cpu'
             END AS class,
             {step} AS step,
             x.clipped, x.clipped_ns, x.overlaps_next
      FROM clipped x {step_join}
    ) TO {_sql_str(out)} (FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1, ROW_GROUP_SIZE {EVENTS_ROW_GROUP})
    """


def _step_expr(con, steps, ts: str, name: str) -> tuple[str, str]:
    """SQL giving the profiler step of the event time ``ts``: (expression, extra FROM clause).

    The step is the window ``[start, end)`` that starts last at or before ts, if ts is
    before its end; otherwise NULL. ``steps``: (step, event_id, start_ns, end_ns) tuples.
    Up to :data:`STEP_TREE_MAX` windows this is a balanced CASE tree (log2(n) comparisons
    per event, no join); beyond, an ASOF join against temp table ``name`` made on ``con``.
    """
    order = sorted(steps, key=lambda s: (s[2], s[0]))
    if not order:
        return "CAST(NULL AS BIGINT)", ""
    if len(order) > STEP_TREE_MAX:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name}(step BIGINT, ts BIGINT, e BIGINT)")
        con.executemany(f"INSERT INTO {name} VALUES (?, ?, ?)", [(s[0], s[2], s[3]) for s in order])
        return f"CASE WHEN {ts} < s.e THEN s.step END", f"ASOF LEFT JOIN {name} s ON {ts} >= s.ts"
    starts = [int(s[2]) for s in order]

    def tree(lo: int, hi: int) -> str:  # ts >= starts[lo] and (hi == n or ts < starts[hi])
        if hi - lo == 1:
            return f"CASE WHEN {ts} < {int(order[lo][3])} THEN CAST({int(order[lo][0])} AS BIGINT) END"
        mid = (lo + hi) // 2
        return f"CASE WHEN {ts} < {starts[mid]} THEN {tree(lo, mid)} ELSE {tree(mid, hi)} END"

    return f"CASE WHEN {ts} < {starts[0]} THEN CAST(NULL AS BIGINT) ELSE {tree(0, len(order))} END", ""


def reference_link(raw: pa.Table, run_id: str, rank: int, cpu_only: bool, steps, tmp_path, pdl: bool = False):
    """Run the SQL link pass over ``raw`` (RAW_SCHEMA rows; dictionary columns are decoded).
    Its events file has one more column, ``overlaps_next`` (a GPU op running past the next op's
    start on its stream); the stats end with the count of those not clipped."""
    raw = pa.table({f.name: (raw.column(f.name).cast(pa.string()) if pa.types.is_dictionary(f.type)
                             else raw.column(f.name)) for f in raw.schema})
    src = tmp_path / f"ref_raw_{rank}.parquet"
    out = tmp_path / f"ref_events_{rank}.parquet"
    import pyarrow.parquet as pq

    pq.write_table(raw, src)
    con = duckdb.connect()
    step, step_join = _step_expr(con, steps, "x.step_ts", f"steps_{rank}")
    from tracekit.model.ops import canonical_op  # names a collective: the one rule shared with linkpass

    names = {n for n in raw.column("name").to_pylist() if n}
    calls = tuple(sorted(n for n in names if n.startswith(("c10d::", "nccl:", "rccl:")) and canonical_op(n, trace=True)))
    con.execute(_events_sql(run_id, rank, str(src), out, cpu_only, step, step_join, pdl, calls))
    ev = f"read_parquet({_sql_str(out)})"
    spans, launches = {}, {}
    for eid, ts, dur, pid, tid, lts, ldur in con.execute(
        f"""SELECT k.event_id, k.ts_ns, k.dur_ns, l.device, l.track, l.ts_ns, l.dur_ns
            FROM {ev} k LEFT JOIN {ev} l ON k.launch_event_id = l.event_id WHERE k.class = 'comm'"""
    ).fetchall():
        spans[eid] = (ts, dur)
        if lts is not None:
            launches[eid] = (pid, tid, lts, lts + ldur)
    stats = con.execute(
        f"""SELECT (SELECT count(*) FROM {ev} WHERE clipped), (SELECT max(clipped_ns) FROM {ev} WHERE clipped),
                   count(*), max(l.ts_ns - k.ts_ns)
            FROM {ev} k JOIN {ev} l ON k.launch_event_id = l.event_id
            WHERE k.track_kind = 'gpu_stream' AND k.ts_ns < l.ts_ns"""
    ).fetchone()
    kept = con.execute(f"SELECT count(*) FROM {ev} WHERE overlaps_next AND NOT clipped").fetchone()[0]
    return out, spans, launches, tuple(stats) + (kept,)
