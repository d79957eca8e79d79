"""benchmarks/synth_job.py: a synthetic N-rank job whose injected straggler, waits and clock
offsets tracekit must recover exactly after ingest."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

import tracekit
from tracekit.errors import BadInputError, FileError

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("synth_job", REPO / "benchmarks" / "synth_job.py")
synth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synth)

GLOO_BASE = REPO / "fixtures" / "3d_2x2x2" / "rank0.pt.trace.json.gz"  # CPU gloo: 10 all-reduces
NCCL_BASE = REPO.parent / "shared" / "traces" / "hta_nccl_parser_a100_r0of2" / "nccl_data.json.gz"


def _check_recovered(tmp_path: Path, truth: dict) -> tracekit.api.Run:
    """Ingest the job and compare every injected quantity with what tracekit computed."""
    run = tracekit.open(tmp_path / "store").ingest(truth["traces_dir"], run_id="synth")
    ranks = run.sql("SELECT rank, host, clock_offset_ns FROM ranks ORDER BY rank").df()
    assert ranks["clock_offset_ns"].tolist() == truth["clock_offset_ns"]
    assert ranks["host"].tolist() == truth["hosts"]

    inst = run.instances().set_index(["pg_name", "seq"])
    assert len(inst) == len(truth["instances"])
    waits = run.waits().set_index(["pg_name", "seq", "rank"])["wait_ns"]
    for t in truth["instances"]:
        row = inst.loc[(t["pg_name"], t["seq"])]
        assert bool(row["complete"]) and not bool(row["disagree"])
        assert (row["op"], int(row["size_bytes"]), int(row["group_size"])) == (t["op"], t["size_bytes"], len(t["ranks"]))
        assert int(row["straggler"]) == t["last_arrival_rank"]
        assert int(row["last_arrival_ns"]) == t["last_arrival_ns"]
        assert int(row["first_arrival_ns"]) == min(t["arrival_ns"])
        for r, w in zip(t["ranks"], t["wait_ns"]):
            assert int(waits.loc[(t["pg_name"], t["seq"], r)]) == w
    # the chosen straggler arrives last in every instance of its groups, and only there
    s = truth["straggler"]
    mine = [t for t in truth["instances"] if s in t["ranks"]]
    assert mine and all(int(inst.loc[(t["pg_name"], t["seq"]), "straggler"]) == s for t in mine)
    return run


def _raw_kernels(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return doc, [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "Seq" in (e.get("args") or {})]


def test_truth_matches_the_files_written(tmp_path):
    """Independent of tracekit: the rank files' own starts, shifted by the truth's offsets, are the
    truth's arrivals; every rank of a group agrees on op, size and seq; an instance ends at one time."""
    truth = synth.make_job(tmp_path / "job", 8, GLOO_BASE, layout="tp2xpp2xdp", seed=3, straggler=6,
                           gpus_per_node=2, compute_events=120)
    by_key = {(t["pg_name"], t["seq"]): t for t in truth["instances"]}
    seen = 0
    for r in range(8):
        doc, kernels = _raw_kernels(Path(truth["traces_dir"]) / f"rank{r}.pt.trace.json.gz")
        assert doc["distributedInfo"]["rank"] == r and doc["host_name"] == f"node{r // 2:04d}"
        assert len(doc["traceEvents"]) < 200  # trimmed: small per-rank files
        for e in kernels:
            a = e["args"]
            t = by_key[(a["Process Group Name"], a["Seq"])]
            i = t["ranks"].index(r)
            start = round(e["ts"] * 1000) + truth["clock_offset_ns"][r]
            assert start == t["arrival_ns"][i]
            assert start + round(e["dur"] * 1000) == t["end_ns"]
            assert json.loads(a["Process Group Ranks"]) == t["ranks"] and a["Group size"] == len(t["ranks"])
            seen += 1
    assert seen == sum(len(t["ranks"]) for t in truth["instances"])
    # 10 all-reduces of the base, round-robin over tp, pp, dp: 4 + 3 + 3 templates × 4 groups each
    assert len(truth["instances"]) == 40
    assert truth["clock_offset_ns"][:2] == [0, 0] and len(set(truth["clock_offset_ns"])) == 4


def test_recovers_8_ranks_3d_layout_exactly(tmp_path):
    truth = synth.make_job(tmp_path / "job", 8, GLOO_BASE, layout="tp2xpp2xdp", seed=1, straggler=5,
                           gpus_per_node=2, compute_events=150)
    run = _check_recovered(tmp_path, truth)
    dims = run.sql("SELECT pg_name, dimension FROM process_groups").df()
    want = {g["pg_name"]: g["pg_desc"] for g in truth["process_groups"] if g["pg_desc"] != "default_pg"}
    got = dict(zip(dims["pg_name"], dims["dimension"]))
    assert set(got) == {t["pg_name"] for t in truth["instances"]} == set(want)  # every group ran collectives
    assert got == want  # tp / pp / dp from the run config's parallel_layout, as injected


@pytest.mark.skipif(not NCCL_BASE.is_file(), reason="../shared/traces/hta_nccl_parser_a100_r0of2 is absent")
def test_recovers_16_ranks_from_a_gpu_trace(tmp_path):
    truth = synth.make_job(tmp_path / "job", 16, NCCL_BASE, layout="tp2xdp", seed=7, straggler=11,
                           gpus_per_node=4, compute_events=300)
    assert truth["dims"] == {"tp": 2, "dp": 8}
    # the base's 15 all-reduces and 6 broadcasts, alternating tp (8 groups) and dp (2 groups)
    assert len(truth["instances"]) == 11 * 8 + 10 * 2
    _check_recovered(tmp_path, truth)


def test_layout_and_groups():
    assert synth.parse_layout("tp2xpp2xdp", 16) == [("tp", 2), ("pp", 2), ("dp", 4)]
    groups = synth.process_groups(synth.parse_layout("tp2xpp2xdp", 8), 8)
    by_desc = {}
    for g in groups:
        by_desc.setdefault(g["pg_desc"], []).append(g["ranks"])
    assert by_desc == {
        "default_pg": [list(range(8))],
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "dp": [[0, 4], [1, 5], [2, 6], [3, 7]],
    }
    assert [g["pg_name"] for g in groups] == [str(i) for i in range(13)]
    for bad in ("tp3xdp", "tp2xzz", "tpxdp", "tp2xtp2xdp", "tp2xdp3"):
        with pytest.raises(BadInputError):
            synth.parse_layout(bad, 8)


def test_bad_inputs(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]}))
    with pytest.raises(FileError, match="no collective"):
        synth.make_job(tmp_path / "a", 4, plain)
    with pytest.raises(BadInputError, match="--straggler"):
        synth.make_job(tmp_path / "b", 4, GLOO_BASE, straggler=4)
    synth.make_job(tmp_path / "c", 4, GLOO_BASE, compute_events=50)
    with pytest.raises(BadInputError, match="already holds rank files"):
        synth.make_job(tmp_path / "c", 4, GLOO_BASE)
    assert synth.main(["--ranks", "1", "--base", str(GLOO_BASE), "--out", str(tmp_path / "d")]) == 2
