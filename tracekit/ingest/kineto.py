"""Kineto (torch.profiler) JSON traces → raw event rows, streamed chunk by chunk.

One rank file at a time: :func:`read_rank_file` reads the file with
:class:`~tracekit.ingest.jsonstream.TraceStream`, turns every complete event
(``ph == "X"``) into a row of the store's ``events`` shape, and appends the rows
to a Parquet file as it goes, so memory holds one chunk of events at a time.
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
exactly: integers are multiplied by 1000; floats below 2^52/1000 µs are
``round(x*1000)`` (provably exact for three decimals at that magnitude); any
other value is converted from its decimal text.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracekit.errors import FileError
from tracekit.ingest.jsonstream import TraceStream

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
_ARGS_NEEDED = GPU_CATEGORIES | {"runtime", "driver"}

# Communication by name (DESIGN.md "Classifying events"); metadata decides first.
CUSTOM_ALL_REDUCE_PATTERNS = (
    r"cross_device_reduce",  # vLLM / SGLang custom all-reduce
    r"custom_?all_?reduce",
    r"(?:one|two)_?shot_?all_?reduce",
)
BUILTIN_COMM_PATTERNS = (r"nccl", r"rccl", r"^gloo:", r"msccl") + CUSTOM_ALL_REDUCE_PATTERNS
_COMM_CPU_PREFIX = ("nccl:", "c10d::", "gloo:", "record_param_comms", "rccl:")

_MAX_EXACT_FLOAT_US = float(2**52) / 1000.0

RAW_SCHEMA = pa.schema(
    [
        ("event_id", pa.int64()),
        ("track_kind", pa.string()),
        ("device", pa.int64()),
        ("track", pa.int64()),
        ("category", pa.string()),
        ("name", pa.string()),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        ("is_comm", pa.bool_()),
    ]
)


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


_KARGS = msgspec.json.Decoder(KArgs)
_EMPTY_ARGS = KArgs()

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
    if type(v) is int:
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
    try:
        arr = np.asarray(values)
    except (ValueError, OverflowError):
        arr = np.asarray(values, dtype=object)
    if arr.dtype.kind == "i":
        return arr.astype(np.int64) * 1000, np.ones(n, dtype=bool)
    if arr.dtype.kind == "f":
        finite = np.isfinite(arr)
        if not finite.all() or (np.abs(arr[finite]).max(initial=0.0) < _MAX_EXACT_FLOAT_US):
            out = np.zeros(n, dtype=np.int64)
            ok = finite & (np.abs(np.where(finite, arr, 0)) < _MAX_EXACT_FLOAT_US)
            out[ok] = np.rint(arr[ok] * 1000.0).astype(np.int64)
            if ok.all() or (finite == ok).all():
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
    """What one rank file yielded, besides the rows written to Parquet."""

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
    path: str | Path, out_parquet: Path, comm_regex: re.Pattern, progress=None, sha256: str | None = None
) -> RankFile:
    """Stream one Kineto file into ``out_parquet`` (RAW_SCHEMA rows); returns its :class:`RankFile`.

    Raises FileError for unreadable or malformed input (see jsonstream).
    """
    path = Path(path)
    stream = TraceStream(path)
    rf = RankFile(path=path, sha256="", meta={})
    writer: pq.ParquetWriter | None = None
    next_id = 0
    cat_cache: dict = {}
    comm_name_cache: dict = {}
    try:
        for chunk in stream:
            evs = chunk.events
            xs = []
            for e in evs:
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
                continue
            n = len(xs)
            exact_cache: list = []

            def exact(_chunk=chunk, _cache=exact_cache):
                if not _cache:
                    _cache.append([ev for ev in _chunk.exact() if ev.ph == "X"])
                return _cache[0]

            ts_ns, ts_ok = _vector_ns([e.ts for e in xs], exact, "ts")
            dur_ns, dur_ok = _vector_ns([e.dur for e in xs], exact, "dur")
            cats = []
            for e in xs:
                c = e.cat
                got = cat_cache.get(c) if isinstance(c, (str, type(None))) else None
                if got is None:
                    got = _canon_cat(c)
                    if isinstance(c, (str, type(None))):
                        cat_cache[c] = got
                cats.append(got)
            names = [e.name if type(e.name) is str else ("" if e.name is None else str(e.name)) for e in xs]

            ids = np.arange(next_id, next_id + n, dtype=np.int64)
            next_id += n
            track_kind = []
            device = np.empty(n, dtype=np.int64)
            track = np.empty(n, dtype=np.int64)
            corr = [None] * n
            ext = [None] * n
            is_comm = np.zeros(n, dtype=bool)
            for i, e in enumerate(xs):
                cat = cats[i]
                name = names[i]
                gpu = cat in GPU_CATEGORIES
                args = None
                if cat in _ARGS_NEEDED:
                    args = _decode_args(e.args)
                comm_name = comm_name_cache.get(name)
                if comm_name is None:
                    comm_name = bool(comm_regex.search(name)) if gpu or name.startswith("gloo:") else False
                    comm_name_cache[name] = comm_name
                cpu_comm = (not gpu) and (name.startswith(_COMM_CPU_PREFIX))
                if cpu_comm or (name.startswith("ProfilerStep#") and cat == "user_annotation"):
                    if args is None:
                        args = _decode_args(e.args)
                if gpu:
                    track_kind.append("gpu_stream")
                    dv = _as_int(args.device) if args is not None else None
                    st = _as_int(args.stream) if args is not None else None
                    device[i] = dv if dv is not None else _track_id(e.pid)
                    track[i] = st if st is not None else _track_id(e.tid)
                else:
                    track_kind.append("cpu_thread")
                    device[i] = _track_id(e.pid)
                    track[i] = _track_id(e.tid)
                if args is not None:
                    corr[i] = _as_int(args.correlation)
                    x = args.external_id if args.external_id is not None else args.external_id_lc
                    ext[i] = _as_int(x)
                    has_meta = args.collective is not None or args.in_nelems is not None
                    if gpu and cat == "kernel" and (comm_name or has_meta):
                        is_comm[i] = True
                    if is_comm[i] or cpu_comm:
                        row = {f: getattr(args, f) for f in META_FIELDS}
                        if row["input_dims"] is None:
                            row["input_dims"] = args.input_dims_lc
                        row.update(
                            event_id=int(ids[i]),
                            name=name,
                            category=cat,
                            gpu=gpu,
                            device=int(device[i]),
                            track=int(track[i]),
                            ts_ns=int(ts_ns[i]),
                            dur_ns=int(dur_ns[i]),
                            correlation=corr[i],
                        )
                        rf.comm_meta.append(row)
                    if name.startswith("ProfilerStep#") and cat == "user_annotation":
                        m = re.match(r"ProfilerStep#(\d+)", name)
                        if m and ts_ok[i] and dur_ok[i]:
                            rf.steps.append((int(m.group(1)), int(ids[i]), int(ts_ns[i]), int(ts_ns[i] + dur_ns[i])))
                elif gpu and cat == "kernel" and comm_name:
                    is_comm[i] = True
                if cpu_comm and name.startswith("gloo:"):
                    is_comm[i] = True
            valid = ts_ok & dur_ok & (dur_ns >= 0) & (ts_ns > 0)
            nbad = int(n - valid.sum())
            if nbad:
                rf.quarantined += nbad
                # metadata rows of quarantined events must not survive either
                bad_ids = set(ids[~valid].tolist())
                if bad_ids:
                    rf.comm_meta = [r for r in rf.comm_meta if r["event_id"] not in bad_ids]
                    rf.steps = [s for s in rf.steps if s[1] not in bad_ids]
            if any(k == "gpu_stream" for k in track_kind):
                rf.has_gpu = True
            batch = pa.record_batch(
                [
                    pa.array(ids),
                    pa.array(track_kind, pa.string()),
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
                schema=RAW_SCHEMA,
            )
            if nbad:
                batch = batch.filter(pa.array(valid))
            if writer is None:
                writer = pq.ParquetWriter(out_parquet, RAW_SCHEMA, compression="zstd", compression_level=1)
            writer.write_batch(batch)
            rf.events += batch.num_rows
            if progress is not None:
                progress(n)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        pq.write_table(RAW_SCHEMA.empty_table(), out_parquet)
    rf.meta = stream.meta
    rf.warnings.extend(stream.notes)
    rf.sha256 = sha256 or sha256_file(path)
    return rf


def _decode_args(raw) -> KArgs:
    try:
        return _KARGS.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
        return _EMPTY_ARGS
