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

import bisect
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

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
"""Staging files are uncompressed IPC: the link pass reads them four times (0.04 s per 2M rows,
0.1 s with zstd); they take ~70 B per event on disk while the rank is linked."""


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


@dataclass
class RankFile:
    """What one rank file yielded, besides the rows written to its staging file."""

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
    meta_spill: str | None = None  # file holding comm_meta rows moved out of memory (see spill_meta)
    meta_spilled: int = 0  # rows in meta_spill
    meta_frames: list[tuple[int, int, int]] = field(default_factory=list)  # (offset, size, rows) per spilled frame

    def spill_meta(self, path: Path) -> None:
        """Append the in-memory ``comm_meta`` rows to ``path`` (msgpack frames) and drop them from memory.

        Large traces keep ~10k such rows per 200k events; spilling them keeps the
        reader's memory flat. :meth:`load_comm_meta` gives every row back, in order.
        """
        if not self.comm_meta:
            return
        try:
            data = b"M" + _MSGPACK_ENC.encode(self.comm_meta)
        except OverflowError:  # an int beyond 64 bits (msgpack has none): JSON keeps it
            data = b"J" + msgspec.json.encode(self.comm_meta)
        with open(path, "ab") as fh:
            fh.write(len(data).to_bytes(8, "little"))
            self.meta_frames.append((fh.tell(), len(data), len(self.comm_meta)))
            fh.write(data)
        self.meta_spill = str(path)
        self.meta_spilled += len(self.comm_meta)
        self.comm_meta = []

    def load_comm_meta(self) -> list[dict]:
        """Every comm_meta row (spilled ones first, then those still in memory), in file order."""
        rows: list[dict] = []
        for _off, _size, frame in self._frames():
            rows.extend(frame)
        return rows + self.comm_meta

    def _frames(self):
        """(offset, size, rows) of each spilled frame, in order."""
        if not self.meta_spill:
            return
        with open(self.meta_spill, "rb") as fh:
            while head := fh.read(8):
                size = int.from_bytes(head, "little")
                off = fh.tell()
                yield off, size, _decode_frame(fh.read(size))

    def meta_rows(self, times=None, columns: bool = True) -> "MetaRows":
        """The comm_meta rows as :class:`MetaRows` (columns in memory unless ``columns`` is False,
        the rows themselves on demand).

        ``times``: replaced (ts_ns, dur_ns) by event_id (``lookup`` as
        :class:`tracekit.spill.SortedColumns` has it)."""
        return MetaRows(self, times, columns)


def _decode_frame(data: bytes) -> list[dict]:
    dec = _MSGPACK_DEC if data[:1] == b"M" else _JSON_ROWS_DEC
    return dec.decode(memoryview(data)[1:])


META_FRAME_CACHE = 4
"""Decoded spill frames :class:`MetaRows` keeps (the ones used last)."""


class MetaRows:
    """Every comm_meta row of a rank file by index (file order), without holding them all.

    One pass over the spill frames (written by :meth:`RankFile.spill_meta`) keeps only numpy
    columns, one entry per row: ``gpu`` (bool), ``ts_ns``, ``dur_ns``,
    ``name`` (an index into ``names``) and ``thread`` (an index into ``threads``, the
    distinct (device, track) pairs). :meth:`row` gives a row's dict: rows the reader
    still held come from memory, spilled ones from their frame, decoded when first
    needed; the :data:`META_FRAME_CACHE` frames used last stay decoded, so a pass in
    file order decodes each frame once. ``times`` (event_id → (ts_ns, dur_ns)) replace
    those rows' times (clipped GPU spans), in the columns and in the dicts.

    With ``columns`` False nothing is decoded up front and no columns are kept (``frames``
    reads the rows in order).

    Memory: 25 B per row (none without columns) plus at most META_FRAME_CACHE frames of
    META_SPILL_ROWS rows.
    """

    def __init__(self, rf: RankFile, times=None, columns: bool = True):
        self._path = rf.meta_spill
        self._times = times if times is not None and len(times) else None
        self.names: list[str] = []
        self.threads: list[tuple] = []
        name_ix: dict = {}
        thread_ix: dict = {}
        self._frame_at: list[tuple[int, int, int]] = []  # (first row, file offset, size)
        total = rf.meta_spilled + len(rf.comm_meta)  # columns allocated once, filled frame by frame
        self._n = total
        if columns:
            self.gpu = np.empty(total, dtype=bool)
            self.ts_ns = np.empty(total, dtype=np.int64)
            self.dur_ns = np.empty(total, dtype=np.int64)
            self.name = np.empty(total, dtype=np.int32)
            self.thread = np.empty(total, dtype=np.int32)
        first = 0

        def add(rows: list[dict], at: int) -> None:
            n = len(rows)
            if at + n > total:
                raise ValueError(f"metadata spill {self._path} holds more rows than were spilled")
            if not columns:
                return
            sl = slice(at, at + n)
            self.gpu[sl] = np.fromiter((bool(r["gpu"]) for r in rows), dtype=bool, count=n)
            self.ts_ns[sl] = np.fromiter((r["ts_ns"] for r in rows), dtype=np.int64, count=n)
            self.dur_ns[sl] = np.fromiter((r["dur_ns"] for r in rows), dtype=np.int64, count=n)
            if self._times is not None:
                eid = np.fromiter((r["event_id"] for r in rows), dtype=np.int64, count=n)
                found, (t, d), _ = self._times.lookup(eid)
                self.ts_ns[sl][found] = t[found]
                self.dur_ns[sl][found] = d[found]
            self.name[sl] = np.fromiter((name_ix.setdefault(r["name"], len(name_ix)) for r in rows),
                                        dtype=np.int32, count=n)
            self.thread[sl] = np.fromiter(
                (thread_ix.setdefault((r["device"], r["track"]), len(thread_ix)) for r in rows), dtype=np.int32, count=n
            )

        if columns:
            for off, size, frame in rf._frames():
                self._frame_at.append((first, off, size))
                add(frame, first)
                first += len(frame)
        else:  # the frames' places and sizes, as the spill recorded them: nothing decoded
            for off, size, rows in rf.meta_frames:
                self._frame_at.append((first, off, size))
                first += rows
        self._tail_first = first
        self._tail = rf.comm_meta
        add(self._tail, first)
        if first + len(self._tail) != total:
            raise ValueError(f"metadata spill {self._path} holds fewer rows than were spilled")
        self.names = list(name_ix)
        self.threads = list(thread_ix)
        self._firsts = [f[0] for f in self._frame_at]
        self._cache: dict = {}
        self._lo = self._hi = 0  # rows [lo, hi) are those of frame list _cur, the last one used
        self._cur: list = []
        self._retime(self._tail)

    def frames(self):
        """(first row index, rows) of every frame in file order, the rows still in memory last;
        the dicts carry the replaced times. Frames are decoded afresh (the cache of :meth:`row`
        is left alone)."""
        for first, off, size in self._frame_at:
            with open(self._path, "rb") as fh:
                fh.seek(off)
                frame = _decode_frame(fh.read(size))
            self._retime(frame)
            yield first, frame
        if self._tail:
            yield self._tail_first, self._tail

    def __len__(self) -> int:
        return self._n

    def names_where(self, fn) -> np.ndarray:
        """Per row: ``fn(name)`` (evaluated once per distinct name)."""
        table = np.array([bool(fn(nm)) for nm in self.names] + [False], dtype=bool)
        return table[self.name]

    def row(self, i: int) -> dict:
        """The dict of row ``i``, with its replaced times (the same dict object while its frame is cached)."""
        i = int(i)
        if self._lo <= i < self._hi:
            return self._cur[i - self._lo]
        if i >= self._tail_first:
            return self._tail[i - self._tail_first]
        k = bisect.bisect_right(self._firsts, i) - 1
        first, off, size = self._frame_at[k]
        frame = self._cache.pop(k, None)
        if frame is None:
            with open(self._path, "rb") as fh:
                fh.seek(off)
                frame = _decode_frame(fh.read(size))
            self._retime(frame)
            if len(self._cache) >= META_FRAME_CACHE:
                self._cache.pop(next(iter(self._cache)))
        self._cache[k] = frame  # most recently used last
        self._lo, self._hi, self._cur = first, first + len(frame), frame
        return frame[i - first]

    def _retime(self, rows: list[dict]) -> None:
        times = self._times
        if times is None or not rows:
            return
        eid = np.fromiter((r["event_id"] for r in rows), dtype=np.int64, count=len(rows))
        found, (t, d), _ = times.lookup(eid)
        for j in np.flatnonzero(found).tolist():
            rows[j]["ts_ns"], rows[j]["dur_ns"] = int(t[j]), int(d[j])


_MSGPACK_ENC = msgspec.msgpack.Encoder()
_MSGPACK_DEC = msgspec.msgpack.Decoder(list[dict])
_JSON_ROWS_DEC = msgspec.json.Decoder(list[dict])
META_SPILL_ROWS = 4096
"""comm_meta rows a reader keeps in memory before :meth:`RankFile.spill_meta` (one spill frame)."""


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
