"""Ingest of the real traces in ../shared/traces, checked against independent computations.

Each test skips with a reason when ../shared is absent (a user's fresh clone).
"""

from __future__ import annotations

from tracekit import analyses
import gzip
import json
import math
from pathlib import Path

import pytest

from tests.conftest import TRACES, shared_trace
from tracekit.ingest import ingest_paths
from tracekit.store import Store

DTYPE = {"float": 4, "long int": 8, "int": 4}


def _load(path: Path) -> list[dict]:
    op = gzip.open if path.name.endswith(".gz") else open
    with op(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


def _union(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _intersection_len(a, b):
    i = j = 0
    tot = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            tot += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tot


def _independent_overlap(events):
    """HTA-style per-rank overlap from the raw JSON: kernels only, comm by 'nccl' in the name."""
    ks = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    comm = _union([(e["ts"], e["ts"] + e["dur"]) for e in ks if "nccl" in e["name"].lower()])
    comp = _union([(e["ts"], e["ts"] + e["dur"]) for e in ks if "nccl" not in e["name"].lower()])
    c = sum(e - s for s, e in comm)
    return (_intersection_len(comm, comp) / c) if c else None


@pytest.fixture(scope="module")
def dlrm(session_store):
    d = shared_trace("param_dlrm_8rank_v100")
    con = analyses.connect(session_store("dlrm"))
    yield d, "dlrm", con
    con.close()


def test_dlrm_every_nccl_kernel_gets_its_collective(dlrm):
    d, rid, con = dlrm
    for path in sorted(d.glob("worker*.json")):
        evs = _load(path)
        rank = json.loads(path.read_text())["distributedInfo"]["rank"]
        kernels = sorted((e for e in evs if e.get("cat") == "kernel" and "nccl" in e["name"]), key=lambda e: e["ts"])
        got = con.execute(
            "SELECT c.op, c.size_bytes, e.name, c.meta_source FROM collectives c "
            "JOIN events e USING (run_id, rank, event_id) WHERE c.rank = ? ORDER BY c.ts_ns",
            [rank],
        ).fetchall()
        assert len(got) == len(kernels) == 8
        for (op, size, name, src), k in zip(got, kernels):
            assert name == k["name"]
            assert op == ("all_to_all" if "SendRecv" in k["name"] else "all_reduce")
            assert src == "cpu_op_dims"
        # sizes: the nccl:* CPU ops in call order, Input Dims × Input type
        ops = sorted((e for e in evs if e.get("name", "").startswith("nccl:")), key=lambda e: e["ts"])
        want = [math.prod(o["args"]["Input Dims"][0]) * DTYPE[o["args"]["Input type"][0]] for o in ops]
        got_by_issue = [
            r[0] for r in con.execute("SELECT size_bytes FROM collectives WHERE rank = ? ORDER BY seq", [rank]).fetchall()
        ]
        assert got_by_issue == want


def test_dlrm_instances_complete_across_8_ranks(dlrm):
    _, rid, con = dlrm
    rows = con.execute(
        "SELECT count(*), min(ranks_seen), bool_and(complete), bool_or(disagree) FROM collective_instances"
    ).fetchone()
    assert rows == (8, 8, True, False)


def test_dlrm_overlap_matches_independent_interval_math(dlrm):
    d, rid, con = dlrm
    got = dict(con.execute("SELECT rank, overlap_ratio FROM overlap_by_rank").fetchall())
    for path in sorted(d.glob("worker*.json")):
        evs = _load(path)
        rank = json.loads(path.read_text())["distributedInfo"]["rank"]
        assert got[rank] == pytest.approx(_independent_overlap(evs), abs=1e-9)


def _ingest_one(tmp_path, rel):
    p = shared_trace(rel)
    store = Store(tmp_path / "store")
    rid = ingest_paths([p], store)
    return analyses.connect(store), rid


def test_tracelens_nccl_on_compute_stream_has_zero_overlap(tmp_path):
    con, _ = _ingest_one(tmp_path, "tracelens_b200_r0of8/eager_trace.json.gz")
    comm, overlap, ratio = con.execute("SELECT comm_ns, overlap_ns, overlap_ratio FROM overlap_by_rank").fetchone()
    assert comm > 0 and overlap == 0 and ratio == 0.0


def test_ddp_serialized_allreduces_overlap_near_zero(tmp_path):
    con, _ = _ingest_one(tmp_path, "hta_ddp_v100_r1of2/df_index_resolver.json.gz")
    n, ratio = con.execute(
        "SELECT (SELECT count(*) FROM collectives WHERE op = 'all_reduce'), overlap_ratio FROM overlap_by_rank"
    ).fetchone()
    assert n == 2020
    assert ratio < 0.01


def test_compute_only_trace_has_null_ratio_and_warning(tmp_path):
    from tracekit.report.data import build_report

    con, rid = _ingest_one(tmp_path, "single_gpu_compute/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    assert con.execute("SELECT overlap_ratio, comm_ns FROM overlap_by_rank").fetchone() == (None, 0)
    rep = build_report(Store(tmp_path / "store"), rid)
    assert rep["overlap_by_rank"][0]["overlap_ratio"] is None
    assert any("no communication" in w for w in rep["warnings"])


def _all_kineto_files():
    if not TRACES.exists():
        return [pytest.param(None, marks=pytest.mark.skip(reason="../shared/traces is not available"))]
    files = sorted(p for p in TRACES.rglob("*") if p.name.endswith((".json", ".json.gz")))
    return [pytest.param(p, id=str(p.relative_to(TRACES))) for p in files]


@pytest.mark.parametrize("path", _all_kineto_files())
def test_every_shared_kineto_file_ingests(tmp_path, path):
    store = Store(tmp_path / "s")
    rid = ingest_paths([path], store)
    con = analyses.connect(store)
    n_events, = con.execute("SELECT count(*) FROM events").fetchone()
    raw = [e for e in _load(path) if e.get("ph") == "X"]
    quarantined, = con.execute("SELECT sum(events_quarantined) FROM ranks").fetchone()
    assert n_events + quarantined == len(raw)
    assert con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [rid]).fetchone() == (1,)
