"""Kineto (torch.profiler) JSON traces → raw event rows, streamed chunk by chunk.

One rank file at a time: :func:`read_rank_file` reads the file with
:class:`~tracekit.ingest.jsonstream.TraceStream`, turns every complete event
(``ph == "X"``) into a row of the store's ``events`` shape, and appends the rows
to a staging file (Arrow IPC) as it goes, so memory holds one chunk of events at a time.
What needs cross-event context (launch links, class, profiler step, the
collectives) is computed afterwards by :mod:`tracekit.ingest.assemble` over the
written rows (:mod:`tracekit.ingest.staging` holds the staging file's schema and writer); only the few collective-related events keep their metadata here
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
true integer. k = 41 leaves a factor of 2 (0.25 ns).
"""

from __future__ import annotations

import itertools
import operator
import re
import zlib
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Optional

import msgspec
import numpy as np
import pyarrow as pa

from tracekit.errors import FileError
from tracekit.ingest.comm_families import CPU_OP_NAMES, KERNEL_PATTERNS
from tracekit.ingest.jsonstream import FastChunk, TraceStream
from tracekit.ingest.staging import (
    META_FIELDS,
    META_BATCH_ROWS,
    RankFile,
    _BatchWriter,
    raw_batch,
    sha256_file,
)

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
            if len(rf.comm_meta) >= META_BATCH_ROWS:
                rf.flush_meta(out_stage.with_suffix(".meta"))
            if progress is not None:
                progress(batch.num_rows)
    rf.close_meta()
    rf.meta = stream.meta
    rf.warnings.extend(stream.notes)
    rf.sha256 = sha256 or sha256_file(path)
    return rf


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
    return batch.filter(pa.array(valid)) if nbad else batch


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
        pa.array(inv.reshape(-1).astype(np.int32)), pa.array(table[used].tolist(), pa.string())
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
    i64 = pa.int64()
    kind_arr = pa.array(["cpu_thread", "gpu_stream"], pa.string())
    return _finish_batch(
        rf, ids, ts_ns, ts_ok, dur_ns, dur_ok,
        [
            pa.array(ids, i64),
            pa.DictionaryArray.from_arrays(pa.array(gpu.astype(np.int32)), kind_arr),
            pa.array(device, i64),
            pa.array(track, i64),
            _dict_column(ci, cat_tab),
            _dict_column(ni, name_tab),
            pa.array(ts_ns, i64),
            pa.array(dur_ns, i64),
            pa.array(corr, i64, mask=~corr_valid),
            pa.array(ext, i64, mask=~ext_valid),
            pa.array(is_comm),
        ],
    )
