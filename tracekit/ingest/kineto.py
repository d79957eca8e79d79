"""Kineto (torch.profiler) JSON traces → raw event rows, streamed chunk by chunk.

One rank file at a time: :func:`read_rank_file` reads the file with
:class:`~tracekit.ingest.jsonstream.TraceStream`, turns every complete event
(``ph == "X"``) into a row of the store's ``events`` shape, and appends the rows
to a staging file (Arrow IPC) as it goes, so memory holds one chunk of events at a time.
What needs cross-event context (launch links, class, profiler step, the
collectives) is computed afterwards by :mod:`tracekit.ingest.link` over the
written rows; only the few collective-related events keep their metadata here
(``comm_meta``), since those are all the linker needs from ``args``.

Field spellings handled (they changed across PyTorch versions): categories
``kernel``/``Kernel``, ``cuda_runtime``/``Runtime``, ``gpu_memcpy``/``Memcpy``,
``cpu_op``/``Operator``; ``External id``/``external id``; ``Input Dims``/
``Input dims``; ``Process Group Name``/``Process Group ID``; string tids like
``"stream 7"``.

Times: Kineto writes µs with up to three decimals. They become int64 ns
exactly. The C scanner converts the decimal text itself. The msgspec path
multiplies integers by 1000 and takes ``round(x*1000)`` for floats below 2^41 µs;
any other value is converted from its decimal text. Why 2^41: for x < 2^k the
double nearest the text is off by at most 2^(k-53) µs = 500·2^(k-53) ns, and the
product x*1000 adds at most half an ulp of a number below 2^(k+10), 2^(k-44) ns;
the sum, about 2^(k-43) ns, must stay below 0.5 ns so the rounding lands on the
true integer. k = 41 leaves a factor of 2 (0.25 ns). (The bound used to be
2^52/1000 µs ≈ 2^42.03, which let 1 ns errors through: hta_nccl_parser's
ts ≈ 4.46e12 µs lost up to 1 ns.)
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import operator
import re
import zlib
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Optional

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracekit import _arrow
from tracekit.errors import FileError
from tracekit.ingest.comm_families import CPU_OP_NAMES, KERNEL_PATTERNS
from tracekit.ingest.jsonstream import FastChunk, TraceStream

# Canonical categories (store column `category`).
_CAT = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_sync": "sync",
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "cuda_driver": "driver",
    "python_function": "python_function",
    "cpu_instant_event": "cpu_instant_event",
}
GPU_CATEGORIES = frozenset({"kernel", "memcpy", "memset", "sync", "gpu_user_annotation"})

# Communication by name (DESIGN.md "Classifying events"); metadata decides first. Beyond
# NCCL/RCCL/gloo, the collective families' kernels (tracekit.ingest.comm_families: symmetric
# memory, custom all-reduce, TensorRT-LLM, DeepEP, NVSHMEM, MSCCL++) and the CPU ops that launch them.
BUILTIN_COMM_PATTERNS = (r"nccl", r"rccl", r"^gloo:") + KERNEL_PATTERNS
_COMM_CPU_PREFIX = ("nccl:", "c10d::", "gloo:", "record_param_comms", "rccl:") + CPU_OP_NAMES

_MAX_EXACT_FLOAT_US = float(2**41)  # see the module docstring
_MAX_INT_US = (2**63 - 1) // 1000

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


class KArgs(msgspec.Struct, gc=False):
    """The ``args`` keys tracekit reads; everything else is ignored."""

    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_lc: Any = msgspec.field(default=None, name="external id")
    device: Any = None
    stream: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_id: Any = msgspec.field(default=None, name="Process Group ID")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    in_split: Any = msgspec.field(default=None, name="In split size")
    out_split: Any = msgspec.field(default=None, name="Out split size")
    seq: Any = msgspec.field(default=None, name="Seq")
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_dims_lc: Any = msgspec.field(default=None, name="Input dims")
    input_type: Any = msgspec.field(default=None, name="Input type")
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")
    rank: Any = msgspec.field(default=None, name="Rank")
    gstart: Any = msgspec.field(default=None, name="Global rank start")
    gstride: Any = msgspec.field(default=None, name="Global rank stride")


class IdArgs(msgspec.Struct, gc=False):
    """The ``args`` of a runtime/driver call: only its ids are read."""

    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_lc: Any = msgspec.field(default=None, name="external id")


_KARGS = msgspec.json.Decoder(KArgs)
_KARGS_LIST = msgspec.json.Decoder(list[Optional[KArgs]])
_EMPTY_ARGS = KArgs()
_IDS = msgspec.json.Decoder(IdArgs)
_IDS_LIST = msgspec.json.Decoder(list[Optional[IdArgs]])
_EMPTY_IDS = IdArgs()
_LAUNCH_CATEGORIES = frozenset({"runtime", "driver"})

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


INT64_MAX = 2**63 - 1


def int_or_none(v: Any, lo: int = -INT64_MAX, hi: int = INT64_MAX) -> int | None:
    """``v`` if it is a JSON integer (not a bool) within [lo, hi], else None."""
    return v if type(v) is int and lo <= v <= hi else None


def _as_int(v: Any) -> int | None:
    if type(v) is int:
        return v if -INT64_MAX <= v <= INT64_MAX else None
    if type(v) is float and v == v and abs(v) < 9.2e18:
        return int(v)
    if isinstance(v, str):
        m = re.search(r"-?\d{1,18}", v)
        if m:
            return int(m.group())
    return None


def _track_id(v: Any) -> int:
    """Thread/stream/pid ids: ints as is; ``"stream 7"`` → 7; other text → a stable hash."""
    if type(v) is int and -INT64_MAX <= v <= INT64_MAX:
        return v
    i = _as_int(v)
    if i is not None:
        return i
    return -(zlib.crc32(str(v).encode("utf-8", "replace")) + 1)


def text_to_ns(text: bytes | str) -> int | None:
    """µs as JSON text (number or quoted string) → int ns, exactly; None if not a finite number."""
    if not isinstance(text, str):
        text = bytes(text).decode("utf-8", "replace")
    t = text.strip().strip('"').strip()
    if not t or t == "null":
        return None
    try:
        d = Decimal(t)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    return int((d * 1000).to_integral_value())


def _vector_ns(values: list, chunk_text_exact, which: str) -> tuple[np.ndarray, np.ndarray]:
    """µs values → (int64 ns, valid mask), exact (see module docstring)."""
    n = len(values)
    if any(type(v) is bool for v in values):  # numpy would read True as 1
        values = [None if type(v) is bool else v for v in values]
    try:
        arr = np.asarray(values)
    except (ValueError, OverflowError):
        arr = None
    if arr is None or arr.ndim != 1:  # e.g. every ts of the chunk an (empty) list: not numbers
        arr = np.fromiter(values, dtype=object, count=n)
    if arr.dtype.kind == "i":
        arr = arr.astype(np.int64)
        ok = np.abs(arr) < _MAX_INT_US  # beyond, ×1000 would wrap int64: quarantined
        return np.where(ok, arr, 0) * 1000, ok
    if arr.dtype.kind == "f":
        finite = np.isfinite(arr)
        if not finite.all() or (np.abs(arr[finite]).max(initial=0.0) < _MAX_EXACT_FLOAT_US):
            out = np.zeros(n, dtype=np.int64)
            ok = finite & (np.abs(np.where(finite, arr, 0)) < _MAX_EXACT_FLOAT_US)
            out[ok] = np.rint(arr[ok] * 1000.0).astype(np.int64)
            # rint is exact only for at most three decimals: keep it where ns/1000 rounds back
            # to the very double read (below 2^41 µs a fourth decimal never does)
            ok_back = out[ok].astype(np.float64) / 1000.0 == arr[ok]
            if ok_back.all() and (ok.all() or (finite == ok).all()):
                return out, ok
    # slow path: exact decimal text of every value
    exact = chunk_text_exact()
    out = np.zeros(n, dtype=np.int64)
    ok = np.zeros(n, dtype=bool)
    for i, ev in enumerate(exact):
        v = text_to_ns(getattr(ev, which))
        if v is not None and -(2**63) < v < 2**63:
            out[i] = v
            ok[i] = True
    return out, ok


def parse_split_list(v: Any) -> tuple[list[int] | None, bool]:
    """``"[11, 12]"`` / ``[11, 12]`` → ([11, 12], approx); ``"[]"`` → ([], False); a list cut by ``...`` sets approx."""
    if v is None:
        return None, False
    if isinstance(v, list):
        vals = [x for x in v if int_or_none(x, 0) is not None]
        return vals, len(vals) != len(v)
    s = str(v).strip()
    approx = "..." in s
    nums = [int(x) for x in re.findall(r"-?\d+", s.replace("...", "")) if len(x) <= 18]
    return nums, approx


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


def _canon_cat(c: Any) -> str:
    if c is None:
        return "other"
    s = str(c)
    got = _CAT.get(s)
    if got is not None:
        return got
    low = s.lower()
    return _CAT.get(low, low)


def read_rank_file(
    path: str | Path, out_stage: Path, comm_regex: re.Pattern, progress=None, sha256: str | None = None
) -> RankFile:
    """Stream one Kineto file into the staging file ``out_stage`` (RAW_SCHEMA rows); returns its :class:`RankFile`.

    Per chunk, the common columns are built with list comprehensions and numpy;
    only the events that need their ``args`` (GPU work, runtime calls,
    collective-related CPU ops, profiler steps: a minority) are visited one by one.
    Raises FileError for unreadable or malformed input (see jsonstream).
    """
    path = Path(path)
    stream = TraceStream(path)
    rf = RankFile(path=path, sha256="", meta={})
    state = _ChunkState(comm_regex)
    with _BatchWriter(out_stage) as writer:
        for chunk in stream:
            if isinstance(chunk, FastChunk):
                batch = _fast_batch(chunk, rf, state)
            else:
                batch = _chunk_batch(chunk, rf, state)
            if batch is None:
                continue
            writer.write(batch)
            rf.events += batch.num_rows
            if len(rf.comm_meta) >= META_SPILL_ROWS:
                rf.spill_meta(out_stage.with_suffix(".meta"))
            if progress is not None:
                progress(batch.num_rows)
    if rf.meta_spill:
        rf.spill_meta(out_stage.with_suffix(".meta"))
    rf.meta = stream.meta
    rf.warnings.extend(stream.notes)
    rf.sha256 = sha256 or sha256_file(path)
    return rf


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


class _ChunkState:
    """What carries over from chunk to chunk: the next event id and per-name caches."""

    def __init__(self, comm_regex: re.Pattern):
        self.comm_regex = comm_regex
        self.next_id = 0
        self.cat_cache: dict = {}
        self.comm_name_cache: dict = {}
        self.name_flags: dict = {}

    def category(self, c: Any) -> str:
        try:
            got = self.cat_cache.get(c)
        except TypeError:  # unhashable (a list or object where a string belongs)
            return _canon_cat(c)
        if got is None:
            got = self.cat_cache[c] = _canon_cat(c)
        return got

    def categories(self, raw: list) -> list[str]:
        """Canonical categories of a chunk (a dict lookup per event, the cache filled first)."""
        cc = self.cat_cache
        try:
            for c in set(raw) - cc.keys():
                cc[c] = _canon_cat(c)
        except TypeError:  # an unhashable category somewhere
            return [self.category(c) for c in raw]
        return [cc[c] for c in raw]

    def special_names(self, names: list[str]) -> dict:
        """name → True for names whose CPU events need their args (collective ops, profiler steps)."""
        nc = self.name_flags
        for nm in set(names) - nc.keys():
            nc[nm] = nm.startswith(_COMM_CPU_PREFIX) or nm.startswith("ProfilerStep#")
        return nc

    def comm_name(self, name: str) -> bool:
        got = self.comm_name_cache.get(name)
        if got is None:
            got = self.comm_name_cache[name] = bool(self.comm_regex.search(name))
        return got


def _ids(values: list) -> np.ndarray:
    """pid/tid values → int64 track ids (fast path when all are plain ints)."""
    try:
        arr = np.asarray(values)
        if arr.dtype.kind == "i" and arr.ndim == 1 and not any(type(v) is bool for v in values):
            return arr.astype(np.int64)
    except (ValueError, OverflowError):
        pass
    return np.fromiter((_track_id(v) for v in values), dtype=np.int64, count=len(values))


def _chunk_batch(chunk, rf: RankFile, st: _ChunkState) -> pa.RecordBatch | None:
    """One chunk of events → a RAW_SCHEMA batch (quarantined rows removed); fills ``rf`` on the side."""
    xs = []
    for e in chunk.events:
        ph = e.ph
        if ph == "X":
            xs.append(e)
        elif ph == "M" and e.name == "thread_name":
            try:
                a = msgspec.json.decode(e.args)
                rf.thread_names[(_track_id(e.pid), _track_id(e.tid))] = str(a.get("name"))
            except Exception:
                pass
    if not xs:
        return None
    n = len(xs)
    exact_cache: list = []

    def exact():
        if not exact_cache:
            exact_cache.append([ev for ev in chunk.exact() if ev.ph == "X"])
        return exact_cache[0]

    ts_ns, ts_ok = _vector_ns([e.ts for e in xs], exact, "ts")
    dur_ns, dur_ok = _vector_ns([e.dur for e in xs], exact, "dur")
    cats = st.categories([e.cat for e in xs])
    names = [e.name if type(e.name) is str else ("" if e.name is None else str(e.name)) for e in xs]
    ids = np.arange(st.next_id, st.next_id + n, dtype=np.int64)
    st.next_id += n
    gpu = [c in GPU_CATEGORIES for c in cats]
    device = _ids([e.pid for e in xs])
    track = _ids([e.tid for e in xs])
    corr: list = [None] * n
    ext: list = [None] * n
    is_comm = np.zeros(n, dtype=bool)
    # Runtime/driver calls (the bulk of the events that need args) only give their correlation
    # and external ids: their args are decoded in one call per chunk.
    launch_idx = [i for i, c in enumerate(cats) if c in _LAUNCH_CATEGORIES]
    decoded = _decode_many([xs[i].args for i in launch_idx], _IDS_LIST, _IDS, _EMPTY_IDS)
    c_vals = [a.correlation for a in decoded]
    e_vals = [a.external_id if a.external_id is not None else a.external_id_lc for a in decoded]
    if all(type(v) is int and -INT64_MAX <= v <= INT64_MAX for v in itertools.chain(c_vals, e_vals)):
        for i, c, x in zip(launch_idx, c_vals, e_vals):
            corr[i] = c
            ext[i] = x
    else:
        for i, c, x in zip(launch_idx, c_vals, e_vals):
            corr[i] = _as_int(c)
            ext[i] = _as_int(x)
    flags = st.special_names(names)
    special = [i for i, (c, nm) in enumerate(zip(cats, names)) if c in GPU_CATEGORIES or flags[nm]]
    for i, args in zip(special, _decode_many([xs[i].args for i in special], _KARGS_LIST, _KARGS, _EMPTY_ARGS)):
        cat = cats[i]
        name = names[i]
        is_gpu = gpu[i]
        cpu_comm = not is_gpu and name.startswith(_COMM_CPU_PREFIX)
        if is_gpu:
            dv = _as_int(args.device)
            sm = _as_int(args.stream)
            if dv is not None:
                device[i] = dv
            if sm is not None:
                track[i] = sm
        corr[i] = _as_int(args.correlation)
        x = args.external_id if args.external_id is not None else args.external_id_lc
        ext[i] = _as_int(x)
        if cat == "kernel" and (st.comm_name(name) or args.collective is not None or args.in_nelems is not None):
            is_comm[i] = True
        elif cpu_comm and name.startswith("gloo:"):
            is_comm[i] = True
        if is_comm[i] or cpu_comm:
            rf.comm_meta.append(
                _meta_row(args, int(ids[i]), name, cat, is_gpu, int(device[i]), int(track[i]),
                          int(ts_ns[i]), int(dur_ns[i]), corr[i])
            )
        if cat in ("user_annotation", "cpu_op") and name.startswith("ProfilerStep#"):
            _add_step(rf, name, int(ids[i]), ts_ok[i] and dur_ok[i], int(ts_ns[i]), int(dur_ns[i]))
    if not rf.has_gpu and any(gpu):
        rf.has_gpu = True
    return _finish_batch(
        rf, ids, ts_ns, ts_ok, dur_ns, dur_ok,
        [
            pa.array(ids),
            pa.array(["gpu_stream" if g else "cpu_thread" for g in gpu], pa.string()),
            pa.array(device),
            pa.array(track),
            pa.array(cats, pa.string()),
            pa.array(names, pa.string()),
            pa.array(ts_ns),
            pa.array(dur_ns),
            pa.array(corr, pa.int64()),
            pa.array(ext, pa.int64()),
            pa.array(is_comm),
        ],
    )


_META_GET = operator.itemgetter(*[KArgs.__struct_fields__.index(f) for f in META_FIELDS])


def _meta_row(args: KArgs, event_id, name, cat, is_gpu, device, track, ts_ns, dur_ns, correlation) -> dict:
    """The metadata row of a collective-related event: only the fields present (kept for the whole file)."""
    vals = _META_GET(msgspec.structs.astuple(args))
    row = dict(itertools.compress(zip(META_FIELDS, vals), map(operator.is_not, vals, itertools.repeat(None))))
    if "input_dims" not in row and args.input_dims_lc is not None:
        row["input_dims"] = args.input_dims_lc
    row.update(event_id=event_id, name=name, category=cat, gpu=is_gpu, device=device,
               track=track, ts_ns=ts_ns, dur_ns=dur_ns, correlation=correlation)
    return row


_STEP_RE = re.compile(r"ProfilerStep#(\d+)")


def _add_step(rf: RankFile, name: str, event_id: int, ok: bool, ts_ns: int, dur_ns: int) -> None:
    m = _STEP_RE.match(name)
    if m and ok and int(m.group(1)) <= INT64_MAX and ts_ns <= INT64_MAX - max(dur_ns, 0):
        rf.steps.append((int(m.group(1)), event_id, ts_ns, ts_ns + dur_ns))


def _finish_batch(rf: RankFile, ids, ts_ns, ts_ok, dur_ns, dur_ok, columns: list) -> pa.RecordBatch:
    """Quarantine events with a missing/non-positive ts or a negative dur; the RAW_SCHEMA batch of the rest."""
    valid = ts_ok & dur_ok & (dur_ns >= 0) & (ts_ns > 0)
    valid &= ts_ns <= INT64_MAX - np.maximum(dur_ns, 0)  # the end, ts + dur, must be an int64 too
    nbad = int(len(valid) - valid.sum())
    if nbad:
        rf.quarantined += nbad
        bad_ids = set(ids[~valid].tolist())
        rf.comm_meta = [r for r in rf.comm_meta if r["event_id"] not in bad_ids]
        rf.steps = [s for s in rf.steps if s[1] not in bad_ids]
    batch = raw_batch(columns)
    return batch.filter(_arrow.bool_array(valid)) if nbad else batch


def _decode_args(raw) -> KArgs:
    try:
        return _KARGS.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
        return _EMPTY_ARGS


def _decode_many(raws: list, list_decoder, one_decoder, empty) -> list:
    """Decode many raw ``args`` objects in one call (one per item if any of them is odd).

    A missing ``args`` is JSON null, and anything that is not an object decodes as ``empty``.
    """
    if not raws:
        return []
    try:
        return [empty if a is None else a for a in list_decoder.decode(b"[" + b",".join(raws) + b"]")]
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
        out = []
        for r in raws:
            try:
                out.append(one_decoder.decode(r))
            except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
                out.append(empty)
        return out


# Fixed-width records of the C scanner (tracekit/ingest/_kscan.c, struct REC).
REC_DTYPE = np.dtype(
    [(f, "<i8") for f in ("ts", "dur", "pid", "tid", "a_s", "a_e", "corr", "ext_u", "ext_l", "dev", "strm")]
    + [("cat", "<i4"), ("name", "<i4")]
    + [(f, "u1") for f in ("ph", "pid_k", "tid_k", "ts_ok", "dur_ok", "fl", "pad0", "pad1")]
)
_F_CORR, _F_EXTU, _F_EXTL, _F_DEV, _F_STRM, _F_ODD, _F_COLL, _F_NELEM = 1, 2, 4, 8, 16, 32, 64, 128
_PH_X, _PH_M = 1, 2
_K_INT, _K_STR = 0, 1


def _code_table(codes: np.ndarray, strings: list, fn, missing) -> np.ndarray:
    """``fn(strings[c])`` for every code used (``missing`` for code -1), as an object array indexable by code+1."""
    out = np.empty(len(strings) + 1, dtype=object)
    out[0] = missing
    for c in np.unique(codes).tolist():
        if c >= 0:
            out[c + 1] = fn(strings[c])
    return out


def _dict_column(index: np.ndarray, table: np.ndarray) -> pa.DictionaryArray:
    """Rows' values ``table[index]`` as a dictionary array holding only the values used."""
    used, inv = np.unique(index, return_inverse=True)
    return pa.DictionaryArray.from_arrays(
        _arrow.from_numpy(inv.reshape(-1).astype(np.int32), pa.int32()), _arrow.string_array(table[used].tolist())
    )


def _fast_ids(vals: np.ndarray, kinds: np.ndarray, strings: list) -> np.ndarray:
    """pid/tid of scanner records → int64 track ids, as :func:`_track_id` gives them."""
    out = vals.astype(np.int64, copy=True)
    strs = kinds == _K_STR
    if strs.any():
        table = {c: _track_id(strings[c]) for c in np.unique(vals[strs]).tolist()}
        out[strs] = [table[c] for c in vals[strs].tolist()]
    none = (kinds != _K_INT) & ~strs
    if none.any():
        out[none] = _track_id(None)
    return out


def _slice_args(text: bytes, a_s: int, a_e: int) -> bytes:
    return text[a_s:a_e] if a_s >= 0 else b"null"


def _fast_batch(ch: FastChunk, rf: RankFile, st: _ChunkState) -> pa.RecordBatch | None:
    """Scanner records → a RAW_SCHEMA batch; the same rows, ids and side results as :func:`_chunk_batch`.

    Everything per event is numpy over the records; Python objects are made per
    distinct string, and ``args`` are decoded (msgspec) only for collective-related
    events and for the rare event whose id fields are not plain integers.
    """
    r = np.frombuffer(ch.records, REC_DTYPE)
    strings = ch.strings
    text = ch.text
    ph = r["ph"]
    for i in np.flatnonzero(ph == _PH_M).tolist():
        c = int(r["name"][i])
        if c >= 0 and strings[c] == "thread_name":
            try:
                a = msgspec.json.decode(_slice_args(text, int(r["a_s"][i]), int(r["a_e"][i])))
                pid = _fast_ids(r["pid"][i : i + 1], r["pid_k"][i : i + 1], strings)[0]
                tid = _fast_ids(r["tid"][i : i + 1], r["tid_k"][i : i + 1], strings)[0]
                rf.thread_names[(int(pid), int(tid))] = str(a.get("name"))
            except Exception:
                pass
    x = r[ph == _PH_X]
    n = len(x)
    if n == 0:
        return None
    cat_codes = x["cat"]
    name_codes = x["name"]
    cat_tab = _code_table(cat_codes, strings, st.category, _canon_cat(None))
    cats_obj = cat_tab[cat_codes + 1]
    name_tab = _code_table(name_codes, strings, lambda s: s, "")
    gpu_tab = np.array([c in GPU_CATEGORIES for c in cat_tab.tolist()], dtype=bool)
    launch_tab = np.array([c in _LAUNCH_CATEGORIES for c in cat_tab.tolist()], dtype=bool)
    kernel_tab = np.array([c == "kernel" for c in cat_tab.tolist()], dtype=bool)
    step_cat_tab = np.array([c in ("user_annotation", "cpu_op") for c in cat_tab.tolist()], dtype=bool)
    names_used = [nm for nm in name_tab.tolist() if nm is not None]
    flags = st.special_names(names_used)

    def name_flag(fn) -> np.ndarray:
        return np.array([nm is not None and fn(nm) for nm in name_tab.tolist()], dtype=bool)

    special_tab = name_flag(lambda nm: flags[nm])
    comm_cpu_tab = name_flag(lambda nm: nm.startswith(_COMM_CPU_PREFIX))
    gloo_tab = name_flag(lambda nm: nm.startswith("gloo:"))
    comm_name_tab = name_flag(st.comm_name)
    step_name_tab = name_flag(lambda nm: nm.startswith("ProfilerStep#"))

    ci = cat_codes + 1
    ni = name_codes + 1
    gpu = gpu_tab[ci]
    ts_ns = x["ts"].copy()
    dur_ns = x["dur"].copy()
    ts_ok = x["ts_ok"].astype(bool)
    dur_ok = x["dur_ok"].astype(bool)
    ids = np.arange(st.next_id, st.next_id + n, dtype=np.int64)
    st.next_id += n
    device = _fast_ids(x["pid"], x["pid_k"], strings)
    track = _fast_ids(x["tid"], x["tid_k"], strings)
    fl = x["fl"]
    # ids are read for runtime/driver calls and the events that need their args (GPU work,
    # collective ops, profiler steps); other rows keep null, as in _chunk_batch
    special = gpu | special_tab[ni]
    want = launch_tab[ci] | special
    has_corr = want & ((fl & _F_CORR) != 0)
    ext_u = (fl & _F_EXTU) != 0
    has_ext = want & (ext_u | ((fl & _F_EXTL) != 0))
    ext_vals = np.where(ext_u, x["ext_u"], x["ext_l"])
    dev_override = gpu & ((fl & _F_DEV) != 0)
    strm_override = gpu & ((fl & _F_STRM) != 0)
    device[dev_override] = x["dev"][dev_override]
    track[strm_override] = x["strm"][strm_override]
    corr = np.where(has_corr, x["corr"], 0)
    ext = np.where(has_ext, ext_vals, 0)
    corr_valid = has_corr.copy()
    ext_valid = has_ext.copy()
    # the rare event whose id fields are not plain integers: as _chunk_batch reads them
    for i in np.flatnonzero(want & ((fl & _F_ODD) != 0)).tolist():
        a = _decode_args(_slice_args(text, int(x["a_s"][i]), int(x["a_e"][i])))
        c = _as_int(a.correlation)
        e = _as_int(a.external_id if a.external_id is not None else a.external_id_lc)
        corr_valid[i], corr[i] = c is not None, c or 0
        ext_valid[i], ext[i] = e is not None, e or 0
        if gpu[i]:
            dv, sm = _as_int(a.device), _as_int(a.stream)
            if dv is not None:
                device[i] = dv
            if sm is not None:
                track[i] = sm
    kernel = kernel_tab[ci]
    is_comm = (kernel & (comm_name_tab[ni] | ((fl & (_F_COLL | _F_NELEM)) != 0))) | (~gpu & gloo_tab[ni])
    cpu_comm = ~gpu & comm_cpu_tab[ni]
    meta_idx = np.flatnonzero(is_comm | cpu_comm)
    if len(meta_idx):
        sub = x[meta_idx]
        decoded = _decode_many(
            [text[a:b] if a >= 0 else b"null" for a, b in zip(sub["a_s"].tolist(), sub["a_e"].tolist())],
            _KARGS_LIST, _KARGS, _EMPTY_ARGS,
        )
        m_corr = np.where(corr_valid[meta_idx], corr[meta_idx], 0).tolist()
        m_corr_ok = corr_valid[meta_idx].tolist()
        cols = zip(decoded, ids[meta_idx].tolist(), name_tab[ni[meta_idx]].tolist(), cats_obj[meta_idx].tolist(),
                   gpu[meta_idx].tolist(), device[meta_idx].tolist(), track[meta_idx].tolist(),
                   ts_ns[meta_idx].tolist(), dur_ns[meta_idx].tolist(), m_corr, m_corr_ok)
        rf.comm_meta.extend(
            _meta_row(a, eid, nm, cat, g, dv, tr, ts, du, c if ok else None)
            for a, eid, nm, cat, g, dv, tr, ts, du, c, ok in cols
        )
    for i in np.flatnonzero(step_cat_tab[ci] & step_name_tab[ni]).tolist():
        _add_step(rf, name_tab[ni[i]], int(ids[i]), bool(ts_ok[i] and dur_ok[i]), int(ts_ns[i]), int(dur_ns[i]))
    if not rf.has_gpu and gpu.any():
        rf.has_gpu = True
    # arrays from buffers (tracekit._arrow): pa.array would import pandas
    i64 = pa.int64()
    kind_arr = _arrow.string_array(["cpu_thread", "gpu_stream"])
    return _finish_batch(
        rf, ids, ts_ns, ts_ok, dur_ns, dur_ok,
        [
            _arrow.from_numpy(ids, i64),
            pa.DictionaryArray.from_arrays(_arrow.from_numpy(gpu.astype(np.int32), pa.int32()), kind_arr),
            _arrow.from_numpy(device, i64),
            _arrow.from_numpy(track, i64),
            _dict_column(ci, cat_tab),
            _dict_column(ni, name_tab),
            _arrow.from_numpy(ts_ns, i64),
            _arrow.from_numpy(dur_ns, i64),
            _arrow.from_numpy(corr, i64, corr_valid),
            _arrow.from_numpy(ext, i64, ext_valid),
            _arrow.bool_array(is_comm),
        ],
    )
