"""nccl-tests logs → one run of source ``nccl_tests`` in the store.

Each result row of a log (one message size; out-of-place and in-place) becomes
a ``collectives`` row of rank 0 — the rank that prints the log — with the
log's own time (``dur_ns``, the average over its iterations, warm-up already
excluded by nccl-tests) and its algbw/busbw (``log_algbw_gbps``,
``log_busbw_gbps``). ``group_size`` is the number of ranks the log lists;
``pg_name`` is ``nccl_tests:<op>``. Rows sit one after another on a synthetic
timeline (``ts_ns``), so nothing downstream mistakes them for overlapping work;
the run has no ``events``. These runs feed the α–β fit (``collective_samples``).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracekit import SCHEMA_VERSION
from tracekit.ingest.attribute import dtype_bytes, wire_bytes_for
from tracekit.ingest.nccl_tests import parse_nccl_tests
from tracekit.store import combined_digest
from tracekit.store import COLLECTIVES_SCHEMA, EVENTS_SCHEMA, PARQUET_OPTS, RANKS_SCHEMA, RUNS_SCHEMA

_GAP_NS = 1_000  # between two synthetic rows


def build_nccl_tests_run(stage: Path, run_id: str, files: list[Path], digests: list[str], *, config: dict) -> None:
    """Parse ``files`` (nccl-tests logs) and write the run's tables into ``stage``.

    Raises FileError (from the parser) for a file that is not an nccl-tests log.
    """
    logs = [parse_nccl_tests(f) for f in files]
    rows = []
    t = 1_000_000_000  # 1 s: keeps every ts positive
    eid = 0
    for log in logs:
        pg = f"nccl_tests:{log.op}"
        seq = 0
        for r in log.rows:
            for in_place, time_us, algbw, busbw in (
                (False, r.oop_time_us, r.oop_algbw, r.oop_busbw),
                (True, r.ip_time_us, r.ip_algbw, r.ip_busbw),
            ):
                if time_us is None:
                    continue
                dur = round(time_us * 1000)
                k = r.group_size or log.group_size
                rows.append(dict(
                    run_id=run_id, rank=0, event_id=eid, pg_name=pg, pg_ranks=list(range(k)), group_size=k,
                    seq=seq, op=r.op or log.op, dtype=r.dtype, size_bytes=r.size_bytes,
                    wire_bytes=wire_bytes_for(r.op or log.op, r.size_bytes, k, None, 0, dtype_bytes(r.dtype)),
                    in_splits=None, out_splits=None, peer=None, algo=None, proto=None, ts_ns=t, dur_ns=dur,
                    meta_source="nccl_tests", approx=False, issue_ts_ns=t,
                    log_algbw_gbps=algbw, log_busbw_gbps=busbw, in_place=in_place,
                ))
                eid += 1
                seq += 1
                t += dur + _GAP_NS
    (stage / "events").mkdir()
    pq.write_table(EVENTS_SCHEMA.empty_table(), stage / "events" / "rank=0.parquet", **PARQUET_OPTS)
    pq.write_table(pa.Table.from_pylist(rows, schema=COLLECTIVES_SCHEMA), stage / "collectives.parquet", **PARQUET_OPTS)
    # One ranks row (rank 0 printed the logs); several logs share it through a combined digest.
    ranks = [dict(run_id=run_id, rank=0, host=None,
                  source_path=";".join(str(Path(f).resolve()) for f in files),
                  source_sha256=combined_digest(digests), clock_offset_ns=0, clock_offset_err_ns=0, events=0,
                  events_quarantined=0, warnings=[])]
    pq.write_table(pa.Table.from_pylist(ranks, schema=RANKS_SCHEMA), stage / "ranks.parquet", **PARQUET_OPTS)
    dev = next((x[3] for log in logs for x in log.ranks if x[3]), None)
    cfg = dict(config, logs=[dict(path=str(f), op=log.op, group_size=log.group_size, dtype=log.dtype,
                                  rows=len(log.rows), params=log.params) for f, log in zip(files, logs)])
    run = dict(
        run_id=run_id, created_at=datetime.now(timezone.utc), source="nccl_tests", workload="sweep",
        backend="nccl", world_size=max(log.group_size for log in logs), torch_version=None,
        nccl_version=next((log.nccl_version for log in logs if log.nccl_version), None), device_name=dev,
        config=json.dumps(cfg, sort_keys=True, default=str), schema_version=SCHEMA_VERSION,
    )
    pq.write_table(pa.Table.from_pylist([run], schema=RUNS_SCHEMA), stage / "run.parquet", **PARQUET_OPTS)
