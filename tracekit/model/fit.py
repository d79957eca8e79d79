"""Fitting α and β of a link from measured collective times.

Given samples (bytes n_i, seconds t_i) of one collective on one group size,
fit the line t = a + b·n, then read α and β off the algorithm's
coefficients: with T = A·α + B·D/β (:func:`tracekit.model.collectives.algorithm_coefficients`),
α = a/A and β = B/b; e.g. ring all-reduce on k ranks has a = 2(k−1)·α and
b = 2(k−1)/(k·β). n½ = α·β. (Reference, "Fitting α and β from measurements".)

The fit weights relative error: it minimises Σ((t_i − a − b·n_i)/t_i)²
(weighted least squares with weights 1/t_i²), so that 1 KB messages count as
much as 1 GB ones. A plain least-squares fit over 1 KB–1 GB is dominated by
the largest messages and gets α badly wrong; :func:`fit_unweighted` is kept
for that comparison.

Samples excluded, each with its reason:
- ``warmup``: the first sample (the first call on a communicator can include
  connection setup and be 10⁴× slower) when ``warmup_first``;
- ``empty``: zero-byte samples when ``drop_empty`` (NCCL returns almost at
  once for a count of 0, so such a call measures launch overhead, not α:
  in the superbench nccl-tests all_to_all log a 0 B call takes 1.3 µs and a
  32 B one 89 µs);
- ``outlier``: points the robust rule flags. After each fit, with r_i the
  relative residuals (t_i − a − b·n_i)/t_i of the kept points, med their
  median and σ = 1.4826·MAD (the normal-consistent median absolute
  deviation), a sample is an outlier when |r_i − med| > max(k·σ, floor)
  (k = ``outlier_k`` = 5, floor = ``outlier_floor`` = 2 % so that noiseless
  data is not trimmed to nothing). The rule is re-applied to every
  non-warm-up, non-empty sample against the new fit (so a point can come
  back) until the kept set stops changing, at most 20 rounds.

β from the large sizes, α from the small ones. Real NCCL curves bend: protocol and chunking
switches make the time per byte fall slowly up to the plateau, so one line over every size puts
its slope between the two regimes and β lands below the large-message busbw plateau, often outside
its own interval. So, after the robust fit over all sizes, the bound is the larger of
``BETA_RANGE_CROSSOVERS`` × D* (D* = a/b of the current fit) and the start of the plateau (the
smallest size from which every per-size median n/t stays >= ``PLATEAU_WITHIN`` × the best); when
the kept samples hold >= ``BETA_RANGE_MIN_SIZES`` = 2 distinct sizes at or above it and >= 2 below,
the bandwidth term b is the slope of the relative weighted line through the samples >= the bound
alone (its intercept is discarded: the α term is <= 1/5 of the time there), and a is the relative
weighted mean of t − b·n over the samples below it (b fixed; a < 0 is clamped to 0); D* is
recomputed and the split repeated until the β range stops changing (at most 5 rounds). se(b) and
β's interval come from the large-size regression alone, se(a) and α's from the small-size one (s²
over m − 1 degrees of freedom, se(a)² = s²/Σ(1/t²); b's uncertainty is not propagated into a).
``beta_range_bytes`` / ``alpha_range_bytes`` report the two size ranges (both the whole range when
the split does not apply; ``split`` says which).

If the weighted fit's intercept comes out negative (α < 0 is not a link),
it is refitted through the origin (a = 0, b = Σ(n/t)/Σ((n/t)²)) and
``intercept_clamped`` is set.

How good the fit is: with the regression written as 1 ≈ a·(1/t) +
b·(n/t) over the m kept samples, the residual variance s² = Σr²/(m − p) (p = 2
fitted parameters, 1 when clamped) and cov(a, b) = s²·(XᵀX)⁻¹ give the
standard errors of a and b (ordinary least-squares theory on the weighted
problem, e.g. Draper & Smith, "Applied Regression Analysis", 3rd ed., ch. 9);
se(α) = se(a)/A and, by the delta method, se(β) = B·se(b)/b². The 95 %
intervals are a ± t·se(a), b ± t·se(b) mapped through α = a/A, β = B/b
(t the Student quantile for m − p degrees of freedom; β's upper end is None
when b − t·se(b) <= 0). The fit's own crossover size is D* = a/b (= A·α·β/B,
where its α and β terms are equal).

Many fits at once: :func:`fit_alpha_beta_many` (the analyses fit every process group in one call);
:func:`fit_alpha_beta` is it on one problem, so a fit is the same to the last bit alone or in any
batch (the batch shares the elementwise work and the sorts; each problem's sums, lstsq and
standard errors run on its own arrays).

``status`` (:func:`judge_fit`):
- ``insufficient`` — fewer than ``MIN_SIZES`` = 3 distinct sizes kept, or the
  kept sizes do not span the fit's D* (none below it: the α term was never
  measured; none above: the β term was not), or a parameter is not determined
  (α's 95 % interval reaches 0, or β's is unbounded: e.g. 3 sizes, 1 degree
  of freedom);
- ``poor`` — size_spread above ``MAX_SPREAD`` = 15 %: the RMS relative
  residual of the per-size medians of the kept samples, (m_s − a − b·s)/m_s
  (a line cannot describe the sizes: e.g. NCCL switching protocol or
  algorithm with size, or a link whose β changes part-way). Judged on the
  medians, not on single samples, so that noise which repeated calls average
  out (a busy CPU host's gloo timings scatter by ±40 % per call) does not
  hide a good line, while a misfit that every call of a size shares does
  show; residual_spread (per sample) is reported beside it; or more than
  ``MAX_OUTLIER_FRACTION`` = 25 % of the candidate samples dropped as outliers;
- ``ok`` otherwise. Only ``ok`` fits may be used as a reference for verdicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tracekit.errors import BadInputError
from tracekit.model.collectives import algorithm_coefficients, _check_model_op, _check_algo
from tracekit.model.links import Link, custom_link

__all__ = ["AlphaBetaFit", "fit_alpha_beta", "fit_alpha_beta_many", "fit_unweighted", "judge_fit", "MIN_SIZES", "MAX_SPREAD",
           "MAX_OUTLIER_FRACTION"]

_MAD_TO_SIGMA = 1.4826

MIN_SIZES = 3
"""Distinct sizes an ``ok`` fit needs (two points always fit a line exactly)."""
MAX_SPREAD = 0.15
"""Largest RMS relative residual of the per-size medians of an ``ok`` fit (±5 % noise: about 3 %)."""
MAX_OUTLIER_FRACTION = 0.25
"""Largest fraction of candidate samples an ``ok`` fit may drop as outliers."""
BETA_RANGE_CROSSOVERS = 4
"""β is fitted on the sizes >= this many crossovers D* (there the α term is <= 1/(1+4) = 20 % of the
time on the fitted line) that are also on the plateau, α on the sizes below (module docstring)."""
BETA_RANGE_MIN_SIZES = 2
"""Distinct sizes the β range needs for the two-range estimate (two sizes, each measured more than once
in nccl-tests' out-of-place and in-place columns, leave the slope a degree of freedom)."""
PLATEAU_WITHIN = 0.9
"""The plateau of a sweep: the largest sizes from which every per-size median rate n/t (∝ busbw) stays
>= this fraction of the best one. nccl-tests' busbw at the largest sizes of a healthy run moves by a
few percent from size to size; 10 % keeps the flat top and leaves out the ramp."""


_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
"""Student's t 97.5 % quantiles for 1…30 degrees of freedom (the standard table, e.g. NIST/SEMATECH
e-Handbook of Statistical Methods, 1.3.6.7.2)."""


def _t975(dof: int) -> float | None:
    """Student's t 97.5 % quantile for ``dof`` degrees of freedom (two-sided 95 %); None for dof < 1.

    The table :data:`_T975` up to 30; beyond, the Cornish–Fisher expansion around z = 1.959964 to
    the 1/ν³ term (Abramowitz & Stegun 26.7.5; error < 1e-4 for ν > 30).
    """
    if dof < 1:
        return None
    if dof <= len(_T975):
        return _T975[dof - 1]
    z = 1.959963984540054
    v = float(dof)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / v + g2 / v**2 + g3 / v**3


@dataclass(frozen=True)
class AlphaBetaFit:
    """α, β and n½ fitted from (bytes, seconds) samples of one collective.

    a_s, b_s_per_byte: the fitted line t = a + b·bytes (seconds, seconds/byte);
    alpha_s = a/A, beta_Bps = B/b, n_half_bytes = α·β through the
    algorithm's coefficients A, B (alpha_coeff, beta_coeff);
    n_samples, n_used, n_dropped: counts; dropped: (index, reason) pairs,
    reason one of warmup / empty / outlier; used: per-sample flag;
    residuals: per-sample relative residual (t − a − b·n)/t, in input
    order (dropped samples included, so their distance shows);
    residual_spread: root mean square of the used residuals (the fit's
    typical relative error); residual_max_abs: the largest |used residual|;
    method: ``relative_wls`` or ``ols``;
    n_sizes: distinct sizes among the used samples; min_size_bytes /
    max_size_bytes: their range; alpha_se_s / beta_se_Bps: standard errors
    (None without a degree of freedom left); alpha_ci_s / beta_ci_Bps: 95 %
    intervals (low, high), an end None where unbounded; crossover_bytes: the
    fit's D* = a/b, bytes; size_spread: RMS relative residual of the per-size
    medians; status: ok / insufficient / poor and status_reason in words
    (module docstring); split: whether β was fitted on the large sizes and α
    on the small ones; beta_range_bytes / alpha_range_bytes: (smallest,
    largest) size each was fitted on, bytes.
    """

    op: str
    algo: str
    group_size: int
    method: str
    alpha_s: float
    beta_Bps: float
    n_half_bytes: float
    a_s: float
    b_s_per_byte: float
    alpha_coeff: float
    beta_coeff: float
    n_samples: int
    n_used: int
    n_dropped: int
    residual_spread: float
    residual_max_abs: float
    intercept_clamped: bool
    dropped: tuple[tuple[int, str], ...] = field(default=())
    used: tuple[bool, ...] = field(default=())
    residuals: tuple[float, ...] = field(default=())
    n_sizes: int = 0
    min_size_bytes: float | None = None
    max_size_bytes: float | None = None
    alpha_se_s: float | None = None
    beta_se_Bps: float | None = None
    alpha_ci_s: tuple[float | None, float | None] = (None, None)
    beta_ci_Bps: tuple[float | None, float | None] = (None, None)
    crossover_bytes: float | None = None
    size_spread: float | None = None
    status: str = "ok"
    status_reason: str = ""
    split: bool = False
    alpha_range_bytes: tuple[float | None, float | None] = (None, None)
    beta_range_bytes: tuple[float | None, float | None] = (None, None)

    def predict_s(self, size_bytes: float) -> float:
        """The fitted line's time for ``size_bytes``: a + b·n, seconds."""
        return self.a_s + self.b_s_per_byte * float(size_bytes)

    def link(self, name: str | None = None) -> Link:
        """The fitted α/β as a Link (for predictions under the run's own link).

        Raises BadInputError when the fit gave α < 0 (only possible for the
        unweighted fit).
        """
        return custom_link(self.alpha_s, self.beta_Bps, name=name or f"fitted {self.op} k={self.group_size}")

    def to_dict(self) -> dict:
        """Snake-case dict (seconds, bytes, bytes/s); ``dropped`` as a list of {index, reason}."""
        return {
            "op": self.op,
            "algo": self.algo,
            "group_size": self.group_size,
            "method": self.method,
            "alpha_s": self.alpha_s,
            "beta_Bps": self.beta_Bps,
            "n_half_bytes": self.n_half_bytes,
            "a_s": self.a_s,
            "b_s_per_byte": self.b_s_per_byte,
            "alpha_coeff": self.alpha_coeff,
            "beta_coeff": self.beta_coeff,
            "n_samples": self.n_samples,
            "n_used": self.n_used,
            "n_dropped": self.n_dropped,
            "residual_spread": self.residual_spread,
            "residual_max_abs": self.residual_max_abs,
            "intercept_clamped": self.intercept_clamped,
            "n_sizes": self.n_sizes,
            "min_size_bytes": self.min_size_bytes,
            "max_size_bytes": self.max_size_bytes,
            "alpha_se_s": self.alpha_se_s,
            "beta_se_Bps": self.beta_se_Bps,
            "alpha_ci_s": list(self.alpha_ci_s),
            "beta_ci_Bps": list(self.beta_ci_Bps),
            "crossover_bytes": self.crossover_bytes,
            "size_spread": self.size_spread,
            "status": self.status,
            "status_reason": self.status_reason,
            "split": self.split,
            "alpha_range_bytes": list(self.alpha_range_bytes),
            "beta_range_bytes": list(self.beta_range_bytes),
            "dropped": [{"index": i, "reason": r} for i, r in self.dropped],
            "used": list(self.used),
            "residuals": list(self.residuals),
        }


def _median(x: np.ndarray) -> float:
    """``float(np.median(x))`` of a 1-d float array, bit for bit (the middle value, or the mean
    (lower + upper) / 2 of the two middle ones, as numpy's partition-then-mean gives them), from one
    sort: np.median's own dispatch costs more than the work on the fits' few samples. NaN anywhere
    (np.median's answer is then NaN) or an empty array: np.median itself."""
    m = x.size
    if m == 0 or not np.isfinite(x).all():
        return float(np.median(x))
    s = np.sort(x)
    h = m // 2
    return float(s[h]) if m % 2 else float((s[h - 1] + s[h]) / 2)


def _size_medians(n: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct sizes of ``n`` ascending, as np.unique gives them, and per size the median of
    ``v`` over the samples of that size): ``np.array([np.median(v[n == s]) for s in np.unique(n)])``
    bit for bit (each median as :func:`_median`), from one lexsort instead of a median call per
    size. ``n``: finite sizes; a NaN in ``v`` or a zero size (np.unique's pick of 0.0 or -0.0):
    the per-size np.median."""
    if not n.size or not np.isfinite(v).all() or not n.all():
        sizes = np.unique(n)
        return sizes, np.array([np.median(v[n == sz]) for sz in sizes])
    o = np.lexsort((v, n))
    ns, vs = n[o], v[o]
    first = np.empty(ns.size, dtype=bool)
    first[0] = True
    np.not_equal(ns[1:], ns[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    counts = np.diff(starts, append=ns.size)
    mid = starts + counts // 2
    odd = (counts % 2) == 1
    return ns[starts], np.where(odd, vs[mid], (vs[np.where(odd, mid, mid - 1)] + vs[mid]) / 2)


def _distinct_below(x: np.ndarray, k: int) -> bool:
    """Whether ``x`` (finite sizes) holds fewer than ``k`` distinct values: ``np.unique(x).size < k``,
    without the sort for k <= 2."""
    if k <= 2:
        if k <= 0:
            return False
        return x.size == 0 or (k == 2 and not x.min() < x.max())
    return np.unique(x).size < k


def _samples(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    try:
        n = np.asarray(sizes_bytes, dtype=float).reshape(-1)
        t = np.asarray(times_s, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise BadInputError("bad fit samples: sizes and times must be numbers") from None
    if n.shape != t.shape:
        raise BadInputError(f"bad fit samples: {n.size} sizes but {t.size} times")
    if not np.all(np.isfinite(n)) or np.any(n < 0):
        raise BadInputError("bad fit samples: sizes must be finite numbers of bytes >= 0")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise BadInputError("bad fit samples: times must be finite numbers of seconds > 0")
    return n, t


def _initial_mask(n: np.ndarray, warmup_first: bool, drop_empty: bool) -> tuple[np.ndarray, list[tuple[int, str]]]:
    keep = np.ones(n.size, dtype=bool)
    reasons: list[tuple[int, str]] = []
    if warmup_first and n.size:
        keep[0] = False
        reasons.append((0, "warmup"))
    if drop_empty:
        for i in np.flatnonzero(n == 0):
            if keep[i]:
                keep[i] = False
                reasons.append((int(i), "empty"))
    return keep, reasons


def _check_enough(n: np.ndarray, mask: np.ndarray) -> None:
    if _distinct_below(n[mask], 2):
        raise BadInputError(
            f"cannot fit α and β: {int(mask.sum())} usable samples with "
            f"{np.unique(n[mask]).size} distinct size(s); need at least 2 distinct sizes"
        )


def _wls(n: np.ndarray, t: np.ndarray) -> tuple[float, float, bool]:
    """Minimise Σ((t − a − b·n)/t)²; (a, b, clamped)."""
    x = np.column_stack([1.0 / t, n / t])
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    coef, *_ = np.linalg.lstsq(x / scale, np.ones_like(t), rcond=None)
    a, b = (coef / scale).tolist()
    if a < 0:
        u = n / t
        denom = float(np.dot(u, u))
        b = float(u.sum() / denom) if denom > 0 else 0.0
        return 0.0, b, True
    return a, b, False


def _ols(n: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    x = np.column_stack([np.ones_like(n), n])
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    coef, *_ = np.linalg.lstsq(x / scale, t, rcond=None)
    a, b = (coef / scale).tolist()
    return a, b


def _result(
    op: str,
    algo: str,
    k: int,
    method: str,
    n: np.ndarray,
    t: np.ndarray,
    mask: np.ndarray,
    dropped: list[tuple[int, str]],
    a: float,
    b: float,
    clamped: bool,
    split: tuple[np.ndarray, np.ndarray] | None = None,
    pre: tuple | None = None,
) -> AlphaBetaFit:
    """The fit's record; ``split``: (α-range mask, β-range mask) when the two-range estimate applied;
    ``pre``: (r, sizes used, their median times) computed already (:func:`fit_alpha_beta_many`: the
    residuals ``(t − (a + b·n))/t`` and ``_size_medians(n[mask], t[mask])``, the same numbers)."""
    coeffs = algorithm_coefficients(op, algo, k)
    if not b > 0:
        raise BadInputError(
            f"cannot fit β for {op}: the fitted time does not grow with size (slope {b:.3g} s/B); "
            "the samples need sizes well into the bandwidth-bound range"
        )
    alpha = a / coeffs.alpha_coeff
    beta = coeffs.beta_coeff / b
    r = (t - (a + b * n)) / t if pre is None else pre[0]
    used_r = r[mask]
    if split is None:
        se_a, se_b, dof = _standard_errors(n[mask], t[mask], used_r, clamped, method)
        tq_a = tq = _t975(dof)
        ranges = ((float(n[mask].min()), float(n[mask].max())),) * 2
    else:
        am, bm = split
        nb, tb = n[bm], t[bm]
        a_bw, b_bw, cl_bw = _wls(nb, tb)
        _, se_b, dof = _standard_errors(nb, tb, (tb - (a_bw + b_bw * nb)) / tb, cl_bw, method)
        tq = _t975(dof)
        ra = r[am]
        dof_a = int(am.sum()) - 1
        se_a = (math.sqrt(float(np.dot(ra, ra)) / dof_a / float(np.sum(1.0 / t[am] ** 2)))
                if dof_a >= 1 and not clamped else None)
        tq_a = _t975(dof_a)
        ranges = ((float(n[am].min()), float(n[am].max())), (float(nb.min()), float(nb.max())))
    alpha_se = alpha_ci = beta_se = beta_ci = None
    if se_b is not None and tq is not None:
        beta_se = coeffs.beta_coeff * se_b / b**2
        lo_b, hi_b = b - tq * se_b, b + tq * se_b
        beta_ci = (coeffs.beta_coeff / hi_b, coeffs.beta_coeff / lo_b if lo_b > 0 else None)
    if se_a is not None and tq_a is not None:
        alpha_se = se_a / coeffs.alpha_coeff
        alpha_ci = ((a - tq_a * se_a) / coeffs.alpha_coeff, (a + tq_a * se_a) / coeffs.alpha_coeff)
    sizes_used, medians = _size_medians(n[mask], t[mask]) if pre is None else pre[1:]
    size_r = (medians - (a + b * sizes_used)) / medians
    size_spread = float(np.sqrt(np.mean(size_r**2)))
    n_outliers = sum(1 for _, why in dropped if why == "outlier")
    n_candidates = int(mask.sum()) + n_outliers
    status, reason = judge_fit(
        n_sizes=int(sizes_used.size), min_size=float(sizes_used[0]), max_size=float(sizes_used[-1]),
        crossover=a / b, spread=size_spread, n_outliers=n_outliers,
        n_candidates=n_candidates, alpha_low=(alpha_ci or (None, None))[0], beta_high=(beta_ci or (None, None))[1],
    )
    return AlphaBetaFit(
        op=op,
        algo=algo,
        group_size=k,
        method=method,
        alpha_s=alpha,
        beta_Bps=beta,
        n_half_bytes=alpha * beta,
        a_s=a,
        b_s_per_byte=b,
        alpha_coeff=coeffs.alpha_coeff,
        beta_coeff=coeffs.beta_coeff,
        n_samples=int(n.size),
        n_used=int(mask.sum()),
        n_dropped=int(n.size - mask.sum()),
        residual_spread=float(np.sqrt(np.mean(used_r**2))),
        residual_max_abs=float(np.max(np.abs(used_r))),
        intercept_clamped=clamped,
        dropped=tuple(sorted(dropped)),
        used=tuple(mask.tolist()),
        residuals=tuple(r.tolist()),
        n_sizes=int(sizes_used.size),
        min_size_bytes=float(sizes_used[0]),
        max_size_bytes=float(sizes_used[-1]),
        alpha_se_s=alpha_se,
        beta_se_Bps=beta_se,
        alpha_ci_s=alpha_ci or (None, None),
        beta_ci_Bps=beta_ci or (None, None),
        crossover_bytes=a / b,
        size_spread=size_spread,
        status=status,
        status_reason=reason,
        split=split is not None,
        alpha_range_bytes=ranges[0],
        beta_range_bytes=ranges[1],
    )


def _split_ranges(n: np.ndarray, t: np.ndarray, mask: np.ndarray, a: float, b: float, clamped: bool,
                  rates: tuple | None = None):
    """The two-range estimate of the module docstring: (a, b, clamped, (α mask, β mask)), or None when
    the kept samples lack BETA_RANGE_MIN_SIZES sizes at or above the bound or 2 sizes below (or the
    line's a or b is not positive). ``rates``: ``_size_medians(n[mask], n[mask] / t[mask])`` computed
    already."""
    if not (a > 0 and b > 0):
        return None
    sizes, rate = _size_medians(n[mask], n[mask] / t[mask]) if rates is None else rates
    i = sizes.size
    top = PLATEAU_WITHIN * rate.max()
    while i > 0 and rate[i - 1] >= top:
        i -= 1
    plateau_start = float(sizes[min(i, sizes.size - 1)])
    got = None
    for _ in range(5):
        if not (a > 0 and b > 0):
            return got
        bound = max(BETA_RANGE_CROSSOVERS * a / b, plateau_start)
        bm = mask & (n >= bound)
        am = mask & (n < bound)
        if _distinct_below(n[bm], BETA_RANGE_MIN_SIZES) or _distinct_below(n[am], 2):
            return got
        if got is not None and np.array_equal(bm, got[3][1]):
            return got
        _, b_new, _ = _wls(n[bm], t[bm])
        if not b_new > 0:
            return got
        w = 1.0 / t[am] ** 2
        a_new = float(np.sum((t[am] - b_new * n[am]) * w) / np.sum(w))
        cl = a_new < 0
        got = (max(a_new, 0.0), b_new, cl, (am, bm))
        a, b = got[0], got[1]
    return got


def _standard_errors(n: np.ndarray, t: np.ndarray, r: np.ndarray, clamped: bool, method: str):
    """(se(a), se(b), degrees of freedom) of the fitted line; an se None where it cannot be had.

    relative_wls: the regression 1 ≈ a/t + b·n/t, residuals r = (t − a − b·n)/t; ols: t ≈ a + b·n,
    residuals t·r. s² = Σres²/(m − p), cov = s²·(XᵀX)⁻¹ (module docstring).
    """
    m = int(n.size)
    if method == "ols":
        x = np.column_stack([np.ones_like(n), n])
        res = r * t
    else:
        x = np.column_stack([1.0 / t, n / t])
        res = r
    if clamped:
        x = x[:, 1:]
    p = x.shape[1]
    dof = m - p
    if dof < 1:
        return None, None, dof
    s2 = float(np.dot(res, res)) / dof
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    try:
        inv = np.linalg.inv(xs.T @ xs)
    except np.linalg.LinAlgError:
        return None, None, dof
    var = np.diag(inv) * s2 / scale**2
    se = np.sqrt(np.maximum(var, 0.0)).tolist()
    if clamped:
        return None, se[0], dof
    return se[0], se[1], dof


def judge_fit(
    *, n_sizes: int, min_size: float, max_size: float, crossover: float, spread: float,
    n_outliers: int = 0, n_candidates: int = 0, alpha_low: float | None = 1.0, beta_high: float | None = 1.0,
) -> tuple[str, str]:
    """(status, reason) of a fit by the rule of the module docstring.

    n_sizes: distinct sizes used; min_size / max_size: their range, bytes; crossover: the fit's
    D* = a/b, bytes; spread: RMS relative residual of the per-size medians; n_outliers of n_candidates samples dropped by
    the robust rule; alpha_low / beta_high: the low end of α's and the high end of β's 95 % interval
    (None: unbounded or not computable). status is ``ok``, ``insufficient`` or ``poor``; reason says
    why (empty for ok).
    """
    if n_sizes < MIN_SIZES:
        return "insufficient", f"{n_sizes} distinct sizes: need >= {MIN_SIZES} to judge a line"
    if not min_size < crossover:
        return "insufficient", (
            f"every size >= the fit's crossover D* = {crossover:,.0f} B: its α term was never measured"
        )
    if not crossover < max_size:
        return "insufficient", (
            f"every size <= the fit's crossover D* = {crossover:,.0f} B: its β term was never measured"
        )
    if alpha_low is None or alpha_low <= 0:
        return "insufficient", "α not determined: its 95 % interval reaches 0 (more sizes, or repeats, below D*)"
    if beta_high is None:
        return "insufficient", "β not determined: its 95 % interval is unbounded (more sizes, or repeats, above D*)"
    if spread > MAX_SPREAD:
        return "poor", (
            f"per-size residual spread {spread:.0%} > {MAX_SPREAD:.0%}: one α–β line does not describe the sizes"
        )
    if n_candidates and n_outliers > MAX_OUTLIER_FRACTION * n_candidates:
        return "poor", f"{n_outliers} of {n_candidates} samples dropped as outliers (> {MAX_OUTLIER_FRACTION:.0%})"
    return "ok", ""


def fit_alpha_beta(
    sizes_bytes: Sequence[float],
    times_s: Sequence[float],
    op: str,
    group_size: int,
    algo: str = "ring",
    warmup_first: bool = True,
    drop_empty: bool = True,
    outlier_k: float | None = 5.0,
    outlier_floor: float = 0.02,
    split_ranges: bool = True,
) -> AlphaBetaFit:
    """Fit α and β from samples of ``op`` on ``group_size`` ranks run with ``algo``.

    sizes_bytes: the nccl-tests S of each sample, bytes; times_s: each
    sample's time, seconds (for a trace: the instance's sync time), in the
    order they were taken. Minimises Σ((t_i − a − b·n_i)/t_i)² over the kept
    samples, drops warm-up / empty / outlier samples as the module docstring
    describes (``outlier_k=None`` turns the robust rule off), then α = a/A,
    β = B/b, n½ = α·β with A, B from ``algorithm_coefficients(op, algo, k)``
    (ring all-reduce: a = 2(k−1)α, b = 2(k−1)/(k·β)). ``split_ranges``: β from the sizes >=
    BETA_RANGE_CROSSOVERS·D* and α from those below, where the samples allow (module docstring);
    False keeps the one line over every size.

    Returns an AlphaBetaFit. Raises BadInputError for mismatched or bad
    samples, fewer than 2 distinct sizes left, a non-positive fitted slope,
    an unknown op/algo, or a group size the algorithm cannot run on.
    """
    got = fit_alpha_beta_many([(sizes_bytes, times_s, op, group_size, algo)], warmup_first=warmup_first,
                              drop_empty=drop_empty, outlier_k=outlier_k, outlier_floor=outlier_floor,
                              split_ranges=split_ranges)[0]
    if isinstance(got, BadInputError):
        raise got
    return got


def _group_medians(gid: np.ndarray, v: np.ndarray, ngroups: int) -> np.ndarray:
    """Per group 0..ngroups−1 of ``gid``, :func:`_median` of the values ``v`` of its elements (in
    their order), from one lexsort over every group; NaN for a group without elements."""
    o = np.lexsort((v, gid))
    vs = v[o]
    counts = np.bincount(gid, minlength=ngroups)
    starts = np.cumsum(counts) - counts
    mid = starts + counts // 2
    odd = (counts % 2) == 1
    some = counts > 0
    med = np.full(ngroups, np.nan)
    m, od = mid[some], odd[some]
    med[some] = np.where(od, vs[m], (vs[np.where(od, m, m - 1)] + vs[m]) / 2)
    bad = np.bincount(gid, weights=~np.isfinite(v), minlength=ngroups) > 0
    for g in np.flatnonzero(bad):  # np.median's own answer (NaN, or what infinities make)
        med[g] = _median(v[gid == g])
    return med


def _group_size_medians(gid: np.ndarray, n: np.ndarray, v: np.ndarray, ngroups: int) -> list:
    """Per group 0..ngroups−1 of ``gid``, :func:`_size_medians` of its elements' sizes ``n`` and values
    ``v`` (distinct sizes ascending, each size's median value), from one lexsort over every group."""
    o = np.lexsort((v, n, gid))
    gs, ns, vs = gid[o], n[o], v[o]
    first = np.ones(ns.size, dtype=bool)
    first[1:] = (ns[1:] != ns[:-1]) | (gs[1:] != gs[:-1])
    starts = np.flatnonzero(first)
    counts = np.diff(starts, append=ns.size)
    mid = starts + counts // 2
    odd = (counts % 2) == 1
    sizes, meds = ns[starts], np.where(odd, vs[mid], (vs[np.where(odd, mid, mid - 1)] + vs[mid]) / 2)
    runs = np.bincount(gs[starts], minlength=ngroups)
    ends = np.cumsum(runs)
    out = [(sizes[e - r:e], meds[e - r:e]) for r, e in zip(runs.tolist(), ends.tolist())]
    bad = np.bincount(gid, weights=~np.isfinite(v) | (n == 0), minlength=ngroups) > 0
    for g in np.flatnonzero(bad):  # _size_medians' own way (np.unique, np.median per size)
        sel = gid == g
        out[g] = _size_medians(n[sel], v[sel])
    return out


def _spec(op, algo, group_size, memo: dict):
    """(canonical op, algorithm, k) after fit_alpha_beta's checks of them, or the BadInputError they
    raise; remembered per (op, algo, group size and its type)."""
    try:
        key = (op, algo, type(group_size), group_size)
        hash(key)
    except TypeError:
        key = None
    if key is not None and key in memo:
        return memo[key]
    try:
        canon = _check_model_op(op)
        a_name = _check_algo(canon, algo)
        algorithm_coefficients(canon, a_name, group_size)  # validate k before any work
        got = (canon, a_name, int(group_size))
    except BadInputError as exc:
        got = exc
    if key is not None:
        memo[key] = got
    return got


def fit_alpha_beta_many(
    problems: Sequence[tuple],
    warmup_first: bool = True,
    drop_empty: bool = True,
    outlier_k: float | None = 5.0,
    outlier_floor: float = 0.02,
    split_ranges: bool = True,
) -> list:
    """:func:`fit_alpha_beta` of each problem ``(sizes_bytes, times_s, op, group_size, algo)``, with
    the same options for all: per problem its AlphaBetaFit, or the BadInputError fit_alpha_beta
    raises for it (returned, not raised). fit_alpha_beta is this function on one problem, so the
    fits are the same bit for bit however the problems are batched: what is computed for all
    problems at once (the masks, the residuals and the other elementwise arithmetic, the medians by
    one sort) gives each problem the numbers its own arrays would, and what could differ in the
    last bit when batched (sums, dot products, norms, lstsq, inverses: numpy's and BLAS's summation
    orders) runs per problem on its own arrays."""
    out: list = [None] * len(problems)
    memo: dict = {}
    ok = []  # (problem index, canonical op, algorithm, k, sizes, times)
    for i, (sizes_bytes, times_s, op, group_size, algo) in enumerate(problems):
        got = _spec(op, algo, group_size, memo)
        if isinstance(got, BadInputError):
            out[i] = got
            continue
        try:
            n, t = _samples(sizes_bytes, times_s)
        except BadInputError as exc:
            out[i] = exc
            continue
        ok.append((i, *got, n, t))
    if not ok:
        return out
    P = len(ok)
    lens = np.array([len(p[4]) for p in ok], dtype=np.int64)
    offs = np.cumsum(lens) - lens
    N = np.concatenate([p[4] for p in ok])
    T = np.concatenate([p[5] for p in ok])
    G = np.repeat(np.arange(P), lens)
    # candidates: the warm-up sample and the empty ones out (_initial_mask)
    cand = np.ones(N.size, dtype=bool)
    dropped: list = [[] for _ in range(P)]
    if warmup_first:
        for g in np.flatnonzero(lens > 0).tolist():
            cand[offs[g]] = False
            dropped[g].append((0, "warmup"))
    if drop_empty:
        empty = cand & (N == 0)
        for j in np.flatnonzero(empty).tolist():
            dropped[G[j]].append((j - int(offs[G[j]]), "empty"))
        cand &= ~empty
    # enough distinct sizes (_check_enough)
    idx = np.flatnonzero(cand)
    usable = np.bincount(G[idx], minlength=P)
    distinct = _group_distinct(G[idx], N[idx], P)
    active = []
    bad_k = outlier_k is not None and (not math.isfinite(outlier_k) or outlier_k <= 0)
    for g in range(P):
        if distinct[g] < 2:
            out[ok[g][0]] = BadInputError(
                f"cannot fit α and β: {int(usable[g])} usable samples with "
                f"{int(distinct[g])} distinct size(s); need at least 2 distinct sizes")
        elif bad_k:
            out[ok[g][0]] = BadInputError(f"bad outlier_k {outlier_k!r}: expected a positive number or None")
        else:
            active.append(g)
    if not active:
        return out
    seg = [(int(offs[g]), int(offs[g] + lens[g])) for g in range(P)]
    mask = cand.copy()
    A, B = np.zeros(P), np.zeros(P)
    CL = [False] * P

    def refit(g):
        s, e = seg[g]
        m = mask[s:e]
        A[g], B[g], CL[g] = _wls(N[s:e][m], T[s:e][m])

    for g in active:
        refit(g)
    if outlier_k is not None:  # the robust rule, round by round for the fits still changing
        looping = np.zeros(P, dtype=bool)
        looping[active] = True
        for _ in range(20):
            if not looping.any():
                break
            r = (T - (A[G] + B[G] * N)) / T
            sel = mask & looping[G]
            med = _group_medians(G[sel], r[sel], P)
            dev = np.abs(r - med[G])
            sigma = _MAD_TO_SIGMA * _group_medians(G[sel], dev[sel], P)
            threshold = outlier_k * sigma
            threshold = np.where(outlier_floor > threshold, outlier_floor, threshold)  # max(x, floor)
            new_mask = cand & (dev <= threshold[G])
            changed = np.bincount(G, weights=(new_mask != mask) & looping[G], minlength=P) > 0
            ni = np.flatnonzero(new_mask & looping[G])
            enough = _group_distinct(G[ni], N[ni], P) >= 2
            go = looping & changed & enough
            looping = go
            for g in np.flatnonzero(go).tolist():
                s, e = seg[g]
                mask[s:e] = new_mask[s:e]
                refit(g)
        for j in np.flatnonzero(cand & ~mask).tolist():
            dropped[G[j]].append((j - int(offs[G[j]]), "outlier"))
    splits: dict = {}
    if split_ranges:
        want = [g for g in active if A[g] > 0 and B[g] > 0]
        if want:
            kept = mask & np.isin(G, want)
            ki = np.flatnonzero(kept)
            rates = _group_size_medians(G[ki], N[ki], N[ki] / T[ki], P)
            for g in want:
                s, e = seg[g]
                two = _split_ranges(N[s:e], T[s:e], mask[s:e], float(A[g]), float(B[g]), CL[g], rates=rates[g])
                if two is not None:
                    A[g], B[g], CL[g] = two[0], two[1], two[2]
                    splits[g] = two[3]
    r = (T - (A[G] + B[G] * N)) / T
    ki = np.flatnonzero(mask)
    meds = _group_size_medians(G[ki], N[ki], T[ki], P)
    for g in active:
        i, canon, a_name, k = ok[g][:4]
        s, e = seg[g]
        try:
            out[i] = _result(canon, a_name, k, "relative_wls", N[s:e], T[s:e], mask[s:e], dropped[g], float(A[g]),
                             float(B[g]), CL[g], split=splits.get(g), pre=(r[s:e], *meds[g]))
        except BadInputError as exc:
            out[i] = exc
    return out


def _group_distinct(gid: np.ndarray, n: np.ndarray, ngroups: int) -> np.ndarray:
    """Per group 0..ngroups−1 of ``gid``, how many distinct values ``n`` (finite) its elements hold
    (np.unique's count: 0.0 and -0.0 are one)."""
    if not gid.size:
        return np.zeros(ngroups, dtype=np.int64)
    o = np.lexsort((n, gid))
    gs, ns = gid[o], n[o]
    first = np.ones(ns.size, dtype=bool)
    first[1:] = (ns[1:] != ns[:-1]) | (gs[1:] != gs[:-1])
    return np.bincount(gs[first], minlength=ngroups)


def fit_unweighted(
    sizes_bytes: Sequence[float],
    times_s: Sequence[float],
    op: str,
    group_size: int,
    algo: str = "ring",
    warmup_first: bool = True,
    drop_empty: bool = True,
) -> AlphaBetaFit:
    """Plain (unweighted) least squares t = a + b·n, for comparison with :func:`fit_alpha_beta`.

    Same sample drops as the weighted fit except the robust rule; minimises
    Σ(t_i − a − b·n_i)², which the largest messages dominate, so α (and a
    at small sizes) comes out badly wrong over a 1 KB–1 GB sweep, possibly
    negative (reported as is). Raises BadInputError as fit_alpha_beta does.
    """
    canon = _check_model_op(op)
    a_name = _check_algo(canon, algo)
    algorithm_coefficients(canon, a_name, group_size)
    k = int(group_size)
    n, t = _samples(sizes_bytes, times_s)
    mask, dropped = _initial_mask(n, warmup_first, drop_empty)
    _check_enough(n, mask)
    a, b = _ols(n[mask], t[mask])
    return _result(canon, a_name, k, "ols", n, t, mask, dropped, a, b, False)
