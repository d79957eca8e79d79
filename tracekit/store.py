"""The Parquet store: one directory per run, DuckDB views over all of them.

Layout (``<store>`` defaults to ``./tracekit-store``; ``--store`` or the
``TRACEKIT_STORE`` environment variable change it)::

    <store>/runs/<run_id>/run.parquet          1 row: the ``runs`` table
    <store>/runs/<run_id>/ranks.parquet        1 row per rank
    <store>/runs/<run_id>/events/rank=<r>.parquet
    <store>/runs/<run_id>/collectives.parquet  1 row per collective call per rank
    <store>/.staging/                          private to writers

Writes are atomic: a run is assembled in ``.staging`` and renamed into
``runs/`` as a whole, so an interrupted or failed ingest leaves the store as it
was. Every run row carries ``schema_version``; a reader refuses a store whose
major version is newer than this tracekit's (``StoreError``).

The column contract is in ``../shared/DESIGN.md`` ("The store"); the Arrow
schemas below are its executable form.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterable

import pyarrow as pa

from tracekit import SCHEMA_VERSION
from tracekit.errors import StoreError

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

RUNS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("source", pa.string()),  # kineto / nsys / nccl_tests / collector name
        ("workload", pa.string()),  # tp / ep / pp / disagg_kv / sweep / external
        ("backend", pa.string()),  # nccl / rccl / gloo / unknown
        ("world_size", pa.int32()),
        ("torch_version", pa.string()),
        ("nccl_version", pa.string()),
        ("device_name", pa.string()),
        ("config", pa.string()),  # JSON text
        ("schema_version", pa.string()),
    ]
)

RANKS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("host", pa.string()),
        ("source_path", pa.string()),
        ("source_sha256", pa.string()),
        ("clock_offset_ns", pa.int64()),
        ("clock_offset_err_ns", pa.int64()),
        ("events", pa.int64()),
        ("events_quarantined", pa.int64()),
        ("warnings", pa.list_(pa.string())),
    ]
)

EVENTS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("event_id", pa.int64()),  # unique within (run, rank); file order
        ("track_kind", pa.string()),  # gpu_stream / cpu_thread
        ("device", pa.int64()),  # GPU index, or process id for CPU threads
        ("track", pa.int64()),  # stream id or thread id
        ("category", pa.string()),  # kernel, memcpy, memset, sync, cpu_op, user_annotation, runtime, ...
        ("name", pa.string()),
        ("ts_ns", pa.int64()),  # start, ns on the run's common clock
        ("dur_ns", pa.int64()),  # duration, ns
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        ("launch_event_id", pa.int64()),  # GPU work -> the runtime launch call on the CPU
        ("class", pa.string()),  # compute / comm / memory / sync / cpu / other
        ("step", pa.int64()),  # profiler step number or null
        ("clipped", pa.bool_()),  # overlapped the next op on its GPU stream; cut to its start
        ("clipped_ns", pa.int64()),  # how much was cut, ns (0 when not clipped)
    ]
)

COLLECTIVES_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("event_id", pa.int64()),  # the span that communicated (NCCL kernel / gloo span)
        ("pg_name", pa.string()),
        ("pg_ranks", pa.list_(pa.int32())),
        ("group_size", pa.int32()),
        ("seq", pa.int64()),
        ("op", pa.string()),  # canonical op, null when unattributed
        ("dtype", pa.string()),
        ("size_bytes", pa.int64()),  # nccl-tests S
        ("wire_bytes", pa.int64()),  # bytes this rank must put on the wire
        ("in_splits", pa.list_(pa.int64())),  # all-to-all input splits, elements per peer ([] = even)
        ("out_splits", pa.list_(pa.int64())),  # all-to-all output splits, elements per peer
        ("peer", pa.int32()),
        ("algo", pa.string()),
        ("proto", pa.string()),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("meta_source", pa.string()),  # kernel_args / record_param_comms / cpu_op_dims / name_only
        ("approx", pa.bool_()),
        ("issue_ts_ns", pa.int64()),  # when the CPU issued it (launch or op start); orders seq
        ("log_algbw_gbps", pa.float64()),  # nccl-tests runs: the log's own algbw, GB/s
        ("log_busbw_gbps", pa.float64()),  # nccl-tests runs: the log's own busbw, GB/s
        ("in_place", pa.bool_()),  # nccl-tests runs: the in-place column
        ("wrong", pa.int64()),  # nccl-tests runs: wrong values of the row (#wrong; see nccl_tests_run); else null
    ]
)

TABLES = {
    "runs": ("run.parquet", RUNS_SCHEMA),
    "ranks": ("ranks.parquet", RANKS_SCHEMA),
    "events": ("events/*.parquet", EVENTS_SCHEMA),
    "collectives": ("collectives.parquet", COLLECTIVES_SCHEMA),
}

PARQUET_OPTS = dict(compression="zstd", compression_level=3)
ANALYSIS_MEMORY_LIMIT = 48 * 2**20
"""DuckDB's memory budget for analyses, bytes (it spills beyond; see :class:`AnalysisConnection`).
No analysis holds a whole rank in one window any more (overlap_windows sweeps a sorted stream,
collective_instances is built in parts), so a small budget suffices: the report of a 3 GB trace
(×64 replica of hta_ddp_v100) peaks at ~226 MiB (~260 MiB at 128 MB), of a 757 MB one (×16) at
~187 MiB (benchmarks/README.md)."""

ANALYSIS_MEMORY_MAX = 8 * 2**30
"""The budget a statement that cannot run within ANALYSIS_MEMORY_LIMIT may grow to (×4 per retry)."""


class AnalysisConnection:
    """A DuckDB connection whose ``execute`` retries a statement that ran out of memory.

    Sorts, joins and aggregations spill to disk within the budget; a window over one very
    large partition may not, and DuckDB then fails the statement. Instead of failing the
    report, the budget is raised ×4 (up to ANALYSIS_MEMORY_MAX) and the statement run again
    (a failed statement has no effect). Everything else is the wrapped connection's.
    """

    def __init__(self, con, limit: int):
        self._con = con
        self.memory_limit = limit
        con.execute(f"SET memory_limit = '{limit}B'")

    def raise_budget(self) -> bool:
        """Raise the budget ×4 (up to ANALYSIS_MEMORY_MAX); False when it is already there."""
        if self.memory_limit >= ANALYSIS_MEMORY_MAX:
            return False
        self.memory_limit = min(self.memory_limit * 4, ANALYSIS_MEMORY_MAX)
        self._con.execute(f"SET memory_limit = '{self.memory_limit}B'")
        return True

    def execute(self, *args, **kwargs):
        import duckdb

        while True:
            try:
                return self._con.execute(*args, **kwargs)
            except duckdb.OutOfMemoryException:
                if not self.raise_budget():
                    raise

    def __getattr__(self, name):
        return getattr(self._con, name)


_NS_PER_UNIT = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def default_store_path() -> Path:
    """The store directory: ``$TRACEKIT_STORE`` if set, else ``./tracekit-store``."""
    return Path(os.environ.get("TRACEKIT_STORE") or "tracekit-store")


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is a safe directory name, else raise StoreError."""
    if not RUN_ID_RE.match(run_id or ""):
        raise StoreError(
            f"invalid run id {run_id!r}: use letters, digits, '.', '_' and '-' (at most 128 characters)"
        )
    return run_id


def combined_digest(digests: Iterable[str]) -> str:
    """One sha256 standing for several source files (a run whose single rank row covers many files)."""
    import hashlib

    ds = sorted(digests)
    if len(ds) == 1:
        return ds[0]
    return hashlib.sha256("\n".join(ds).encode()).hexdigest()


def _major(version: str) -> int:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 10**6  # unparsable: treat as newer


class Store:
    """A tracekit store directory.

    ``Store(path)`` does not create anything; writers call :meth:`staging`.
    Raises StoreError when the path exists but is not a directory.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_store_path()
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"{self.path}: store path exists and is not a directory")

    @property
    def runs_dir(self) -> Path:
        return self.path / "runs"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / check_run_id(run_id)

    def run_ids(self) -> list[str]:
        """Run ids present in the store, sorted by name."""
        if not self.runs_dir.is_dir():
            return []
        return sorted(p.name for p in self.runs_dir.iterdir() if p.is_dir() and (p / "run.parquet").exists())

    def has_run(self, run_id: str) -> bool:
        return (self.run_dir(run_id) / "run.parquet").exists()

    # -- writing -----------------------------------------------------------------

    def staging(self) -> "Staging":
        """A private directory to assemble one run in; see :class:`Staging`."""
        return Staging(self)

    # -- reading -----------------------------------------------------------------

    def connect(self, *, run_ids: list[str] | None = None, read_only_check: bool = True):
        """A DuckDB connection (:class:`AnalysisConnection`) with the store's tables as views.

        Views ``runs``, ``ranks``, ``events``, ``collectives`` read the Parquet
        files of every run, or only of ``run_ids`` (faster for one run's report);
        when there is no run they are empty with the right columns. The analyses are
        not here: ``tracekit.analyses.connect(store, ...)`` adds them.
        Raises StoreError if a run was written by a newer major schema version.
        """
        import duckdb

        con = duckdb.connect(database=":memory:")
        con.execute("SET preserve_insertion_order = false")
        # Each view that reads a Parquet file binds its footer anew (the analyses bind the events
        # file some twenty times); cached, it is parsed once: on a 3 GB trace's store (408 row
        # groups) the analyses' views took +52 MiB uncached, +8 MiB cached.
        con.execute("SET parquet_metadata_cache = true")
        # Bounded memory for analyses of big runs: DuckDB spills to a temporary folder beyond this.
        con.execute("SET temp_directory = ?", [str(Path(tempfile.gettempdir()) / "tracekit-duckdb")])
        con = AnalysisConnection(con, ANALYSIS_MEMORY_LIMIT)
        ids = self.run_ids() if run_ids is None else [check_run_id(r) for r in run_ids]
        for table, (pattern, schema) in TABLES.items():
            files = []
            for rid in ids:
                files.extend(sorted(str(p) for p in self.run_dir(rid).glob(pattern)))
            if files:
                lst = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
                con.execute(
                    f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM read_parquet([{lst}], union_by_name = true)"
                )
            else:
                empty = schema.empty_table()
                con.register(f"__empty_{table}", empty)
                con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM __empty_{table}")
        if read_only_check and ids:
            newest = con.execute("SELECT schema_version FROM runs").fetchall()
            mine = _major(SCHEMA_VERSION)
            for (ver,) in newest:
                if _major(ver) > mine:
                    raise StoreError(
                        f"{self.path}: written by a newer tracekit (schema {ver}, this one reads {SCHEMA_VERSION}); upgrade tracekit"
                    )
        return con

    def latest_run_id(self, workload: str | None = None, required: bool = True) -> str | None:
        """The most recently created run (of ``workload`` if given; nccl-tests runs excluded then).

        StoreError when there is none and ``required``, else None.
        """
        import pyarrow.parquet as pq

        best = None
        for rid in self.run_ids():
            # ParquetFile, not read_table (which imports pyarrow.dataset and pandas: ~0.25 s of startup);
            # created_at compared as integer ns since the epoch, not as a Python datetime (converting
            # a tz-aware timestamp imports pandas too; a cast imports pyarrow.compute)
            t = pq.ParquetFile(self.run_dir(rid) / "run.parquet").read(columns=["created_at", "workload", "source"])
            if workload is not None and (t.column("workload")[0].as_py() != workload
                                         or t.column("source")[0].as_py() == "nccl_tests"):
                continue
            ts = t.column("created_at")[0]
            created = None if ts.value is None else ts.value * _NS_PER_UNIT[ts.type.unit]
            if best is None or created > best[0]:
                best = (created, rid)
        if best is None:
            if not required:
                return None
            what = f"no {workload} runs" if workload else "no runs"
            raise StoreError(f"{self.path}: {what} in the store (run `tracekit ingest` or `tracekit collect` first)")
        return best[1]

    def find_by_sha256(self, digests: Iterable[str]) -> str | None:
        """The run whose ranks came from exactly these source files (by sha256), if any."""
        want = sorted(digests)
        import pyarrow.parquet as pq

        for rid in self.run_ids():
            f = self.run_dir(rid) / "ranks.parquet"
            if not f.exists():
                continue
            have = sorted(x for x in pq.ParquetFile(f).read(columns=["source_sha256"]).column(0).to_pylist() if x)
            if have and (have == want or have == [combined_digest(want)]):
                return rid
        return None


OWNER_FILE = ".owner-pid"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_abandoned(root: Path) -> None:
    """Delete staging directories left by writers that died (killed mid-ingest): their owner pid
    is gone. Directories of live writers (concurrent ingests) are left alone."""
    for d in root.iterdir():
        if not d.is_dir():
            continue
        try:
            pid = int((d / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue  # being created right now, or not ours
        if pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(d, ignore_errors=True)


class Staging:
    """A staging directory for one run, renamed into the store on :meth:`commit`.

    Use as a context manager: leaving the block without ``commit`` (an error, an
    interrupt) deletes the staging directory and leaves the store unchanged.
    """

    def __init__(self, store: Store):
        self.store = store
        self.dir: Path | None = None

    def __enter__(self) -> "Staging":
        self._created_store = not self.store.path.exists()
        root = self.store.path / ".staging"
        try:
            root.mkdir(parents=True, exist_ok=True)
            _remove_abandoned(root)
            self.dir = root / uuid.uuid4().hex
            self.dir.mkdir()
            (self.dir / OWNER_FILE).write_text(f"{os.getpid()}\n")
        except OSError as exc:
            raise StoreError(f"{self.store.path}: cannot write to the store ({exc.strerror or exc})") from None
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.dir is not None and self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
        root = self.store.path / ".staging"
        try:
            root.rmdir()  # only when empty
        except OSError:
            pass
        if self._created_store and self.store.path.exists() and not any(self.store.path.iterdir()):
            try:
                self.store.path.rmdir()  # we created it for nothing
            except OSError:
                pass

    def commit(self, run_id: str, *, replace: bool = False) -> Path:
        """Move the staged run into ``runs/<run_id>`` atomically; returns its path.

        With ``replace`` an existing run of that id is swapped out (the old one
        is moved aside first, then removed). Raises StoreError if the id exists
        and ``replace`` is false.
        """
        assert self.dir is not None
        dest = self.store.run_dir(run_id)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.store.path}: cannot write to the store ({exc.strerror or exc})") from None
        old = None
        try:
            if dest.exists():
                if not replace:
                    raise StoreError(
                        f"run {run_id!r} already exists in {self.store.path} (use --replace or another --run-id)"
                    )
                old = self.dir.parent / (uuid.uuid4().hex + ".old")
                os.rename(dest, old)
            try:
                os.rename(self.dir, dest)
            except OSError:
                if old is not None:
                    os.rename(old, dest)  # put the replaced run back
                raise
        except OSError as exc:
            raise StoreError(f"{self.store.path}: cannot write the run into the store ({exc.strerror or exc})") from None
        (dest / OWNER_FILE).unlink(missing_ok=True)
        self.dir = None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return dest
