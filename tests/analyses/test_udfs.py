"""The model UDFs (analyses.register_udfs, arrow UDFs called once per distinct argument tuple of a
chunk) answer what tracekit.model's scalar functions answer, row for row, at edge values: NULL
arguments, 0.0 and -0.0, NaN, infinities, negative and unknown values, and rows repeated across
more than one DuckDB vector (2,048 rows), in an order that mixes them."""

from __future__ import annotations

import itertools
import math

import duckdb
import pyarrow as pa
import pytest

from tracekit.analyses import per_distinct, register_udfs
from tracekit.errors import TracekitError
from tracekit.model import (
    ALGORITHMS,
    algbw,
    algorithm_coefficients,
    applicable_algorithms,
    busbw,
    busbw_factor,
    custom_link,
    link_from_preset,
    pipeline_bubble_fraction,
    predict_collective,
    verdict,
)

NAN, INF = float("nan"), float("inf")


def scalar(fn, *args):
    """The model's answer as SQL sees it: NULL for a NULL argument or where the model refuses."""
    if any(a is None for a in args):
        return None
    try:
        return fn(*args)
    except (TracekitError, ValueError, ZeroDivisionError):
        return None


def same(a, b) -> bool:
    """Equal as values that SQL returns: NULL = NULL, NaN = NaN, and 0.0 ≠ -0.0."""
    if isinstance(a, float) and isinstance(b, float):
        return repr(a) == repr(b)
    return a == b and type(a) is type(b)


def run_udf(sql_fn: str, types: list[str], rows: list[tuple]) -> list:
    """``sql_fn`` applied to ``rows`` (repeated and shuffled over three vectors), in row order."""
    con = duckdb.connect()
    register_udfs(con)
    cols = [f"c{i}" for i in range(len(types))]
    reps = rows * (3 * 2048 // len(rows) + 1)
    order = sorted(range(len(reps)), key=lambda i: (i * 7919) % len(reps))  # a fixed shuffle
    reps = [reps[i] for i in order]
    arrow = {"BIGINT": pa.int64(), "INTEGER": pa.int32(), "DOUBLE": pa.float64(), "VARCHAR": pa.string(),
             "BOOLEAN": pa.bool_()}
    con.register("t", pa.table({"i": list(range(len(reps))),
                                **{c: pa.array([r[j] for r in reps], arrow[t]) for j, (c, t) in enumerate(zip(cols, types))}}))
    got = [r[0] for r in con.execute(f"SELECT {sql_fn}({', '.join(cols)}) FROM t ORDER BY i").fetchall()]
    return list(zip(reps, got))


def check(sql_fn, types, rows, expect):
    bad = [(args, got, expect(*args)) for args, got in run_udf(sql_fn, types, rows) if not same(got, expect(*args))]
    assert not bad, f"{sql_fn}: {bad[:5]}"


SIZES = [None, 0, 1, 1000, 8_388_608, -5]
TIMES_NS = [None, 0.0, -0.0, 1.0, 2500.5, -3.0, NAN, INF]
OPS = [None, "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "barrier", "bogus"]
KS = [None, 1, 2, 3, 8, 0, -2]


def test_bandwidth_udfs():
    check("tk_algbw", ["BIGINT", "DOUBLE"], list(itertools.product(SIZES, TIMES_NS)),
          lambda d, t: scalar(lambda d, t: algbw(float(d), float(t) * 1e-9), d, t))
    check("tk_busbw", ["VARCHAR", "BIGINT", "DOUBLE", "INTEGER"], list(itertools.product(OPS, SIZES[:4], TIMES_NS, KS)),
          lambda op, d, t, n: scalar(lambda op, d, t, n: busbw(op, float(d), float(t) * 1e-9, int(n)), op, d, t, n))
    check("tk_busbw_factor", ["VARCHAR", "INTEGER"], list(itertools.product(OPS, KS)),
          lambda op, n: scalar(lambda op, n: float(busbw_factor(op, int(n))), op, n))


def test_verdict_udf():
    vals = [None, 0.0, -0.0, 1.0, 2.0, NAN, INF]
    check("tk_verdict", ["DOUBLE", "DOUBLE"], list(itertools.product(vals, vals)),
          lambda a, b: scalar(lambda a, b: verdict(float(a), float(b)), a, b))


ALGOS = [None, "ring", "tree", "double_binary_tree", "nvls", "pairwise", "p2p", "recursive_doubling", "bogus"]


def test_coefficient_udfs():
    rows = list(itertools.product(OPS, ALGOS, KS))
    for name, attr in (("tk_alpha_coeff", "alpha_coeff"), ("tk_beta_coeff", "beta_coeff")):
        check(name, ["VARCHAR", "VARCHAR", "INTEGER"], rows,
              lambda op, a, n, attr=attr: scalar(lambda op, a, n: float(getattr(algorithm_coefficients(op, a, int(n)), attr)),
                                                 op, a, n))


def test_model_algo_udf():
    kernel = [None, "", "RING", "ring", "TREE", "NVLS", "NVLSTREE", "COLLNET"]

    def expect(op, ka, n):  # the kernel's algorithm when the model has it for (op, k), else the default
        if op is None or n is None or not ALGORITHMS.get(op):
            return None
        cand = {"RING": "ring", "TREE": "double_binary_tree", "NVLS": "nvls", "NVLSTREE": "nvls"}.get(str(ka or "").upper())
        try:
            ok = cand in ALGORITHMS[op] and cand in applicable_algorithms(op, int(n))
        except (TracekitError, ValueError):
            return None
        return cand if ok else ALGORITHMS[op][0]

    check("tk_model_algo", ["VARCHAR", "VARCHAR", "INTEGER"], list(itertools.product(OPS, kernel, KS)), expect)


def test_best_algorithm_udfs():
    rows = list(itertools.product(["all_reduce", "all_gather", "bogus", None], [0, 4096, 8_388_608, None], [2, 8, 1],
                                  [0.0, -0.0, 5e-6, -1.0, None], [0.0, 2e11, NAN], [True, False]))

    def best(op, d, n, a, b, sw):
        preds = predict_collective(op, float(d), int(n), custom_link(a, b), algo="all")
        if not sw:
            preds = [p for p in preds if p.algo != "nvls"] or preds
        return min(preds, key=lambda p: p.time_s)

    types = ["VARCHAR", "BIGINT", "INTEGER", "DOUBLE", "DOUBLE", "BOOLEAN"]
    check("tk_best_algo", types, rows, lambda *a: scalar(lambda *a: best(*a).algo, *a))
    check("tk_best_time", types, rows, lambda *a: scalar(lambda *a: best(*a).time_s, *a))


def test_link_and_bubble_udfs():
    names = [None, "nvlink4", "ib_ndr", "eth100", "bogus", ""]
    check("tk_link_alpha", ["VARCHAR"], [(n,) for n in names], lambda n: scalar(lambda n: link_from_preset(n).alpha_s, n))
    check("tk_link_beta", ["VARCHAR"], [(n,) for n in names], lambda n: scalar(lambda n: link_from_preset(n).beta_Bps, n))
    pm = list(itertools.product([None, 0, 1, 4, -1], [None, 0, 1, 8]))
    check("tk_pipeline_bubble", ["BIGINT", "BIGINT"], pm,
          lambda p, m: scalar(lambda p, m: pipeline_bubble_fraction(int(p), int(m)), p, m))


def test_per_distinct_calls_once_per_distinct_tuple_and_keeps_signed_zeros():
    calls = []

    def f(a, b):
        calls.append((a, b))
        return math.copysign(1.0, a) * b

    con = duckdb.connect()
    con.create_function("f", per_distinct(f, "DOUBLE"), ["DOUBLE", "DOUBLE"], "DOUBLE", type="arrow",
                        null_handling="special")
    con.register("v", pa.table({"a": [2.0, 2.0, 0.0, -0.0, 2.0], "b": [3.0, 3.0, 1.0, 1.0, 3.0]}))
    got = con.execute("SELECT f(a, b) FROM v").fetchall()
    assert [r[0] for r in got] == [3.0, 3.0, 1.0, -1.0, 3.0]
    assert sorted(calls, key=repr) == sorted([(2.0, 3.0), (0.0, 1.0), (-0.0, 1.0)], key=repr)  # (2, 3) once



def test_algbw_array_is_algbw_element_by_element():
    from tracekit.model import algbw_array

    sizes = [0, 1, 1000, 8_388_608, 2**53 + 1, -5, NAN, INF, 1e300]
    secs = [0.0, -0.0, 1e-9, 2.5e-6, 1.0, -3.0, NAN, INF, 1e-300]
    pairs = list(itertools.product(sizes, secs))
    got = algbw_array([p[0] for p in pairs], [p[1] for p in pairs])
    for (s, t), g in zip(pairs, got.tolist()):
        want = scalar(algbw, s, t)
        assert same(g, NAN if want is None else want), (s, t, g, want)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
