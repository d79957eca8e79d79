"""Every weak reference comes with its remedy (tracekit/report/remedies.py): the rule that rejected a
fit, the sizes it saw, why no calibration run judged the collectives, and the command that fixes it.

fixtures/nccl_tests/two_runs.md (fixtures/nccl_tests/NOTE.md): run 0, all_reduce on 8 H100, rows at
1 MiB, 4 MiB (its out-of-place half #wrong: left out) and 64 MiB → 2 distinct sizes kept: rule
min_sizes (judge_fit needs 3). Run 1, all_reduce on 2 A100, 1, 8 and 64 MiB: all above the fit's
crossover D*, so rule alpha_term_unmeasured; the sweep must go below D*: the largest power of two
<= D*/8 (D* read from the fit, checked to lie below 1 MiB).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import FIXTURES
from tracekit.cli import main
from tracekit.ingest import ingest_paths
from tracekit.model.fit import judge_fit
from tracekit.report.remedies import _size_arg, fit_rule
from tracekit.store import Store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = Store(tmp_path_factory.mktemp("remedy-store"))
    ingest_paths([FIXTURES / "nccl_tests" / "two_runs.md"], st, run_id="log")
    ingest_paths([FIXTURES / "handmade" / "two_rank"], st, run_id="hand")
    return st


def _report(store, run, capsys):
    assert main(["analyze", "--store", str(store.path), "--run", run, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_judge_fit_reasons_map_to_rules():
    """Each of judge_fit's own reasons is named by its rule."""
    base = dict(n_sizes=5, min_size=1e3, max_size=1e8, crossover=1e5, spread=0.01)
    cases = {
        "min_sizes": dict(base, n_sizes=2),
        "alpha_term_unmeasured": dict(base, min_size=2e5),
        "beta_term_unmeasured": dict(base, max_size=5e4),
        "alpha_undetermined": dict(base, alpha_low=0.0),
        "beta_undetermined": dict(base, beta_high=None),
        "spread": dict(base, spread=0.3),
        "outliers": dict(base, n_outliers=4, n_candidates=10),
    }
    for rule, kw in cases.items():
        assert fit_rule(*judge_fit(**kw)) == rule
    assert fit_rule(*judge_fit(**base)) is None
    assert _size_arg(65536) == "64K" and _size_arg(8 << 30) == "8G" and _size_arg(1000) == "1000"


def test_rejected_fits_print_rule_and_remedy(store, capsys):
    rep = _report(store, "log", capsys)
    fits = {f["group_size"]: f for f in rep["fit"] if f["scope"] == "group"}
    assert fits[8]["status"] == "insufficient" and fits[8]["n_sizes"] == 2
    d = fits[2]["crossover_bytes"]
    assert fits[2]["min_size_bytes"] == 1 << 20 and d < 1 << 20
    lo = 1 << ((int(d) // 8).bit_length() - 1)  # largest power of two <= D*/8
    rem = {(r["topic"], r["group_size"]): r for r in rep["remedies"]}
    r8, r2 = rem[("fit", 8)], rem[("fit", 2)]
    assert r8["rule"] == "min_sizes" and "2 distinct size(s)" in r8["why"]
    assert r8["fix"][0].startswith("all_reduce_perf -b 8 -e 8G -f 2 -n 20 -g 8")
    assert r2["rule"] == "alpha_term_unmeasured" and "3 distinct size(s)" in r2["why"]
    assert f"--min-bytes {_size_arg(lo)}" in r2["fix"][1] and r2["fix"][1].startswith(
        "tracekit collect sweep --ops all_reduce --ranks 2")
    # the presets the log fell back on say why: its own fit was rejected
    assert rem[("reference", 8)]["rule"] == "preset" and "own all_reduce fit on 8 ranks was rejected" in rem[
        ("reference", 8)]["why"]
    # the terminal says the same
    assert main(["analyze", "--store", str(store.path), "--run", "log"]) == 0
    out = capsys.readouterr().out
    assert "Weak references and their remedies" in out and "[bold]" not in out
    assert "  rule min_sizes: 2 distinct sizes: need >= 3" in out
    assert "  rule alpha_term_unmeasured: every size >= the fit's crossover D*" in out
    assert f"--min-bytes {_size_arg(lo)}" in out


def test_no_reference_says_why_no_sweep(store, capsys):
    rep = _report(store, "hand", capsys)
    nr = [r for r in rep["remedies"] if r["rule"] == "no_reference"]
    assert {r["op"] for r in nr} == {"all_reduce", "all_gather"}
    for r in nr:
        # the store's only calibration run is the nccl-tests log: a H100/A100 benchmark, not 'Handmade GPU'
        assert "nccl-tests log log is another machine" in r["why"]
        assert r["fix"][0].startswith("tracekit analyze --link PRESET")


def test_sweep_fixture_rejects_by_spread(tmp_path, capsys):
    sweep = FIXTURES / "sweep_2rank"
    if not sweep.exists():
        pytest.skip("fixtures/sweep_2rank is absent")
    st = Store(tmp_path / "s")
    ingest_paths([sweep], st, run_id="sweep")
    ingest_paths([FIXTURES / "tp_2rank"], st, run_id="tp")
    rep = _report(st, "sweep", capsys)
    poor = [f for f in rep["fit"] if f["status"] == "poor" and f["scope"] == "group"]
    spread = [r for r in rep["remedies"] if r["topic"] == "fit" and r["rule"] == "spread"]
    assert {r["op"] for r in spread} == {f["op"] for f in poor if "spread" in f["status_reason"]}
    for r in spread:
        assert r["fix"][0].startswith("tracekit analyze --link PRESET")
    # the TP run's own one-size fit is rejected, but its verdicts stand on the sweep: nothing to fix
    tp = _report(st, "tp", capsys)
    own = [r for r in tp["remedies"] if r["topic"] == "fit"]
    refs = {r["reference"] for r in tp["references"] if r["op"] == "all_reduce"}
    assert refs == {"sweep run sweep"}
    assert own and own[0]["rule"] == "min_sizes" and own[0]["fix"] == ["none needed: its verdicts use sweep run sweep"]


def test_incomplete_group_says_record_every_rank(tmp_path, capsys):
    """Rank 0 of the 2-rank fixture relabelled as 1 of 8: its collectives are incomplete (1 of 8 ranks),
    so no verdict, and the remedy is every rank's trace, not a link."""
    d = json.loads((FIXTURES / "handmade" / "two_rank" / "rank0.json").read_text())
    d["distributedInfo"]["world_size"] = 8
    for e in d["traceEvents"]:
        if "Group size" in e.get("args", {}):
            e["args"]["Group size"] = 8
            e["args"]["Process Group Ranks"] = str(list(range(8)))
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "rank0.json").write_text(json.dumps(d))
    st = Store(tmp_path / "s")
    ingest_paths([tmp_path / "t"], st, run_id="r0of8")
    rep = _report(st, "r0of8", capsys)
    inc = {r["op"]: r for r in rep["remedies"] if r["rule"] == "incomplete"}
    assert set(inc) == {"all_reduce", "all_gather"}
    assert inc["all_reduce"]["why"].startswith("incomplete: 1 of 8 ranks recorded")
    assert inc["all_reduce"]["fix"][0].startswith("tracekit ingest FOLDER_OF_EVERY_RANK_FILE --replace")


def test_html_lists_the_remedies(store, tmp_path):
    from tracekit.report.html import write_html_report

    page = write_html_report(store, tmp_path / "r.html", run_id="log").read_text(encoding="utf-8")
    sec = page.split("Weak references and their remedies", 1)[1]
    assert "alpha_term_unmeasured" in sec and "all_reduce_perf -b 8 -e 8G -f 2 -n 20 -g 8" in sec


def test_remedies_never_offer_a_command_that_cannot_help():
    # unit: the fit rows as the report holds them (min/max sizes measured, the rule that rejected it)
    from tracekit.report.remedies import _fit_fix

    log, wide = dict(source="nccl_tests"), dict(min_size_bytes=4, max_size_bytes=8 << 30, crossover_bytes=1e6)
    # a log that already spans 4 B–8 GiB: its own command again is no remedy for outliers; --link is
    fix = _fit_fix("outliers", dict(wide, op="all_reduce", group_size=8), log)
    assert fix[0].startswith("tracekit analyze --link PRESET") and "already measured 4 B–8 GiB" in fix[0]
    assert not any(c.startswith("all_reduce_perf") for c in fix)
    assert fix[1].startswith("tracekit collect sweep --ops all_reduce --ranks 8 --iters 20")
    # a log of a narrow range still gets the nccl-tests command
    fix = _fit_fix("outliers", dict(wide, min_size_bytes=1 << 20, op="all_reduce", group_size=8), log)
    assert fix[0].startswith("all_reduce_perf -b 8 -e 8G -f 2 -n 20 -g 8")
    # broadcast: collect sweep does not measure it, so no sweep command is offered
    fix = _fit_fix("outliers", dict(wide, op="broadcast", group_size=8), log)
    assert not any("collect sweep" in c for c in fix)
    fix = _fit_fix("min_sizes", dict(op="broadcast", group_size=8), dict(source="kineto"))
    assert fix == ["tracekit analyze --link PRESET (tracekit predict links lists them) or --alpha TIME --beta RATE"
                   "   (tracekit collect sweep does not measure broadcast)"]


def test_after_a_rejected_sweep_the_remedy_does_not_loop():
    # the README's path: collect tp, then the suggested collect sweep, whose fit was rejected (a loaded
    # machine): the remedy must not print the command just run, but more repeats and why
    from tracekit.report.remedies import _sweep_fixes

    run = dict(backend="gloo", device_name=None)
    sweep = dict(run_id="sweep-1", source="kineto", backend="gloo", device=None,
                 fits=[("all_reduce", 2, "poor", "per-size residual spread 16% > 15%")])
    got = _sweep_fixes([sweep], run, "all_reduce", 2, " TAIL")
    assert got == ["tracekit collect sweep --ops all_reduce --ranks 2 --iters 50   on a quiet machine: sweep run "
                   "sweep-1 (spread) was rejected, and a sweep on a busy one fails the same way"]
    # another machine's rejected sweep, or none: the plain command; an op the sweep does not measure: nothing
    other = dict(sweep, backend="nccl", device="NVIDIA H100 80GB HBM3")
    assert _sweep_fixes([other], run, "all_reduce", 2, " TAIL") == ["tracekit collect sweep --ops all_reduce --ranks 2 TAIL"]
    assert _sweep_fixes([], run, "broadcast", 2, " TAIL") == []


def test_a_multi_node_log_gets_an_mpi_command_with_one_gpu_per_process(tmp_path, capsys):
    """The H100 fleet's 10 nodes × 1 GPU log: its all_gather fit on 10 ranks is rejected and the
    remedy is nccl-tests again. Ten GPUs on ten nodes are ten MPI processes of one GPU each, not
    one process driving 10 GPUs (``-g 10`` asks for ten GPUs on one node)."""
    from tests.conftest import shared_trace

    log = shared_trace("nccltests_h100_fleet/multi_node/nccl_N10_G1.log")
    st = Store(tmp_path / "s")
    rid = ingest_paths([log], st, run_id="g1")
    rep = _report(st, rid, capsys)
    fixes = [x for r in rep["remedies"] if r.get("op") == "all_gather" and r.get("group_size") == 10
             for x in r["fix"] if "all_gather_perf" in x]
    assert fixes and all(x.startswith("mpirun -np 10 all_gather_perf ") and " -g 1 " in x for x in fixes)
    assert not any(" -g 10" in x for r in rep["remedies"] for x in r["fix"])
