"""Cross-table invariants of the report over every fixture and every folder of ../shared/traces
(benchmarks/invariants.py: the inputs, the checks and why). One ingest per input; inputs over
benchmarks/invariants.MAX_MB are skipped by name. Shared traces are skipped with a reason when
../shared is absent (a fresh clone)."""

from __future__ import annotations

import copy
import importlib.util

import pytest

from tests.conftest import FIXTURES

_spec = importlib.util.spec_from_file_location("invariants", FIXTURES.parent / "benchmarks" / "invariants.py")
inv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(inv)

INPUTS, SKIPPED = inv.inputs()
NAMES = [n for n, _ in INPUTS]
if not inv.SHARED.is_dir():
    NAMES.append("shared")  # one test that says why the shared traces were not checked


@pytest.mark.parametrize("name", NAMES)
def test_report_invariants(name, tmp_path):
    if name == "shared":
        pytest.skip(f"{inv.SHARED} is absent: the shared traces were not checked")
    paths = dict(INPUTS)[name]
    rep, rows = inv.analyze(paths, tmp_path / "store")
    assert inv.check(rep, rows) == []


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return inv.analyze([FIXTURES / "handmade" / "two_rank"], tmp_path_factory.mktemp("s"))


def test_the_checks_catch_what_they_claim(good):
    """Each invariant, broken by hand in a good report, is reported (a check that cannot fail is none)."""
    rep, rows = good
    assert inv.check(rep, rows) == []

    def broken(edit) -> list[str]:
        r, w = copy.deepcopy(rep), copy.deepcopy(rows)
        edit(r, w)
        return inv.check(r, w)

    def part(r, w):
        r["gpu_time_breakdown"]["by_rank"][0]["idle_ns"] += 1
    assert any("parts sum" in b for b in broken(part))

    def count(r, w):
        r["collectives"][0]["count"] += 1
    assert any("by-op count" in b for b in broken(count))

    def incomplete(r, w):
        r["process_groups"][0]["incomplete"] += 1
    assert any("incomplete counts disagree" in b for b in broken(incomplete))

    def path(r, w):
        p = r["critical_path"]["summary"][0]
        p["length_ns"], p["longer_than_step"] = p["window_ns"] + 1, None
    assert any("no reason given" in b for b in broken(path))

    def skew(r, w):
        w["unsupported"] = [("skew or straggler of one rank", 2)]
    assert any("skew or straggler of one rank" in b for b in broken(skew))

    def negative(r, w):
        w["negative"] = [("wait_ns", 1)]
    assert any("negative wait_ns" in b for b in broken(negative))

    def k_source(r, w):
        w["k_source"] = [(1, 1, 0)]
    got = broken(k_source)
    assert any("no k_source" in b for b in got) and any("not the world size" in b for b in got)

    def cap(r, w):
        w["over_cap"] = [(1,)]
    assert any("without over_cap" in b for b in broken(cap))


def test_skipped_inputs_are_named():
    for s in SKIPPED:
        assert " MB > " in s
