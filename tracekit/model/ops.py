"""Canonical collective names, shared by the predictor, the fitter and busbw.

The canonical names are the store's (DESIGN.md, ``collectives.op``):
all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce,
gather, scatter, send, recv, barrier.
"""

from __future__ import annotations

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


def canonical_op(name: str) -> str:
    """The canonical op for ``name``: ``'allreduce'``, ``'AllReduce'``, ``'all_reduce_perf'`` → ``'all_reduce'``.

    Case, ``-``/``_``/space separators and an nccl-tests ``_perf`` suffix are
    ignored; nccl-tests' ``sendrecv`` counts as ``send`` (each rank sends S).
    Raises BadInputError for a name that is not a collective.
    """
    raw = str(name)
    key = raw.strip().lower()
    if key.endswith("_perf"):
        key = key[: -len("_perf")]
    key = key.replace("_", "").replace("-", "").replace(" ", "")
    op = OP_ALIASES.get(key)
    if op is None:
        raise BadInputError(f"unknown collective {raw!r}: expected one of {', '.join(CANONICAL_OPS)}")
    return op
