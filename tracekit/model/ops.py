"""Canonical collective names, shared by the predictor, the fitter and busbw.

The canonical names are the store's (DESIGN.md, ``collectives.op``):
all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce,
gather, scatter, send, recv, barrier.
"""

from __future__ import annotations

import re

from tracekit.errors import BadInputError

__all__ = ["CANONICAL_OPS", "OP_ALIASES", "canonical_op"]

CANONICAL_OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "barrier",
)

# Spellings seen in nccl-tests binaries, torch.distributed and NCCL, with the
# separators removed, mapped to the canonical name (the trace reader uses it too).
OP_ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "allgatherintotensor": "all_gather",
    "reducescatter": "reduce_scatter",
    "reducescattertensor": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
    "alltoallsingle": "all_to_all",
    "broadcast": "broadcast",
    "bcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
    "sendrecv": "send",
    "p2p": "send",
    "barrier": "barrier",
}


# Traces: a SendRecv kernel or a p2p group implements other collectives (the launching op decides).
_TRACE_ALIASES = {k: v for k, v in OP_ALIASES.items() if k not in ("sendrecv", "p2p")} | {"recvanysource": "recv"}
_PREFIXES = ("nccl", "rccl", "c10d", "gloo", "msccl")
_SUFFIXES = ("coalesced", "intotensor", "tensor", "base", "single", "perf")
_TRACE_CACHE: dict = {}


def _key(name) -> str:
    """``name`` lower-cased without separators, one backend prefix and any of the suffixes."""
    s = re.sub(r"[^a-z0-9]", "", str(name).lower())
    for p in _PREFIXES:
        if s.startswith(p):
            s = s[len(p):]
            break
    changed = True
    while changed:
        changed = False
        for suf in _SUFFIXES:
            if s.endswith(suf) and len(s) > len(suf):
                s = s[: -len(suf)]
                changed = True
    return s


def canonical_op(name, *, trace: bool = False) -> str | None:
    """The canonical op for a collective's name in any spelling.

    Case, separators, one backend prefix (``nccl``, ``rccl``, ``c10d``, ``gloo``, ``msccl``)
    and the suffixes ``coalesced``, ``into_tensor``, ``tensor``, ``base``, ``single`` and
    nccl-tests' ``_perf`` are ignored: ``'AllReduce'``, ``'all_reduce_perf'`` → ``'all_reduce'``;
    ``nccl:_all_gather_base``, ``allgather_into_tensor_coalesced`` → ``'all_gather'``;
    ``c10d::alltoall_base_`` → ``'all_to_all'``.

    ``trace=False`` (names a user or nccl-tests gives): ``sendrecv`` counts as ``send`` (each
    rank sends S); raises BadInputError for a name that is not a collective.
    ``trace=True`` (names in traces): SendRecv/Generic kernels and p2p give None (the launching
    op decides), ``recv_any_source`` is ``recv``, and any unknown or empty name gives None.
    """
    if trace:
        if not name:
            return None
        try:
            got = _TRACE_CACHE.get(name, _TRACE_CACHE)
        except TypeError:  # unhashable
            return _TRACE_ALIASES.get(_key(name))
        if got is _TRACE_CACHE:
            if len(_TRACE_CACHE) > 65536:
                _TRACE_CACHE.clear()
            got = _TRACE_CACHE[name] = _TRACE_ALIASES.get(_key(name))
        return got
    op = OP_ALIASES.get(_key(name))
    if op is None:
        raise BadInputError(f"unknown collective {str(name)!r}: expected one of {', '.join(CANONICAL_OPS)}")
    return op
