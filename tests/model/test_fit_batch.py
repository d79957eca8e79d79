"""tracekit.model.fit: fit_alpha_beta_many gives each problem the fit fit_alpha_beta gives it alone,
bit for bit, whatever the batch (sizes, orders, mixed ops and group sizes, errors among them); the
exact medians it takes by sorting are numpy's."""

from __future__ import annotations

import random
import zlib

import numpy as np
import pytest

from tracekit.errors import BadInputError
from tracekit.model import ALGORITHMS, fit_alpha_beta
from tracekit.model.fit import (_group_medians, _group_size_medians, _median, _size_medians,
                                fit_alpha_beta_many)


def _problem(rng: random.Random):
    """A sweep or trace-like sample set: sizes over decades, noise, outliers, ties, zero sizes, and
    now and then too few sizes or an op the model lacks."""
    op = rng.choice(["all_reduce", "all_gather", "all_to_all", "broadcast", "send", "reduce_scatter", "barrier"])
    k = rng.choice([1, 2, 4, 8, 16])
    alpha, beta = 10 ** rng.uniform(-6, -4), 10 ** rng.uniform(9, 11.5)
    sizes = sorted({2 ** rng.randint(0, 31) for _ in range(rng.choice([1, 2, 3, 5, 8, 14]))})
    if rng.random() < 0.1:
        sizes = [0] + sizes
    n, t = [], []
    for sz in sizes:
        for _ in range(rng.choice([1, 1, 2, 4])):
            tt = (alpha * 2 * (k - 1 or 1) + sz / beta) * max(1 + rng.gauss(0, rng.choice([0.001, 0.03, 0.3])), 0.05)
            if rng.random() < 0.05:
                tt *= rng.choice([30.0, 0.1])
            if t and rng.random() < 0.05:
                tt = t[-1]
            n.append(float(sz))
            t.append(tt)
    order = list(range(len(n)))
    rng.shuffle(order)
    algo = (ALGORITHMS.get("send" if op == "recv" else op) or ["ring"])[0]
    return [n[i] for i in order], [t[i] for i in order], op, k, algo


def _alone(p, **kw):
    try:
        return fit_alpha_beta(p[0], p[1], p[2], p[3], algo=p[4], **kw)
    except BadInputError as exc:
        return exc


def _same(a, b) -> bool:
    if isinstance(a, BadInputError) or isinstance(b, BadInputError):
        return type(a) is type(b) and str(a) == str(b)
    return repr(a.to_dict()) == repr(b.to_dict())  # repr: floats to the last bit, NaN equal to NaN


@pytest.mark.parametrize("kw", [{}, {"warmup_first": False}, {"split_ranges": False}, {"outlier_k": None},
                                {"drop_empty": False, "warmup_first": False}, {"outlier_k": 2.5, "outlier_floor": 0.0}])
def test_a_batch_gives_each_problem_its_own_fit(kw):
    rng = random.Random(zlib.crc32(repr(sorted(kw.items())).encode()))
    problems = [_problem(rng) for _ in range(300)]
    problems.append(([1e3, 1e6], [1e-5, 0.0], "all_reduce", 8, "ring"))  # a bad time: its own error
    problems.append(([1e3, 1e6], [1e-5, 2e-5], "all_reduce", 6, "rabenseifner"))  # a bad k for the algorithm
    alone = [_alone(p, **kw) for p in problems]
    assert sum(not isinstance(f, BadInputError) for f in alone) > 100
    assert {f.status for f in alone if not isinstance(f, BadInputError)} == {"ok", "poor", "insufficient"}
    for lo, hi in ((0, len(problems)), (0, 1), (7, 60), (100, 302)):
        got = fit_alpha_beta_many(problems[lo:hi], **kw)
        assert all(_same(a, b) for a, b in zip(got, alone[lo:hi]))
    shuffled = list(range(len(problems)))
    rng.shuffle(shuffled)
    got = fit_alpha_beta_many([problems[i] for i in shuffled], **kw)
    assert all(_same(g, alone[i]) for g, i in zip(got, shuffled))


def test_a_bad_outlier_k_is_the_error_of_every_problem_that_gets_that_far():
    got = fit_alpha_beta_many([([1.0, 2.0, 4.0], [1e-5, 2e-5, 4e-5], "all_reduce", 2, "ring"),
                               ([1.0], [1e-5], "all_reduce", 2, "ring")], warmup_first=False, outlier_k=-1)
    assert [str(g) for g in got] == [
        "bad outlier_k -1: expected a positive number or None",
        "cannot fit α and β: 1 usable samples with 1 distinct size(s); need at least 2 distinct sizes"]


def test_medians_by_sorting_are_numpys():
    rng = np.random.default_rng(3)
    for m in list(range(1, 12)) + [50, 51, 1000]:
        for _ in range(30):
            x = rng.standard_normal(m) * 10.0 ** rng.integers(-5, 5, size=m)
            if rng.random() < 0.3:
                x[rng.integers(0, m)] = x[0]  # ties
            assert _median(x) == float(np.median(x))
    assert np.isnan(_median(np.array([1.0, np.nan, 2.0])))
    n = rng.choice([1.0, 8.0, 64.0, 4096.0], size=200)
    v = rng.standard_normal(200)
    sizes, med = _size_medians(n, v)
    assert sizes.tolist() == np.unique(n).tolist()
    assert med.tolist() == [float(np.median(v[n == s])) for s in np.unique(n)]
    gid = rng.integers(0, 7, size=200)
    assert _group_medians(gid, v, 8)[:7].tolist() == [float(np.median(v[gid == g])) for g in range(7)]
    assert np.isnan(_group_medians(gid, v, 8)[7])  # no elements
    per = _group_size_medians(gid, n, v, 7)
    for g in range(7):
        want = _size_medians(n[gid == g], v[gid == g])
        assert per[g][0].tolist() == want[0].tolist() and per[g][1].tolist() == want[1].tolist()
