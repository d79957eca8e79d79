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

__all__ = ["busbw_factor", "algbw", "algbw_array", "busbw", "size_bucket", "size_bucket_label", "SIZE_BUCKET_SQL"]

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


def algbw_array(size_bytes, seconds):
    """:func:`algbw` over arrays: float64 GB/s, NaN where :func:`algbw` answers None (t = 0) or
    refuses (a negative or non-finite size or time; NaN in, NaN out). The same operations in the
    same order, element by element (S / t / 1e9), so the same floats; a valid answer is never NaN.
    For the SQL UDFs over whole columns (tests/analyses/test_udfs.py checks it against :func:`algbw`)."""
    import numpy as np

    s = np.asarray(size_bytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    ok = np.isfinite(s) & (s >= 0) & np.isfinite(t) & (t > 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(ok, s / t / _GB, np.nan)


def busbw(op: str, size_bytes: float, seconds: float, n: float) -> float | None:
    """Bus bandwidth algbw × busbw_factor(op, n) in GB/s (nccl-tests convention).

    Comparable with a link's β; in-switch and hierarchical algorithms can
    legitimately exceed it (flag, don't clip). Returns None when t = 0.
    Raises BadInputError as :func:`algbw` and :func:`busbw_factor` do.
    """
    factor = busbw_factor(op, n)
    bw = algbw(size_bytes, seconds)
    return None if bw is None else bw * factor


# -- size buckets ------------------------------------------------------------------


def size_bucket(size_bytes: int | None) -> int | None:
    """The power-of-two size bucket of a message: the largest 2^k <= ``size_bytes``, in bytes.

    nccl-tests steps its sizes by powers of two (``-f 2``, the default ``-b 8 -e 128M``), so a bucket
    ``[2^k, 2^(k+1))`` holds exactly one nccl-tests size and every trace size falls in one of them;
    per-op statistics (medians of sync time and busbw) are taken per bucket, never across sizes.
    ``size_bucket(131072)`` → 131072, ``size_bucket(200_000)`` → 131072; 0 or a negative size → 0
    (its own bucket); None → None. The SQL analyses use :data:`SIZE_BUCKET_SQL`, the same rule
    (``tk_size_bucket``; tests/analyses/test_size_buckets.py checks that they agree).
    """
    if size_bytes is None:
        return None
    n = int(size_bytes)
    return 0 if n <= 0 else 1 << (n.bit_length() - 1)


def size_bucket_label(lo_bytes: int | None) -> str:
    """A bucket's range with binary prefixes, hi exclusive: 131072 → ``'128 KiB–256 KiB'``; 0 → ``'0 B'``;
    None → ``'unknown'``."""
    if lo_bytes is None:
        return "unknown"
    if lo_bytes <= 0:
        return "0 B"
    return f"{_binary(lo_bytes)}–{_binary(2 * lo_bytes)}"


def _binary(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:g} {unit}"
    return f"{n} B"


SIZE_BUCKET_SQL = """
CREATE OR REPLACE TEMP MACRO tk_size_bucket(s) AS (CASE
    WHEN s IS NULL THEN NULL
    WHEN s <= 0 THEN 0
    WHEN (1::HUGEINT << floor(log2(s))::BIGINT) > s THEN 1::HUGEINT << (floor(log2(s))::BIGINT - 1)
    WHEN (1::HUGEINT << (floor(log2(s))::BIGINT + 1)) <= s THEN 1::HUGEINT << (floor(log2(s))::BIGINT + 1)
    ELSE 1::HUGEINT << floor(log2(s))::BIGINT END)::BIGINT
"""
"""DuckDB macro ``tk_size_bucket(size_bytes) → BIGINT``: :func:`size_bucket` in SQL (log2 in floating
point, corrected by one where rounding near 2^k put it on the wrong side)."""
