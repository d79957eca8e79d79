"""Kineto (torch.profiler) JSON traces → raw event rows, streamed chunk by chunk.

One rank file at a time: :func:`read_rank_file` reads the file with
:class:`~tracekit.ingest.jsonstream.TraceStream`, turns every complete event
(``ph == "X"``, and each ``B``/``E`` pair, matched per thread in stack order) into a row
of the store's ``events`` shape (events without a ``ph`` and unpaired B/E are quarantined,
counted, with a warning), and appends the rows
to a staging file (Arrow IPC) as it goes, so memory holds one chunk of events at a time.
What needs cross-event context (launch links, class, profiler step, the
collectives) is computed afterwards by :mod:`tracekit.ingest.assemble` over the
written rows (:mod:`tracekit.ingest.staging` holds the staging file's schema and writer); only the few collective-related events keep their metadata here
(the rank file's comm-metadata table, :data:`~tracekit.ingest.staging.META_SCHEMA`, a batch per
chunk built column-wise), since those are all the linker needs from ``args``.

Both decoders (the C scanner's records and msgspec's events) give a chunk as the same
columns (:class:`_Events`), and one function, :func:`_build_batch`, makes the rows. The
``args`` keys read are one table, :data:`ARGS`.

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
true integer. k = 41 leaves a factor of 2 (0.25 ns); a looser bound lets 1 ns
errors through (benchmarks/README.md, "Design measurements kept out of the code").
"""

from __future__ import annotations

import itertools
import operator
import re
import zlib
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Optional

import msgspec
import numpy as np
import pyarrow as pa

from tracekit.errors import FileError
from tracekit.ingest import staging
from tracekit.ingest.comm_families import COMM_CPU_PREFIX  # the comm-by-name rule lives with the families
from tracekit.ingest.jsonstream import FastChunk, TraceStream
from tracekit.ingest.staging import META_BATCH_ROWS, RankFile, _BatchWriter, raw_batch, sha256_file

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

_MAX_EXACT_FLOAT_US = float(2**41)  # see the module docstring
_MAX_INT_US = (2**63 - 1) // 1000

@dataclass(frozen=True)
class ArgSpec:
    """One ``args`` key tracekit reads from a Kineto event (a row of :data:`ARGS`)."""

    field: str  # attribute of KArgs / IdArgs; key of the metadata rows (META_FIELDS)
    key: str  # the spelling in the trace's ``args``
    role: str  # "id": an integer the C scanner reads into REC.<rec>; "flag": a key whose presence
    #            (non-null) the scanner flags, a metadata field too; "meta": a metadata field only;
    #            "alias:<field>": an older spelling of <field>, read when <field> is absent; "unused"
    rec: str | None = None  # the REC field (_kscan.c) of an "id" key


ARGS: tuple[ArgSpec, ...] = (
    ArgSpec("correlation", "correlation", "id", "corr"),  # GPU op ↔ runtime launch
    ArgSpec("external_id", "External id", "id", "ext_u"),  # CPU op ↔ its launches
    ArgSpec("external_id_lc", "external id", "id", "ext_l"),  # the spelling before PyTorch 1.10, read as external_id
    ArgSpec("device", "device", "id", "dev"),  # GPU events: the device (their pid otherwise)
    ArgSpec("stream", "stream", "id", "strm"),  # GPU events: the stream (their tid otherwise)
    ArgSpec("collective", "Collective name", "flag"),  # on a kernel: it is communication
    ArgSpec("in_nelems", "In msg nelems", "flag"),  # on a kernel: it is communication
    ArgSpec("out_nelems", "Out msg nelems", "meta"),
    ArgSpec("group_size", "Group size", "meta"),
    ArgSpec("dtype", "dtype", "meta"),
    ArgSpec("pg_name", "Process Group Name", "meta"),
    ArgSpec("pg_id", "Process Group ID", "meta"),  # the older key for the group
    ArgSpec("pg_desc", "Process Group Description", "meta"),
    ArgSpec("pg_ranks", "Process Group Ranks", "meta"),
    ArgSpec("in_split", "In split size", "meta"),
    ArgSpec("out_split", "Out split size", "meta"),
    ArgSpec("seq", "Seq", "meta"),
    ArgSpec("input_dims", "Input Dims", "meta"),
    ArgSpec("input_dims_lc", "Input dims", "alias:input_dims"),
    ArgSpec("input_type", "Input type", "meta"),
    ArgSpec("concrete", "Concrete Inputs", "meta"),
    ArgSpec("rank", "Rank", "unused"),
    ArgSpec("gstart", "Global rank start", "meta"),
    ArgSpec("gstride", "Global rank stride", "meta"),
)
"""The trace ``args`` that matter, once: the msgspec structs (:class:`KArgs`, :class:`IdArgs`),
the metadata fields (:data:`META_FIELDS`) and the C scanner's record layout (:data:`REC_DTYPE`)
are derived from it, and tests/ingest/test_fast_scanner.py checks ``_kscan.ARG_KEYS`` against it."""

META_FIELDS = tuple(a.field for a in ARGS if a.role in ("flag", "meta"))
if META_FIELDS != staging.META_FIELDS:  # the metadata table's columns are these args, in this order
    raise ImportError("tracekit.ingest.kineto.ARGS and tracekit.ingest.staging.META_FIELDS disagree")
"""Keys of a collective-related event's metadata row (those present), in :data:`ARGS` order."""
_ALIASES = tuple((a.field, a.role.split(":", 1)[1]) for a in ARGS if a.role.startswith("alias:"))
_SCANNED = tuple(a for a in ARGS if a.role in ("id", "flag"))  # what the scanner reads from args


def _args_struct(name: str, specs, doc: str) -> type:
    cls = msgspec.defstruct(
        name, [(a.field, Any, msgspec.field(default=None, name=a.key)) for a in specs], gc=False, module=__name__
    )
    cls.__doc__ = doc
    return cls


KArgs = _args_struct("KArgs", ARGS, "The ``args`` keys tracekit reads (:data:`ARGS`); everything else is ignored.")
IdArgs = _args_struct(
    "IdArgs", _SCANNED, "The ``args`` a non-collective event needs: its ids, GPU device/stream and the comm flags."
)


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
            for batch in chunk_batches(chunk, rf, state):
                writer.write(batch)
                rf.events += batch.num_rows
                if progress is not None:
                    progress(batch.num_rows)
            if rf.meta_pending >= META_BATCH_ROWS:
                rf.flush_meta(out_stage.with_suffix(".meta"))
    rf.close_meta(out_stage.with_suffix(".meta"))  # no row held in the RankFile the driver receives
    if stream.bare_array and state.phased == 0:  # Chrome's array form, but no item is a trace event
        raise FileError(path, 'not a trace: a JSON list in which no item is a trace event (an object with a "ph")')
    state.finish(rf)
    rf.quarantined += stream.events_dropped
    rf.meta = stream.meta
    rf.warnings.extend(stream.notes)
    rf.sha256 = sha256 or sha256_file(path)
    return rf


class _ChunkState:
    """What carries over from chunk to chunk: the next event id and per-name caches."""

    def __init__(self, comm_regex):
        self.comm_regex = comm_regex
        self.next_id = 0
        self.cat_cache: dict = {}
        self.comm_name_cache: dict = {}
        self.name_flags: dict = {}
        self.no_ph = 0  # events without a phase (quarantined)
        self.phased = 0  # events with a phase (any "ph": X, B/E, M, ...)
        self.open: dict = {}  # (pid, tid) → stack of B events not yet ended
        self.unmatched_e: list = []  # E events with no B open on their thread

    def pair(self, be: list) -> list:
        """B/E events (:class:`_Open`, file order) → the (B, E) pairs they complete.

        Chrome's duration events nest per thread: an E ends the latest B still open on its
        (pid, tid). Its nestable async events (``b``/``e``) nest per (pid, cat, id) instead
        (:attr:`_Open.key`), wherever their threads. An E with none open is kept in
        ``unmatched_e``; a B never ended stays open.
        """
        done = []
        for ev in be:
            stack = self.open.setdefault(ev.key or (ev.pid, ev.tid), [])
            if not ev.end:
                stack.append(ev)
            elif stack:
                done.append((stack.pop(), ev))
            else:
                self.unmatched_e.append(ev)
        return done

    def finish(self, rf: RankFile) -> None:
        """At the end of the file: count the events that became no row, with a warning each."""
        if self.no_ph:
            rf.quarantined += self.no_ph
            rf.warnings.append(f'{self.no_ph} event(s) without a "ph" (phase) quarantined')
        unended = [b for stack in self.open.values() for b in stack]
        if unended or self.unmatched_e:
            rf.quarantined += len(unended) + len(self.unmatched_e)
            parts = []
            for what, evs in (("B without an E", unended), ("E without a B", self.unmatched_e)):
                if evs:
                    names = ", ".join(sorted({repr(e.name) if e.name else "unnamed" for e in evs})[:3])
                    more = "" if len({e.name for e in evs}) <= 3 else ", ..."
                    parts.append(f"{len(evs)} {what} ({names}{more}, pid/tid {evs[0].pid}/{evs[0].tid})")
            rf.warnings.append("unpaired duration events quarantined: " + "; ".join(parts))

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
            nc[nm] = nm.startswith(COMM_CPU_PREFIX) or nm.startswith("ProfilerStep#")
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


# -- one chunk of events as columns, from either decoder --------------------------------------
#
# Both decoders (the C scanner's records, :func:`_fast_events`; msgspec's Ev objects,
# :func:`_slow_events`) give a chunk's complete events as the same :class:`_Events` columns,
# and its B/E events and the count of events without a phase on the side. One function,
# :func:`_build_batch`, applies the rules (categories, ids, the comm rule, metadata rows, steps,
# quarantine) and builds the rows.

PH_OTHER, PH_X, PH_M, PH_B, PH_E, PH_NONE = 0, 1, 2, 3, 4, 5
"""Phase codes (REC.ph in _kscan.c): X complete, M metadata, B/E begin/end, NONE no ``ph`` (or null)."""
_PH_CODE = {"X": PH_X, "M": PH_M, "B": PH_B, "E": PH_E}


@dataclass
class _Ids:
    """Per event of a chunk: what :data:`ARGS`' "id" and "flag" keys gave (0 / False where not read)."""

    corr: np.ndarray  # int64
    corr_ok: np.ndarray  # bool: a correlation was read
    ext: np.ndarray  # int64, External id (else external id)
    ext_ok: np.ndarray
    dev: np.ndarray  # int64, args.device (GPU events)
    dev_ok: np.ndarray
    strm: np.ndarray  # int64, args.stream (GPU events)
    strm_ok: np.ndarray
    coll: np.ndarray  # bool: Collective name or In msg nelems present (not null)


@dataclass
class _Events:
    """One chunk's complete events as columns.

    ``cats[ci]`` is each event's canonical category and ``names[ni]`` its name (object arrays,
    indexed per event); ``device``/``track`` its pid/tid as track ids; ``ids(want, gpu)`` the
    :class:`_Ids` read for the events in ``want`` (device and stream only for those in ``gpu``);
    ``raw(idx)`` the raw JSON ``args`` of events ``idx`` (``b"null"`` where absent).
    """

    ts_ns: np.ndarray
    ts_ok: np.ndarray
    dur_ns: np.ndarray
    dur_ok: np.ndarray
    ci: np.ndarray
    cats: np.ndarray
    ni: np.ndarray
    names: np.ndarray
    device: np.ndarray
    track: np.ndarray
    ids: Any
    raw: Any

    def __len__(self) -> int:
        return len(self.ts_ns)


@dataclass
class _Decoded:
    """What a decoder read from one chunk: the complete events, the B/E events in file order
    (:class:`_Open` rows, ``end`` False for B), events with no phase, and thread names."""

    events: _Events | None
    be: list
    no_ph: int = 0


@dataclass
class _Open:
    """A B or E event, read in full (they are rare), until :meth:`_ChunkState.pair` pairs it."""

    end: bool
    pid: int
    tid: int
    ts_ns: int
    ts_ok: bool
    cat: str
    name: str
    args: bytes
    key: Any = None  # async b/e events: ("async", pid, cat, id) pairs them; None: per (pid, tid)


def _intern(values: list) -> tuple[np.ndarray, np.ndarray]:
    """(codes, table): ``table[codes]`` == values, one table entry per distinct value."""
    tab: dict = {}
    codes = np.fromiter((tab.setdefault(v, len(tab)) for v in values), dtype=np.int64, count=len(values))
    out = np.empty(len(tab), dtype=object)
    out[:] = list(tab)
    return codes, out


def _raw_ids(raws: list, want: np.ndarray, gpu: np.ndarray) -> _Ids:
    """:class:`_Ids` from raw ``args`` JSON (the msgspec path): one decode call for the ``want`` events."""
    n = len(raws)
    ids = _Ids(*(np.zeros(n, dtype=t) for t in (np.int64, bool) * 4), np.zeros(n, dtype=bool))
    at = np.flatnonzero(want)
    if not len(at):
        return ids
    decoded = _decode_many([raws[i] for i in at.tolist()], _IDS_LIST, _IDS, _EMPTY_IDS)
    c_vals = [a.correlation for a in decoded]
    e_vals = [a.external_id if a.external_id is not None else a.external_id_lc for a in decoded]
    if not all(type(v) is int and -INT64_MAX <= v <= INT64_MAX for v in itertools.chain(c_vals, e_vals)):
        c_vals = [_as_int(v) for v in c_vals]
        e_vals = [_as_int(v) for v in e_vals]
    on_gpu = gpu[at]
    g_dec = list(itertools.compress(decoded, on_gpu.tolist()))
    for vals, rows, out, ok in (
        (c_vals, at, ids.corr, ids.corr_ok),
        (e_vals, at, ids.ext, ids.ext_ok),
        ([_as_int(a.device) for a in g_dec], at[on_gpu], ids.dev, ids.dev_ok),
        ([_as_int(a.stream) for a in g_dec], at[on_gpu], ids.strm, ids.strm_ok),
    ):
        got = np.fromiter((v is not None for v in vals), dtype=bool, count=len(vals))
        out[rows[got]] = [v for v in vals if v is not None]
        ok[rows[got]] = True
    ids.coll[at] = np.fromiter((a.collective is not None or a.in_nelems is not None for a in decoded),
                               dtype=bool, count=len(decoded))
    return ids


def _events_from_open(spans: list, st: "_ChunkState") -> _Events:
    """Paired B/E events as complete events: (B, E) pairs → :class:`_Events` (dur = E.ts − B.ts)."""
    ts = np.array([b.ts_ns for b, _ in spans], dtype=np.int64)
    end = np.array([e.ts_ns for _, e in spans], dtype=np.int64)
    ok = np.array([b.ts_ok for b, _ in spans], dtype=bool)
    dur_ok = ok & np.array([e.ts_ok for _, e in spans], dtype=bool)
    ci, cats = _intern([b.cat for b, _ in spans])
    ni, names = _intern([b.name for b, _ in spans])
    raws = [b.args for b, _ in spans]
    return _Events(
        ts, ok, np.where(dur_ok, end - ts, 0), dur_ok, ci, cats, ni, names,
        np.array([b.pid for b, _ in spans], dtype=np.int64), np.array([b.tid for b, _ in spans], dtype=np.int64),
        lambda want, gpu: _raw_ids(raws, want, gpu), lambda idx: [raws[i] for i in idx],
    )


def _async_part(v: Any):
    """A hashable form of an async event's pid, cat or id (a list or object as its JSON text)."""
    try:
        hash(v)
        return v
    except TypeError:
        return msgspec.json.encode(v)


def _slow_events(chunk, rf: RankFile, st: "_ChunkState") -> _Decoded:
    """A msgspec :class:`~tracekit.ingest.jsonstream.Chunk` → :class:`_Decoded` (thread names go to ``rf``)."""
    xs, be_idx, no_ph, async_keys = [], [], 0, {}
    for e in chunk.events:
        ph = e.ph
        if ph == "X":
            xs.append(e)
        elif ph == "B" or ph == "E":
            be_idx.append(len(xs))
            xs.append(e)
        elif ph == "b" or ph == "e":  # Chrome's nestable async spans: paired by (pid, cat, id)
            async_keys[len(xs)] = ("async", _async_part(e.pid), _async_part(e.cat),
                                   _async_part(e.id) if e.id is not None else ("name", _async_part(e.name)))
            be_idx.append(len(xs))
            xs.append(e)
        elif ph is None:
            no_ph += 1
        elif ph == "M" and e.name == "thread_name":
            try:
                a = msgspec.json.decode(e.args)
                rf.thread_names[(_track_id(e.pid), _track_id(e.tid))] = str(a.get("name"))
            except Exception:
                pass
    if not xs:
        return _Decoded(None, [], no_ph)
    n = len(xs)
    exact_cache: list = []

    def exact():
        if not exact_cache:
            exact_cache.append([ev for ev in chunk.exact() if ev.ph in ("X", "B", "E", "b", "e")])
        return exact_cache[0]

    ts_ns, ts_ok = _vector_ns([e.ts for e in xs], exact, "ts")
    dur_ns, dur_ok = _vector_ns([e.dur for e in xs], exact, "dur")
    ci, cats = _intern(st.categories([e.cat for e in xs]))
    ni, names = _intern([e.name if type(e.name) is str else ("" if e.name is None else str(e.name)) for e in xs])
    device = _ids([e.pid for e in xs])
    track = _ids([e.tid for e in xs])
    be = []
    if be_idx:
        be = [_Open(xs[i].ph in ("E", "e"), int(device[i]), int(track[i]), int(ts_ns[i]), bool(ts_ok[i]),
                    cats[ci[i]], names[ni[i]], bytes(xs[i].args), async_keys.get(i)) for i in be_idx]
        keep = np.ones(n, dtype=bool)
        keep[be_idx] = False
        xs = [e for e, k in zip(xs, keep.tolist()) if k]
        if not xs:
            return _Decoded(None, be, no_ph)
        ts_ns, ts_ok, dur_ns, dur_ok, ci, ni, device, track = (
            a[keep] for a in (ts_ns, ts_ok, dur_ns, dur_ok, ci, ni, device, track))
    raws = [e.args for e in xs]
    ev = _Events(ts_ns, ts_ok, dur_ns, dur_ok, ci, cats, ni, names, device, track,
                 lambda want, gpu: _raw_ids(raws, want, gpu), lambda idx: [raws[i] for i in idx])
    return _Decoded(ev, be, no_ph)


# Fixed-width records of the C scanner (tracekit/ingest/_kscan.c, struct REC): the event's
# fields, then one int64 per "id" key of ARGS, then the string codes and the byte flags.
REC_DTYPE = np.dtype(
    [(f, "<i8") for f in ("ts", "dur", "pid", "tid", "a_s", "a_e")]
    + [(a.rec, "<i8") for a in ARGS if a.role == "id"]
    + [("cat", "<i4"), ("name", "<i4")]
    + [(f, "u1") for f in ("ph", "pid_k", "tid_k", "ts_ok", "dur_ok", "fl", "pad0", "pad1")]
)
ARG_BITS = {a.field: 1 << k for k, a in enumerate(a for a in ARGS if a.role == "id")}
"""REC.fl bit of each "id" key (set when its value is a plain int64), then F_ODD, then the flags."""
_F_ODD = 1 << len(ARG_BITS)  # one of the id keys holds a non-null value that is not a plain integer
ARG_BITS.update({a.field: _F_ODD << (k + 1) for k, a in enumerate(a for a in ARGS if a.role == "flag")})
_F_COLL_ANY = sum(ARG_BITS[a.field] for a in ARGS if a.role == "flag")
_K_INT, _K_STR = 0, 1


def _code_table(codes: np.ndarray, strings: list, fn, missing) -> np.ndarray:
    """``fn(strings[c])`` for every code used (``missing`` for code -1), as an object array indexable by code+1."""
    out = np.empty(len(strings) + 1, dtype=object)
    out[0] = missing
    for c in np.flatnonzero(np.bincount(codes + 1, minlength=1)[1:]).tolist():  # the codes used, ascending
        out[c + 1] = fn(strings[c])
    return out


def _dict_column(index: np.ndarray, table: np.ndarray) -> pa.DictionaryArray:
    """Rows' values ``table[index]`` as a dictionary array holding only the values used, in
    ``table`` order (what ``np.unique(index, return_inverse=True)`` gives, without its sort)."""
    used = np.flatnonzero(np.bincount(index, minlength=len(table)))
    code = np.zeros(len(table), dtype=np.int32)
    code[used] = np.arange(len(used), dtype=np.int32)
    return pa.DictionaryArray.from_arrays(pa.array(code[index]), pa.array(table[used].tolist(), pa.string()))


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


def _rec_ids(x: np.ndarray, text: bytes, want: np.ndarray, gpu: np.ndarray) -> _Ids:
    """:class:`_Ids` from scanner records: numpy over the flags; msgspec only for the rare event
    whose id fields are not plain integers (F_ODD), read as :func:`_raw_ids` reads them."""
    fl = x["fl"]
    b = ARG_BITS
    corr_ok = want & ((fl & b["correlation"]) != 0)
    ext_u = (fl & b["external_id"]) != 0
    ext_ok = want & (ext_u | ((fl & b["external_id_lc"]) != 0))
    ids = _Ids(
        np.where(corr_ok, x["corr"], 0), corr_ok,
        np.where(ext_ok, np.where(ext_u, x["ext_u"], x["ext_l"]), 0), ext_ok,
        x["dev"].copy(), gpu & ((fl & b["device"]) != 0),
        x["strm"].copy(), gpu & ((fl & b["stream"]) != 0),
        (fl & _F_COLL_ANY) != 0,
    )
    odd = np.flatnonzero(want & ((fl & _F_ODD) != 0)).tolist()
    if odd:
        one = _raw_ids([_slice_args(text, int(x["a_s"][i]), int(x["a_e"][i])) for i in odd],
                       np.ones(len(odd), dtype=bool), gpu[odd])
        for f in ("corr", "corr_ok", "ext", "ext_ok", "dev", "dev_ok", "strm", "strm_ok"):
            getattr(ids, f)[odd] = getattr(one, f)
    return ids


_REC_BYTES = np.dtype((np.void, REC_DTYPE.itemsize))


def _records_where(r: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``r[mask]`` for scanner records, copied as opaque fixed-size items: the same array, without
    numpy's field-by-field copy of structured items (several times slower)."""
    return r.view(_REC_BYTES)[mask].view(REC_DTYPE)


def _fast_events(ch: FastChunk, rf: RankFile, st: "_ChunkState") -> _Decoded:
    """Scanner records → :class:`_Decoded`, numpy per event and Python per distinct string."""
    r = np.frombuffer(ch.records, REC_DTYPE)
    strings = ch.strings
    text = ch.text
    ph = r["ph"].copy()  # contiguous: the comparisons below read 1 byte an event, not a cache line
    for i in np.flatnonzero(ph == PH_M).tolist():
        c = int(r["name"][i])
        if c >= 0 and strings[c] == "thread_name":
            try:
                a = msgspec.json.decode(_slice_args(text, int(r["a_s"][i]), int(r["a_e"][i])))
                pid = _fast_ids(r["pid"][i : i + 1], r["pid_k"][i : i + 1], strings)[0]
                tid = _fast_ids(r["tid"][i : i + 1], r["tid_k"][i : i + 1], strings)[0]
                rf.thread_names[(int(pid), int(tid))] = str(a.get("name"))
            except Exception:
                pass
    no_ph = int(np.count_nonzero(ph == PH_NONE))
    be = []
    be_mask = (ph == PH_B) | (ph == PH_E)
    if be_mask.any():
        y = _records_where(r, be_mask)
        pids = _fast_ids(y["pid"], y["pid_k"], strings).tolist()
        tids = _fast_ids(y["tid"], y["tid_k"], strings).tolist()
        for k, rec in enumerate(y.tolist()):
            d = dict(zip(REC_DTYPE.names, rec))
            be.append(_Open(d["ph"] == PH_E, pids[k], tids[k], d["ts"], bool(d["ts_ok"]),
                            st.category(None if d["cat"] < 0 else strings[d["cat"]]),
                            "" if d["name"] < 0 else strings[d["name"]], _slice_args(text, d["a_s"], d["a_e"])))
    x = _records_where(r, ph == PH_X)
    if len(x) == 0:
        return _Decoded(None, be, no_ph)
    cat_codes = x["cat"]
    name_codes = x["name"]
    ev = _Events(
        x["ts"].copy(), x["ts_ok"].astype(bool), x["dur"].copy(), x["dur_ok"].astype(bool),
        cat_codes + 1, _code_table(cat_codes, strings, st.category, _canon_cat(None)),
        name_codes + 1, _code_table(name_codes, strings, lambda s: s, ""),
        _fast_ids(x["pid"], x["pid_k"], strings), _fast_ids(x["tid"], x["tid_k"], strings),
        lambda want, gpu: _rec_ids(x, text, want, gpu),
        lambda idx: [_slice_args(text, a, b) for a, b in zip(x["a_s"][idx].tolist(), x["a_e"][idx].tolist())],
    )
    return _Decoded(ev, be, no_ph)


def _table_flags(table: np.ndarray, fn) -> np.ndarray:
    """``fn(v)`` for every entry of a code table (None entries: False), as a bool array."""
    return np.array([v is not None and bool(fn(v)) for v in table.tolist()], dtype=bool)


def _build_batch(ev: _Events, rf: RankFile, st: "_ChunkState") -> pa.RecordBatch:
    """One chunk's complete events → a RAW_SCHEMA batch (quarantined rows removed); fills ``rf`` on the side.

    The rules, once for both decoders: GPU categories are ``gpu_stream`` rows whose device and
    stream come from ``args`` when given; ids are read for runtime/driver calls and for the
    events that need their ``args`` (GPU work, collective-related CPU ops, profiler steps;
    other rows keep null); communication is a kernel named so (the builtin and user patterns)
    or carrying collective args, or a ``gloo:`` CPU span; collective-related events keep a
    metadata row (:func:`_meta_rest`); ``ProfilerStep#N`` annotations are the steps. Per-event
    work is numpy; Python runs per distinct category/name (the metadata rows are columns too:
    :func:`_meta_rest`).
    """
    n = len(ev)
    cats, names, ci, ni = ev.cats, ev.names, ev.ci, ev.ni
    flags = st.special_names([nm for nm in names.tolist() if nm is not None])
    gpu = _table_flags(cats, GPU_CATEGORIES.__contains__)[ci]
    launch = _table_flags(cats, _LAUNCH_CATEGORIES.__contains__)[ci]
    kernel = _table_flags(cats, "kernel".__eq__)[ci]
    step_cat = _table_flags(cats, ("user_annotation", "cpu_op").__contains__)[ci]
    special = gpu | _table_flags(names, flags.__getitem__)[ni]
    ids = ev.ids(launch | special, gpu)
    device = ev.device.copy()
    track = ev.track.copy()
    device[ids.dev_ok] = ids.dev[ids.dev_ok]
    track[ids.strm_ok] = ids.strm[ids.strm_ok]
    is_comm = (kernel & (_table_flags(names, st.comm_name)[ni] | ids.coll)) | (
        ~gpu & _table_flags(names, lambda nm: nm.startswith("gloo:"))[ni])
    cpu_comm = ~gpu & _table_flags(names, lambda nm: nm.startswith(COMM_CPU_PREFIX))[ni]
    event_ids = np.arange(st.next_id, st.next_id + n, dtype=np.int64)
    st.next_id += n
    ts_ns, dur_ns = ev.ts_ns, ev.dur_ns
    valid = _valid(ts_ns, ev.ts_ok, dur_ns, ev.dur_ok)
    meta_idx = np.flatnonzero((is_comm | cpu_comm) & valid)
    if len(meta_idx):
        decoded = _decode_many(ev.raw(meta_idx), _KARGS_LIST, _KARGS, _EMPTY_ARGS)
        m_corr = np.where(ids.corr_ok[meta_idx], ids.corr[meta_idx], None).tolist()
        m_cat = cats[ci[meta_idx]].tolist()
        rf.add_meta(staging.columns_meta_batch(
            event_ids[meta_idx], names[ni[meta_idx]].tolist(), gpu[meta_idx], device[meta_idx], track[meta_idx],
            ts_ns[meta_idx], dur_ns[meta_idx], _meta_rest(decoded, m_cat, m_corr)))
    steps = step_cat & valid & _table_flags(names, lambda nm: nm.startswith("ProfilerStep#"))[ni]
    for i in np.flatnonzero(steps).tolist():
        _add_step(rf, names[ni[i]], int(event_ids[i]), bool(ev.ts_ok[i] and ev.dur_ok[i]), int(ts_ns[i]), int(dur_ns[i]))
    if not rf.has_gpu and gpu.any():
        rf.has_gpu = True
    i64 = pa.int64()
    return _finish_batch(
        rf, valid,
        [
            pa.array(event_ids, i64),
            pa.DictionaryArray.from_arrays(pa.array(gpu.astype(np.int32)),
                                           pa.array(["cpu_thread", "gpu_stream"], pa.string())),
            pa.array(device, i64),
            pa.array(track, i64),
            _dict_column(ci, cats),
            _dict_column(ni, names),
            pa.array(ts_ns, i64),
            pa.array(dur_ns, i64),
            pa.array(ids.corr, i64, mask=~ids.corr_ok),
            pa.array(ids.ext, i64, mask=~ids.ext_ok),
            pa.array(is_comm),
        ],
    )


def chunk_batches(chunk, rf: RankFile, st: "_ChunkState") -> list[pa.RecordBatch]:
    """A chunk from :class:`~tracekit.ingest.jsonstream.TraceStream` (scanner records or msgspec
    events) → its RAW_SCHEMA batches: its complete events, then the B/E spans it completed."""
    d = _fast_events(chunk, rf, st) if isinstance(chunk, FastChunk) else _slow_events(chunk, rf, st)
    st.no_ph += d.no_ph
    items = len(chunk.records) // REC_DTYPE.itemsize if isinstance(chunk, FastChunk) else len(chunk.events)
    st.phased += items - d.no_ph
    out = [] if d.events is None else [_build_batch(d.events, rf, st)]
    if d.be:
        spans = st.pair(d.be)
        if spans:
            out.append(_build_batch(_events_from_open(spans, st), rf, st))
    return out


_META_GET = operator.attrgetter(*META_FIELDS)
_ALIAS_GET = [(operator.attrgetter(alias), META_FIELDS.index(target)) for alias, target in _ALIASES]


def _meta_rest(decoded: list, category: list, correlation: list) -> list[bytes]:
    """The ``rest`` JSON of collective-related events' metadata rows (:data:`staging.META_SCHEMA`)
    from their decoded ``args`` (:class:`KArgs`): the :data:`META_FIELDS` present (not None), in
    that order, then ``category`` and ``correlation``; a field spelled only the older way
    (:data:`_ALIASES`) is read from its alias."""
    fields = list(map(_META_GET, decoded))
    for get, t in _ALIAS_GET:
        alias = list(map(get, decoded))
        if alias.count(None) < len(alias):
            fields = [f if a is None or f[t] is not None else f[:t] + (a,) + f[t + 1:] for f, a in zip(fields, alias)]
    return staging.rest_column(fields, category, correlation)


_STEP_RE = re.compile(r"ProfilerStep#(\d+)")


def _add_step(rf: RankFile, name: str, event_id: int, ok: bool, ts_ns: int, dur_ns: int) -> None:
    m = _STEP_RE.match(name)
    if m and ok and int(m.group(1)) <= INT64_MAX and ts_ns <= INT64_MAX - max(dur_ns, 0):
        rf.steps.append((int(m.group(1)), event_id, ts_ns, ts_ns + dur_ns))


def _valid(ts_ns, ts_ok, dur_ns, dur_ok) -> np.ndarray:
    """Per event: kept (True) or quarantined, for a missing/non-positive ts, a missing or negative
    dur, or an end (ts + dur) beyond int64."""
    valid = ts_ok & dur_ok & (dur_ns >= 0) & (ts_ns > 0)
    valid &= ts_ns <= INT64_MAX - np.maximum(dur_ns, 0)  # the end, ts + dur, must be an int64 too
    return valid


def _finish_batch(rf: RankFile, valid: np.ndarray, columns: list) -> pa.RecordBatch:
    """The RAW_SCHEMA batch of the events ``valid`` (:func:`_valid`) keeps; the others are counted
    as quarantined (their metadata rows and steps were never made)."""
    nbad = int(len(valid) - valid.sum())
    rf.quarantined += nbad
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
