"""The staging area between a reader and the link pass: the raw event schema, the per-rank
staging file, the comm-metadata rows and the batch writer.

Readers (:mod:`tracekit.ingest.kineto`, :mod:`tracekit.ingest.nsys`) write one staging file
per rank file (an Arrow IPC stream of :data:`RAW_SCHEMA` rows, in file order) and return a
:class:`RankFile` holding what else the file yielded (its metadata rows, profiler steps,
warnings). The link pass (:mod:`tracekit.ingest.linkpass`) and the run's assembly
(:mod:`tracekit.ingest.assemble`) read them; readers and the later passes import this module,
not each other.
"""

from __future__ import annotations

import hashlib
import itertools
import operator
from dataclasses import dataclass, field
import re
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


_DICT = pa.dictionary(pa.int32(), pa.string())
RAW_SCHEMA = pa.schema(
    [
        ("event_id", pa.int64()),
        ("track_kind", _DICT),
        ("device", pa.int64()),
        ("track", pa.int64()),
        ("category", _DICT),
        ("name", _DICT),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        ("is_comm", pa.bool_()),
    ]
)
"""Rows of the readers' staging files (Arrow IPC streams, one per rank file, read by the link pass).
String columns are dictionary-encoded (a dictionary per batch)."""

_STAGE_IPC = pa.ipc.IpcWriteOptions()
"""Staging files are uncompressed IPC: the link pass reads them three times, and decompressing
would cost more than the disk it saves (benchmarks/README.md, "Design measurements")."""


def raw_batch(columns: list) -> pa.RecordBatch:
    """A RAW_SCHEMA batch from its columns; plain string columns are dictionary-encoded."""
    cols = [c.dictionary_encode() if pa.types.is_string(c.type) and pa.types.is_dictionary(f.type) else c
            for c, f in zip(columns, RAW_SCHEMA)]
    return pa.record_batch(cols, schema=RAW_SCHEMA)


def open_stage_writer(out: Path):
    """An Arrow IPC stream writer of RAW_SCHEMA batches into ``out`` (close() it)."""
    return pa.ipc.new_stream(str(out), RAW_SCHEMA, options=_STAGE_IPC)


META_FIELDS = (
    "collective",
    "in_nelems",
    "out_nelems",
    "group_size",
    "dtype",
    "pg_name",
    "pg_id",
    "pg_desc",
    "pg_ranks",
    "in_split",
    "out_split",
    "seq",
    "input_dims",
    "input_type",
    "concrete",
    "gstart",
    "gstride",
)


META_SCHEMA = pa.schema(
    [
        ("event_id", pa.int64()),
        ("name", pa.string()),
        ("gpu", pa.bool_()),
        ("device", pa.int64()),
        ("track", pa.int64()),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("rest", pa.large_binary()),
    ]
)
"""The comm-metadata table of a rank file (one Arrow IPC stream in the staging folder, file order):
the columns the collectives search and sort on, and ``rest``, the row's other keys (category,
correlation, the :data:`META_FIELDS` present) as JSON, whose values vary in type between traces
(ints beyond 64 bits included)."""

_FIXED = ("event_id", "name", "gpu", "device", "track", "ts_ns", "dur_ns")
_JSON = msgspec.json.Encoder(enc_hook=lambda o: o.item() if isinstance(o, np.generic) else _unencodable(o))
_JSON_DEC = msgspec.json.Decoder()

META_BATCH_ROWS = 4096
"""comm_meta rows a reader keeps in memory before :meth:`RankFile.flush_meta` writes them out."""


def _unencodable(o):
    raise TypeError(f"metadata value of type {type(o).__name__} cannot be stored")


def _meta_batch(rows: list[dict]) -> pa.RecordBatch:
    """Metadata rows given as dicts (the nsys reader's, tests') → one :data:`META_SCHEMA` batch."""
    cols = [pa.array([r.get(f) for r in rows], t.type) for f, t in zip(_FIXED, META_SCHEMA)]
    rest = [encode_rest({k: v for k, v in r.items() if k not in _FIXED}) for r in rows]
    return pa.record_batch(cols + [pa.array(rest, pa.large_binary())], schema=META_SCHEMA)


def encode_rest(rest: dict) -> bytes:
    """The ``rest`` JSON of one metadata row from its keys other than the fixed columns."""
    return _JSON.encode(rest)


_ALWAYS = object()  # a default no value is: the row's correlation is written even when null
_Rest = msgspec.defstruct(
    "_MetaRest", [(f, Any, None) for f in META_FIELDS] + [("category", Any, None), ("correlation", Any, _ALWAYS)],
    omit_defaults=True, gc=False, module=__name__)
"""``rest`` of a metadata row as a struct: encoded, the :data:`META_FIELDS` that are not None, in
that order, then category and correlation (null included): the JSON a dict with those keys gives."""


def rest_column(fields, category, correlation) -> list[bytes]:
    """``rest`` JSON of rows given column-wise, with no Python code per row: ``fields`` yields each
    row's :data:`META_FIELDS` values as a tuple (None: absent), ``category`` / ``correlation`` the
    row's values (a correlation of None is written as null, a category of None left out). Same
    bytes as :func:`encode_rest` of the dict of the present fields, then ``category`` when it is
    not None, then ``correlation``."""
    rows = itertools.starmap(_Rest, map(operator.add, fields, zip(category, correlation)))
    return list(map(_JSON.encode, rows))


def columns_meta_batch(event_id, name, gpu, device, track, ts_ns, dur_ns, rest: list[bytes]) -> pa.RecordBatch:
    """One :data:`META_SCHEMA` batch from its columns (arrays or lists, one entry per row; ``rest``
    from :func:`rest_column`)."""
    cols = [pa.array(c, f.type) for c, f in zip((event_id, name, gpu, device, track, ts_ns, dur_ns, rest), META_SCHEMA)]
    return pa.record_batch(cols, schema=META_SCHEMA)


@dataclass
class RankFile:
    """What one rank file yielded, besides the rows written to its staging file.

    Metadata rows of collective-related events not yet written to the comm-metadata table
    ``meta_path`` (:data:`META_SCHEMA`) are held as dicts in ``comm_meta`` (appended by a reader)
    or as batches (:meth:`add_meta`), in file order; :meth:`meta_rows` reads the table and both.
    """

    path: Path
    sha256: str
    meta: dict
    events: int = 0
    quarantined: int = 0
    has_gpu: bool = False
    comm_meta: list[dict] = field(default_factory=list)  # metadata rows of collective-related events
    steps: list[tuple[int, int, int, int]] = field(default_factory=list)  # (step, event_id, ts, end)
    thread_names: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    meta_path: str | None = None  # the comm-metadata table, once rows were written to it
    _meta_writer: object = field(default=None, repr=False, compare=False)
    _meta_parts: list = field(default_factory=list, repr=False, compare=False)  # META_SCHEMA batches held
    _meta_held: int = field(default=0, repr=False, compare=False)  # rows in _meta_parts

    def __setstate__(self, state: dict) -> None:
        """Unpickled (a worker's result in the driver, a task in a worker): the rank lists of
        ``meta['distributedInfo']['pg_config']`` shared with every RankFile holding the same list
        (:func:`_shared_ranks`): every rank's trace lists the world group's N ranks, N² integers
        at N ranks otherwise."""
        self.__dict__.update(state)
        _shared_ranks(self.meta)
        _shared_meta(self.meta)

    def add_meta(self, batch: pa.RecordBatch) -> None:
        """Hold a :data:`META_SCHEMA` batch of metadata rows (after the ``comm_meta`` dicts so far)."""
        self._held_batches()
        if batch.num_rows:
            self._meta_parts.append(batch)
            self._meta_held += batch.num_rows

    @property
    def meta_pending(self) -> int:
        """Metadata rows held in memory (dicts and batches), not yet in the table."""
        return len(self.comm_meta) + self._meta_held

    def _held_batches(self) -> list:
        """The rows held in memory as batches, in file order (the ``comm_meta`` dicts become one)."""
        if self.comm_meta:
            self._meta_parts.append(_meta_batch(self.comm_meta))
            self._meta_held += len(self.comm_meta)
            self.comm_meta = []
        return self._meta_parts

    def flush_meta(self, path: Path) -> None:
        """Append the rows held in memory to the table at ``path`` and drop them from memory
        (the reader's memory stays flat; :meth:`close_meta` when the file is read)."""
        parts = self._held_batches()
        if not parts:
            return
        if self._meta_writer is None:
            self.meta_path = str(path)
            self._meta_writer = pa.ipc.new_stream(str(path), META_SCHEMA)
        for batch in parts:
            self._meta_writer.write_batch(batch)
        self._meta_parts = []
        self._meta_held = 0

    def close_meta(self, path: Path | None = None) -> None:
        """Write the rows still in memory and close the table. ``path``: where to start the table
        when no row was written yet (so that no row travels with the RankFile to the driver and
        back); without it, rows are written only to a table already started."""
        if self._meta_writer is None and path is not None and self.meta_pending:
            self.flush_meta(Path(path))
        if self._meta_writer is not None:
            self.flush_meta(Path(self.meta_path))
            self._meta_writer.close()
            self._meta_writer = None

    def remove_meta(self) -> None:
        """Delete the comm-metadata table (after the run is assembled)."""
        if self.meta_path:
            Path(self.meta_path).unlink(missing_ok=True)

    def meta_table(self) -> pa.Table:
        """Every comm_meta row as one :data:`META_SCHEMA` table, in file order."""
        parts = []
        if self.meta_path:
            with pa.OSFile(self.meta_path) as fh:
                parts.extend(pa.ipc.open_stream(fh).read_all().to_batches())
        parts.extend(self._meta_parts)  # held batches, then the dicts appended since (file order)
        if self.comm_meta:
            parts.append(_meta_batch(self.comm_meta))
        return pa.Table.from_batches(parts, schema=META_SCHEMA)

    def meta_rows(self, times=None) -> "MetaRows":
        """The comm_meta rows as :class:`MetaRows`. ``times``: replaced (ts_ns, dur_ns) by event_id
        (``lookup`` as :class:`tracekit.ingest.linkpass.ById` has it)."""
        return MetaRows(self.meta_table(), times)


_RANK_LISTS: dict = {}
"""tuple(ranks) → the one list of a process group's ranks that unpickled RankFiles share."""
_RANK_LISTS_MAX = 100_000
"""Distinct rank lists kept (the table is emptied beyond it: a long-lived process ingesting many runs)."""


def _shared_ranks(meta) -> None:
    """Replace, in place, each ``ranks`` list of ``meta['distributedInfo']['pg_config']`` by the equal
    list seen before (:data:`_RANK_LISTS`), so equal lists of many ranks' metadata are stored once.
    Lists holding unhashable items are left as they are."""
    di = meta.get("distributedInfo") if isinstance(meta, dict) else None
    pgs = di.get("pg_config") if isinstance(di, dict) else None
    if not isinstance(pgs, list):
        return
    if len(_RANK_LISTS) > _RANK_LISTS_MAX:
        _RANK_LISTS.clear()
    for pg in pgs:
        if isinstance(pg, dict) and isinstance(pg.get("ranks"), list):
            try:
                pg["ranks"] = _RANK_LISTS.setdefault(tuple(pg["ranks"]), pg["ranks"])
            except TypeError:  # an unhashable item: not shared
                pass


_SHARED_META: dict = {}
"""Pickled value → the one object that unpickled RankFiles' equal metadata values share
(:func:`_shared_meta`); emptied beyond _RANK_LISTS_MAX entries."""

SHARED_META_KEYS = ("deviceProperties", "INFO")
"""Top-level trace metadata shared between RankFiles when equal (every rank of a job on one GPU
model writes the same), besides the process groups of ``distributedInfo.pg_config``."""


def _shared_meta(meta) -> None:
    """Replace, in place, ``meta``'s SHARED_META_KEYS values and each process group of its
    ``distributedInfo.pg_config`` by an equal one seen before (:data:`_SHARED_META`, keyed by their
    pickle), so that a driver holding N ranks' metadata holds each distinct value once, not N copies
    (every rank's trace repeats its groups, e.g. the world group, and the job's GPUs). Values that
    cannot be pickled are left as they are. The shared values are read, never changed, after a
    RankFile is unpickled."""
    if not isinstance(meta, dict):
        return
    import pickle

    if len(_SHARED_META) > _RANK_LISTS_MAX:
        _SHARED_META.clear()
    di = meta.get("distributedInfo")
    where = [(meta, k) for k in SHARED_META_KEYS if isinstance(meta.get(k), (dict, list))]
    if isinstance(di, dict) and isinstance(di.get("pg_config"), list):
        where.extend((di["pg_config"], i) for i, pg in enumerate(di["pg_config"]) if isinstance(pg, dict))
    for holder, k in where:
        try:
            key = pickle.dumps(holder[k], protocol=pickle.HIGHEST_PROTOCOL)  # equal pickles: equal values
        except Exception:  # an unpicklable value: kept as it is
            continue
        holder[k] = _SHARED_META.setdefault(key, holder[k])


class MetaRows:
    """The comm_meta rows of a rank file by index (file order), in memory.

    Columns (numpy, one entry per row): ``event_id``, ``gpu`` (bool), ``ts_ns``, ``dur_ns``,
    ``name`` (an index into ``names``) and ``thread`` (an index into ``threads``, the distinct
    (device, track) pairs, a null being None). :meth:`row` gives a row's dict (decoded from the
    table when asked). ``times`` (event_id → (ts_ns, dur_ns), clipped GPU spans) replace those
    rows' times, in the columns and in the dicts. Memory: the table (~150 B per row) and ~40 B
    per row of columns.
    """

    def __init__(self, table: pa.Table, times=None):
        table = table.combine_chunks()
        self._table = table
        n = table.num_rows
        self.event_id = table.column("event_id").to_numpy()
        self.gpu = table.column("gpu").to_numpy(zero_copy_only=False).astype(bool)
        self.ts_ns = table.column("ts_ns").to_numpy().copy()
        self.dur_ns = table.column("dur_ns").to_numpy().copy()
        if times is not None and len(times) and n:
            found, (t, d), _ = times.lookup(self.event_id)
            self.ts_ns[found] = t[found]
            self.dur_ns[found] = d[found]
        name = table.column("name").dictionary_encode().combine_chunks() if n else None
        self.names = name.dictionary.to_pylist() if n else []
        self.name = name.indices.to_numpy().astype(np.int32) if n else np.empty(0, dtype=np.int32)
        thread_ix: dict = {}
        self.thread = np.fromiter(
            (thread_ix.setdefault(p, len(thread_ix)) for p in zip(table.column("device").to_pylist(),
                                                                  table.column("track").to_pylist())),
            dtype=np.int32, count=n)
        self.threads = list(thread_ix)
        rest = table.column("rest").combine_chunks() if n else pa.array([], pa.large_binary())
        self._rest_at = np.frombuffer(rest.buffers()[1], dtype=np.int64)[rest.offset:rest.offset + n + 1] if n else None
        self._rest = memoryview(rest.buffers()[2]) if n and rest.buffers()[2] is not None else memoryview(b"")

    def __len__(self) -> int:
        return len(self.event_id)

    def names_where(self, fn) -> np.ndarray:
        """Per row: ``fn(name)`` (evaluated once per distinct name)."""
        table = np.array([bool(fn(nm)) for nm in self.names] + [False], dtype=bool)
        return table[self.name]

    def row(self, i: int) -> dict:
        """The dict of row ``i`` (a new one each time), with its replaced times."""
        i = int(i)
        at = self._rest_at  # ndarray.item(i): the Python int/bool, without a numpy scalar between
        r = _JSON_DEC.decode(self._rest[at.item(i):at.item(i + 1)])
        device, track = self.threads[self.thread.item(i)]
        r.update(event_id=self.event_id.item(i), name=self.names[self.name.item(i)], gpu=self.gpu.item(i),
                 device=device, track=track, ts_ns=self.ts_ns.item(i), dur_ns=self.dur_ns.item(i))
        return r


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes (as stored, compressed or not)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _BatchWriter:
    """Record batches → one file, written by a second thread.

    pyarrow releases the GIL while encoding and writing, so this overlaps the
    work on the next batch. At most two batches wait (bounded memory). An error in
    the thread (a full disk...) is raised by the next ``write`` or by leaving the
    ``with`` block. By default a staging file (RAW_SCHEMA, :func:`open_stage_writer`);
    with ``schema``, a Parquet file: ``options`` go to ``pq.ParquetWriter``,
    ``row_group_size`` to each ``write_batch``.
    """

    def __init__(self, out: Path, schema: pa.Schema | None = None, options: dict | None = None,
                 row_group_size: int | None = None):
        import queue
        import threading

        self.out = out
        self.schema = schema
        self.options = options or {}
        self.row_group_size = row_group_size
        self._q: queue.Queue = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._t = threading.Thread(target=self._run, name="tracekit-raw-writer", daemon=True)
        self._t.start()

    def _run(self) -> None:
        writer = None
        try:
            while True:
                batch = self._q.get()
                if batch is None:
                    break
                if self._error is None:
                    if writer is None:
                        writer = self._open()
                    if self.schema is None:
                        writer.write_batch(batch)
                    else:
                        writer.write_batch(batch, row_group_size=self.row_group_size)
            if writer is None:
                writer = self._open()
        except BaseException as exc:  # handed to the reading thread
            self._error = exc
            while self._q.get() is not None:  # drain until the reader says it is done
                pass
        finally:
            if writer is not None:
                try:
                    writer.close()
                except BaseException as exc:
                    self._error = self._error or exc

    def _open(self):
        if self.schema is None:
            return open_stage_writer(self.out)
        return pq.ParquetWriter(self.out, self.schema, **self.options)

    def write(self, batch: pa.RecordBatch) -> None:
        if self._error is not None:
            raise self._error
        self._q.put(batch)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self._q.put(None)
        self._t.join()
        if exc_type is None and self._error is not None:
            raise self._error
        return False


_RANK_RE = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?(\d+)", re.I)


def rank_from_filename(path: str | Path) -> int | None:
    """``rank-3.json``, ``rank3``, ``worker3``, ``rank_3`` → 3; None when the name has no rank."""
    m = _RANK_RE.search(Path(path).name)
    return int(m.group(1)) if m else None
