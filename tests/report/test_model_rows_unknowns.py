"""The "Model per step" table on traces that cannot support a plain ratio (../shared/traces):

- hta_ddp_v100_r1of2: its 2,020 all-reduces carry no size (no Input Dims), so no call can be
  predicted whatever the reference: the note says so, even with --link (it said "no α/β ... pass
  --link", which --link does not fix);
- hta_nccl_parser_a100_r0of2: rank 0 of 2, so its measured communication holds the wait for rank 1,
  which no recorded rank can split off: the ratio is an upper bound on the transfer's slowness, shown
  with "≤" and said in the caption.
"""

from __future__ import annotations

import pytest

from tests.conftest import TRACES
from tracekit.cli import main

pytestmark = pytest.mark.skipif(not TRACES.exists(), reason="../shared/traces absent")


def _model_table(capsys, store, run, *extra):
    assert main(["analyze", "--store", str(store), "--run", run, "--section", "model", *extra]) == 0
    out = capsys.readouterr().out
    return " ".join(out.split("Model per step", 1)[1].split("Gap per step", 1)[0].split())


def test_sizeless_collectives_are_not_called_a_missing_reference(tmp_path, capsys):
    store = tmp_path / "s"
    assert main(["ingest", str(TRACES / "hta_ddp_v100_r1of2"), "--store", str(store), "--run-id", "ddp"]) == 0
    capsys.readouterr()
    text = _model_table(capsys, store, "ddp", "--link", "nvlink2")
    assert "some collectives have no size or no model: not predicted" in text
    assert "no α/β for this run's collectives" not in text


def test_one_rank_of_two_bounds_the_ratio(tmp_path, capsys):
    store = tmp_path / "s"
    assert main(["ingest", str(TRACES / "hta_nccl_parser_a100_r0of2"), "--store", str(store), "--run-id", "r0"]) == 0
    capsys.readouterr()
    text = _model_table(capsys, store, "r0")
    assert "0 no_overlap 0.519 0.519 ≤ 25.41× (measured larger) preset:nvlink3" in text
    assert "includes waiting for ranks that were not recorded" in text


def test_references_show_nccls_per_size_values_as_a_range(session_store):
    # param_dlrm_8rank_v100: the preset reference is NCCL's model, which picks a protocol per size, so
    # an all-reduce's fixed latency and D* differ between instances: the report shows their range (it
    # showed one instance's value, which one depending on DuckDB's threads), and hosts unknown are said
    from tracekit import analyses
    from tracekit.report.data import build_report

    store = session_store("dlrm")
    con = analyses.connect(store)
    want = {op: (lo, hi, llo, lhi) for op, lo, hi, llo, lhi in con.execute(
        "SELECT op, min(crossover_bytes), max(crossover_bytes), min(ref_alpha_term_ns), max(ref_alpha_term_ns) "
        "FROM collective_verdicts WHERE verdict_basis = 'preset' GROUP BY op").fetchall()}
    refs = {r["op"]: r for r in build_report(store, "dlrm", con=con)["references"]}
    con.close()
    ar = refs["all_reduce"]
    assert want["all_reduce"][0] < want["all_reduce"][1]  # two protocols among its sizes
    assert ar["crossover_bytes"] is None and ar["fixed_latency_ns"] is None
    assert (ar["crossover_min_bytes"], ar["crossover_max_bytes"], ar["fixed_latency_min_ns"],
            ar["fixed_latency_max_ns"]) == want["all_reduce"]
    a2a = refs["all_to_all"]
    assert a2a["crossover_bytes"] == want["all_to_all"][0] == want["all_to_all"][1]
    assert "(unknown, ranks per host unknown)" in ar["note"] and "uneven" not in ar["note"]
