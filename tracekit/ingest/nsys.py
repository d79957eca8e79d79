"""Nsight Systems (``nsys export --type sqlite``) → raw event rows, streamed table by table.

Same contract as :func:`tracekit.ingest.kineto.read_rank_file`, once per rank:
:func:`read_nsys_report` writes rows of :data:`~tracekit.ingest.staging.RAW_SCHEMA` to one
staging file (Arrow IPC) per rank and returns a :class:`~tracekit.ingest.staging.RankFile`
for each, so linking, collectives and the analyses run unchanged. A report of one process
is one rank; a report of a whole job (``nsys profile torchrun ...``) holds one rank per
process with GPU work, each read with every query restricted to that process (CUPTI
numbers correlation ids per process, so launches and kernels are joined within it), all
on the report's clock. Several reports of one job (one per node or per rank) ingest as one
run. ``.nsys-rep`` reports are exported first with ``nsys export --type sqlite`` when nsys
is on PATH (:func:`export_report`), else refused with the command to run.

What is read (tables that are absent are skipped; columns differ between export
schema versions, so every SELECT is built from ``PRAGMA table_info``):

* ``CUPTI_ACTIVITY_KIND_KERNEL`` → ``kernel`` on ``gpu_stream`` (device = deviceId,
  track = streamId, correlation = correlationId); the name is the demangled name
  (else short, else mangled) through ``StringIds``; communication by the comm regex;
* ``..._MEMCPY`` / ``..._MEMSET`` → ``memcpy`` / ``memset`` with Kineto-style names
  (``Memcpy HtoD (Pageable -> Device)``);
* ``..._SYNCHRONIZATION`` → ``sync``: on its GPU stream when it has one, else on the
  CPU thread of the API call with the same correlation id;
* ``..._RUNTIME`` (CUDA runtime and driver API calls) → ``runtime`` / ``driver`` on
  ``cpu_thread`` (pid = globalTid >> 24 & 0xFFFFFF, tid = globalTid & 0xFFFFFF), name
  without the ``_v7000`` version suffix. Exports taken with CUDA backtraces (schema 2.x)
  hold a second, enclosing row per call (event class "CUDA backtrace"); one row per
  correlation id is kept, the API call itself;
* ``NVTX_EVENTS`` push/pop and start/end ranges → ``nvtx`` on their CPU thread. NCCL's
  own ranges (``ncclAllReduce``, ``ncclAllGather``, ...) also become a metadata row that
  plays the part of Kineto's ``record_param_comms`` for the kernel launched inside the
  range: the op, and the size when the range carries NCCL's payload (``Message size
  [bytes]``, or a count and datatype). NCCL's message size is one rank's buffer; the
  nccl-tests size of all-gather (output) and reduce-scatter (input) is that × the group
  size, taken from ``ncclCommInitRank``'s ``No. of ranks`` when the file has exactly one
  such value (else all-gather is scaled by the world size and flagged approximate, and
  reduce-scatter's size is left unknown). The payload's ``NCCL communicator ID`` names the
  process group (``nccl-comm-<hex>``), whose ``ncclCommInitRank`` gives its size. Calls
  between ``ncclGroupStart`` and ``ncclGroupEnd`` (whose range encloses the group's one
  launch) are stretched over the group (:func:`_apply_groups`); torch's own ranges
  (``nccl:all_to_all, op_id = 7``) name the op as Kineto's ``nccl:*`` CPU ops do. The
  backend is nccl when NCCL kernels or ranges are there. Payloads are read from
  ``jsonText``; binary payloads (``NVTX_PAYLOAD_SCHEMAS``) are not decoded;
* ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` (graphs traced whole) → ``cuda_graph`` spans on
  their stream. When CUDA graphs ran but no kernel inside them was traced, the rank
  gets a warning: communication inside the graphs is invisible to the overlap numbers.
* ``TARGET_INFO_GPU`` (device names → ``meta["deviceProperties"]``),
  ``TARGET_INFO_SESSION_START_TIME``, ``TARGET_INFO_SYSTEM_ENV`` (host name),
  ``EXPORT_META_DATA`` (schema 2.x) / ``META_DATA_EXPORT`` (3.x), ``ThreadNames``.

Times are int64 ns in the file, relative to the capture's start; tracekit adds the
session's UTC start (``utcEpochNs``) so that ranks captured by separate nsys sessions
share one (wall) clock. Rows with start ≤ 0, a missing end or end < start are
quarantined (counted, not stored).

Rank (:func:`_assign_process_ranks`): the launcher's ``RANK`` (or ``OMPI_COMM_WORLD_RANK``,
``PMI_RANK``, ``SLURM_PROCID``...; ``LOCAL_RANK`` alone on one node) in the environment nsys
recorded for the process (``META_DATA_CAPTURE``); else the file name (``rank3``,
``worker3``...; one-process files); else an NVTX thread name ``MPI Rank N`` (nsys' MPI
tracing); else the ``Rank`` of NCCL's ``ncclCommInitRank`` range; else the CUDA device and
pid order (several processes; a warning says which of the last two was used); a lone
process without any is rank 0, several files without any are numbered in file order.

The file is opened read-only and read with cursors in batches; no table is ever held
whole in Python memory.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import numpy as np
import pyarrow as pa

from tracekit.errors import FileError
from tracekit.ingest.attribute import dtype_bytes
from tracekit.model.ops import canonical_op
from tracekit.ingest.staging import META_FIELDS, RankFile, open_stage_writer, raw_batch, sha256_file

BATCH_ROWS = 50_000

_INT64_MAX = 2**63 - 1
_NO_STREAM = (None, 0xFFFFFFFF, -1)  # CUPTI's "invalid" stream id in sync records

# Enums for Kineto-style memcpy/memset/sync names: copy kinds (ENUM_CUDA_MEMCPY_OPER) and sync
# types (ENUM_CUPTI_SYNC_TYPE) follow CUPTI; memory kinds are nsys' own numbering
# (ENUM_CUDA_MEM_KIND, 0 = pageable ... 7 = unknown), read from the file when it has the table.
_COPY_KIND = {
    1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH", 10: "PtoP",
    11: "HtoD (Unified)", 12: "DtoH (Unified)", 13: "DtoD (Unified)",
}
_MEM_KIND = {
    0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
    6: "Managed Static", 7: "Unknown",
}
_SYNC_TYPE = {1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}

# nsys event types (ENUM_NSYS_EVENT_TYPE; the same numbers in schema 2.9 and 3.13).
_NVTX_RANGE_TYPES_DEFAULT = {59, 60, 70, 71}  # Nvtx(t)PushPopRange, Nvtx(t)StartEndRange
_NVTX_RANGE_TYPE_NAMES = ("NvtxPushPopRange", "NvtxStartEndRange", "NvtxtPushPopRange", "NvtxtStartEndRange")
_NVTX_DOMAIN_CREATE_DEFAULT = 75
_NVTX_THREAD_DEFAULT = 39
# nsys event classes of the duplicate rows a backtrace-enabled capture writes (ENUM_NSYS_EVENT_CLASS).
_BACKTRACE_CLASSES_DEFAULT = (67, 68, 69)

_NCCL_DTYPES = {
    "ncclint8": "int8", "ncclchar": "int8", "nccluint8": "uint8",
    "ncclint32": "int32", "ncclint": "int32", "nccluint32": "uint32",
    "ncclint64": "int64", "nccluint64": "uint64",
    "ncclfloat16": "float16", "ncclhalf": "float16", "ncclfloat32": "float32", "ncclfloat": "float32",
    "ncclfloat64": "float64", "nccldouble": "float64", "ncclbfloat16": "bfloat16",
    "ncclfloat8e4m3": "float8_e4m3fn", "ncclfloat8e5m2": "float8_e5m2",
}
_NCCL_NAME_RE = re.compile(r"nccl|rccl", re.I)
_MPI_RANK_RE = re.compile(r"^\s*MPI Rank (\d+)\s*$")
_VERSION_SUFFIX_RE = re.compile(r"_v\d+$")
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def _i(v: Any) -> int | None:
    """An SQLite value as int, or None (text/float/blob that is not an integer)."""
    if type(v) is int:
        return v
    if isinstance(v, float) and v == v and abs(v) < 9.2e18:
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return None
    return None


def _coalesce(exprs: list[str]) -> str:
    """SQL coalesce of 0, 1 or more expressions (SQLite's coalesce() wants at least two)."""
    if not exprs:
        return "NULL"
    if len(exprs) == 1:
        return exprs[0]
    return f"coalesce({', '.join(exprs)})"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class _Reader:
    """State of one file's read: the connection, the Parquet writer and the RankFile."""

    def __init__(self, path: Path, out_stage: Path, comm_regex: re.Pattern, progress, pid: int | None = None):
        self.path = path
        self.pid = pid  # the process read (OS pid) in a report of several processes; None: every row
        self.first = True  # the first process of the report (see own())
        self.unowned: set[str] = set()
        self.out = out_stage
        self.comm_regex = comm_regex
        self.progress = progress
        self.rf = RankFile(path=path, sha256="", meta={})
        self.writer = None  # the staging file's Arrow IPC stream writer, opened on the first batch
        self.next_id = 0
        self.base = 0
        self._comm_name_cache: dict[str, bool] = {}
        self._strings: dict[int, str | None] = {}
        self.con: sqlite3.Connection | None = None
        self.tables: set[str] = set()
        self.has_strings = False
        # what the process tells about its rank and backend (filled while reading)
        self.devices: list[int] = []
        self.mpi_rank: int | None = None
        self.nccl_inits: list[tuple[int, int]] = []  # (Rank, No. of ranks) of its ncclCommInitRank ranges
        self.nccl_ranges = 0  # NCCL collective NVTX ranges
        self.p2p_rows: list = []  # (meta row, send | recv, NCCL peer rank, communicator size) of p2p calls
        self.uses_nccl = False

    # -- output -----------------------------------------------------------------------

    def emit(self, track_kind: str, category: str, dev, trk, names, start, end, corr, comm=None) -> int:
        """Write one batch of valid events (parallel lists); returns the first event_id of the batch."""
        n = len(names)
        first = self.next_id
        if not n:
            return first
        self.next_id += n
        ts = np.asarray(start, dtype=np.int64)
        te = np.asarray(end, dtype=np.int64)
        batch = raw_batch(
            [
                pa.array(np.arange(first, first + n, dtype=np.int64)),
                pa.array([track_kind] * n, pa.string()),
                pa.array(dev, pa.int64()),
                pa.array(trk, pa.int64()),
                pa.array([category] * n, pa.string()),
                pa.array(names, pa.string()),
                pa.array(ts + self.base),
                pa.array(te - ts),
                pa.array(corr, pa.int64()),
                pa.nulls(n, pa.int64()),
                pa.array(comm if comm is not None else [False] * n, pa.bool_()),
            ],
        )
        if self.writer is None:
            self.writer = open_stage_writer(self.out)
        self.writer.write_batch(batch)
        self.rf.events += n
        if track_kind == "gpu_stream":
            self.rf.has_gpu = True
        if self.progress is not None:
            self.progress(n)
        return first

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def comm_meta_row(
        self, eid: int, name: str, category: str, gpu: bool, device, track, start, end, corr, **meta
    ) -> dict:
        row = {f: None for f in META_FIELDS}
        row.update(meta)
        row.update(
            event_id=eid, name=name, category=category, gpu=gpu, device=device, track=track,
            ts_ns=start + self.base, dur_ns=end - start, correlation=corr,
        )
        self.rf.comm_meta.append(row)
        return row

    # -- input ------------------------------------------------------------------------

    def own(self, alias: str, cols: list[str], col: str) -> str:
        """SQL: the row belongs to the process read (``col``: globalPid or globalTid); "1" when the
        file is read whole. The rows of a table without that column (no export tracekit knows
        lacks it) all go to the first process, with a warning."""
        if self.pid is None:
            return "1"
        if col not in cols:
            if self.first:
                self.unowned.add(col)
            return "1" if self.first else "0"
        return f"({_pid_sql(f'{alias}.{_q(col)}')} = {int(self.pid)})"

    def columns(self, table: str) -> list[str]:
        return [r[1] for r in self.con.execute(f"PRAGMA table_info({_q(table)})")]

    def batches(self, sql: str) -> Iterator[list[tuple]]:
        cur = self.con.execute(sql)
        try:
            while True:
                batch = cur.fetchmany(BATCH_ROWS)
                if not batch:
                    return
                yield batch
        finally:
            cur.close()

    def rows(self, sql: str) -> Iterator[tuple]:
        for b in self.batches(sql):
            yield from b

    def valid(self, alias: str) -> str:
        """SQL: the row has integer start/end, start > 0, end ≥ start, and fits int64 after the time shift."""
        return (
            f"(typeof({alias}.start) = 'integer' AND typeof({alias}.\"end\") = 'integer' AND {alias}.start > 0 "
            f"AND {alias}.\"end\" >= {alias}.start AND {alias}.\"end\" <= {_INT64_MAX - self.base})"
        )

    def quarantine(self, table: str, alias: str, where: str = "1") -> None:
        """Count the rows of ``table`` (matching ``where``) that :meth:`valid` rejects."""
        n = self.con.execute(
            f"SELECT count(*) FROM {table} {alias} WHERE ({where}) AND NOT {self.valid(alias)}"
        ).fetchone()[0]
        self.rf.quarantined += int(n or 0)

    def resolve(self, vals: list) -> list[str | None]:
        """Raw name values (StringIds ids, or the text itself) → text; ids are looked up lazily, once each."""
        cache = self._strings
        if self.has_strings:
            miss = {v for v in vals if type(v) is int and v not in cache}
            if miss:
                ids = sorted(miss)
                for i in range(0, len(ids), 500):
                    part = ids[i : i + 500]
                    for k, v in self.con.execute(
                        f"SELECT id, value FROM StringIds WHERE id IN ({', '.join('?' * len(part))})", part
                    ):
                        cache[k] = None if v is None else str(v)
                for k in miss:
                    cache.setdefault(k, None)
        return [
            (cache.get(v) if self.has_strings else str(v)) if type(v) is int else (None if v is None else str(v))
            for v in vals
        ]

    def text(self, alias: str, col: str | None) -> str:
        """SQL for a column holding either a StringIds id or the text itself."""
        if col is None:
            return "NULL"
        ref = f"{alias}.{_q(col)}"
        if not self.has_strings:
            return f"CAST({ref} AS TEXT)"
        return (
            f"CASE WHEN typeof({ref}) = 'integer' THEN (SELECT value FROM StringIds WHERE id = {ref}) "
            f"ELSE CAST({ref} AS TEXT) END"
        )

    def one_of(self, cols: list[str], *names: str) -> str | None:
        for n in names:
            if n in cols:
                return n
        return None

    def col(self, alias: str, cols: list[str], name: str) -> str:
        return f"{alias}.{_q(name)}" if name in cols else "NULL"

    def int_or(self, alias: str, cols: list[str], name: str, default: int = -1) -> str:
        """SQL: the column as an integer, ``default`` when absent or null."""
        return f"coalesce(CAST({alias}.{_q(name)} AS INTEGER), {default})" if name in cols else str(default)

    def corr(self, alias: str, cols: list[str]) -> str:
        return f"CAST({alias}.correlationId AS INTEGER)" if "correlationId" in cols else "NULL"

    def enum_ids(self, table: str, names, default) -> set[int]:
        """Ids of named values in an ENUM_* table; ``default`` when the table is absent."""
        if table not in self.tables:
            return set(default)
        got = {
            int(r[0])
            for r in self.con.execute(f"SELECT id, name FROM {_q(table)}")
            if r[1] is not None and _i(r[0]) is not None and (names(r[1]) if callable(names) else r[1] in names)
        }
        return got or set(default)

    def is_comm_name(self, name: str) -> bool:
        v = self._comm_name_cache.get(name)
        if v is None:
            v = bool(self.comm_regex.search(name))
            self._comm_name_cache[name] = v
        return v


def _pid_sql(expr: str) -> str:
    return f"coalesce((CAST({expr} AS INTEGER) >> 24) & 16777215, -1)"


def _tid_sql(expr: str) -> str:
    return f"coalesce(CAST({expr} AS INTEGER) & 16777215, -1)"


def read_nsys_file(
    path: str | Path, out_stage: Path, comm_regex: re.Pattern, progress=None, sha256: str | None = None
) -> RankFile:
    """The first (or only) rank of :func:`read_nsys_report`, its rows in ``out_stage``.

    Kept for callers that read one-process exports; a report of several processes
    gives its other ranks only through :func:`read_nsys_report`.
    """
    return read_nsys_report(path, out_stage, comm_regex, progress, sha256)[0][0]


def read_nsys_report(
    path: str | Path, out_stage: Path, comm_regex: re.Pattern, progress=None, sha256: str | None = None
) -> list[tuple[RankFile, Path]]:
    """Read one ``nsys export --type sqlite`` file: one :class:`RankFile` per process with GPU work.

    Returns ``[(RankFile, staging file), ...]`` in process order (by pid); the first
    process' rows go to ``out_stage``, the k-th's to ``<out_stage stem>.p<k>.arrows``
    beside it. A report of one process (or none) is read whole: one rank.
    In a report of several processes (``nsys profile torchrun ...``) each process with
    GPU activity (kernels, memcpy, memset, syncs, graphs: their ``globalPid``) is a
    rank, read with every query restricted to that process, so that correlation ids,
    which CUPTI numbers per process, link launches and kernels only within it. CPU
    rows of processes without GPU work (the launcher) are left out, with a warning.
    The rank of each process: see :func:`_rank_of`. Every rank keeps the report's
    clock (offset 0, one host).

    Raises FileError when the file is not a readable SQLite database or not an
    Nsight Systems export.
    """
    path = Path(path)
    out_stage = Path(out_stage)
    try:
        if path.stat().st_size == 0:
            raise FileError(path, "empty file (not an Nsight Systems export)")
    except OSError as exc:
        raise FileError(path, f"cannot read ({exc.strerror or exc})") from None
    con = None
    readers: list[_Reader] = []
    try:
        try:
            con = sqlite3.connect(f"file:{quote(path.resolve().as_posix())}?mode=ro", uri=True)
        except sqlite3.Error as exc:
            raise FileError(path, f"cannot open as SQLite ({exc})") from None
        con.text_factory = lambda b: b.decode("utf-8", "replace")
        try:
            probe = _Reader(path, out_stage, comm_regex, progress)
            probe.con = con
            _check_export(probe)
            pids, others = _gpu_processes(probe)
            env = _capture_env(probe)
            if len(pids) <= 1:
                readers = [probe]
            else:
                for k, pid in enumerate(pids):
                    stage = out_stage if k == 0 else out_stage.with_name(f"{out_stage.stem}.p{k}{out_stage.suffix}")
                    rd = _Reader(path, stage, comm_regex, progress, pid=pid)
                    rd.first = k == 0
                    rd.con, rd.tables, rd.has_strings = con, probe.tables, probe.has_strings
                    readers.append(rd)
            for rd in readers:
                try:
                    _read(rd)
                finally:
                    rd.close()
            _assign_process_ranks(readers, env)
            if len(readers) > 1 and readers[0].unowned:
                readers[0].rf.warnings.append(
                    "some tables of this export have no process id (" + ", ".join(sorted(readers[0].unowned))
                    + "): their rows were all given to this rank"
                )
            if len(readers) > 1 and others:
                n_rows, n_procs = others
                readers[0].rf.warnings.append(
                    f"{n_rows} CPU event(s) of {n_procs} process(es) without GPU work (e.g. the launcher) left out"
                )
        except sqlite3.Error as exc:
            msg = str(exc)
            if isinstance(exc, sqlite3.OperationalError) and not re.search(r"malformed|corrupt|not a database", msg):
                # e.g. a column of an unexpected type or layout in an export version tracekit does not know
                raise FileError(path, f"cannot read this Nsight Systems export ({msg})") from None
            raise FileError(path, f"corrupt or unreadable SQLite database ({msg})") from None
        except UnicodeDecodeError as exc:  # SQLite's own message quoting damaged bytes of the schema
            raise FileError(path, f"corrupt or unreadable SQLite database (its schema holds invalid UTF-8: "
                                  f"{exc.reason})") from None
    finally:
        for rd in readers:
            rd.close()
        if con is not None:
            con.close()
    digest = sha256 or sha256_file(path)
    out = []
    for rd in readers:
        if rd.rf.events == 0:
            open_stage_writer(rd.out).close()
        rd.rf.sha256 = digest
        out.append((rd.rf, rd.out))
    return out


def _check_export(r: _Reader) -> None:
    """Fill ``r.tables`` / ``r.has_strings``; raise FileError unless the file is an Nsight Systems export."""
    try:
        r.tables = {row[0] for row in r.con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc):
            raise FileError(r.path, "not an SQLite database (corrupt or not an Nsight Systems export)") from None
        raise
    cupti = {t for t in r.tables if t.startswith("CUPTI_ACTIVITY_KIND_")}
    if not cupti and "NVTX_EVENTS" not in r.tables and "StringIds" not in r.tables:
        shown = ", ".join(sorted(r.tables)[:5]) or "no tables"
        raise FileError(
            r.path, f"not an Nsight Systems export: no CUPTI_ACTIVITY_KIND_*, NVTX_EVENTS or StringIds table ({shown})"
        )
    if "StringIds" not in r.tables:  # every name would be a bare number (NCCL kernels not recognised)
        raise FileError(r.path, "Nsight Systems export without its StringIds table: names cannot be read "
                                "(export the report again: nsys export --type sqlite)")
    r.has_strings = "StringIds" in r.tables


_GPU_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
)
_CPU_TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")


def _gpu_processes(r: _Reader) -> tuple[list[int], tuple[int, int] | None]:
    """The pids (``globalPid >> 24 & 0xFFFFFF``) with GPU activity, ascending; and (CPU rows,
    processes) of the CUDA runtime / NVTX rows of the other processes (None when there are none)."""
    pids: set[int] = set()
    for t in _GPU_TABLES:
        if t in r.tables and "globalPid" in r.columns(t):
            pids.update(p for (p,) in r.con.execute(f"SELECT DISTINCT {_pid_sql('globalPid')} FROM {t}") if p != -1)
    if len(pids) <= 1:
        return sorted(pids), None
    rows = procs = 0
    listed = ", ".join(str(p) for p in sorted(pids))
    for t in _CPU_TABLES:
        if t in r.tables and "globalTid" in r.columns(t):
            for _p, n in r.con.execute(
                f"SELECT {_pid_sql('globalTid')} AS p, count(*) FROM {t} WHERE p NOT IN ({listed}) GROUP BY p"
            ):
                rows += n
                procs += 1
    return sorted(pids), ((rows, procs) if rows else None)


def _read(r: _Reader) -> None:
    """Read the rows of ``r``'s process (of the whole file when ``r.pid`` is None) into its staging file."""
    if not r.tables:
        _check_export(r)
    _read_meta(r)
    graph_corr = _graph_launch_correlations(r)
    state = {"graph_node_kernels": 0, "kernel_devices": set(), "nccl_kernels": 0}
    _read_kernels(r, graph_corr, state)
    _read_memcpy(r)
    _read_memset(r)
    _read_sync(r)
    graph_trace_rows = _read_graph_trace(r)
    _read_runtime(r)
    _read_nvtx(r)
    _finish_meta(r, state)
    _graph_warning(r, graph_corr, graph_trace_rows, state)



# -- metadata -------------------------------------------------------------------------


def _read_meta(r: _Reader) -> None:
    meta: dict[str, Any] = {"source_format": "nsys"}
    for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if t in r.tables and {"name", "value"} <= set(r.columns(t)):
            kv = {str(k): v for k, v in r.con.execute(f"SELECT name, value FROM {_q(t)}")}
            meta["nsys_export"] = {
                "schema_version": kv.get("EXPORT_SCHEMA_VERSION"),
                "product_version": kv.get("EXPORT_PRODUCT_VERSION"),
            }
            break
    if "TARGET_INFO_SESSION_START_TIME" in r.tables and "utcEpochNs" in r.columns("TARGET_INFO_SESSION_START_TIME"):
        row = r.con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
        base = _i(row[0]) if row else None
        if base is not None and 0 < base < 2**62:
            r.base = base
            meta["baseTimeNanoseconds"] = base
    if "TARGET_INFO_SYSTEM_ENV" in r.tables and {"name", "value"} <= set(r.columns("TARGET_INFO_SYSTEM_ENV")):
        row = r.con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1").fetchone()
        if row and row[0]:
            meta["host_name"] = str(row[0])
    gpus = []
    if "TARGET_INFO_GPU" in r.tables:
        cols = r.columns("TARGET_INFO_GPU")
        if "name" in cols:
            sel = ", ".join(r.col("g", cols, c) for c in ("id", "name", "busLocation", "totalMemory", "smCount"))
            for gid, name, bus, mem, sms in r.con.execute(f"SELECT {sel} FROM TARGET_INFO_GPU g"):
                d = {"id": _i(gid), "name": None if name is None else str(name)}
                if bus is not None:
                    d["busLocation"] = str(bus)
                if _i(mem) is not None:
                    d["totalGlobalMem"] = _i(mem)
                if _i(sms) is not None:
                    d["numSms"] = _i(sms)
                gpus.append(d)
    meta["deviceProperties"] = gpus
    if "ThreadNames" in r.tables and {"nameId", "globalTid"} <= set(r.columns("ThreadNames")):
        own = r.own("t", ["globalTid"], "globalTid")
        sql = (
            f"SELECT {r.text('t', 'nameId')}, {_pid_sql('t.globalTid')}, {_tid_sql('t.globalTid')} "
            f"FROM ThreadNames t WHERE {own}"
        )
        for name, pid, tid in r.rows(sql):
            if name is not None:
                r.rf.thread_names[(pid, tid)] = str(name)
    r.rf.meta = meta


def _finish_meta(r: _Reader, state: dict) -> None:
    """Order the GPUs (those the process used first) and note what the process tells about its rank."""
    meta = r.rf.meta
    used = state["kernel_devices"]
    if used and meta.get("deviceProperties"):
        # the GPUs this process used first: the run's device_name is the first entry
        meta["deviceProperties"].sort(key=lambda d: (d.get("id") not in used, d.get("id") is None, d.get("id") or 0))
    r.devices = sorted(d for d in used if d is not None and d >= 0)
    mpi = {int(m.group(1)) for n in r.rf.thread_names.values() if (m := _MPI_RANK_RE.match(n))}
    r.mpi_rank = mpi.pop() if len(mpi) == 1 else None
    r.uses_nccl = bool(state["nccl_kernels"] or r.nccl_ranges)


# -- ranks ----------------------------------------------------------------------------

# The launchers' names for a process' global rank, local rank and world size (torchrun / torch
# elastic, Open MPI, PMI / Cray PALS, PMIx, Slurm), in order of preference.
_ENV_RANK = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
_ENV_LOCAL_RANK = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK", "SLURM_LOCALID")
_ENV_WORLD = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
_CAPTURE_KEY_RE = re.compile(r"^PROCESS_(\d+):(PID|ENVIRONMENT_VARIABLE)$")


def _capture_env(r: _Reader) -> dict[int, dict]:
    """The environment nsys recorded for the processes it launched, by launch index.

    ``META_DATA_CAPTURE`` (schema 3.x exports) holds one ``PROCESS_<k>:ENVIRONMENT_VARIABLE``
    row per variable (value ``NAME="value"``) and ``PROCESS_<k>:PID`` (0 when nsys launched the
    process itself) for each process it was told to launch or attach to. Returns
    ``{k: {"pid": int | None, "env": {NAME: value}}}`` keeping only the launcher variables
    tracekit reads (_ENV_RANK, _ENV_LOCAL_RANK, _ENV_WORLD); {} when the table is absent.
    """
    t = "META_DATA_CAPTURE"
    if t not in r.tables or not {"name", "value"} <= set(r.columns(t)):
        return {}
    wanted = set(_ENV_RANK + _ENV_LOCAL_RANK + _ENV_WORLD)
    out: dict[int, dict] = {}
    for name, value in r.rows(f"SELECT name, value FROM {t} WHERE name LIKE 'PROCESS_%'"):
        m = _CAPTURE_KEY_RE.match(str(name))
        if not m or value is None:
            continue
        proc = out.setdefault(int(m.group(1)), {"pid": None, "env": {}})
        if m.group(2) == "PID":
            pid = _i(value)
            proc["pid"] = pid if pid else None
            continue
        var, eq, val = str(value).partition("=")
        if eq and var in wanted:
            val = val.strip()
            if len(val) >= 2 and val[0] == val[-1] == '"':
                val = val[1:-1]
            proc["env"][var] = val
    return out


def _env_rank(env: dict[str, str]) -> tuple[int | None, int | None, str | None]:
    """(rank, world size, variable read) from a launcher environment; Nones when it has no rank."""
    def first(names):
        for n in names:
            v = _i(env.get(n))
            if v is not None and v >= 0:
                return v, n
        return None, None

    world, _ = first(_ENV_WORLD)
    rank, var = first(_ENV_RANK)
    if rank is None:
        rank, var = first(_ENV_LOCAL_RANK)  # one node: the local rank is the rank
    return rank, (world if world and world > 0 else None), var


def _assign_process_ranks(readers: list[_Reader], env: dict[int, dict]) -> None:
    """Set ``meta["distributedInfo"]`` (rank, world_size, backend, rank_source) of each process read.

    The rank comes from the first of these that gives every process of the file a rank, and
    distinct ranks:

    1. ``env``: the launcher's variables in the environment nsys recorded (:func:`_capture_env`),
       matched to the process by its pid, or, for a one-process read, the one launched process
       that has them (a report per rank under ``srun nsys profile ...``);
    2. ``file name`` (one-process reads only: ``rank3.sqlite``);
    3. ``MPI thread name``: nsys' ``MPI Rank N`` thread name;
    4. ``nccl``: the ``Rank`` of the process' ``ncclCommInitRank`` NVTX payload for its largest
       communicator (the world's, whose ``No. of ranks`` is also the world size);
    5. ``order``: by CUDA device, then pid (several processes), with a warning; a lone process
       without a rank keeps none (the ingest takes it as rank 0 and says so), and several
       files whose processes have no rank are numbered in file order by the ingest.
    Ranks other than from env, file name or MPI are marked with a warning naming the source.
    """
    from tracekit.ingest.staging import rank_from_filename

    n = len(readers)
    by_pid = {e["pid"]: e for e in env.values() if e["pid"] is not None}
    with_rank = [e for e in env.values() if _env_rank(e["env"])[0] is not None]

    def from_env(rd):
        e = by_pid.get(rd.pid) if rd.pid is not None else None
        if e is None and n == 1 and len(with_rank) == 1:
            e = with_rank[0]
        return _env_rank(e["env"]) if e else (None, None, None)

    def from_nccl(rd):
        best = max(rd.nccl_inits, key=lambda x: x[1], default=None)  # (rank, nranks), largest comm
        return (best[0], best[1]) if best else (None, None)

    chosen = None
    for source in ("env", "file name", "MPI thread name", "nccl"):
        if source == "file name" and n > 1:
            continue
        got = []
        for rd in readers:
            if source == "env":
                rk, ws, var = from_env(rd)
                got.append((rk, ws, f"{var} in the recorded environment" if var else None))
            elif source == "file name":
                got.append((rank_from_filename(rd.path), None, None))
            elif source == "MPI thread name":
                got.append((rd.mpi_rank, None, None))
            else:
                rk, ws = from_nccl(rd)
                got.append((rk, ws, None))
        ranks = [g[0] for g in got]
        if all(x is not None for x in ranks) and len(set(ranks)) == n:
            chosen = (source, got)
            break
    if chosen is None and n > 1:
        order = sorted(readers, key=lambda rd: (rd.devices[0] if rd.devices else 1 << 30, rd.pid))
        pos = {id(rd): k for k, rd in enumerate(order)}
        chosen = ("order", [(pos[id(rd)], None, None) for rd in readers])
    for k, rd in enumerate(readers):
        di: dict[str, Any] = {}
        if rd.uses_nccl:
            di["backend"] = "nccl"
        if chosen is None:
            di["rank_source"] = "order"  # a lone process: the ingest numbers it
        else:
            source, got = chosen
            rk, ws, how = got[k]
            di["rank"] = int(rk)
            di["rank_source"] = source
            if ws is not None and ws > rk:
                di["world_size"] = int(ws)
            who = f"process {rd.pid}" if rd.pid is not None else "the process"
            if n > 1:
                who += f" of a {n}-process report"
            if source == "nccl":
                rd.rf.warnings.append(
                    f"rank {rk} taken from NCCL's ncclCommInitRank NVTX range ({who}; no launcher rank in its "
                    "recorded environment)"
                )
            elif source == "order":
                dev = f"GPU {rd.devices[0]}" if rd.devices else "no kernels"
                rd.rf.warnings.append(
                    f"rank {rk} assigned by CUDA device and process order ({who}, {dev}): the report records "
                    "neither the launcher's RANK nor NCCL's ranks"
                )
        if di:
            rd.rf.meta["distributedInfo"] = di
        if "rank" in di and di["rank_source"] != "order":
            _name_p2p_pairs(rd, di["rank"])
        if rd.pid is not None:
            rd.rf.meta["nsys_pid"] = rd.pid


def _name_p2p_pairs(rd: _Reader, rank: int) -> None:
    """Give NCCL's send/recv calls on the world communicator the point-to-point group
    ``p2p:<src>-><dst>`` (global ranks; pg_ranks [src, dst], group size 2) that the gloo path
    gives c10d's, so that the i-th send from src to dst matches the i-th receive (DESIGN.md,
    "Matching collectives"). NCCL's ``Peer rank`` is a rank of the call's communicator; it is
    the global rank only on the world communicator, taken to be the largest this process
    initialised; calls on smaller communicators keep no group."""
    world = max((k for _, k in rd.nccl_inits), default=None)
    if world is None:
        return
    for row, op, peer, k in rd.p2p_rows:
        if k != world or peer >= world:
            continue
        src, dst = (rank, peer) if op == "send" else (peer, rank)
        row.update(pg_name=f"p2p:{src}->{dst}", pg_ranks=[src, dst], group_size=2)


# -- GPU activity ---------------------------------------------------------------------


def _graph_launch_correlations(r: _Reader) -> set[int]:
    """Correlation ids of cudaGraphLaunch / cuGraphLaunch calls (few: one per graph replay)."""
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if t not in r.tables:
        return set()
    cols = r.columns(t)
    ncol = r.one_of(cols, "nameId", "name")
    if ncol is None or "correlationId" not in cols:
        return set()
    if ncol == "nameId" and r.has_strings:
        found = r.con.execute("SELECT id FROM StringIds WHERE value LIKE '%GraphLaunch%'")
        ids = [x for (v,) in found if (x := _i(v)) is not None]
        if not ids:
            return set()
        where = f"x.nameId IN ({', '.join(str(x) for x in ids)})"
    else:
        where = f"{r.text('x', ncol)} LIKE '%GraphLaunch%'"
    where += f" AND {r.own('x', cols, 'globalTid')}"
    return {v for (c,) in r.rows(f"SELECT x.correlationId FROM {t} x WHERE {where}") if (v := _i(c)) is not None}


def _read_kernels(r: _Reader, graph_corr: set[int], state: dict) -> None:
    t = "CUPTI_ACTIVITY_KIND_KERNEL"
    if t not in r.tables:
        return
    cols = r.columns(t)
    name_sql = _coalesce([f"k.{c}" for c in ("demangledName", "shortName", "mangledName") if c in cols])
    node_sql = r.int_or("k", cols, "graphNodeId", 0)
    sql = (
        f"SELECT {r.int_or('k', cols, 'deviceId')}, {r.int_or('k', cols, 'streamId')}, {r.corr('k', cols)}, "
        f"k.start, k.\"end\", {name_sql}, {_pid_sql(r.col('k', cols, 'globalPid'))}, {node_sql} "
        f"FROM {t} k WHERE {r.valid('k')} AND {r.own('k', cols, 'globalPid')}"
    )
    r.quarantine(t, "k", r.own("k", cols, "globalPid"))
    is_comm = r.is_comm_name
    for batch in r.batches(sql):
        dev, stream, corr, start, end, raw, kpid, node = map(list, zip(*batch))
        name = [x or "" for x in r.resolve(raw)]
        comm = [is_comm(n) for n in name]
        first = r.emit("gpu_stream", "kernel", dev, stream, name, start, end, corr, comm)
        state["kernel_devices"].update(dev)
        state["nccl_kernels"] += sum(1 for n, c in zip(name, comm) if c and _NCCL_NAME_RE.search(n))
        state["graph_node_kernels"] += sum(1 for nd, c in zip(node, corr) if nd != 0 or c in graph_corr)
        for i, c in enumerate(comm):
            if c:
                r.comm_meta_row(first + i, name[i], "kernel", True, dev[i], stream[i], start[i], end[i], corr[i])


def _read_memcpy(r: _Reader) -> None:
    t = "CUPTI_ACTIVITY_KIND_MEMCPY"
    if t not in r.tables:
        return
    cols = r.columns(t)
    kinds = _mem_kinds(r)
    sql = (
        f"SELECT {r.int_or('m', cols, 'deviceId')}, {r.int_or('m', cols, 'streamId')}, {r.corr('m', cols)}, "
        f"m.start, m.\"end\", {r.int_or('m', cols, 'copyKind')}, {r.int_or('m', cols, 'srcKind')}, "
        f"{r.int_or('m', cols, 'dstKind')} FROM {t} m WHERE {r.valid('m')} AND {r.own('m', cols, 'globalPid')}"
    )
    r.quarantine(t, "m", r.own("m", cols, "globalPid"))
    cache: dict = {}

    def label(key):
        got = cache.get(key)
        if got is None:
            ck, sk, dk = key
            got = cache[key] = (
                f"Memcpy {_COPY_KIND.get(ck, 'Unknown')} ({kinds.get(sk, 'Unknown')} -> {kinds.get(dk, 'Unknown')})"
            )
        return got

    for batch in r.batches(sql):
        dev, stream, corr, start, end, ck, sk, dk = map(list, zip(*batch))
        names = [label(k) for k in zip(ck, sk, dk)]
        r.emit("gpu_stream", "memcpy", dev, stream, names, start, end, corr)


def _read_memset(r: _Reader) -> None:
    t = "CUPTI_ACTIVITY_KIND_MEMSET"
    if t not in r.tables:
        return
    cols = r.columns(t)
    kinds = _mem_kinds(r)
    sql = (
        f"SELECT {r.int_or('m', cols, 'deviceId')}, {r.int_or('m', cols, 'streamId')}, {r.corr('m', cols)}, "
        f"m.start, m.\"end\", {r.int_or('m', cols, 'memKind', 2)} FROM {t} m "
        f"WHERE {r.valid('m')} AND {r.own('m', cols, 'globalPid')}"
    )
    r.quarantine(t, "m", r.own("m", cols, "globalPid"))
    for batch in r.batches(sql):
        dev, stream, corr, start, end, mk = map(list, zip(*batch))
        names = [f"Memset ({kinds.get(k, 'Device')})" for k in mk]
        r.emit("gpu_stream", "memset", dev, stream, names, start, end, corr)


def _mem_kinds(r: _Reader) -> dict:
    t = "ENUM_CUDA_MEM_KIND"
    if t in r.tables and {"id", "label"} <= set(r.columns(t)):
        got = {_i(i): str(lab) for i, lab in r.con.execute(f"SELECT id, label FROM {t}") if lab is not None}
        if got:
            return got
    return _MEM_KIND


def _read_sync(r: _Reader) -> None:
    t = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if t not in r.tables:
        return
    cols = r.columns(t)
    rt = "CUPTI_ACTIVITY_KIND_RUNTIME"
    gpid = r.col("s", cols, "globalPid")
    # the thread that made the synchronizing call (for syncs with no stream), else the process' main thread
    pid_sql = tid_sql = _pid_sql(gpid)
    join = ""
    if rt in r.tables and {"correlationId", "globalTid"} <= set(r.columns(rt)) and "correlationId" in cols:
        # the call with the same correlation id in the same process (ids repeat across processes)
        join = (
            f" LEFT JOIN (SELECT correlationId AS c, min(globalTid) AS gtid FROM {rt} x "
            f"WHERE correlationId IS NOT NULL AND {r.own('x', r.columns(rt), 'globalTid')} "
            f"GROUP BY correlationId) rt ON rt.c = s.correlationId"
        )
        pid_sql = f"CASE WHEN rt.gtid IS NULL THEN {pid_sql} ELSE {_pid_sql('rt.gtid')} END"
        tid_sql = f"CASE WHEN rt.gtid IS NULL THEN {tid_sql} ELSE {_tid_sql('rt.gtid')} END"
    sql = (
        f"SELECT {r.int_or('s', cols, 'deviceId')}, {r.int_or('s', cols, 'streamId')}, {r.corr('s', cols)}, "
        f"s.start, s.\"end\", {r.int_or('s', cols, 'syncType', 0)}, {pid_sql}, {tid_sql} "
        f"FROM {t} s{join} WHERE {r.valid('s')} AND {r.own('s', cols, 'globalPid')}"
    )
    r.quarantine(t, "s", r.own("s", cols, "globalPid"))
    for batch in r.batches(sql):
        gpu = [x for x in batch if x[1] not in _NO_STREAM]
        cpu = [x for x in batch if x[1] in _NO_STREAM]
        for rows, kind in ((gpu, "gpu_stream"), (cpu, "cpu_thread")):
            if not rows:
                continue
            dev, stream, corr, start, end, st, pid, tid = map(list, zip(*rows))
            names = [_SYNC_TYPE.get(x, "Sync") for x in st]
            if kind == "gpu_stream":
                r.emit(kind, "sync", dev, stream, names, start, end, corr)
            else:
                # a wait with no stream (context / event synchronize): on the CPU thread that waited
                r.emit(kind, "sync", pid, tid, names, start, end, corr)


def _read_graph_trace(r: _Reader) -> int:
    """Whole-graph executions (``--cuda-graph-trace=graph``) as ``cuda_graph`` spans; returns their count."""
    t = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
    if t not in r.tables:
        return 0
    cols = r.columns(t)
    sql = (
        f"SELECT {r.int_or('g', cols, 'deviceId')}, {r.int_or('g', cols, 'streamId')}, {r.corr('g', cols)}, "
        f"g.start, g.\"end\", CAST({r.col('g', cols, 'graphId')} AS INTEGER) FROM {t} g "
        f"WHERE {r.valid('g')} AND {r.own('g', cols, 'globalPid')}"
    )
    before = r.rf.quarantined
    r.quarantine(t, "g", r.own("g", cols, "globalPid"))
    n = r.rf.quarantined - before
    for batch in r.batches(sql):
        dev, stream, corr, start, end, gid = map(list, zip(*batch))
        names = ["CUDA Graph" if g is None else f"CUDA Graph {g}" for g in gid]
        r.emit("gpu_stream", "cuda_graph", dev, stream, names, start, end, corr)
        n += len(batch)
    return n


def _graph_warning(r: _Reader, graph_corr: set[int], graph_trace_rows: int, state: dict) -> None:
    created = 0
    if "CUDA_GRAPH_EVENTS" in r.tables:
        created = r.con.execute("SELECT count(*) FROM CUDA_GRAPH_EVENTS").fetchone()[0]
    used = graph_trace_rows or graph_corr or created
    if not used:
        return
    if graph_trace_rows or state["graph_node_kernels"] == 0:
        what = []
        if graph_corr:
            what.append(f"{len(graph_corr)} graph launch(es)")
        if graph_trace_rows:
            what.append(f"{graph_trace_rows} whole-graph execution(s)")
        if created and not what:
            what.append(f"{created} graph creation event(s)")
        r.rf.warnings.append(
            f"CUDA graphs traced at graph granularity ({', '.join(what)}, no kernels inside them): "
            "communication inside graphs is invisible, so comm and overlap exclude it "
            "(re-capture with nsys --cuda-graph-trace=node)"
        )


# -- CPU activity ---------------------------------------------------------------------


def _read_runtime(r: _Reader) -> None:
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if t not in r.tables:
        return
    cols = r.columns(t)
    ncol = r.one_of(cols, "nameId", "name")
    gt = r.col("x", cols, "globalTid")
    base_sel = f"{_pid_sql(gt)}, {_tid_sql(gt)}, {r.corr('x', cols)}, x.start, x.\"end\", {r.col('x', cols, ncol)}"
    sql = f"SELECT {base_sel} FROM {t} x WHERE {r.valid('x')} AND {r.own('x', cols, 'globalTid')}"
    r.quarantine(t, "x", r.own("x", cols, "globalTid"))
    if "eventClass" in cols and "correlationId" in cols:
        bt = r.enum_ids("ENUM_NSYS_EVENT_CLASS", lambda n: "BACKTRACE" in str(n).upper(), _BACKTRACE_CLASSES_DEFAULT)
        lst = ", ".join(str(b) for b in sorted(bt))
        if r.con.execute(
            f"SELECT EXISTS (SELECT 1 FROM {t} x WHERE eventClass IN ({lst}) AND {r.own('x', cols, 'globalTid')})"
        ).fetchone()[0]:
            # one row per call: prefer the API record over the backtrace one, then the innermost
            sql = (
                f"SELECT {base_sel} FROM (SELECT y.*, CASE WHEN y.correlationId IS NULL OR y.correlationId <= 0 "
                f"THEN 1 ELSE row_number() OVER (PARTITION BY y.correlationId ORDER BY (y.eventClass IN ({lst})), "
                f"y.start DESC, y.rowid) END AS rn FROM {t} y WHERE {r.valid('y')} AND {r.own('y', cols, 'globalTid')}) x "
                f"WHERE x.rn = 1"
            )
    cache: dict = {}

    def clean(name):
        got = cache.get(name)
        if got is None:
            n = "" if name is None else _VERSION_SUFFIX_RE.sub("", str(name))
            got = cache[name] = (n, n.startswith("cu") and not n.startswith("cuda"))
        return got

    for batch in r.batches(sql):
        pid, tid, corr, start, end, raw = map(list, zip(*batch))
        cn = [clean(x) for x in r.resolve(raw)]
        if any(d for _, d in cn):
            for want in (False, True):
                idx = [i for i, (_, d) in enumerate(cn) if d == want]
                if idx:
                    r.emit(
                        "cpu_thread", "driver" if want else "runtime", [pid[i] for i in idx], [tid[i] for i in idx],
                        [cn[i][0] for i in idx], [start[i] for i in idx], [end[i] for i in idx], [corr[i] for i in idx],
                    )
        else:
            r.emit("cpu_thread", "runtime", pid, tid, [n for n, _ in cn], start, end, corr)


def _read_nvtx(r: _Reader) -> None:
    t = "NVTX_EVENTS"
    if t not in r.tables:
        return
    cols = r.columns(t)
    if not {"start", "end", "eventType"} <= set(cols):
        return
    ranges = r.enum_ids("ENUM_NSYS_EVENT_TYPE", _NVTX_RANGE_TYPE_NAMES, _NVTX_RANGE_TYPES_DEFAULT)
    dom_create = r.enum_ids("ENUM_NSYS_EVENT_TYPE", ("NvtxDomainCreate",), (_NVTX_DOMAIN_CREATE_DEFAULT,))
    thread_ev = r.enum_ids("ENUM_NSYS_EVENT_TYPE", ("NvtxThread",), (_NVTX_THREAD_DEFAULT,))
    text_sql = _coalesce([r.text("n", c) for c in ("text", "textId") if c in cols])
    gt = r.col("n", cols, "globalTid")
    dom = r.int_or("n", cols, "domainId", 0)
    # domain names (per process) and NVTX thread names: few rows
    domains: dict[tuple[int, int], str] = {}
    special = ", ".join(str(x) for x in sorted(dom_create | thread_ev))
    sql = (
        f"SELECT n.eventType, {text_sql}, {_pid_sql(gt)}, {_tid_sql(gt)}, {dom} "
        f"FROM {t} n WHERE n.eventType IN ({special}) AND {r.own('n', cols, 'globalTid')}"
    )
    for et, txt, pid, tid, d in r.rows(sql):
        if txt is None:
            continue
        if et in dom_create:
            domains[(pid, d)] = str(txt)
        elif et in thread_ev:
            r.rf.thread_names.setdefault((pid, tid), str(txt))
    json_sql = _coalesce([f"n.{c}" for c in ("jsonText", "jsonTextId") if c in cols])
    raw_text = _coalesce([f"n.{c}" for c in ("text", "textId") if c in cols])
    num_sql = _coalesce([f"CAST(n.{_q(c)} AS INTEGER)" for c in ("uint64Value", "int64Value") if c in cols])
    is_range = f"n.eventType IN ({', '.join(str(x) for x in sorted(ranges))})"
    sql = (
        f"SELECT {_pid_sql(gt)}, {_tid_sql(gt)}, n.start, n.\"end\", {raw_text}, {dom}, "
        f"{json_sql}, {num_sql} FROM {t} n WHERE {is_range} AND {r.valid('n')} AND {r.own('n', cols, 'globalTid')}"
    )
    r.quarantine(t, "n", f"{is_range} AND {r.own('n', cols, 'globalTid')}")
    nccl_rows: list[list] = []  # [meta row, op, payload] of NCCL's collective ranges
    groups: list = []  # ncclGroupStart/End ranges and those collective ranges, for _apply_groups
    comm_size: dict[str, int] = {}  # NCCL communicator id → its No. of ranks (ncclCommInitRank)
    nranks: set[int] = set()
    for batch in r.batches(sql):
        pid, tid, start, end, raw, d, js, num = map(list, zip(*batch))
        names = [x or "" for x in r.resolve(raw)]
        first = r.emit("cpu_thread", "nvtx", pid, tid, names, start, end, [None] * len(names))
        for i, name in enumerate(names):
            if not name.startswith(("nccl", "ProfilerStep#")):
                continue
            m = _STEP_RE.match(name)
            if m:
                r.rf.steps.append((int(m.group(1)), first + i, start[i] + r.base, end[i] + r.base))
                continue
            domain = domains.get((pid[i], d[i]))
            if domain is not None and domain.upper() != "NCCL":
                continue
            if name.startswith("nccl:"):
                # torch's own ranges (emit_nvtx / record_function): "nccl:all_to_all, op_id = 3"
                base = name.split(",", 1)[0].strip()
                if canonical_op(base, trace=True) is not None:
                    r.comm_meta_row(first + i, base, "nvtx", False, pid[i], tid[i], start[i], end[i], None)
                    r.nccl_ranges += 1
                continue
            if name in ("ncclGroupStart", "ncclGroupEnd"):
                groups.append(((pid[i], tid[i]), start[i], end[i], name == "ncclGroupStart", None))
                continue
            if name.startswith("ncclCommInit") or name == "ncclCommSplit":
                pl = _payload(r.resolve([js[i]])[0], num[i])
                k = _find_int(pl, ("no. of ranks", "nranks", "number of ranks"))
                if k is not None and k > 0:
                    nranks.add(k)
                    rk = _find_int(pl, ("rank", "myrank"))
                    if rk is not None and 0 <= rk < k:
                        r.nccl_inits.append((rk, k))
                    comm = pl.get(_COMM_KEY)
                    if comm is not None:
                        comm_size[str(comm)] = k
                continue
            op = canonical_op(name, trace=True)
            if op is None:
                continue
            row = r.comm_meta_row(
                first + i, "record_param_comms", "nvtx", False, pid[i], tid[i], start[i], end[i], None, collective=name
            )
            r.nccl_ranges += 1
            item = [row, op, _payload(r.resolve([js[i]])[0], num[i])]
            nccl_rows.append(item)
            groups.append(((pid[i], tid[i]), start[i], end[i], None, item))
    _apply_groups(r, groups)
    k = nranks.pop() if len(nranks) == 1 else None
    for row, op, payload in nccl_rows:
        comm = payload.get(_COMM_KEY)
        kk = comm_size.get(str(comm), k) if comm is not None else k
        if comm is not None and op not in ("send", "recv"):
            # the communicator is the process group (point-to-point calls pair by peer, not by it)
            row["pg_name"] = f"nccl-comm-{comm:x}" if isinstance(comm, int) and comm >= 0 else f"nccl-comm-{comm}"
        _fill_sizes(r, row, op, payload, kk)
        if op in ("send", "recv"):
            peer = _find_int(payload, ("peer rank", "peer"))
            if peer is not None and 0 <= peer < 2**31:
                r.p2p_rows.append((row, op, peer, kk))


_COMM_KEY = "nccl communicator id"  # NCCL's payload entry naming the communicator (its hash)


def _apply_groups(r: _Reader, items: list) -> None:
    """Stretch the NCCL calls made inside ``ncclGroupStart`` … ``ncclGroupEnd`` over the whole group.

    NCCL launches a group's kernel inside ``ncclGroupEnd``, after the calls (``ncclSend``,
    ``ncclRecv``, …) have returned, so their ranges do not enclose the launch; their metadata
    rows are given the span [group start, group end] on their thread so that they do. A group
    of one op keeps every call (the innermost wins); a group mixing sends and receives (an
    all-to-all made of point-to-point calls: one SendRecv kernel) becomes one ``all_to_all``
    row sized by the sum of its sends when it has at least two sends, else its first call.
    ``items``: ((pid, tid), start, end, is_start | None, [row, op, payload] | None), file times.
    """
    by_thread: dict = {}
    for it in items:
        by_thread.setdefault(it[0], []).append(it)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e[1], e[3] is None))
        depth, g_start, members = 0, None, []
        for _thr, start, end, is_start, item in evs:
            if item is not None:
                if depth > 0:
                    members.append(item)
                continue
            if is_start:
                if depth == 0:
                    g_start, members = start, []
                depth += 1
            elif depth > 0:
                depth -= 1
                if depth == 0 and members:
                    _close_group(r, members, g_start, end)


def _close_group(r: _Reader, members: list, g_start: int, g_end: int) -> None:
    ops = {m[1] for m in members}
    keep = members
    if len(ops) > 1:
        sends = [m for m in members if m[1] == "send"]
        keep = members[:1]
        if ops <= {"send", "recv"} and len(sends) >= 2:
            total = 0
            for m in sends:
                v = _find_int(m[2], ("message size [bytes]", "size", "bytes"))
                total = None if (v is None or total is None) else total + v
            first = sends[0]
            first[0]["collective"] = "ncclAllToAll"
            first[1] = "all_to_all"
            merged = {"message size [bytes]": total} if total is not None else {}
            if _COMM_KEY in first[2]:
                merged[_COMM_KEY] = first[2][_COMM_KEY]
            first[2] = merged
            keep = [first]
    for m in keep:
        m[0]["ts_ns"] = g_start + r.base
        m[0]["dur_ns"] = g_end - g_start


# -- NCCL NVTX payloads ---------------------------------------------------------------


def _payload(js: Any, num: Any) -> dict[str, Any]:
    """Flat {lower-case key: scalar} of an NVTX range's payload (JSON text, or a bare number)."""
    out: dict[str, Any] = {}
    if js:
        try:
            doc = json.loads(js)
        except (ValueError, TypeError, RecursionError):
            doc = None
        _flatten(doc, out, 0)
    if _i(num) is not None and "size" not in out:
        out["size"] = _i(num)
    return out


_TYPE_NAMES = re.compile(r"^(u?int\d*|float\d*|double|size(_t)?|str(ing)?|bool|char|enum|value)$", re.I)


def _flatten(doc: Any, out: dict, depth: int) -> None:
    if depth > 8:
        return
    if isinstance(doc, list):
        for x in doc:
            _flatten(x, out, depth + 1)
    elif isinstance(doc, dict):
        for k, v in doc.items():
            key = str(k).strip().lower()
            if isinstance(v, (int, float, str)) and not isinstance(v, bool):
                out.setdefault(key, v)
            elif isinstance(v, dict) and len(v) == 1:
                (ik, iv), = v.items()
                if isinstance(iv, (int, float, str)) and _TYPE_NAMES.match(str(ik)):
                    out.setdefault(key, iv)  # {"Message size [bytes]": {"uint64": 4096}}
                else:
                    _flatten(v, out, depth + 1)
            else:
                _flatten(v, out, depth + 1)


def _find_int(payload: dict, keys) -> int | None:
    for k in keys:
        if k in payload:
            v = _i(payload[k])
            if v is not None:
                return v
    return None


def _fill_sizes(r: _Reader, row: dict, op: str, payload: dict, k: int | None) -> None:
    """Put the NCCL range's size into the metadata row (collectives.size_bytes_for reads it)."""
    count = None
    dtype = None
    for key, v in payload.items():
        if count is None and (key == "count" or "nelem" in key or "element" in key):
            count = _i(v)
        if dtype is None and ("datatype" in key or key == "dtype" or key == "type"):
            s = re.sub(r"[^a-z0-9]", "", str(v).lower())
            dtype = _NCCL_DTYPES.get(s) or _NCCL_DTYPES.get("nccl" + s) or (str(v) if str(v).isidentifier() else None)
    if count is not None and dtype is not None and dtype_bytes(dtype) is not None:
        n = count
    else:
        n = None
        for key, v in payload.items():
            if "size" in key or "bytes" in key:
                n = _i(v)
                if n is not None:
                    break
        dtype = "byte" if n is not None else None
    if n is None or not 0 <= n < 2**50 or (k is not None and not 0 < k < 2**20):
        return
    row["dtype"] = dtype
    if k is not None:
        row["group_size"] = k
    # NCCL passes one rank's buffer: the all-gather input, the reduce-scatter output
    if op == "all_gather":
        row["in_nelems"] = n
        if k is not None:
            row["out_nelems"] = n * k
        else:
            # the shard scaled by the world size (flagged approximate): collectives' dims path
            r.comm_meta_row(
                row["event_id"], "nccl:all_gather", "nvtx", False, row["device"], row["track"],
                row["ts_ns"] - r.base, row["ts_ns"] - r.base + row["dur_ns"], None,
                input_dims=[[n]], input_type=[dtype],
            )
    elif op == "reduce_scatter":
        row["out_nelems"] = n
        if k is not None:
            row["in_nelems"] = n * k
        else:
            row["out_nelems"] = None  # the input (nccl-tests S) is unknown without the group size
    else:
        row["in_nelems"] = n
        row["out_nelems"] = n


# -- .nsys-rep reports ----------------------------------------------------------------

EXPORT_TIMEOUT_S = 3600


def _export_hint(path: Path) -> str:
    stem = path.name[: -len(".nsys-rep")] if path.name.endswith(".nsys-rep") else path.stem
    return f"nsys export --type sqlite --output {stem}.sqlite {path.name}"


def find_nsys_for_export(path: Path) -> str:
    """The ``nsys`` executable on PATH, to export the report ``path``.

    Raises FileError (exit 2, one line) naming the report and the command that exports it
    when there is none.
    """
    import shutil

    exe = shutil.which("nsys")
    if not exe:
        raise FileError(
            path,
            f"an Nsight Systems report: nsys is not on PATH to export it; export it where nsys is "
            f"({_export_hint(path)}) and ingest the .sqlite",
        )
    return exe


def export_report(path: Path, dest: Path) -> Path:
    """Export the report ``path`` (``.nsys-rep``) to the SQLite file ``dest`` with
    ``nsys export --type sqlite --force-overwrite true --output DEST PATH`` (the documented
    exporter switches); returns ``dest``.

    Raises FileError (one line) when nsys is not on PATH, fails, or writes no file.
    """
    import subprocess

    exe = find_nsys_for_export(path)
    cmd = [exe, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(dest), str(path)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FileError(path, f"nsys export failed ({exc})") from None
    if done.returncode != 0 or not dest.is_file():
        last = (done.stderr or done.stdout or "").strip().splitlines()
        why = last[-1] if last else f"exit status {done.returncode}, no {dest.name}"
        raise FileError(path, f"nsys export failed: {why} (try: {_export_hint(path)})")
    return dest
