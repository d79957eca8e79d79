"""Second pass of an ingest: link, classify and step-assign events; write the run's tables.

Runs in DuckDB over the raw rows the readers wrote (never the whole trace in
Python memory):

* ``launch_event_id``: a GPU event's runtime launch call on the CPU (the
  ``cudaLaunchKernel``/``hipLaunchKernel``... event with the same correlation id);
* ``class`` (DESIGN.md, "Classifying events"): ``comm`` for communication
  kernels (metadata or name) and, on CPU-only traces, the ``gloo:*`` spans;
  ``compute`` for other kernels and, on CPU-only traces, the ``cpu_op`` events
  of threads that do no communication; ``memory`` for memcpy/memset; ``sync``
  for ``cuda_sync`` and Stream/Event/Device synchronize calls; ``cpu`` for other
  CPU events; ``other`` for the rest of the GPU tracks;
* ``step``: the ``ProfilerStep#N`` window holding the event (GPU work: the
  window holding its launch).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from tracekit import SCHEMA_VERSION
from tracekit._arrow import table_from_rows
from tracekit.errors import FileError
from tracekit.ingest.collectives import assign_seq, build_collectives
from tracekit.store import COLLECTIVES_SCHEMA, PARQUET_OPTS, RANKS_SCHEMA, RUNS_SCHEMA

_SYNC_NAME = "(?i)(stream|event|device|context)synchronize|cuda_sync|hip(stream|event|device)synchronize"


def _sql_str(s: str) -> str:
    return "'" + str(s).replace("'", "''") + "'"


def finish_run(
    stage: Path, run_id, results, ranks, raw_files, *, workload, config, source, align: str | None = None
) -> None:
    """Write run.parquet, ranks.parquet, events/rank=R.parquet, collectives.parquet into ``stage``.

    ``align``: ``none`` | ``host`` | ``collectives`` (default: collectives when the
    ranks' hosts differ, else none); see :func:`tracekit.ingest.clocks.estimate_offsets`.
    """
    from tracekit.ingest.clocks import choose_alignment, estimate_offsets

    world_size = _world_size(results, ranks)
    pg_config = _pg_config(results)
    (stage / "events").mkdir()
    con = _link_connection(stage)
    all_rows: list[dict] = []
    rank_rows = []
    hosts = {}
    for rf, rank, raw in sorted(zip(results, ranks, raw_files), key=lambda t: t[1]):
        cpu_only = not rf.has_gpu
        out = stage / "events" / f"rank={rank}.parquet"
        # A connection of its own, closed before the collectives are built: DuckDB gives its
        # memory back then, so the link pass and the metadata rows never peak together.
        rcon = _link_connection(stage)
        try:
            step, step_join = _step_expr(rcon, rf.steps, "x.step_ts", f"steps_{rank}")
            rcon.execute(_events_sql(run_id, rank, raw, out, cpu_only, step, step_join))
            ev = f"read_parquet({_sql_str(out)})"
            # comm spans after clipping, with their launch call (GPU) for op attribution
            spans = {}
            launches = {}
            for eid, ts, dur, pid, tid, lts, ldur in rcon.execute(
                f"""
                SELECT k.event_id, k.ts_ns, k.dur_ns, l.device, l.track, l.ts_ns, l.dur_ns
                FROM {ev} k LEFT JOIN {ev} l ON k.launch_event_id = l.event_id
                WHERE k.class = 'comm'
                """
            ).fetchall():
                spans[eid] = (ts, dur)
                if lts is not None:
                    launches[eid] = (pid, tid, lts, lts + ldur)
            n_clipped, max_clip, n_skew, max_skew = rcon.execute(
                f"""
                SELECT (SELECT count(*) FROM {ev} WHERE clipped), (SELECT max(clipped_ns) FROM {ev} WHERE clipped),
                       count(*), max(l.ts_ns - k.ts_ns)
                FROM {ev} k JOIN {ev} l ON k.launch_event_id = l.event_id
                WHERE k.track_kind = 'gpu_stream' AND k.ts_ns < l.ts_ns
                """
            ).fetchone()
        finally:
            rcon.close()
        comm_meta = rf.load_comm_meta()
        for m in comm_meta:
            if m["event_id"] in spans:
                m["ts_ns"], m["dur_ns"] = spans[m["event_id"]]
        rows = build_collectives(
            run_id, rank, comm_meta, launches, world_size=world_size, pg_config=pg_config, cpu_only=cpu_only
        )
        del comm_meta
        all_rows.extend(rows)
        warnings = list(dict.fromkeys(rf.warnings))
        if rf.quarantined:
            warnings.append(f"{rf.quarantined} event(s) quarantined (missing or non-positive ts, negative dur)")
        if n_clipped:
            warnings.append(
                f"{n_clipped} GPU event(s) overlapped the next on their stream by more than {CLIP_TOLERANCE_NS} ns "
                f"and were clipped to its start (largest cut {max_clip / 1e3:.3f} µs)"
            )
        if n_skew:
            warnings.append(
                f"{n_skew} GPU event(s) start before their own launch call (largest skew {max_skew / 1e3:.3f} µs): "
                "CPU and GPU clocks disagree"
            )
        if rf.events == 0:
            warnings.append("metadata only: the file holds no complete events")
        n_unattr = sum(1 for r in rows if r["op"] is None)
        if n_unattr:
            warnings.append(f"{n_unattr} communication span(s) unattributed (no collective metadata anywhere)")
        if not rows and rf.events:
            warnings.append("no communication in this rank's trace")
        di = rf.meta.get("distributedInfo") if isinstance(rf.meta.get("distributedInfo"), dict) else {}
        host = str(rf.meta.get("host_name") or di.get("host") or "") or None
        hosts[rank] = host
        rank_rows.append(
            dict(
                run_id=run_id,
                rank=rank,
                host=host,
                source_path=str(Path(rf.path).resolve()),
                source_sha256=rf.sha256,
                clock_offset_ns=0,
                clock_offset_err_ns=0,
                events=rf.events,
                events_quarantined=rf.quarantined,
                warnings=warnings,
            )
        )
        Path(raw).unlink(missing_ok=True)
        if rf.meta_spill:
            Path(rf.meta_spill).unlink(missing_ok=True)
    assign_seq(all_rows)
    mode = choose_alignment(align, hosts)
    if mode == "none" and align is None:  # an explicit --align none says the clocks are trusted
        _check_one_timeline(con, stage, results, ranks)
    offsets = estimate_offsets(all_rows, sorted(hosts), hosts, mode)
    for rr in rank_rows:
        off, err, note = offsets.get(rr["rank"], (0, 0, None))
        rr["clock_offset_ns"], rr["clock_offset_err_ns"] = off, err
        if note:
            rr["warnings"].append(note)
        if off:
            f = stage / "events" / f"rank={rr['rank']}.parquet"
            tmp = f.with_suffix(".shifting")
            con.execute(
                f"COPY (SELECT * REPLACE (ts_ns + {int(off)} AS ts_ns) FROM read_parquet({_sql_str(f)})) "
                f"TO {_sql_str(tmp)} (FORMAT parquet, COMPRESSION zstd)"
            )
            tmp.replace(f)
    for r in all_rows:
        off = offsets.get(r["rank"], (0, 0, None))[0]
        if off:
            r["ts_ns"] += off
            r["issue_ts_ns"] += off
    con.close()
    pq.write_table(
        table_from_rows(all_rows, COLLECTIVES_SCHEMA), stage / "collectives.parquet", **PARQUET_OPTS
    )
    pq.write_table(table_from_rows(rank_rows, RANKS_SCHEMA), stage / "ranks.parquet", **PARQUET_OPTS)
    run_row = _run_row(run_id, results, all_rows, world_size, workload, config, source)
    run_row["config"] = json.dumps(dict(config, clock_alignment=mode), sort_keys=True, default=str)
    pq.write_table(table_from_rows([run_row], RUNS_SCHEMA), stage / "run.parquet", **PARQUET_OPTS)
    shutil.rmtree(stage / "duckdb-tmp", ignore_errors=True)
    try:
        (stage / "raw").rmdir()
    except OSError:
        pass


def _link_connection(stage: Path):
    """An in-memory DuckDB for the link pass: bounded memory, spilling to the staging directory."""
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute("SET preserve_insertion_order = false")
    con.execute(f"SET memory_limit = '{LINK_MEMORY_LIMIT}'")
    con.execute(f"SET temp_directory = {_sql_str(stage / 'duckdb-tmp')}")
    return con


LINK_MEMORY_LIMIT = "256MB"
"""DuckDB's memory budget for the link pass (it spills beyond it)."""

EVENTS_ROW_GROUP = 32_768
"""Rows per Parquet row group of events files. DuckDB's writer buffers a row group per
thread; at its default (122,880 rows of up to ~500-byte kernel names) that buffer was
most of the link pass's memory on large ranks (x16: 60 MB more at peak, and slower)."""

CLIP_TOLERANCE_NS = 100
"""Overlaps of consecutive GPU ops on one stream up to this are clock noise, not clipped."""


def _events_sql(
    run_id: str, rank: int, raw: str, out: Path, cpu_only: bool, step: str, step_join: str = ""
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
      sync_names AS (  -- Stream/Event/Device synchronize calls, by name (every match contains one of the ILIKEs)
        SELECT DISTINCT name FROM {src}
        WHERE (name ILIKE '%synchronize%' OR name ILIKE '%cuda_sync%') AND regexp_matches(name, {_sql_str(_SYNC_NAME)})
      ),
      linked AS (
        SELECT r.*, l.launch_id, coalesce(l.launch_ts, r.ts_ns) AS step_ts,
               (ct.track IS NOT NULL) AS on_comm_thread, g.next_ts, (sn.name IS NOT NULL) AS sync_name
        FROM {src} r
        LEFT JOIN launch l ON r.track_kind = 'gpu_stream' AND r.correlation = l.correlation
        LEFT JOIN comm_threads ct ON r.track_kind = 'cpu_thread' AND r.device = ct.device AND r.track = ct.track
        LEFT JOIN gpu_ops g ON r.event_id = g.event_id
        LEFT JOIN sync_names sn ON r.name = sn.name
      ),
      clipped AS (
        SELECT *, (next_ts IS NOT NULL AND ts_ns + dur_ns - next_ts > {CLIP_TOLERANCE_NS}) AS clipped,
               CASE WHEN next_ts IS NOT NULL AND ts_ns + dur_ns - next_ts > {CLIP_TOLERANCE_NS}
                    THEN ts_ns + dur_ns - greatest(next_ts, ts_ns) ELSE 0 END AS clipped_ns
        FROM linked
      )
      SELECT {_sql_str(run_id)} AS run_id, CAST({rank} AS INTEGER) AS rank, x.event_id, x.track_kind,
             x.device, x.track, x.category, x.name, x.ts_ns, x.dur_ns - x.clipped_ns AS dur_ns,
             x.correlation, x.external_id, x.launch_id AS launch_event_id,
             CASE
               WHEN x.is_comm THEN 'comm'
               WHEN {str(cpu_only).upper()} AND x.name IN ('c10d::send', 'c10d::recv_', 'c10d::recv_any_source_')
                 THEN 'comm'
               WHEN x.category = 'sync' OR x.sync_name THEN 'sync'
               WHEN x.category = 'kernel' THEN 'compute'
               WHEN x.category IN ('memcpy', 'memset') THEN 'memory'
               WHEN x.track_kind = 'gpu_stream' THEN 'other'
               WHEN {str(cpu_only).upper()} AND x.category = 'cpu_op' AND NOT x.on_comm_thread
                    AND NOT (x.name LIKE 'c10d::%' OR x.name LIKE 'nccl:%' OR x.name LIKE 'gloo:%'
                             OR x.name = 'record_param_comms')
                 THEN 'compute'
               ELSE 'cpu'
             END AS class,
             {step} AS step,
             x.clipped, x.clipped_ns
      FROM clipped x {step_join}
    ) TO {_sql_str(out)} (FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1, ROW_GROUP_SIZE {EVENTS_ROW_GROUP})
    """


STEP_TREE_MAX = 512
"""Up to this many profiler steps, an event's step is a binary-search CASE tree in SQL;
beyond it, an ASOF join over a steps table (which sorts every event). Binding the tree
costs ~0.04 s at 512 steps and grows with it (0.6 s at 4096), evaluating it ~25 ns a row."""


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


def _check_one_timeline(con, stage: Path, results, ranks) -> None:
    """Ranks of one run on one clock were profiled over a common window: their spans must share
    some time. Files of different runs (or days) fail here instead of giving absurd waits.

    Raises FileError naming the rank file that starts after another one ended.
    """
    spans = []
    for rf, rank in zip(results, ranks):
        f = stage / "events" / f"rank={rank}.parquet"
        lo, hi = con.execute(f"SELECT min(ts_ns), max(ts_ns + dur_ns) FROM read_parquet({_sql_str(f)})").fetchone()
        if lo is not None:
            spans.append((lo, hi, rf.path))
    if len(spans) < 2:
        return
    late = max(spans, key=lambda t: t[0])
    early = min(spans, key=lambda t: t[1])
    if late[0] > early[1]:
        gap_s = (late[0] - early[1]) / 1e9
        raise FileError(
            late[2],
            f"starts {gap_s:,.3f} s after {Path(early[2]).name} ends: not the same run "
            "(or clocks of different hosts: try --align collectives)",
        )


def _world_size(results, ranks) -> int:
    ws = 0
    for r in results:
        di = r.meta.get("distributedInfo")
        if isinstance(di, dict) and isinstance(di.get("world_size"), int):
            ws = max(ws, di["world_size"])
    return max(ws, max(ranks) + 1 if ranks else 1, len(results))


def _pg_config(results) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in results:
        di = r.meta.get("distributedInfo")
        if not isinstance(di, dict):
            continue
        for pg in di.get("pg_config") or []:
            if isinstance(pg, dict) and "pg_name" in pg and isinstance(pg.get("ranks"), list):
                out[str(pg["pg_name"])] = [x for x in pg["ranks"] if type(x) is int and 0 <= x < 2**31]
    return out


def _run_row(run_id, results, rows, world_size, workload, config, source) -> dict:
    from datetime import datetime, timezone

    meta = results[0].meta if results else {}
    di = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    dev = meta.get("deviceProperties")
    device_name = None
    if isinstance(dev, list) and dev and isinstance(dev[0], dict):
        device_name = dev[0].get("name")
    backend = di.get("backend")
    if isinstance(device_name, str) and ("AMD" in device_name or "Instinct" in device_name) and backend == "nccl":
        backend = "rccl"
    if not isinstance(backend, str) or not backend:
        if any(r.get("algo") or r.get("proto") for r in rows):
            backend = "nccl"
        elif rows and all(r.get("algo") is None for r in rows) and not (isinstance(dev, list) and dev):
            backend = "gloo"
        else:
            backend = config.get("backend") or "unknown"
    return dict(
        run_id=run_id,
        created_at=datetime.now(timezone.utc),
        source=source,
        workload=workload or config.get("workload") or "external",
        backend=backend,
        world_size=world_size,
        torch_version=config.get("torch_version") or meta.get("pytorch_version"),
        nccl_version=di.get("nccl_version"),
        device_name=device_name or config.get("device_name"),
        config=json.dumps(config, sort_keys=True, default=str),
        schema_version=SCHEMA_VERSION,
    )
