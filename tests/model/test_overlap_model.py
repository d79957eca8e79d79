"""The run config's explicit overlap model ({kind, params}) and the one mapping of older run configs.

The stored fixtures predate the ``overlap_model`` key: measured_vs_model maps their layout to a
model in one function (analyses.measured_vs_model.overlap_model). Checked here: that mapping on
every fixture, by hand from its run_config.json; that a config carrying the explicit model gives
the same rows as the mapped one; and that pp's collector writes what the mapping reads.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tracekit import analyses
from tracekit.analyses.measured_vs_model import overlap_model
from tests.conftest import FIXTURES
from tracekit.ingest import ingest_paths
from tracekit.store import Store


def _cfg(rel):
    return json.loads((FIXTURES / rel / "run_config.json").read_text())


@pytest.mark.parametrize(
    "rel, want",
    [
        ("tp_2rank", {"kind": "no_overlap", "params": {}}),
        ("tp_chunks_2rank", {"kind": "chunked", "params": {"chunks": 4}}),
        ("ep_2rank", {"kind": "no_overlap", "params": {}}),
        ("ep_2rank/tbo", {"kind": "two_batch", "params": {"layers": 2}}),
        ("kv_bulk_2rank", {"kind": "no_overlap", "params": {}}),
        ("kv_layerwise_2rank", {"kind": "layerwise", "params": {"layers": 4}}),
        ("pp_2rank", {"kind": "pipeline", "params": {"stages": 2, "microbatches": 4}}),
        ("sweep_2rank", {"kind": "no_overlap", "params": {}}),
    ],
)
def test_old_run_configs_map_to_a_model(rel, want):
    cfg = _cfg(rel)
    assert "overlap_model" not in cfg  # recorded before the key existed
    assert overlap_model(cfg.get("workload"), cfg) == want


def test_pp_decode_maps_the_median_stage_time_and_the_decode_message():
    cfg = _cfg("pp_decode_2rank")
    per_stage = sorted(st["decode_per_microbatch_s"] for st in cfg["timing"]["stage_compute_s"])
    msg = [m["bytes"] for m in cfg["expected"]["messages"] if m["kind"] == "activation" and m["phase"] == "decode"]
    assert len(per_stage) == 2 and msg
    assert overlap_model("pp", cfg) == {
        "kind": "pp_decode", "params": {"stages": 2, "stage_compute_s": per_stage[1], "message_bytes": msg[0]}}


def test_the_explicit_model_wins_and_gives_the_same_rows(tmp_path):
    """kv_layerwise with its model written out gives the mapped rows; relabelled no_overlap (the
    workload still says layerwise), the model column follows the key, not the workload."""
    store = Store(tmp_path / "s")
    cfg = _cfg("kv_layerwise_2rank")
    for name, model in [("explicit", overlap_model("disagg_kv", cfg)), ("none", {"kind": "no_overlap", "params": {}}),
                        ("odd", {"kind": "warp_drive", "params": {}})]:
        d = tmp_path / name
        shutil.copytree(FIXTURES / "kv_layerwise_2rank", d)
        (d / "run_config.json").write_text(json.dumps(dict(cfg, overlap_model=model)))
        ingest_paths([d], store, run_id=name)
    ingest_paths([FIXTURES / "kv_layerwise_2rank"], store, run_id="mapped")
    con = analyses.connect(store, link="eth25")
    q = "SELECT * EXCLUDE (run_id) FROM measured_vs_model WHERE run_id = ? ORDER BY rank"
    mapped = con.execute(q, ["mapped"]).fetchall()
    assert [r[7] for r in mapped] == ["layerwise", "layerwise"]
    assert con.execute(q, ["explicit"]).fetchall() == mapped
    none = con.execute("SELECT model, predicted_exposed_ns, predicted_comm_ns FROM measured_vs_model "
                       "WHERE run_id = 'none' ORDER BY rank").fetchall()
    assert [r[0] for r in none] == ["no_overlap", "no_overlap"] and all(r[1] == r[2] for r in none)
    odd = con.execute("SELECT model, predicted_exposed_ns, note FROM measured_vs_model WHERE run_id = 'odd'").fetchall()
    assert odd and all(r[1] is None and "unknown overlap model 'warp_drive'" in r[2] for r in odd)


def test_pp_collector_writes_what_the_mapping_reads():
    pytest.importorskip("torch")
    from tracekit.collectors.workloads import pp

    cfg = _cfg("pp_decode_2rank")
    fake = pp.PPConfig(ranks=2, stages=2, mode="decode", microbatches=cfg["microbatches"])
    got = pp._pp_overlap_model(fake, cfg["expected"]["messages"], cfg["timing"]["stage_compute_s"])
    assert got == overlap_model("pp", cfg)
    train = pp._pp_overlap_model(pp.PPConfig(ranks=2, stages=2, mode="train", microbatches=4), [], [])
    assert train == overlap_model("pp", _cfg("pp_2rank"))
