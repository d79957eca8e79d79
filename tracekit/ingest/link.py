"""Second pass of an ingest: link, classify and step-assign events; write the run's tables.

Per rank, :func:`tracekit.ingest.eventlink.link_rank` streams the staging rows the
reader wrote into the final events file (never the whole trace in memory):

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

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracekit import SCHEMA_VERSION, _arrow, spill
from tracekit._memory import release_free_memory
from tracekit._arrow import table_from_rows
from tracekit.errors import FileError
from tracekit.spill import ExternalSort, PositionStore
from tracekit.ingest.collectives import build_collectives
from tracekit.ingest.eventlink import CLIP_TOLERANCE_NS, link_rank
from tracekit.ingest.kineto import _BatchWriter
from tracekit.store import COLLECTIVES_SCHEMA, PARQUET_OPTS, RANKS_SCHEMA, RUNS_SCHEMA, glob_escape


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
    tables: list = []  # per rank: its collectives rows (COLLECTIVES_SCHEMA)
    rank_rows = []
    hosts = {}
    extent = {}
    for rf, rank, raw in sorted(zip(results, ranks, raw_files), key=lambda t: t[1]):
        cpu_only = not rf.has_gpu
        out = stage / "events" / f"rank={rank}.parquet"
        lk = link_rank(raw, out, run_id, rank, cpu_only, rf.steps, _BatchWriter)
        release_free_memory()
        n_clipped, max_clip, n_skew, max_skew = lk.n_clipped, lk.max_clip_ns, lk.n_skew, lk.max_skew_ns
        extent[rank] = (lk.ts_lo, lk.ts_hi)
        meta = rf.meta_rows(lk.spans, columns=cpu_only)
        rows = build_collectives(
            run_id, rank, meta, lk.launches, world_size=world_size, pg_config=pg_config, cpu_only=cpu_only,
            scratch=Path(raw).parent,
        )
        try:
            table = _RankCollectives(stage / f"collectives.rank={rank}.arrows", rank, rows)
        finally:
            lk.close()
        del meta, lk, rows
        release_free_memory()
        tables.append(table)
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
        if table.n_unattributed:
            warnings.append(
                f"{table.n_unattributed} communication span(s) unattributed (no collective metadata anywhere)"
            )
        if not table.num_rows and rf.events:
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
    mode = choose_alignment(align, hosts)
    if mode == "none" and align is None:  # an explicit --align none says the clocks are trusted
        _check_one_timeline(extent, results, ranks)
    offsets = estimate_offsets(_light_rows(tables) if mode != "none" else [], sorted(hosts), hosts, mode)
    con = None
    for rr in rank_rows:
        off, err, note = offsets.get(rr["rank"], (0, 0, None))
        rr["clock_offset_ns"], rr["clock_offset_err_ns"] = off, err
        if note:
            rr["warnings"].append(note)
        if off:
            if con is None:
                con = _shift_connection(stage)
            f = stage / "events" / f"rank={rr['rank']}.parquet"
            tmp = f.with_suffix(".shifting")
            con.execute(
                f"COPY (SELECT * REPLACE (ts_ns + {int(off)} AS ts_ns) FROM read_parquet({_sql_str(glob_escape(f))})) "
                f"TO {_sql_str(tmp)} (FORMAT parquet, COMPRESSION zstd)"
            )
            tmp.replace(f)
    if con is not None:
        con.close()
    with pq.ParquetWriter(stage / "collectives.parquet", COLLECTIVES_SCHEMA, **PARQUET_OPTS) as w:
        for t in tables:
            for part in t.tables(offsets.get(t.rank, (0, 0, None))[0]):
                w.write_table(part, row_group_size=COLLECTIVES_ROW_GROUP)
            t.remove()
    pq.write_table(table_from_rows(rank_rows, RANKS_SCHEMA), stage / "ranks.parquet", **PARQUET_OPTS)
    algo_proto = sorted(set().union(*(t.algo_proto for t in tables)), key=str)
    run_row = _run_row(run_id, results, [dict(algo=a, proto=p) for a, p in algo_proto], world_size, workload,
                       config, source)
    run_row["config"] = json.dumps(dict(config, clock_alignment=mode), sort_keys=True, default=str)
    pq.write_table(table_from_rows([run_row], RUNS_SCHEMA), stage / "run.parquet", **PARQUET_OPTS)
    shutil.rmtree(stage / "duckdb-tmp", ignore_errors=True)
    try:
        (stage / "raw").rmdir()
    except OSError:
        pass


COLLECTIVES_CHUNK = 4096
"""Collectives rows built as dicts before they become columns."""

COLLECTIVES_ROW_GROUP = 65_536
"""Rows per row group of collectives.parquet (and per table handed to its writer)."""


class _RankCollectives:
    """One rank's collectives rows, spilled to ``path`` (an Arrow IPC stream) as they are built,
    COLLECTIVES_CHUNK rows at a time, so that a run's collectives are never all in memory.

    A row whose trace gives no ``seq`` but whose op is known gets one: its position in its
    (rank, pg_name) group ordered by issue_ts_ns, then ts_ns, then event_id, counting from 0
    (the CPU's call order; a rank whose trace carries ``Seq`` keeps it; a row without an op
    gets none: it cannot be matched across ranks). Those rows go through an external sort
    (tracekit.spill) and, when there are any, the spill is rewritten once with their seq.
    Kept in memory: ``num_rows``, ``n_unattributed`` (rows with no op) and ``algo_proto``
    (the distinct (algo, proto) pairs). :meth:`tables` reads the rows back with a clock
    offset applied.
    """

    def __init__(self, path: Path, rank: int, rows):
        self.path, self.rank = path, rank
        self.num_rows = self.n_unattributed = 0
        self.algo_proto: set = set()
        self._pg: dict = {}
        todo = ExternalSort([np.int64, np.int64, np.int64, np.int64, np.int64], 5, spill.STATE_BUDGET, path.parent,
                            "seqfill")
        try:
            with pa.OSFile(str(path), "wb") as fh, pa.ipc.new_stream(fh, COLLECTIVES_SCHEMA) as w:
                chunk: list = []
                for r in rows:
                    chunk.append(r)
                    if len(chunk) >= COLLECTIVES_CHUNK:
                        self._spill(chunk, w, todo)
                        chunk = []
                if chunk:
                    self._spill(chunk, w, todo)
            if todo.rows:
                self._fill_seq(todo)
        finally:
            todo.close()

    def _spill(self, chunk: list, w, todo: ExternalSort) -> None:
        table = table_from_rows(chunk, COLLECTIVES_SCHEMA)
        n = table.num_rows
        seq_ok = _arrow.not_null(table.column("seq").combine_chunks())
        need = ~seq_ok & _arrow.not_null(table.column("op").combine_chunks())
        if need.any():
            pg = [r["pg_name"] for r, m in zip(chunk, need.tolist()) if m]
            todo.add(
                np.fromiter((-1 if v is None else self._pg.setdefault(v, len(self._pg)) for v in pg),
                            dtype=np.int64, count=len(pg)),
                _arrow.to_numpy(table.column("issue_ts_ns").combine_chunks())[0][need],
                _arrow.to_numpy(table.column("ts_ns").combine_chunks())[0][need],
                _arrow.to_numpy(table.column("event_id").combine_chunks())[0][need],
                np.flatnonzero(need) + self.num_rows,
            )
        self.num_rows += n
        self.n_unattributed += table.column("op").null_count
        self.algo_proto.update((r["algo"], r["proto"]) for r in chunk)
        w.write_table(table)

    def _fill_seq(self, todo: ExternalSort) -> None:
        """Number the rows of ``todo`` (pg code, issue ts, ts, event_id, row) per pg code in that
        order, then rewrite the spill with those seq."""
        with PositionStore([np.int64, np.bool_], spill.STATE_BUDGET, self.path.parent, "seq") as seq:
            group, at = None, 0  # the pg code of the rows numbered last, and the next number in it
            for pg, _issue, _ts, _eid, row in todo.batches():
                n = len(pg)
                new = np.empty(n, dtype=bool)
                new[0] = int(pg[0]) != group
                new[1:] = pg[1:] != pg[:-1]
                start = np.maximum.accumulate(np.where(new, np.arange(n), 0))
                number = np.arange(n) - start
                if not new[0]:  # the batch's first rows continue the previous batch's group
                    number[start == 0] += at
                seq.put(row, number, np.ones(n, dtype=bool))
                group, at = int(pg[-1]), int(number[-1]) + 1
            tmp = self.path.with_suffix(".filled")
            with pa.OSFile(str(self.path)) as src, pa.OSFile(str(tmp), "wb") as fh, \
                    pa.ipc.new_stream(fh, COLLECTIVES_SCHEMA) as w:
                i = COLLECTIVES_SCHEMA.get_field_index("seq")
                for b in pa.ipc.open_stream(src):
                    filled, ok = seq.take(b.num_rows)
                    old, old_ok = _arrow.to_numpy(b.column(i))
                    old_ok = _arrow.all_valid(old_ok, b.num_rows)
                    col = _arrow.from_numpy(np.where(ok, filled, old), pa.int64(), ok | old_ok)
                    w.write_batch(b.set_column(i, COLLECTIVES_SCHEMA.field(i), col))
        tmp.replace(self.path)

    def tables(self, offset_ns: int = 0, columns: list[str] | None = None):
        """The rows as COLLECTIVES_SCHEMA tables of about COLLECTIVES_ROW_GROUP rows (whole spilled
        chunks), ``offset_ns`` added to ts_ns and issue_ts_ns; only ``columns`` when given."""
        if not self.num_rows:
            return
        held = 0
        pending: list = []
        with pa.OSFile(str(self.path)) as fh:
            for b in pa.ipc.open_stream(fh):
                pending.append(b)
                held += b.num_rows
                if held >= COLLECTIVES_ROW_GROUP:
                    yield self._finish(pending, offset_ns, columns)
                    held, pending = 0, []
            if pending:
                yield self._finish(pending, offset_ns, columns)

    def _finish(self, batches: list, offset_ns: int, columns) -> pa.Table:
        table = pa.Table.from_batches(batches)
        if offset_ns:
            for name in ("ts_ns", "issue_ts_ns"):
                i = table.schema.get_field_index(name)
                vals, ok = _arrow.to_numpy(table.column(i).combine_chunks())
                shifted = _arrow.from_numpy(vals + int(offset_ns), pa.int64(), ok)
                table = table.set_column(i, table.schema.field(i), shifted)
        return table if columns is None else table.select(columns)

    def remove(self) -> None:
        Path(self.path).unlink(missing_ok=True)


def _light_rows(tables):
    """(rank, pg_name, seq, op, ts_ns, dur_ns) dicts of every collectives row, for the clock alignment."""
    cols = ["rank", "pg_name", "seq", "op", "ts_ns", "dur_ns"]
    for t in tables:
        for part in t.tables(columns=cols):
            yield from part.to_pylist()


def _shift_connection(stage: Path):
    """An in-memory DuckDB for shifting events files by a clock offset: bounded memory, spilling to
    the staging directory."""
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute("SET preserve_insertion_order = false")
    con.execute(f"SET memory_limit = '{SHIFT_MEMORY_LIMIT}'")
    con.execute(f"SET temp_directory = {_sql_str(stage / 'duckdb-tmp')}")
    return con


SHIFT_MEMORY_LIMIT = "256MB"
"""DuckDB's memory budget when events files are rewritten with a clock offset (it spills beyond it)."""


def _check_one_timeline(extent: dict, results, ranks) -> None:
    """Ranks of one run on one clock were profiled over a common window: their spans must share
    some time. Files of different runs (or days) fail here instead of giving absurd waits.

    ``extent``: rank → (first start, last end) in ns, (None, None) for a rank with no rows.
    Raises FileError naming the rank file that starts after another one ended.
    """
    spans = []
    for rf, rank in zip(results, ranks):
        lo, hi = extent.get(rank, (None, None))
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
