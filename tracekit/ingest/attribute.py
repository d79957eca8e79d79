"""From collective-related events to rows of the ``collectives`` table.

Inputs are the metadata rows the readers kept (the staging folder's metadata table,
:class:`tracekit.ingest.staging.MetaRows`:
communication kernels and the CPU ops ``record_param_comms`` / ``nccl:*`` /
``c10d::*`` / ``gloo:*`` with their args) and, for GPU traces, each comm
kernel's launch call (thread and time on the CPU). This module decides, per
communication span, which collective it was and how many bytes it moved:

0. a kernel of a collective family beyond NCCL (symmetric memory, custom all-reduce, DeepEP...),
   or one launched inside a family's CPU op: op and size from that op's ``Input Dims`` /
   ``Input type`` (``cpu_op_dims``) or the kernel's name (tracekit.ingest.comm_families);
1. metadata on the kernel itself (``Collective name``, ``In msg nelems``...) →
   ``meta_source = kernel_args``;
2. else the innermost enclosing ``record_param_comms`` of its launch, on the
   launching thread, with metadata → ``record_param_comms``;
3. else the enclosing ``nccl:*`` (then ``c10d::*``) op's ``Input Dims`` and
   ``Input type`` → ``cpu_op_dims``;
4. else the kernel name (``ncclKernel_AllReduce_...``) → ``name_only``;
   SendRecv / Generic kernels with no metadata stay *unattributed* (op null).

Sizes follow nccl-tests' ``S`` (../shared/reference/alpha-beta.md, "Collectives
on k ranks"): the all-reduce buffer, the all-gather *output*, the
reduce-scatter *input*, the all-to-all send buffer. ``wire_bytes`` is the
least a rank must send for the op (the reference's lower bounds):
``2(k−1)/k·S`` for all-reduce, ``(k−1)/k·S`` for all-gather/reduce-scatter/
gather/scatter and even all-to-all; for uneven all-to-all the sum of the
rank's input splits except its own chunk; ``S`` for broadcast, reduce, send;
0 for recv and barrier.

A GPU rank's kernels are resolved per pattern, not one by one (:func:`_gpu_table`): kernels of
the same name and metadata whose launches the same ops enclose (same names and metadata,
innermost first; found for all kernels at once by :func:`enclosing_pairs`) get the same op,
sizes and group, so the rules above run once per pattern and each kernel keeps its own
event_id, times, launch time and seq. CPU-only ranks go call by call (the gloo pairing is
sequential).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.ingest import pg_attribution
from tracekit.ingest.comm_families import kernel_op, resolve_family
from tracekit.ingest.kineto import int_or_none, parse_split_list
from tracekit.model import busbw_factor
from tracekit.model.ops import canonical_op
from tracekit.store import COLLECTIVES_SCHEMA

DTYPE_BYTES = {
    "float": 4, "float32": 4, "float4": 4, "single": 4,
    "double": 8, "float64": 8,
    "half": 2, "float16": 2, "bfloat16": 2, "c10::bfloat16": 2, "c10::half": 2,
    "int": 4, "int32": 4, "uint32": 4,
    "long": 8, "int64": 8, "uint64": 8, "long int": 8, "long long": 8, "long long int": 8,
    "unsigned long": 8, "int64_t": 8, "uint64_t": 8, "int32_t": 4, "uint32_t": 4, "unsigned int": 4,
    "short int": 2, "int16_t": 2, "int8_t": 1, "uint8_t": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
    "short": 2, "int16": 2, "uint16": 2,
    "char": 1, "int8": 1, "byte": 1, "uint8": 1, "bool": 1, "unsigned char": 1, "signed char": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "complexfloat": 8, "complexdouble": 16, "c10::complex<float>": 8, "c10::complex<double>": 16,
}

BUS_FACTOR_OPS = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"}


_KERNEL_RE = re.compile(r"(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)(?:_([A-Z]+))?(?:_([A-Z0-9]+))?", re.I)


@functools.lru_cache(maxsize=4096)
def parse_kernel_name(name: str) -> tuple[str | None, str | None, str | None]:
    """``ncclKernel_AllReduce_RING_LL_Sum_float`` → ("all_reduce", "RING", "LL") (algo/proto informational).

    Kernels of the built-in collective families (tracekit.ingest.comm_families: custom all-reduce
    ``cross_device_reduce_*``, ``multimem_all_reduce_kernel``...) → (their op, None, None).
    """
    m = _KERNEL_RE.search(name or "")
    if not m:
        return kernel_op(name, user=False)[1], None, None
    kind, algo, proto = m.group(1), m.group(2), m.group(3)
    op = canonical_op(kind, trace=True)
    if algo and not algo.isupper():
        algo = None
    return op, algo, proto


def dtype_bytes(dtype: Any) -> int | None:
    """Bytes per element of a dtype as traces spell it (``Float``, ``c10::BFloat16``, ``long int``...); None if unknown."""
    if dtype is None:
        return None
    return DTYPE_BYTES.get(str(dtype).strip().lower())


def parse_ranks(v: Any) -> list[int] | None:
    """Process-group ranks from ``"[0, 1]"`` or ``[0, 1]``; None when absent."""
    if v is None:
        return None
    if isinstance(v, list):
        return [x for x in v if int_or_none(x, 0, 2**31 - 1) is not None]
    nums, _ = parse_split_list(v)
    return nums


def _numel(dims: Any) -> int | None:
    if not isinstance(dims, list) or not dims:
        return None
    first = dims[0]
    if not isinstance(first, list) or not first or not all(int_or_none(x, 0) is not None for x in first):
        return None
    n = math.prod(first)
    return n if n <= 2**62 else None


def size_bytes_for(op: str | None, in_nelems, out_nelems, nbytes: int | None) -> int | None:
    """nccl-tests S from element counts: all-gather uses the output, the rest the input (or the larger)."""
    if nbytes is None:
        return None
    i = int_or_none(in_nelems, 0, 2**53)
    o = int_or_none(out_nelems, 0, 2**53)
    if op == "all_gather":
        n = o if o is not None else None
    elif op in ("reduce_scatter", "all_reduce", "all_to_all"):
        n = i if i is not None else o
    else:
        n = max([x for x in (i, o) if x is not None], default=None)
    return None if n is None else n * nbytes


def wire_bytes_for(op: str | None, size: int | None, group_size: int | None, in_splits, my_index, nbytes) -> int | None:
    """Bytes this rank must put on the wire (see module docstring).

    The even-split bounds are the nccl-tests bus factors times S (2(k−1)/k for all-reduce,
    (k−1)/k for all-gather, reduce-scatter, gather, scatter and all-to-all), taken from
    tracekit.model.busbw_factor. None when the op, the size or a needed group size is unknown.
    """
    if op is None or size is None:
        return None
    if op == "all_to_all" and in_splits and my_index is not None and 0 <= my_index < len(in_splits) and nbytes:
        return (sum(in_splits) - in_splits[my_index]) * nbytes
    if op in BUS_FACTOR_OPS:
        if not group_size:
            return None
        return round(busbw_factor(op, group_size) * size) if group_size > 1 else 0
    if op in ("broadcast", "reduce", "send"):
        return size
    return 0


def c10d_alltoall_splits(op_row: dict) -> tuple[list[int], list[int]] | None:
    """(input splits, output splits) in ELEMENTS from a ``c10d::alltoall_base_`` call, or None.

    Its inputs are (output, input, group, output_split_sizes, input_split_sizes, ...): the
    split lists (``Concrete Inputs`` 3 and 4) count rows of the input/output tensors, so one
    split element is a row of ∏ dims[1:] elements (``Input Dims`` 1 is the input tensor).
    ``"[]"`` means even splits and gives two empty lists.
    """
    if not str(op_row.get("name", "")).startswith("c10d::alltoall_base"):
        return None
    ci, dims = op_row.get("concrete"), op_row.get("input_dims")
    if not isinstance(ci, list) or len(ci) < 5 or not isinstance(dims, list) or len(dims) < 2:
        return None
    out_rows, a1 = parse_split_list(ci[3])
    in_rows, a2 = parse_split_list(ci[4])
    if out_rows is None or in_rows is None or a1 or a2:
        return None
    inp = dims[1]
    if not isinstance(inp, list) or not inp or not all(int_or_none(x, 0) is not None for x in inp):
        return None
    row = math.prod(inp[1:]) if len(inp) > 1 else 1
    return [x * row for x in in_rows], [x * row for x in out_rows]


def _has_meta(r: dict) -> bool:
    return isinstance(r.get("collective"), str) or int_or_none(r.get("in_nelems"), 0) is not None


def _resolve(kernel: dict, enclosing: list[dict]) -> dict:
    """Pick op and sizes for one comm span; returns a partial collectives row, whose ``seq_at``
    says where ``seq`` came from: −1 the kernel, i ``enclosing[i]``, None (or absent) neither.

    A GPU kernel without its own metadata goes to the collective families first
    (:func:`tracekit.ingest.comm_families.resolve_family`: a family kernel, or a family CPU op
    such as ``symm_mem::multimem_all_reduce_`` enclosing its launch); the rules below otherwise.
    """
    if kernel.get("gpu") is not False and not _has_meta(kernel):
        fam = resolve_family(kernel["name"], enclosing, dtype_bytes)
        if fam is not None:
            return fam
    name_op, algo, proto = parse_kernel_name(kernel["name"])
    if kernel.get("gpu") is False:
        name_op = canonical_op(kernel["name"], trace=True)
    src = None
    meta = None
    if _has_meta(kernel):
        src, meta, at = "kernel_args", kernel, -1
    else:
        for at, r in enumerate(enclosing):
            if r["name"] == "record_param_comms" and _has_meta(r):
                src, meta = "record_param_comms", r
                break
    op = None
    dims_row = None
    named_ops = [r for r in enclosing if r["name"] != "record_param_comms"]
    for r in named_ops:  # innermost nccl:* first, then c10d::*
        o = canonical_op(r["name"], trace=True)
        if o is not None:
            if op is None:
                op = o
            if dims_row is None and _numel(r.get("input_dims")) is not None and r["name"].startswith(("nccl:", "rccl:", "gloo:")):
                dims_row = r
    if dims_row is None:
        for r in named_ops:
            if _numel(r.get("input_dims")) is not None and canonical_op(r["name"], trace=True) is not None:
                dims_row = r
                break
    if meta is not None and canonical_op(meta.get("collective"), trace=True) is not None:
        op = canonical_op(meta.get("collective"), trace=True)
    if op is None:
        op = name_op
    row: dict = dict(op=op, algo=algo, proto=proto, approx=False)
    if meta is not None:
        dt = meta_dtype(meta.get("dtype"), _pg_name(meta), meta.get("in_nelems") is not None)
        nb = dtype_bytes(dt)
        row.update(
            meta_source=src,
            dtype=None if dt is None else str(dt),
            size_bytes=size_bytes_for(op, meta.get("in_nelems"), meta.get("out_nelems"), nb),
            group_size=int_or_none(meta.get("group_size"), 1, 2**31 - 1),
            pg_name=_pg_name(meta),
            pg_ranks=parse_ranks(meta.get("pg_ranks")),
            seq=int_or_none(meta.get("seq"), 0),
            in_splits_raw=meta.get("in_split"),
            out_splits_raw=meta.get("out_split"),
            nbytes=nb,
            seq_at=at,
        )
        if row["size_bytes"] is None and dims_row is not None:
            meta = None  # fall through to dims
    if meta is None and dims_row is not None:
        types = dims_row.get("input_type")
        dt = types[0] if isinstance(types, list) and types else None
        nb = dtype_bytes(dt)
        nel = _numel(dims_row.get("input_dims"))
        shard = op == "all_gather"  # an nccl:* all-gather's Input Dims are one rank's shard: × k later
        dims = dims_row.get("input_dims")
        if str(dims_row.get("name", "")).startswith(_OUT_IN_OPS + _GATHER_OUT_IN + _SCATTER_OUT_IN) \
                and isinstance(dims, list) and len(dims) >= 2:
            # c10d's (output, input) ops: S is the all-gather's output, the reduce-scatter's and the
            # all-to-all's input (nccl-tests' S), never the first tensor whatever the op
            nel = _dims_numel(dims[0] if op == "all_gather" else dims[1])
            shard = False
        row.update(
            meta_source="cpu_op_dims",
            dtype=None if dt is None else str(dt),
            size_bytes=None if (nb is None or nel is None) else nel * nb,
            group_size=None,
            pg_name=None,
            pg_ranks=None,
            seq=None,
            in_splits_raw=None,
            out_splits_raw=None,
            nbytes=nb,
            all_gather_shard=shard,
            seq_at=None,
        )
    if "meta_source" not in row:
        row.update(meta_source="name_only", dtype=None, size_bytes=None, group_size=None, pg_name=None,
                   pg_ranks=None, seq=None, in_splits_raw=None, out_splits_raw=None, nbytes=None)
    if op == "all_to_all" and row.get("in_splits_raw") is None:
        for r in enclosing:
            sp = c10d_alltoall_splits(r)
            if sp is not None:
                row["in_splits_raw"], row["out_splits_raw"] = sp
                break
    row["shape_k"] = group_size_from_shapes(op, enclosing, meta, row.get("in_splits_raw"))
    return row


_GATHER_OUT_IN = ("c10d::_allgather_base", "c10d::allgather_into_tensor")
_SCATTER_OUT_IN = ("c10d::_reduce_scatter_base", "c10d::reduce_scatter_tensor")


def _dims_numel(d: Any) -> int | None:
    """Elements of one tensor's dims (``[8192, 64]`` → 524,288); None unless a non-empty list of ints."""
    if not isinstance(d, list) or not d or not all(int_or_none(x, 0) is not None for x in d):
        return None
    return math.prod(d)


def _ratio(big: int | None, small: int | None) -> int | None:
    """big / small when both are positive, small divides big exactly and the ratio is at least 2
    (a ratio of 1 is also what a trace that records one count for both tensors shows), else None."""
    if not big or not small or big % small or big // small < 2:
        return None
    return big // small


def group_size_from_shapes(op: str | None, enclosing: list[dict], meta: dict | None, splits_raw) -> int | None:
    """The group size k that the launching call's own tensors imply, or None when they imply none.

    - all_gather: the output holds k inputs (``output = k × input``, torch.distributed
      ``all_gather_into_tensor``'s contract): ``c10d::_allgather_base_`` /
      ``c10d::allgather_into_tensor*`` with ``Input Dims`` (output, input), or ``Out msg nelems`` /
      ``In msg nelems`` of metadata without a group size;
    - reduce_scatter: the input holds k outputs (``c10d::_reduce_scatter_base_`` /
      ``c10d::reduce_scatter_tensor*``, (output, input); or the metadata's element counts);
    - all_to_all: one split per peer, the rank's own included (``In split size`` / the
      ``c10d::alltoall_base_`` split lists; an empty list says even splits and no k).

    Only an exact integer ratio counts; ``enclosing`` innermost first, ``meta`` the metadata row
    :func:`_resolve` took sizes from (or None).
    """
    if op == "all_to_all":
        splits, cut = parse_split_list(splits_raw)
        return len(splits) if splits and not cut else None
    if op not in ("all_gather", "reduce_scatter"):
        return None
    names = _GATHER_OUT_IN if op == "all_gather" else _SCATTER_OUT_IN
    for r in enclosing:
        if str(r.get("name", "")).startswith(names):
            dims = r.get("input_dims")
            if isinstance(dims, list) and len(dims) >= 2:
                out, inp = _dims_numel(dims[0]), _dims_numel(dims[1])
                k = _ratio(out, inp) if op == "all_gather" else _ratio(inp, out)
                if k is not None:
                    return k
    if meta is not None:
        i = int_or_none(meta.get("in_nelems"), 1, 2**53)
        o = int_or_none(meta.get("out_nelems"), 1, 2**53)
        return _ratio(o, i) if op == "all_gather" else _ratio(i, o)
    return None


def _pg_name(meta: dict) -> str | None:
    v = meta.get("pg_name")
    if v is None:
        v = meta.get("pg_id")
    return None if v is None else str(v)


def build_collectives(
    run_id: str,
    rank: int,
    meta,
    launches,
    *,
    world_size: int | None,
    pg_config: dict[str, list[int]],
    cpu_only: bool,
    calls=None,
) -> Iterator[dict | pa.Table]:
    """Rows of the collectives table for one rank, in the order of the comm spans in the file:
    dicts for a CPU-only rank, one COLLECTIVES_SCHEMA table of them for a GPU rank (:func:`_gpu_table`).

    ``meta``: the rank's comm_meta rows (:class:`~tracekit.ingest.staging.MetaRows`).
    ``launches`` (a :class:`tracekit.ingest.linkpass.ById`) maps a comm kernel's event_id →
    (pid, tid, launch ts, launch end) of its runtime launch call, via ``lookup``;
    kernels missing from it were launched outside the capture. ``pg_config`` maps process-group
    name → global ranks (from ``distributedInfo.pg_config``); ``world_size`` None when no trace
    declares it (one file: a call whose group nothing else names then has group_size null, never 1).
    Each row's ``k_source`` says where its group size came from (:func:`_finish_row`: the call's
    metadata, its tensors' shapes (:func:`group_size_from_shapes`), its group's recorded membership,
    the world size). ``seq`` is left null where the
    trace has none (:func:`tracekit.ingest.assemble.rank_collectives` numbers it).

    CPU-side collectives (``cpu_only``: the rank's trace has no GPU activity), one rule: the
    rank's ``gloo:*`` spans when it has any (:func:`_cpu_rows`), else its collective CPU calls,
    the outermost ``c10d::*`` / ``nccl:*`` / ``rccl:*`` / ``record_param_comms`` op naming a collective
    (``calls``: their event ids, :class:`tracekit.ingest.linkpass._CpuCalls`; :func:`_cpu_call_rows`).
    Their rows have ``cpu_side`` true; a call's span is the call itself, launch and waiting included.
    GPU ranks: a collective is a comm kernel (``cpu_side`` false); a CPU call that launched none
    (a 1-rank group, say) is not one.
    """
    if cpu_only:
        gloo = meta.names_where(lambda nm: nm.startswith("gloo:"))
        rows = (_cpu_rows(run_id, rank, meta, np.flatnonzero(~meta.gpu & ~gloo), world_size, pg_config)
                if gloo.any() else _cpu_call_rows(run_id, rank, meta, calls, world_size, pg_config))
        for row in rows:
            row["cpu_side"] = True
            yield row
        return
    yield _gpu_table(run_id, rank, meta, launches, world_size, pg_config)


PATTERNS_FROM = 256
"""A GPU rank with fewer comm kernels resolves each on its own: finding its patterns costs more
than it could save (benchmarks/README.md, "collectives per pattern")."""


def _gpu_table(run_id, rank, meta, launches, world_size, pg_config) -> pa.Table:
    """The collectives of a GPU rank, one per comm kernel in file order, as a COLLECTIVES_SCHEMA table.

    Kernels alike (same name and metadata, enclosing ops of the same names and metadata, innermost
    first; :func:`_patterns`) resolve alike: :func:`_resolve` and :func:`_finish_row` run once per
    distinct pattern, on its first kernel, and each kernel takes its pattern's row with its own
    event_id, ts_ns, dur_ns, issue_ts_ns (its launch call's start, or its own start when it was
    launched outside the capture) and seq."""
    gpu = np.flatnonzero(meta.gpu)
    found, cols, _ = launches.lookup(meta.event_id[gpu])
    ts = meta.ts_ns[gpu]
    issue = np.where(found, cols[2], ts)
    call, op = enclosing_pairs(meta, launches)
    # per kernel, the meta rows of its enclosing ops (innermost first), -1 past the last
    at = np.arange(len(call))
    pos = at - np.maximum.accumulate(np.where(np.r_[True, call[1:] != call[:-1]], at, 0)) if len(call) else at
    ops = np.full((len(gpu), int(pos.max()) + 1 if len(pos) else 0), -1, dtype=np.int64)
    ops[np.searchsorted(gpu, call), pos] = op
    rep, pattern, seq = _patterns(meta, gpu, ops) if len(gpu) >= PATTERNS_FROM else (range(len(gpu)), None, None)
    rows, seq_at = [], []
    for k in rep:
        sp = meta.row(gpu[k])
        res = _resolve(sp, [meta.row(j) for j in ops[k][ops[k] >= 0].tolist()])
        rows.append(dict(_finish_row(run_id, rank, sp, res, int(issue[k]), world_size, pg_config), cpu_side=False))
        seq_at.append(-2 if res.get("seq_at") is None else res["seq_at"])
    table = pa.Table.from_pylist(rows, schema=COLLECTIVES_SCHEMA)
    if pattern is None:
        return table
    table = table.take(pa.array(pattern))
    # seq: the kernel's own, from the row its pattern's metadata came from (a seq left out of the key)
    at = np.array(seq_at, dtype=np.int64)[pattern]
    src = np.where(at == -1, gpu, ops[np.arange(len(gpu)), np.maximum(at, 0)] if ops.shape[1] else -1)
    own = (at >= -1) & (src >= 0)
    own[own] = seq.valid[src[own]]
    vals = pc.fill_null(table.column("seq"), 0).to_numpy().copy()
    vals[own] = seq.value[src[own]]
    ok = np.where(own, vals >= 0, table.column("seq").is_valid().to_numpy(zero_copy_only=False))
    for name, v, valid in (("event_id", meta.event_id[gpu], None), ("ts_ns", ts, None),
                           ("dur_ns", meta.dur_ns[gpu], None), ("issue_ts_ns", issue, None), ("seq", vals, ok)):
        i = COLLECTIVES_SCHEMA.get_field_index(name)
        table = table.set_column(i, COLLECTIVES_SCHEMA.field(i),
                                 pa.array(v, pa.int64(), mask=None if valid is None else ~valid))
    return table


def _patterns(meta, gpu: np.ndarray, ops: np.ndarray):
    """(the first kernel of each pattern, each kernel's pattern, the meta rows' seqs): kernels
    (``gpu``: their meta rows) are alike when they and their enclosing ops (``ops``: per kernel,
    innermost first, −1 past the last) have the same content (:func:`_content_ids`)."""
    content, seq = _content_ids(meta)
    pattern = _row_ids([content[gpu]] + [np.where(c >= 0, content[c], -1) for c in ops.T])
    return np.unique(pattern, return_index=True)[1].tolist(), pattern, seq


def _row_ids(cols: list) -> np.ndarray:
    """Per row of the int64 columns ``cols`` (of one length), a number from 0 shared by the rows equal
    in every column (one 1-D unique per column: faster than ``np.unique(axis=0)``; the numbers stay
    below the row count, so a pair of them fits int64)."""
    ids = np.zeros(len(cols[0]), dtype=np.int64)
    for c in cols:
        c = np.unique(c, return_inverse=True)[1].reshape(-1)
        ids = np.unique(ids * (int(c.max(initial=0)) + 1) + c, return_inverse=True)[1].reshape(-1)
    return ids


@dataclass
class _Seqs:
    """Per meta row: whether its ``seq`` is a JSON integer of at most 18 digits (``valid``), and it."""

    valid: np.ndarray
    value: np.ndarray


def _content_ids(meta) -> tuple[np.ndarray, _Seqs]:
    """Per meta row, a number shared by the rows of the same name and the same other metadata, and
    the rows' seqs left out of it.

    The metadata: the JSON of the fields the Kineto reader kept (``rest``,
    tracekit.ingest.staging.META_SCHEMA), all that :func:`_resolve` reads besides the name, less
    the launch ``correlation`` (each kernel's id, read by the link pass only) and an integer
    ``seq`` (each call's number: :func:`_gpu_table` puts each kernel's own back). In a JSON without
    a nested object a key right after ``{`` or ``,`` can only be a top-level field (a quote inside
    a JSON string is escaped); a JSON with one stays whole in the key, and its seq is not read. A
    correlation or seq of another form stays in the key (rows then share less, and resolve alike
    all the same)."""
    if not len(meta):
        z = np.zeros(0, dtype=np.int64)
        return z, _Seqs(z.astype(bool), z)
    rest = pc.dictionary_encode(meta._table.column("rest"), null_encoding="encode").combine_chunks()
    at, rest = rest.indices.to_numpy(), rest.dictionary  # the regexes run on the distinct JSONs
    # a JSON holding a nested object (a second "{") could hold a "seq" or "correlation" key of its
    # own: kept whole in the key, its seq not read (such a row shares with identical rows only)
    flat = pc.fill_null(pc.less_equal(pc.count_substring(rest, "{"), 1), False)
    got = pc.struct_field(pc.extract_regex(rest, _SEQ_VALUE_RE), [0]).cast(pa.large_string()).cast(pa.int64())
    got = pc.if_else(flat, got, pa.scalar(None, pa.int64()))
    seq = _Seqs(got.is_valid().to_numpy(zero_copy_only=False)[at], pc.fill_null(got, 0).to_numpy()[at])
    whole = rest
    for pattern in (_SEQ_RE, _CORRELATION_RE):
        rest = pc.replace_substring_regex(rest, pattern, r"\1\2")
    rest = pc.if_else(flat, rest, whole)
    rest = pc.dictionary_encode(rest, null_encoding="encode").indices.to_numpy()[at]
    return np.unique(meta.name.astype(np.int64) * (int(rest.max()) + 1) + rest, return_inverse=True)[1].reshape(-1), seq


_CORRELATION_RE = r'([{,])"correlation":(?:-?[0-9]+|null)([,}])'
_SEQ_RE = r'([{,])"seq":-?[0-9]{1,18}([,}])'
_SEQ_VALUE_RE = r'[{,]"seq":(?P<seq>-?[0-9]{1,18})[,}]'


ENCLOSING_WINDOW = 64
"""A launch call's enclosing ops are looked for among the last this many CPU comm ops of its
thread that start at or before it (by start, the longer first, then file order)."""

_CALLS_AT_ONCE = 4096
"""Launch calls matched against their window at once (int64/bool matrices of this many rows ×
ENCLOSING_WINDOW)."""


def enclosing_ops(meta, launches) -> dict[int, list[int]]:
    """GPU meta row → the meta rows of the CPU comm ops that enclose its launch call, innermost
    first (:func:`enclosing_pairs` as a dict); GPU rows with none are absent."""
    out: dict[int, list[int]] = {}
    for g, r in zip(*(a.tolist() for a in enclosing_pairs(meta, launches))):
        out.setdefault(g, []).append(r)
    return out


def enclosing_pairs(meta, launches) -> tuple[np.ndarray, np.ndarray]:
    """(GPU meta row, CPU meta row) int64 arrays: the CPU comm ops that enclose each GPU row's
    launch call (start ≤ the call's start and end ≥ its end, on its thread, among the
    ENCLOSING_WINDOW ops before it). A GPU row's pairs are adjacent, innermost op (latest start,
    then the shorter) first; GPU rows with none have no pair.

    How: the CPU ops (thread, start, 0, −duration, row) and the launch calls (thread, start, 1,
    0, row) in one lexicographic sort — at equal starts ops come before calls, so an op starting
    with the call counts — and per call the ops just before it in that order on its thread.
    """
    none = np.zeros(0, dtype=np.int64)
    cpu = np.flatnonzero(~meta.gpu)
    gpu = np.flatnonzero(meta.gpu)
    if not len(cpu) or not len(gpu):
        return none, none
    found, (pid, tid, lts, lend), valid = launches.lookup(meta.event_id[gpu])
    call_thr = _thread_index(meta.threads, pid, tid, *valid[:2])
    c = found & (call_thr >= 0)  # calls on a thread that runs no comm op enclose nothing
    n_op, n_call = len(cpu), int(c.sum())
    thr = np.concatenate([meta.thread[cpu].astype(np.int64), call_thr[c]])
    start = np.concatenate([meta.ts_ns[cpu], lts[c]])
    kind = np.r_[np.zeros(n_op, dtype=np.int8), np.ones(n_call, dtype=np.int8)]
    neg_dur = np.concatenate([-meta.dur_ns[cpu], np.zeros(n_call, dtype=np.int64)])
    row = np.concatenate([cpu, gpu[c]])
    end = np.concatenate([meta.ts_ns[cpu] + meta.dur_ns[cpu], lend[c]])
    o = np.lexsort((row, neg_dur, kind, start, thr))
    is_op = kind[o] == 0
    op_end, op_row, op_thr = end[o][is_op], row[o][is_op], thr[o][is_op]
    before = np.cumsum(is_op)[~is_op]  # per call (in sorted order): the ops at or before it
    q_row, q_thr, q_end = row[o][~is_op], thr[o][~is_op], end[o][~is_op]
    calls, ops = [none], [none]
    back = np.arange(ENCLOSING_WINDOW)[None, :]
    for at in range(0, n_call, _CALLS_AT_ONCE):
        sl = slice(at, at + _CALLS_AT_ONCE)
        j = before[sl][:, None] - 1 - back  # innermost first
        ok = j >= 0
        jj = np.where(ok, j, 0)
        ok &= (op_thr[jj] == q_thr[sl][:, None]) & (op_end[jj] >= q_end[sl][:, None])
        qi, rk = np.nonzero(ok)  # by call, then innermost first
        calls.append(q_row[sl][qi])
        ops.append(op_row[jj[qi, rk]])
    return np.concatenate(calls).astype(np.int64), np.concatenate(ops).astype(np.int64)


def _thread_index(threads: list, pid, tid, pid_ok, tid_ok) -> np.ndarray:
    """Per launch call, the index in ``threads`` (MetaRows' (device, track) pairs, None for a
    missing value) of its (pid, tid), −1 when no comm op runs there. ``pid_ok`` / ``tid_ok``:
    validity masks, None when all are present."""
    n = len(pid)
    pv = np.ones(n, dtype=bool) if pid_ok is None else pid_ok
    tv = np.ones(n, dtype=bool) if tid_ok is None else tid_ok
    # (present, value) of each part, a missing value as (0, 0): threads and calls numbered together
    known = np.array([(d is not None, d or 0, t is not None, t or 0) for d, t in threads], dtype=np.int64)
    calls = np.stack([pv, np.where(pv, pid, 0), tv, np.where(tv, tid, 0)], axis=1).astype(np.int64)
    inv = _row_ids(list(np.concatenate([known.reshape(-1, 4), calls]).T))
    index = np.full(int(inv.max()) + 1 if len(inv) else 0, -1, dtype=np.int64)
    index[inv[:len(known)][::-1]] = np.arange(len(known))[::-1]  # the first of equal threads
    return index[inv[len(known):]]


# gloo runs some collectives as others: reduce-scatter as an all-reduce of the whole input.
_GLOO_SPAN_OPS = {"reduce_scatter": ("reduce_scatter", "all_reduce"), "barrier": ("barrier", "all_reduce")}
P2P_OPS = ("send", "recv")


def _cpu_rows(run_id, rank, meta, cpu_rows, world_size, pg_config) -> Iterator[dict]:
    """CPU-only (gloo) traces: each ``gloo:*`` span is a collective; the ``c10d::*`` call that
    issued it (same order per op, first in first out) names the op and, for send/recv, the peer.

    Issuers and spans are paired in issue order: issuer i takes the earliest unpaired span of a
    compatible kind (its own op; for reduce-scatter and barrier also gloo's all-reduce). A p2p
    call's span is the hull of the c10d call and its gloo span (the blocking wait is in the former).
    """
    from collections import deque

    gloo = np.flatnonzero(meta.names_where(lambda nm: nm.startswith("gloo:")))
    spans = gloo[np.argsort(meta.ts_ns[gloo], kind="stable")].tolist()
    span_op = [canonical_op(nm, trace=True) for nm in meta.names]
    queues: dict = defaultdict(deque)
    for j in spans:
        queues[span_op[meta.name[j]]].append(j)
    issuer_of: dict = {}
    for j, op in _cpu_issuers(meta, cpu_rows):
        for kind in _GLOO_SPAN_OPS.get(op, (op,)):
            q = queues.get(kind)
            if q:
                # gloo's two worker threads may start spans out of issue order: among the next
                # few spans of this kind take the first whose tensor shape is the issuer's
                want = _issuer_payload_dims(meta.row(j))
                pick = 0
                if want is not None:
                    for k in range(min(len(q), _PAIR_LOOKAHEAD)):
                        dims = meta.row(q[k]).get("input_dims")
                        if isinstance(dims, list) and dims and dims[0] == want:
                            pick = k
                            break
                sp = q[pick]
                del q[pick]
                issuer_of[sp] = j
                break
    labels = _group_labels(meta)
    for j in spans:
        sp = meta.row(j)
        k = issuer_of.get(j)
        iss = meta.row(k) if k is not None else None
        if iss is not None:
            iss["pg_label"] = labels(k)
        enclosing = ([iss] if iss is not None else []) + ([sp] if _numel(sp.get("input_dims")) is not None else [])
        res = _resolve(dict(sp, gpu=False), enclosing)
        row = _finish_row(run_id, rank, sp, res, iss["ts_ns"] if iss else None, world_size, pg_config)
        pg_attribution.row_facts(row, sp, iss, res)  # groups of unnamed calls: decided across ranks
        if iss is not None and res["op"] in P2P_OPS:
            start = min(iss["ts_ns"], sp["ts_ns"])
            end = max(iss["ts_ns"] + iss["dur_ns"], sp["ts_ns"] + sp["dur_ns"])
            row.update(ts_ns=start, dur_ns=end - start)
            _p2p_pair(row, iss, rank)
        yield row


LABEL_WINDOW = 64
"""A call's process-group range is looked for among the last this many ranges of its thread
that start at or before it: one around more than this many earlier sibling ranges is missed (the
call is then attributed as unlabelled); the ranges of tracekit/collectors/pg_labels.py hold one call each."""


def _group_labels(meta):
    """meta row of a c10d call → the group its innermost enclosing process-group range names
    (``pg_attribution.LABEL_PREFIX`` + name, on the call's thread: start ≤ the call's start,
    end ≥ its end; among the LABEL_WINDOW ranges of that thread starting last before it), or None."""
    at = np.flatnonzero(meta.names_where(lambda nm: nm.startswith(pg_attribution.LABEL_PREFIX)))
    by_thread: dict = defaultdict(list)
    for i in at[np.argsort(meta.ts_ns[at], kind="stable")].tolist():
        by_thread[int(meta.thread[i])].append(i)
    starts = {t: meta.ts_ns[ix] for t, ix in by_thread.items()}

    def label(j: int) -> str | None:
        t = int(meta.thread[j])
        ix = by_thread.get(t)
        if not ix:
            return None
        t0, t1 = meta.ts_ns[j], meta.ts_ns[j] + meta.dur_ns[j]
        hi = int(np.searchsorted(starts[t], t0, side="right"))
        for i in reversed(ix[max(0, hi - LABEL_WINDOW):hi]):
            if meta.ts_ns[i] + meta.dur_ns[i] >= t1:
                return meta.names[meta.name[i]][len(pg_attribution.LABEL_PREFIX):]
        return None

    return label


def _p2p_pair(row: dict, issuer: dict, rank: int) -> None:
    """A CPU send/recv row gets its peer and its pair group ``p2p:<src>-><dst>`` (global ranks; seq
    numbered per pair) from the issuing c10d call, when the call names the peer."""
    peer = _p2p_peer(issuer, row.get("pg_ranks"))
    if peer is not None:
        src, dst = (rank, peer) if row["op"] == "send" else (peer, rank)
        row.update(peer=peer, pg_name=f"p2p:{src}->{dst}", pg_ranks=[src, dst], group_size=2, seq=None,
                   wire_bytes=row["size_bytes"] if row["op"] == "send" else 0,
                   k_source="metadata")  # the call's own peer argument: a pair


def _cpu_call_rows(run_id, rank, meta, calls, world_size, pg_config) -> Iterator[dict]:
    """CPU-only traces without gloo spans: each collective CPU call (the outermost collective op of
    a call, ``calls``: event ids) is a collective whose span is the call (launch and waiting
    included); op and size come from the call and the collective ops inside it on its thread
    (innermost first, then the call): ``record_param_comms`` metadata, then ``nccl:*``/``c10d::*``
    ``Input Dims`` (the rules of :func:`_resolve`). A call whose op cannot be named is kept with op
    null (unattributed). Rows in call order."""
    if calls is None or not len(calls) or not len(meta):
        return
    cpu = np.flatnonzero(~meta.gpu)
    cpu = cpu[np.lexsort((meta.event_id[cpu], -meta.dur_ns[cpu], meta.ts_ns[cpu]))]  # by start, longer first
    starts, ends, thread = meta.ts_ns[cpu], meta.ts_ns[cpu] + meta.dur_ns[cpu], meta.thread[cpu]
    for k in np.flatnonzero(np.isin(meta.event_id[cpu], calls)).tolist():
        root = meta.row(int(cpu[k]))
        hi = int(np.searchsorted(starts, ends[k], side="right"))  # ops starting within the call
        w = np.arange(k + 1, hi)
        inner = cpu[w[(thread[w] == thread[k]) & (ends[w] <= ends[k])]]
        enclosing = [meta.row(int(i)) for i in inner[::-1]] + [root]  # innermost (latest start) first
        res = _resolve(dict(name=root["name"], gpu=False), enclosing)
        row = _finish_row(run_id, rank, root, res, root["ts_ns"], world_size, pg_config)
        if res["op"] in P2P_OPS:
            _p2p_pair(row, next((r for r in enclosing if str(r.get("name", "")).startswith("c10d::")), root), rank)
        yield row


_PAIR_LOOKAHEAD = 4
_OUT_IN_OPS = ("c10d::alltoall_base", "c10d::_allgather_base", "c10d::_reduce_scatter_base")


def _issuer_payload_dims(issuer: dict) -> list | None:
    """The dims of the tensor a c10d call hands to gloo (its input), as the gloo span records them.

    (output, input) ops carry it second; TensorList ops (allreduce_, send, recv_) nest it in the first.
    """
    dims = issuer.get("input_dims")
    if not isinstance(dims, list) or not dims:
        return None
    if str(issuer.get("name", "")).startswith(_OUT_IN_OPS):
        return dims[1] if len(dims) > 1 and isinstance(dims[1], list) else None
    first = dims[0]
    if isinstance(first, list) and len(first) == 1 and isinstance(first[0], list):
        return first[0]
    return None


def _p2p_peer(issuer: dict, pg_ranks) -> int | None:
    """The peer's global rank of a c10d send/recv: its third input (dst/src group rank)."""
    ci = issuer.get("concrete")
    if not isinstance(ci, list) or len(ci) < 3:
        return None
    try:
        peer = int(str(ci[2]).strip())
    except ValueError:
        return None
    if pg_ranks and 0 <= peer < len(pg_ranks):
        return pg_ranks[peer]
    return peer


def _cpu_issuers(meta, cpu_rows: np.ndarray) -> list[tuple[int, str]]:
    """The CPU calls that issued gloo work, in issue order, as (row, op): record_param_comms with a
    collective name when the trace has them, else the c10d::* ops."""
    by_ts = cpu_rows[np.argsort(meta.ts_ns[cpu_rows], kind="stable")]
    rpc_name = meta.names_where(lambda nm: nm == "record_param_comms")
    rpc = []
    for j in by_ts[rpc_name[by_ts]].tolist():
        op = canonical_op(meta.row(j).get("collective"), trace=True)
        if op:
            rpc.append((j, op))
    if rpc:
        return rpc
    op_of = [canonical_op(nm, trace=True) if nm.startswith("c10d::") else None for nm in meta.names]
    return [(j, op_of[meta.name[j]]) for j in by_ts.tolist() if op_of[meta.name[j]]]


def _finish_row(run_id, rank, sp, res, issue_ts, world_size, pg_config) -> dict:
    op = res["op"]
    pg_name = res.get("pg_name")
    pg_ranks = res.get("pg_ranks")
    # k_source (module docstring of this function's caller; DESIGN "group size"): the most specific
    # evidence first — the call's metadata, its tensors' shapes, its group's recorded membership,
    # the world size last (a guess: a sub-group's call would be counted as the world's)
    k_source = "metadata" if (res.get("group_size") or pg_ranks) else None
    guessed_pg = False
    if not pg_ranks and pg_name is not None and pg_name in pg_config:
        pg_ranks = pg_config[pg_name]
    if pg_name is None:
        pg_name = "0" if "0" in pg_config else "default"
        guessed_pg = True
    group_size = res.get("group_size")
    shape_k = res.get("shape_k")
    if group_size is None and not res.get("pg_ranks") and shape_k:
        group_size, k_source = shape_k, "shapes"
        if pg_ranks and len(pg_ranks) != shape_k:
            pg_ranks = None  # the group named (or guessed) is not the one the tensors describe
    if group_size is None and not pg_ranks and guessed_pg:
        pg_ranks = pg_config.get(pg_name)
        if pg_ranks:  # the default group's membership: exact when every group of the rank has its size
            # (a GPU kernel is never a 1-rank group's: NCCL launches none for one)
            least = 2 if sp.get("gpu") is True else 1
            sizes = {len(v) for v in pg_config.values() if rank in v and len(v) >= least}
            k_source = "membership" if sizes == {len(pg_ranks)} else "world"
    approx = bool(res.get("approx"))
    group_size, k_note = consistent_group_size(group_size, pg_ranks, DECLARED_WORLD.get())
    if k_note is not None:  # a contradiction: the smallest consistent size, flagged
        approx = True
        note_group_size(pg_name, k_note)
    if group_size is None and pg_ranks:
        group_size = len(pg_ranks)
        k_source = k_source or "membership"
    if group_size is None and world_size:
        group_size, k_source = world_size, "world"
        if res.get("all_gather_shard"):
            approx = True
    if not pg_ranks and world_size:
        pg_ranks = list(range(world_size)) if group_size == world_size else None
    size = res.get("size_bytes")
    if res.get("all_gather_shard") and size is not None:
        size = size * group_size if group_size else None
    in_splits, a1 = parse_split_list(res.get("in_splits_raw"))
    out_splits, a2 = parse_split_list(res.get("out_splits_raw"))
    approx = approx or a1 or a2
    my_index = pg_ranks.index(rank) if pg_ranks and rank in pg_ranks else None
    nb = res.get("nbytes")
    wire = wire_bytes_for(op, size, group_size, in_splits if not a1 else None, my_index, nb)
    if op == "all_to_all" and in_splits and a1 and nb:  # truncated splits: the even-split bound
        wire = wire_bytes_for(op, size, group_size, None, None, nb)
    return dict(
        run_id=run_id,
        rank=rank,
        event_id=sp["event_id"],
        pg_name=pg_name,
        pg_ranks=pg_ranks,
        group_size=group_size,
        seq=res.get("seq"),
        op=op,
        dtype=res.get("dtype"),
        size_bytes=size,
        wire_bytes=wire,
        in_splits=in_splits,
        out_splits=out_splits,
        peer=None,
        algo=res.get("algo"),
        proto=res.get("proto"),
        ts_ns=sp["ts_ns"],
        dur_ns=sp["dur_ns"],
        meta_source=res["meta_source"],
        approx=approx,
        issue_ts_ns=issue_ts if issue_ts is not None else sp["ts_ns"],
        k_source=k_source if group_size else None,
    )


# -- group sizes that contradict the world or the group's ranks -----------------------------

import contextvars  # noqa: E402

GROUP_SIZE_NOTES: contextvars.ContextVar = contextvars.ContextVar("tracekit_group_size_notes", default=None)
"""While a rank's collectives are built (tracekit.ingest.assemble.assemble_rank): (pg_name, note)
→ calls, for :func:`consistent_group_size`'s contradictions; None elsewhere (nothing kept)."""
DECLARED_WORLD: contextvars.ContextVar = contextvars.ContextVar("tracekit_declared_world", default=None)
"""While a rank's collectives are built: the world size the trace files declare
(``distributedInfo.world_size``), or None: a world inferred from the files ingested (one rank of
a larger job) bounds no group's size."""


def consistent_group_size(group_size: int | None, pg_ranks, world_size: int | None) -> tuple[int | None, str | None]:
    """A call's group size k checked against what else the trace says: ``(k, None)`` when the
    metadata's ``Group size`` (``group_size``) is absent or agrees with the declared world size
    (``world_size``; None: unknown) and with the
    number of distinct ranks in ``Process Group Ranks`` (``pg_ranks``); else ``(smallest, note)``:
    a group cannot hold more ranks than the world, nor other ranks than it lists, so the smallest
    of the sizes given is the one consistent with all of them, and ``note`` says what disagreed.
    busbw and the wire bytes scale with k ((k-1)/k, 2(k-1)/k: nccl-tests doc/PERFORMANCE.md), so a
    k too large inflates them."""
    if group_size is None:
        return None, None
    problems, sizes = [], [group_size]
    if world_size and group_size > world_size:
        problems.append(f"Group size {group_size} is larger than the world ({world_size} ranks)")
        sizes.append(world_size)
    if pg_ranks:
        n = len(set(pg_ranks))
        if n != group_size:
            problems.append(f"Group size {group_size} disagrees with the {n} rank(s) of Process Group Ranks")
            sizes.append(n)
    if not problems:
        return group_size, None
    k = min(sizes)
    return k, "; ".join(problems) + f": {k} used"


def note_group_size(pg_name, note: str, count: bool = True) -> None:
    """Count one call's note (a contradiction of :func:`consistent_group_size`, a dtype of
    :func:`meta_dtype`) where a rank is being built; ``count`` False: noted, not counted (a note
    made once per pattern of calls, not per call)."""
    notes = GROUP_SIZE_NOTES.get()
    if notes is not None:
        key = (pg_name, note)
        notes[key] = (notes.get(key) or 0) + 1 if count else None


def group_size_warnings(notes: dict) -> list[str]:
    """The rank's warnings for :data:`GROUP_SIZE_NOTES`' contents, one per group and note."""
    return [f"process group {pg}: {note}" + ("" if n is None else f" ({n:,} call(s), marked approx)")
            for (pg, note), n in sorted(notes.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))]


def meta_dtype(dtype: Any, pg_name, sized: bool):
    """A call's ``dtype`` metadata as :func:`dtype_bytes` reads it: a string as is; a list of one
    string (``["Float"]``) its string. A value that is no dtype tracekit knows (a number, an
    object, an unknown name) leaves the call's sizes null; when the call has element counts
    (``sized``) that is noted (a rank warning) rather than silent."""
    if isinstance(dtype, list) and len(dtype) == 1 and isinstance(dtype[0], str):
        dtype = dtype[0]
    if dtype is not None and sized and dtype_bytes(dtype) is None:
        shown = dtype if isinstance(dtype, str) else json.dumps(dtype, default=str)
        note_group_size(pg_name, f"dtype {shown[:40]!r} is not a dtype tracekit knows (a name such as Float, "
                                 "BFloat16): its calls have no message size", count=False)
    return dtype


def group_size_disagreements(tables) -> dict[int, list[str]]:
    """``tables``: (rank, collectives table) of every rank of a run → rank → warnings, one per
    process group whose calls carry different group sizes on different ranks (the instance takes
    the largest: collective_instances), naming each rank's sizes. Ranks that agree get none."""
    sizes: dict = {}  # pg_name → rank → set of group sizes
    for rank, t in tables:
        if t is None or not t.num_rows:
            continue
        for pg, k in set(zip(t.column("pg_name").to_pylist(), t.column("group_size").to_pylist())):
            if pg is not None and k is not None:
                sizes.setdefault(pg, {}).setdefault(rank, set()).add(k)
    out: dict[int, list[str]] = {}
    for pg, by_rank in sorted(sizes.items(), key=lambda kv: str(kv[0])):
        if len(set().union(*by_rank.values())) < 2:
            continue
        said = "; ".join(f"rank {r}: {', '.join(map(str, sorted(ks)))}" for r, ks in sorted(by_rank.items()))
        who = "its calls name" if len(by_rank) == 1 else "its ranks' calls name"
        note = (f"process group {pg}: {who} different group sizes ({said}); each instance takes the largest size "
                "its ranks' calls name, check the trace's Group size")
        for r in by_rank:
            out.setdefault(r, []).append(note)
    return out
