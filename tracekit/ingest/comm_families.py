"""Collective families beyond NCCL/RCCL: one table of who implements a collective, and how to size it.

Inference engines and newer torch run collectives with their own kernels (symmetric-memory
multimem all-reduce, vLLM's custom all-reduce, TensorRT-LLM's fused all-reduce, DeepEP's
dispatch/combine, NVSHMEM, MSCCL++). :data:`FAMILIES` lists them: per family, the kernel-name
patterns that make a kernel communication (with the op the name implies, if any) and the CPU ops
that launch them, each with its canonical op and where its size is. From the table come:

* :data:`KERNEL_PATTERNS`: regexes (searched case-insensitively) that the readers add to the
  comm-by-name rule (:data:`BUILTIN_COMM_PATTERNS`, :func:`compile_comm_patterns`, here);
* :data:`CPU_OP_NAMES`: CPU op names whose metadata rows the reader keeps (beside
  ``record_param_comms`` / ``nccl:*`` / ``c10d::*``), so that a kernel's launch can be linked to them;
* :func:`kernel_op`: the op a family kernel's name implies (``parse_kernel_name`` falls back to it);
* :func:`resolve_family`: op, size and process group of one comm kernel from the family CPU op
  that encloses its launch — the same enclosing-op search as ``record_param_comms``.

Sizing (``size_bytes`` is nccl-tests' S, ../shared/reference/alpha-beta.md, "Bus bandwidth"):
S = ∏ ``Input Dims[buffer]`` × bytes of ``Input type[buffer]``, where ``buffer`` names the tensor
that nccl-tests' S counts for the op: the all-reduce buffer, the all-gather *output* (or the
input shard × group size when only the shard is an input: ``per_rank``), the reduce-scatter
*input*, the all-to-all send buffer, the broadcast buffer. The busbw factor then follows from the
op and the group size (tracekit.model.busbw_factor). Where a buffer only bounds what moved
(symmetric buffers of ``all_to_all_vdev``, whose splits are device tensors), the row is ``approx``.

Process group: the op's group-name argument (``group_arg``, an index into ``Concrete Inputs``)
when the trace recorded it (the Kineto traces read so far record no string arguments, so usually the default
group, as for any collective without a process-group name).

User families: ``tracekit ingest --comm-pattern 'REGEX=OP'`` adds a kernel pattern with its op
(:func:`parse_comm_pattern`); :func:`user_families` makes them active while a run's collectives
are built. A bare ``REGEX`` stays "comm, op unknown".

Sources of the names (facts read from each project's source; see the README section
"Collective families"): PyTorch ``torch/csrc/distributed/c10d/symm_mem/`` (op schemas of the
``symm_mem`` library, CUDASymmetricMemoryOps.cu kernels, nvshmem_extension.cu kernels); vLLM
``csrc/custom_all_reduce.cuh`` and ``csrc/torch_bindings.cpp`` (``_C_custom_ar``), vLLM
``vllm/distributed/parallel_state.py`` (``vllm::all_reduce``...), SGLang ``sgl-kernel`` and
``parallel_state.py``; ROCm quick-reduce (``quickreduce::allreduce_prototype_twoshot``);
TensorRT-LLM ``cpp/tensorrt_llm/kernels/customAllReduceKernels.cu``,
``communicationKernels/allReduceFusionKernels.cu``, ``thop/allreduceOp.cpp`` (``trtllm::allreduce``),
FlashInfer ``include/flashinfer/comm/``; DeepEP ``csrc/kernels/{intranode,internode,internode_ll}.cu``;
NVSHMEM ``*_on_stream_kernel`` collectives; MSCCL++ ``apps/nccl/src/{allreduce,allgather}.hpp``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import re
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from tracekit.errors import BadInputError
from tracekit.model.ops import CANONICAL_OPS, OP_ALIASES


@dataclass(frozen=True)
class CpuOp:
    """A CPU op that runs one collective.

    ``name``: the op's name exactly as Kineto records it. ``op``: canonical op. ``buffer``: index
    into ``Input Dims`` / ``Input type`` of the tensor that sizes S; ``per_rank``: that tensor is
    one rank's shard of an all-gather (S = group size × its bytes). ``group_arg``: index into
    ``Concrete Inputs`` of the process-group name, or None. ``approx``: the buffer only bounds S.
    """

    name: str
    op: str
    buffer: int = 0
    per_rank: bool = False
    group_arg: int | None = None
    approx: bool = False


@dataclass(frozen=True)
class Kernel:
    """Kernel names of a family: ``pattern`` (a regex searched case-insensitively in the kernel's
    name) and the canonical ``op`` the name implies, or None (the launching op decides).
    ``aux``: a helper kernel of a collective (token-count or split exchange, buffer barrier):
    communication, but not the call itself, so its collectives row never takes the op of the
    call that launched it (which the call's payload kernel carries) and stays op-less."""

    pattern: str
    op: str | None
    aux: bool = False


@dataclass(frozen=True)
class Family:
    """One implementation of collectives: its kernels and the CPU ops that launch them."""

    name: str
    kernels: tuple[Kernel, ...]
    cpu_ops: tuple[CpuOp, ...] = ()


def _ar(name: str, buffer: int = 0, group_arg: int | None = None) -> CpuOp:
    return CpuOp(name, "all_reduce", buffer, group_arg=group_arg)


FAMILIES: tuple[Family, ...] = (
    Family(
        "torch symmetric memory (symm_mem, CUDA/multimem)",
        kernels=(
            Kernel(r"multimem_all_reduce_kernel", "all_reduce"),
            Kernel(r"multimem_one_shot_(?:all_)?reduce_kernel", "all_reduce"),  # also symm_mem::multimem_one_shot_reduce_out
            Kernel(r"multimem_all_gather_kernel", "all_gather"),
            Kernel(r"(?:one|two)_shot_all_reduce_kernel", "all_reduce"),
        ),
        cpu_ops=(
            # (input, reduce_op, group_name[, out]) unless noted
            _ar("symm_mem::multimem_all_reduce_", 0, 2),
            _ar("symm_mem::multimem_one_shot_all_reduce", 0, 2),
            _ar("symm_mem::multimem_one_shot_all_reduce_out", 0, 2),
            CpuOp("symm_mem::multimem_one_shot_reduce_out", "reduce", 0, group_arg=3),  # (input, op, root, group, out)
            CpuOp("symm_mem::multimem_all_gather_out", "all_gather", 2, group_arg=1),  # (input, group, out): S = out
            _ar("symm_mem::one_shot_all_reduce", 0, 2),
            _ar("symm_mem::one_shot_all_reduce_out", 0, 2),
            _ar("symm_mem::one_shot_all_reduce_copy", 1, 3),  # (symm_buffer, local_input, op, group)
            _ar("symm_mem::one_shot_all_reduce_copy_out", 1, 3),
            _ar("symm_mem::two_shot_all_reduce_", 0, 2),
            _ar("symm_mem::two_shot_all_reduce_out", 0, 2),
            CpuOp("symm_mem::reduce_scatter_out", "reduce_scatter", 0, group_arg=1),  # (input, group, split_last_dim, out)
        ),
    ),
    Family(
        "vLLM / SGLang custom and quick all-reduce",
        kernels=(
            Kernel(r"cross_device_reduce", "all_reduce"),  # cross_device_reduce_1stage / _2stage (vllm::, aiter::)
            Kernel(r"custom_?all_?reduce", "all_reduce"),
            Kernel(r"quickreduce::allreduce", "all_reduce"),  # allreduce_prototype_twoshot (ROCm quick all-reduce)
        ),
        cpu_ops=(
            _ar("_C_custom_ar::all_reduce", 1),  # (fa, inp, out, reg_buffer, reg_buffer_sz_bytes)
            _ar("_C_custom_ar::qr_all_reduce", 1),  # (fa, inp, out, quant_level, cast_bf2half)
            _ar("sgl_kernel::all_reduce", 1),  # (fa, inp, out[, reg_buffer, reg_sz])
            _ar("vllm::all_reduce", 0, 1),  # (tensor, group_name)
            _ar("vllm::inplace_all_reduce", 0, 1),
            _ar("vllm::outplace_all_reduce", 0, 1),
            CpuOp("vllm::all_gather", "all_gather", 0, per_rank=True, group_arg=3),  # (tensor, dim, world_size, group)
            CpuOp("vllm::reduce_scatter", "reduce_scatter", 0, group_arg=3),
            _ar("sglang::inplace_all_reduce", 0, 1),
            _ar("sglang::outplace_all_reduce", 0, 1),
            CpuOp("sglang::reg_all_gather_into_tensor", "all_gather", 0, group_arg=2),  # (output, input, group)
        ),
    ),
    Family(
        "TensorRT-LLM / FlashInfer all-reduce",
        kernels=(
            Kernel(r"allreduce_fusion_kernel", "all_reduce"),  # _oneshot_lamport, _twoshot_sync, moe… variants
            Kernel(r"(?:one|two)_?shot_?all_?reduce", "all_reduce"),  # oneShotAllReduceKernel, twoshotAllreduceKernel…
            Kernel(r"lamport\w*all_?reduce|all_?reduce\w*lamport", "all_reduce"),
        ),
        cpu_ops=(_ar("trtllm::allreduce", 0),),  # (input, workspace, …)
    ),
    Family(
        "DeepEP dispatch / combine",
        kernels=(
            Kernel(r"deep_ep::(?:intranode|internode|internode_ll)::(?:dispatch|combine)\b", "all_to_all"),
            # the token-count exchange and buffer barriers around them: communication, no payload op
            Kernel(r"deep_ep::(?:intranode|internode|internode_ll)::"
                   r"(?:notify_dispatch|cached_notify_dispatch|cached_notify_combine|cached_notify|"
                   r"notify_combine|clean_low_latency_buffer)\b", None, aux=True),
        ),
    ),
    Family(
        "NVSHMEM (library collectives, torch symm_mem NVSHMEM backend)",
        kernels=(
            Kernel(r"alltoall\w*_on_stream_kernel", "all_to_all"),
            Kernel(r"fcollect\w*_on_stream_kernel", "all_gather"),
            Kernel(r"(?:broadcast|bcast)\w*_on_stream_kernel", "broadcast"),
            Kernel(r"reduce_?scatter\w*_on_stream_kernel", "reduce_scatter"),
            Kernel(r"(?:rdxn|reduce)\w*_on_stream_kernel", "all_reduce"),
            Kernel(r"(?:barrier|sync)(?:_all)?_on_stream_kernel", "barrier"),
            Kernel(r"\ballToAllV(?:_2d)?\b", "all_to_all"),  # torch symm_mem all_to_all_vdev(_2d)
            Kernel(r"\bexchangeSplitAndOffset(?:_2d)?\b", None, aux=True),  # the splits, before allToAllV
        ),
        cpu_ops=(
            CpuOp("symm_mem::nvshmem_all_to_all", "all_to_all", 0, group_arg=2),  # (input, out, group)
            CpuOp("symm_mem::all_to_all_vdev", "all_to_all", 0, group_arg=3, approx=True),
            CpuOp("symm_mem::all_to_all_vdev_2d", "all_to_all", 0, group_arg=4, approx=True),
            CpuOp("symm_mem::all_to_all_vdev_2d_offset", "all_to_all", 0, group_arg=4, approx=True),
            CpuOp("symm_mem::nvshmem_broadcast", "broadcast", 0, group_arg=1),  # (input, group)
        ),
    ),
    Family(
        "MSCCL++",
        kernels=(
            Kernel(r"(?:^|[\s:])allreduce(?:\d+|AllPairs|AllToAll|Nvls\w*|Packet\w*)\s*<", "all_reduce"),
            Kernel(r"(?:^|[\s:])allgather\d+\s*<", "all_gather"),
            Kernel(r"msccl", None),  # mscclpp::executionKernel and MSCCL kernels: the plan decides the op
        ),
    ),
)
"""The recognised collective families (README, "Collective families")."""

KERNEL_PATTERNS: tuple[str, ...] = tuple(k.pattern for f in FAMILIES for k in f.kernels)
"""Every family kernel pattern, for the comm-by-name rule."""

CPU_OP_NAMES: tuple[str, ...] = tuple(dict.fromkeys(c.name for f in FAMILIES for c in f.cpu_ops))
"""Every family CPU op name, for the reader's metadata rows."""

_STANDARD_CPU = ("record_param_comms", "nccl:", "rccl:", "c10d::", "gloo:")
"""Ops whose metadata the standard attribution reads: an enclosing one inside a family op wins."""

_CPU_BY_NAME: dict[str, CpuOp] = {c.name: c for f in FAMILIES for c in f.cpu_ops}

_user: contextvars.ContextVar[tuple[Kernel, ...]] = contextvars.ContextVar("tracekit_user_families", default=())


def parse_comm_pattern(text: str) -> Kernel:
    """``--comm-pattern`` text → a :class:`Kernel`: ``'REGEX=OP'`` names the op (any spelling of a
    canonical op: ``all_gather``, ``allgather``...), a bare ``'REGEX'`` leaves it unknown.

    A text whose part after the last ``=`` is a plain word is taken as ``REGEX=OP``; a regex that
    must end in ``=word`` can be written ``...=(?:word)``.
    Raises BadInputError for an invalid regex or an unknown op.
    """
    m = re.fullmatch(r"(.+)=([A-Za-z][A-Za-z_ -]*)", text, re.S)
    pattern, op = (m.group(1), _canon(m.group(2), text)) if m else (text, None)
    try:
        re.compile(pattern)
    except re.error as exc:
        raise BadInputError(f"--comm-pattern {text!r} is not a valid regular expression ({exc})") from None
    return Kernel(pattern, op)


def _canon(word: str, text: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", word.lower())
    op = OP_ALIASES.get(key)
    if op is None or key in ("sendrecv", "p2p"):
        raise BadInputError(f"--comm-pattern {text!r}: unknown op {word!r} (expected one of {', '.join(CANONICAL_OPS)})")
    return op


@contextlib.contextmanager
def user_families(kernels: Sequence[Kernel]) -> Iterator[None]:
    """Makes the user's ``--comm-pattern`` kernels active (checked before the built-in families)
    while the block runs (a context variable: one ingest's patterns never leak into another's)."""
    token = _user.set(tuple(kernels))
    try:
        yield
    finally:
        _user.reset(token)


@functools.lru_cache(maxsize=64)
def _user_matcher(pattern: str):
    """A user's pattern compiled as the comm-by-name rule compiles it (RE2, or refused when it could
    take exponential time: :func:`compile_comm_patterns`)."""
    return compile_comm_patterns([pattern])


@functools.lru_cache(maxsize=8192)
def _match(name: str, user: tuple[Kernel, ...]) -> Kernel | None:
    for k in user:
        if _user_matcher(k.pattern).search(name):
            return k
    for f in FAMILIES:
        for k in f.kernels:
            if re.search(k.pattern, name, re.I):
                return k
    return None


def family_kernel(name: str, user: bool = True) -> Kernel | None:
    """The :class:`Kernel` entry naming a kernel: the user's active ``--comm-pattern`` kernels
    first (unless ``user`` is False), then :data:`FAMILIES`; None if no family names it."""
    return _match(name or "", _user.get() if user else ())


def kernel_op(name: str, user: bool = True) -> tuple[bool, str | None]:
    """(matched, op) for a kernel name: whether a family names it (see :func:`family_kernel`) and
    the op its name implies (None when the launching op must say, or for a helper kernel)."""
    k = family_kernel(name, user)
    return (False, None) if k is None else (True, k.op)


def _numel(dims: Any) -> int | None:
    if not isinstance(dims, list) or not dims or not all(type(x) is int and x >= 0 for x in dims):
        return None
    n = math.prod(dims)
    return n if n <= 2**62 else None


def _at(values: Any, i: int) -> Any:
    return values[i] if isinstance(values, list) and 0 <= i < len(values) else None


def resolve_family(kernel_name: str, enclosing: Sequence[dict], dtype_bytes) -> dict | None:
    """Op, size and group of one comm kernel from the collective families, or None if none applies.

    ``enclosing``: the metadata rows of the CPU ops enclosing the kernel's launch, innermost first
    (``name``, ``input_dims``, ``input_type``, ``concrete``). ``dtype_bytes``: dtype text → bytes
    per element, or None. A family applies when the kernel's name matches a family pattern, or when
    a family CPU op encloses its launch with no ``record_param_comms`` / ``nccl:*`` / ``c10d::*``
    op inside it (those carry the standard metadata and win; None is returned for them, and for a
    name that implies no op when no family op encloses it). A helper kernel (``Kernel.aux``) gets
    an op-less ``name_only`` row whatever encloses it.

    Returns a partial collectives row: ``op`` (the CPU op's, else the name's), ``meta_source``
    ``cpu_op_dims`` with ``dtype``, ``size_bytes`` (nccl-tests S, bytes; None if the dims or the
    dtype are unreadable), ``nbytes``, ``pg_name`` (from the op's group argument when recorded),
    ``all_gather_shard`` (S is one rank's shard: _finish_row multiplies by the group size) and
    ``approx``; or ``meta_source`` ``name_only`` and no size when no family op encloses it.
    """
    k = family_kernel(kernel_name)
    op = None if k is None else k.op
    aux = k is not None and k.aux
    cpu = row = None
    for r in () if aux else enclosing:
        name = r.get("name", "")
        c = _CPU_BY_NAME.get(name)
        if c is not None:
            cpu, row = c, r
            break
        if name.startswith(_STANDARD_CPU):
            break
    if cpu is None:
        if (op is None and not aux) or any(str(r.get("name", "")).startswith(_STANDARD_CPU) for r in enclosing):
            return None  # the standard attribution decides (metadata, then the kernel name)
        return dict(op=op, algo=None, proto=None, approx=False, meta_source="name_only", dtype=None,
                    size_bytes=None, group_size=None, pg_name=None, pg_ranks=None, seq=None,
                    in_splits_raw=None, out_splits_raw=None, nbytes=None)
    dt = _at(row.get("input_type"), cpu.buffer)
    nb = dtype_bytes(dt)
    nel = _numel(_at(row.get("input_dims"), cpu.buffer))
    group = _at(row.get("concrete"), cpu.group_arg) if cpu.group_arg is not None else None
    group = str(group).strip().strip("'\"") if group is not None else ""
    return dict(
        op=cpu.op, algo=None, proto=None, approx=cpu.approx, meta_source="cpu_op_dims",
        dtype=str(dt) if dt else None,
        size_bytes=None if nb is None or nel is None else nel * nb,
        group_size=None, pg_name=group or None, pg_ranks=None, seq=None,
        in_splits_raw=None, out_splits_raw=None, nbytes=nb, all_gather_shard=cpu.per_rank,
    )



# -- the comm-by-name rule (DESIGN.md "Classifying events"; metadata decides first) ------------------
# Beyond NCCL/RCCL/gloo, the collective families' kernels (FAMILIES above: symmetric memory, custom
# all-reduce, TensorRT-LLM, DeepEP, NVSHMEM, MSCCL++) and the CPU ops that launch them.
BUILTIN_COMM_PATTERNS = (r"nccl", r"rccl", r"^gloo:") + KERNEL_PATTERNS
# + the process-group ranges a job may put around its gloo calls (tracekit.ingest.pg_attribution):
# CPU ops whose metadata rows the readers keep
COMM_CPU_PREFIX = ("nccl:", "c10d::", "gloo:", "record_param_comms", "rccl:", "tracekit.process_group:") + CPU_OP_NAMES

try:  # RE2: linear-time matching, so no --comm-pattern can make the ingest hang (a core dependency)
    import re2
except ImportError:  # pragma: no cover - tested by setting re2 to None
    re2 = None

_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


def _slow_regex_reason(tree) -> str | None:
    """Why Python's backtracking ``re`` could take exponential time on this parsed pattern
    (``re._parser`` tree), or None: a backreference, or a repeat whose body holds another repeat
    or an alternation (``(a+)+``, ``(a|aa)*``). A bounded walk over the pattern, not the input."""
    def walk(items, in_repeat: bool) -> str | None:
        for op, av in items:
            name = str(op)
            if name in ("GROUPREF", "GROUPREF_EXISTS"):
                return "a backreference"
            if name in _REPEATS:
                if in_repeat:
                    return "a nested quantifier"
                got = walk(av[2], True)
            elif name == "BRANCH":
                if in_repeat:
                    return "a nested quantifier over an alternation"
                got = next((r for b in av[1] if (r := walk(b, in_repeat))), None)
            elif name in ("SUBPATTERN", "ATOMIC_GROUP"):
                got = walk(av[-1], in_repeat)
            elif name in ("ASSERT", "ASSERT_NOT"):
                got = walk(av[1], in_repeat)
            else:
                got = None
            if got:
                return got
        return None

    return walk(tree, False)


def compile_comm_patterns(patterns) -> Any:
    """One case-insensitive matcher (``.search(name)``) for communication kernel names: the
    union of ``patterns`` (the builtin ones and the user's ``--comm-pattern``).

    With ``google-re2`` (a core dependency) the union runs in RE2 only, in linear time whatever the
    pattern; a pattern RE2 cannot compile (a lookaround, a backreference) is refused with RE2's
    reason. Only where RE2 is not installed does Python's ``re`` run it, after a bounded check:
    patterns with a backreference or a nested quantifier are refused.
    Raises BadInputError naming the pattern (invalid, or refused).
    """
    import re._parser as sre_parse

    trees = []
    for p in patterns:
        try:
            trees.append(sre_parse.parse(p, re.I))
        except (re.error, OverflowError, RecursionError) as exc:
            raise BadInputError(f"--comm-pattern {p!r} is not a valid regular expression ({exc})") from None
    joined = "|".join(f"(?:{p})" for p in patterns)
    if re2 is not None:
        opts = re2.Options()
        opts.log_errors = False
        try:
            return re2.compile("(?i)" + joined, opts)
        except re2.error:
            for p in patterns:  # which one, and why
                try:
                    re2.compile("(?i)" + p, opts)
                except re2.error as exc:
                    why = exc.args[0] if exc.args else exc
                    why = why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
                    raise BadInputError(f"--comm-pattern {p!r}: RE2 (linear-time matching) cannot compile it "
                                        f"({' '.join(why.split())[:120]}); lookarounds and backreferences "
                                        "are not supported") from None
            raise BadInputError("--comm-pattern: RE2 cannot compile the patterns together") from None
    for p, tree in zip(patterns, trees):
        why = _slow_regex_reason(tree)
        if why:
            raise BadInputError(f"--comm-pattern {p!r} has {why}, which can make matching take exponential time "
                                "(install google-re2, or simplify the pattern)")
    return re.compile(joined, re.I)


_COMPUTE_PROBES = ("sm90_xmma_gemm_bf16bf16_bf16f32", "aten::mm", "cudaLaunchKernel",
                   "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
                   "Memcpy HtoD (Pageable -> Device)", "ProfilerStep#3", "cudaStreamSynchronize")
"""Names of compute kernels, CPU ops and runtime calls that no --comm-pattern should match."""


def check_user_patterns(patterns) -> Any:
    """The user's ``--comm-pattern`` regexes compiled (:func:`compile_comm_patterns`), each first
    checked on its own: one that matches the empty string, or every name of
    :data:`_COMPUTE_PROBES` (a GEMM, an elementwise kernel, aten::mm, a runtime call...), would
    make every event communication, and is refused. Raises BadInputError naming the pattern."""
    patterns = list(patterns)
    for p in patterns:
        m = compile_comm_patterns([p])
        if m.search("") is not None:
            raise BadInputError(f"--comm-pattern {p!r} matches the empty string, so every event name: "
                                "give a pattern that names the communication kernels")
        if all(m.search(n) is not None for n in _COMPUTE_PROBES):
            raise BadInputError(f"--comm-pattern {p!r} matches every name (a GEMM, aten::mm, cudaLaunchKernel "
                                "alike): give a pattern that names the communication kernels")
    return compile_comm_patterns(patterns) if patterns else None


__all__ = ["FAMILIES", "KERNEL_PATTERNS", "CPU_OP_NAMES", "BUILTIN_COMM_PATTERNS", "COMM_CPU_PREFIX", "compile_comm_patterns", "check_user_patterns", "CpuOp", "Kernel", "Family", "family_kernel", "kernel_op",
           "parse_comm_pattern", "resolve_family", "user_families"]
