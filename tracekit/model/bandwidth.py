"""nccl-tests bandwidth conventions: algbw, busbw and the bus-bandwidth factor.

``algbw = S / t`` and ``busbw = algbw × factor`` with S the nccl-tests size
(the all-reduce buffer, the all-gather output, the reduce-scatter input), t the
time and GB = 1e9 (reference, "Bus bandwidth"; NVIDIA nccl-tests
doc/PERFORMANCE.md). The factor depends on the group size n of the process
group the collective ran on, never the world size.

These are plain scalar functions of floats and strings so that SQL analyses
can register them as DuckDB Python UDFs.
"""

from __future__ import annotations

import math

from tracekit.errors import BadInputError
from tracekit.model.ops import canonical_op

__all__ = ["busbw_factor", "algbw", "busbw"]

_GB = 1e9


def _group_size(n: float) -> int:
    try:
        f = float(n)
    except (TypeError, ValueError):
        raise BadInputError(f"bad group size {n!r}: expected an integer >= 1") from None
    if not math.isfinite(f) or f != int(f) or f < 1:
        raise BadInputError(f"bad group size {n!r}: expected an integer >= 1")
    return int(f)


def busbw_factor(op: str, n: float) -> float:
    """Bus-bandwidth factor of ``op`` on a group of ``n`` ranks (nccl-tests).

    all_reduce: 2(n−1)/n; all_gather, reduce_scatter, all_to_all, gather,
    scatter: (n−1)/n; broadcast, reduce, send, recv: 1.
    ``op`` may be any spelling :func:`canonical_op` accepts.
    Returns a unitless float. Raises BadInputError for an unknown op, for
    barrier (no payload), or for n not an integer >= 1.
    """
    canon = canonical_op(op)
    k = _group_size(n)
    if canon == "all_reduce":
        return 2.0 * (k - 1) / k
    if canon in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (k - 1) / k
    if canon in ("broadcast", "reduce", "send", "recv"):
        return 1.0
    raise BadInputError(f"{op!r} moves no payload, so it has no bus bandwidth")


def algbw(size_bytes: float, seconds: float) -> float | None:
    """Algorithm bandwidth S/t in GB/s (GB = 1e9), as nccl-tests prints it.

    size_bytes: S, bytes (>= 0); seconds: t (>= 0).
    Returns GB/s, or None when t = 0 (undefined; NULL in SQL).
    Raises BadInputError for negative or non-finite inputs.
    """
    s = float(size_bytes)
    t = float(seconds)
    if not math.isfinite(s) or s < 0:
        raise BadInputError(f"bad size {size_bytes!r}: expected a finite number of bytes >= 0")
    if not math.isfinite(t) or t < 0:
        raise BadInputError(f"bad time {seconds!r}: expected a finite number of seconds >= 0")
    if t == 0:
        return None
    return s / t / _GB


def busbw(op: str, size_bytes: float, seconds: float, n: float) -> float | None:
    """Bus bandwidth algbw × busbw_factor(op, n) in GB/s (nccl-tests convention).

    Comparable with a link's β; in-switch and hierarchical algorithms can
    legitimately exceed it (flag, don't clip). Returns None when t = 0.
    Raises BadInputError as :func:`algbw` and :func:`busbw_factor` do.
    """
    factor = busbw_factor(op, n)
    bw = algbw(size_bytes, seconds)
    return None if bw is None else bw * factor
