"""--comm-pattern runs in RE2 only: a pattern RE2 cannot compile is refused with its reason (no
fallback to Python's backtracking re), and a pattern that would make every event communication
(it matches the empty string, or every compute name) is refused."""

from __future__ import annotations

import time

import pytest

from tests.conftest import FIXTURES, store_snapshot
from tracekit.cli import main
from tracekit.errors import BadInputError
from tracekit.ingest import comm_families, kineto

pytestmark = pytest.mark.skipif(comm_families.re2 is None, reason="google-re2 is not installed")

TWO = FIXTURES / "handmade" / "two_rank"


@pytest.mark.serial  # asserts a wall-time bound: not beside the multi-process tests
@pytest.mark.parametrize("pattern, why", [
    ("(?=nccl)x", "invalid perl operator: (?="),  # lookahead: Python re ran it polynomially
    ("(?!a)(a+)+$", "invalid perl operator: (?!"),
    (r"(a)\1", r"invalid escape sequence: \1"),  # backreference
    ("(?<=x)y", "invalid perl operator: (?<"),
])
def test_patterns_re2_cannot_compile_are_refused_with_the_reason(tmp_path, capsys, pattern, why):
    s = tmp_path / "s"
    assert main(["ingest", str(TWO), "--store", str(s), "--run-id", "good"]) == 0
    before = store_snapshot(s)
    capsys.readouterr()
    t0 = time.perf_counter()
    assert main(["ingest", str(TWO), "--store", str(s), "--comm-pattern", pattern, "--replace"]) == 2
    assert time.perf_counter() - t0 < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "RE2 (linear-time matching) cannot compile it" in err[0] and why in err[0], err
    assert store_snapshot(s) == before


@pytest.mark.parametrize("pattern, why", [
    (".*", "matches the empty string"), ("a*", "matches the empty string"), ("nccl|", "matches the empty string"),
    ("x?", "matches the empty string"), (".", "matches every name"), ("[a-z]", "matches every name"),
    ("(?s).+", "matches every name"),
])
def test_match_everything_patterns_refused(pattern, why):
    with pytest.raises(BadInputError, match=why):
        comm_families.check_user_patterns([pattern])


@pytest.mark.serial  # asserts a wall-time bound: not beside the multi-process tests
def test_narrow_patterns_pass_and_match_case_insensitively():
    m = comm_families.check_user_patterns(["my_allreduce", "^x+y", "(a+)+$"])
    assert m.search("foo_MY_AllReduce") and m.search("xxxy_kernel") and m.search("kernel_aaa")
    assert m.search("sm90_xmma_gemm") is None
    # '(a+)+$' on a long non-matching name: linear in RE2 (Python's re takes exponential time)
    t0 = time.perf_counter()
    assert m.search("a" * 5000 + "b") is None
    assert time.perf_counter() - t0 < 1
