"""Group size from the call itself, mismatched instances kept apart, null where one rank cannot say.

Hand-made Kineto traces written into tmp_path; every expected number is worked out in the comments
from the trace's own timestamps (µs in the file, ns in the store).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.store import Store

A100 = "NVIDIA A100-SXM4-80GB"


def _call(events: list, *, pid: int, tid: int, corr: int, ts: float, cpu_ops: list[tuple[str, dict]],
          kernel: str, k_ts: float, k_dur: float) -> None:
    """One collective as PyTorch records it: nested CPU ops (outermost first) around a
    cudaLaunchKernel whose correlation id the kernel carries."""
    for depth, (name, args) in enumerate(cpu_ops):
        cat = "user_annotation" if name.startswith("nccl:") else "cpu_op"
        events.append(dict(ph="X", cat=cat, name=name, pid=pid, tid=tid, ts=ts + depth, dur=20 - 2 * depth,
                           args=dict(args, **{"External id": corr * 10 + depth})))
    events.append(dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", pid=pid, tid=tid, ts=ts + 5, dur=3,
                       args={"correlation": corr, "External id": corr * 10 + 9}))
    events.append(dict(ph="X", cat="kernel", name=kernel, pid=0, tid=7, ts=k_ts, dur=k_dur,
                       args={"device": 0, "stream": 7, "correlation": corr, "External id": corr * 10 + 9}))


def _write(path, rank: int, world: int | None, events: list, device: str = A100) -> None:
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": device, "computeMajor": 8}],
           "traceEvents": events}
    if world is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    path.write_text(json.dumps(doc))


AG = "ncclKernel_AllGather_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
RS = "ncclKernel_ReduceScatter_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
AR = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def _subgroup_rank(rank: int) -> list:
    """Rank ``rank`` of 8 traced, world 16: an all_gather and a reduce_scatter whose c10d ops give
    the group (output = 8 × input; input = 8 × output), and an all_reduce nothing names a group for."""
    ev: list = []
    # all_gather: output [65536, 64] float = 16,777,216 B; rank r's kernel starts at 1000 + 2r µs,
    # every rank's ends at 1100 µs
    _call(ev, pid=1, tid=1, corr=1, ts=990, kernel=AG, k_ts=1000 + 2 * rank, k_dur=100 - 2 * rank, cpu_ops=[
        ("c10d::_allgather_base_", {"Input Dims": [[65536, 64], [8192, 64], []], "Input type": ["float", "float", ""]}),
        ("nccl:_all_gather_base", {"Input Dims": [[8192, 64]], "Input type": ["float"]})])
    # reduce_scatter: input [65536, 384] float = 100,663,296 B; starts 2000 + r µs, ends 2107 µs
    _call(ev, pid=1, tid=1, corr=2, ts=1990, kernel=RS, k_ts=2000 + rank, k_dur=107 - rank, cpu_ops=[
        ("c10d::_reduce_scatter_base_", {"Input Dims": [[8192, 384], [65536, 384], [], [], []],
                                         "Input type": ["float", "float", "", "", "Scalar"]}),
        ("nccl:_reduce_scatter_base", {"Input Dims": [[65536, 384]], "Input type": ["float"]})])
    # all_reduce: 1,048,576 floats; no group evidence but the world size
    _call(ev, pid=1, tid=1, corr=3, ts=2990, kernel=AR, k_ts=3000, k_dur=50, cpu_ops=[
        ("nccl:all_reduce", {"Input Dims": [[1048576]], "Input type": ["float"]})])
    return ev


@pytest.fixture(scope="module")
def subgroup(tmp_path_factory):
    d = tmp_path_factory.mktemp("subgroup")
    for r in range(8):
        _write(d / f"rank{r}.json", r, 16, _subgroup_rank(r))
    store = Store(tmp_path_factory.mktemp("store"))
    ingest_paths([d], store, run_id="sub")
    con = analyses.connect(store)
    yield store, con
    con.close()


def test_all_gather_in_a_subgroup_of_8_in_a_world_of_16(subgroup):
    _, con = subgroup
    rows = con.execute("SELECT DISTINCT op, group_size, k_source, size_bytes FROM collectives ORDER BY op").fetchall()
    assert rows == [
        ("all_gather", 8, "shapes", 65536 * 64 * 4),  # [65536, 64] / [8192, 64] = 8
        ("all_reduce", 16, "world", 1048576 * 4),
        ("reduce_scatter", 8, "shapes", 65536 * 384 * 4),  # [65536, 384] / [8192, 384] = 8
    ]
    ag = con.execute("SELECT group_size, ranks_seen, complete, sync_time_ns, skew_ns, k_source "
                     "FROM collective_instances WHERE op = 'all_gather'").fetchone()
    # last arrival: rank 7 at 1014 µs; every end 1100 µs → sync 86 µs; skew 14 µs
    assert ag == (8, 8, True, 86_000.0, 14_000, "shapes")
    algbw, factor, busbw, k_source = con.execute(
        "SELECT algbw_gbps, bus_factor, busbw_gbps, k_source FROM collective_bandwidth WHERE op = 'all_gather'").fetchone()
    s = 65536 * 64 * 4
    assert algbw == pytest.approx(s / 86_000, rel=1e-12)  # 195.09 GB/s
    assert factor == 7 / 8  # (k−1)/k, k = 8 (16 would give 15/16)
    assert busbw == pytest.approx(s / 86_000 * 7 / 8, rel=1e-12)  # 170.70 GB/s
    assert k_source == "shapes"


def test_busbw_above_the_device_cap_is_flagged(subgroup):
    _, con = subgroup
    # reduce_scatter: last arrival 2007 µs, end 2107 µs → 100 µs; 100,663,296 B / 100 µs = 1006.6 GB/s,
    # × 7/8 = 880.8 GB/s > A100 NVLink 3's 300 GB/s per direction
    busbw, cap, over = con.execute(
        "SELECT busbw_gbps, cap_gbps, over_cap FROM collective_bandwidth WHERE op = 'reduce_scatter'").fetchone()
    assert busbw == pytest.approx(65536 * 384 * 4 / 100_000 * 7 / 8, rel=1e-12)
    assert cap == 300.0
    assert over is True
    ag = con.execute("SELECT over_cap FROM collective_bandwidth WHERE op = 'all_gather'").fetchone()
    assert ag == (False,)


def test_report_flags_world_k_and_over_cap(subgroup, tmp_path):
    store, _ = subgroup
    out = subprocess.run([sys.executable, "-m", "tracekit", "analyze", "--store", str(store.path), "--json"],
                         capture_output=True, text=True, check=True).stdout
    rep = json.loads(out)
    by_op = {r["op"]: r for r in rep["collectives"]}
    assert by_op["reduce_scatter"]["over_cap"] == 1
    assert by_op["all_reduce"]["k_world"] == 1
    assert any("exceed" in w and "reduce_scatter" in w for w in rep["warnings"])
    text = subprocess.run([sys.executable, "-m", "tracekit", "analyze", "--store", str(store.path), "--detail"],
                          capture_output=True, text=True, check=True).stdout
    assert "!" in text.split("Collectives per op (")[1].split("\n\n")[0]  # the peak is marked, not bare
    by_size = text.split("Collectives per op, class and size")[1].split("\n\n")[0]
    rs = [line for line in by_size.splitlines() if line.startswith("reduce_scatter")]
    assert rs and all("!" in line for line in rs)


def _mismatch_rank(rank: int) -> list:
    """Two ranks (kernel args with Seq and group): seq 0-3 all_reduce, 6-7 all_to_all, but at seq 4
    rank 0 ran an all_reduce where rank 1 ran an all_to_all, and the other way round at seq 5."""
    crossed = ["all_reduce", "all_to_all"] if rank == 0 else ["all_to_all", "all_reduce"]
    ops = ["all_reduce"] * 4 + crossed + ["all_to_all"] * 2
    ev = []
    for seq, op in enumerate(ops):
        start = 1000 + 100 * seq + (10 if rank == 1 else 0)  # rank 1 arrives 10 µs later
        name = {"all_reduce": "AllReduce", "all_to_all": "SendRecv"}[op]
        ev.append(dict(ph="X", cat="kernel", name=f"ncclDevKernel_{name}_RING_LL(x)", pid=0, tid=7, ts=start,
                       dur=50 - (10 if rank == 1 else 0),
                       args={"device": 0, "stream": 7, "correlation": 0, "Seq": seq,
                             "Collective name": {"all_reduce": "allreduce", "all_to_all": "all_to_all"}[op],
                             "In msg nelems": 1024, "Out msg nelems": 1024, "dtype": "Float", "Group size": 2,
                             "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
                             "In split size": "[]", "Out split size": "[]"}))
    return ev


@pytest.fixture(scope="module")
def mismatch(tmp_path_factory):
    d = tmp_path_factory.mktemp("mismatch")
    for r in range(2):
        _write(d / f"rank{r}.json", r, 2, _mismatch_rank(r), device="Handmade GPU")
    store = Store(tmp_path_factory.mktemp("store"))
    ingest_paths([d], store, run_id="mm")
    return store


def test_mismatched_instances_kept_apart(mismatch):
    con = analyses.connect(mismatch)
    # each rank: seq 0-3 all_reduce, seq 4/5 crossed, seq 6-7 all_to_all
    assert con.execute("SELECT seq, ranks, ops FROM mismatched_instances ORDER BY seq").fetchall() == [
        (4, [0, 1], ["all_reduce", "all_to_all"]), (5, [0, 1], ["all_to_all", "all_reduce"])]
    # counts as if seq 4 and 5 were absent: all_reduce 4, all_to_all 2 (each a wait of 10 µs on rank 0)
    assert con.execute("SELECT op, count(*) FROM collective_bandwidth GROUP BY op ORDER BY op").fetchall() == [
        ("all_reduce", 4), ("all_to_all", 2)]
    assert con.execute("SELECT count(*), sum(wait_ns) FROM collective_waits").fetchone() == (12, 6 * 10_000)
    assert con.execute("SELECT count(*) FROM collective_verdicts").fetchone() == (6,)
    assert con.execute("SELECT count(*) FROM collective_samples").fetchone()[0] <= 6
    rep = json.loads(subprocess.run([sys.executable, "-m", "tracekit", "analyze", "--store", str(mismatch.path),
                                     "--json"], capture_output=True, text=True, check=True).stdout)
    assert {r["op"]: r["count"] for r in rep["collectives"]} == {"all_reduce": 4, "all_to_all": 2}
    assert rep["instances"]["instances"] == 6
    assert len(rep["stragglers"]) == 6 and {s["seq"] for s in rep["stragglers"]} == {0, 1, 2, 3, 6, 7}
    assert [r["times_last"] for r in rep["straggler_ranks"]] == [6]
    assert len(rep["mismatched"]) == 2
    assert sum("mismatched instance" in w for w in rep["warnings"]) == 1
    assert rep["process_groups"][0]["instances"] == 6


def test_critical_path_has_no_edge_through_a_mismatched_instance(mismatch):
    from tracekit.analyses import critical_path

    con = analyses.connect(mismatch)
    assert con.execute("SELECT count(*) FROM critical_path").fetchone()[0] > 0
    con.execute(critical_path._ARRIVALS, ["mm"])  # each early span's last arrival: the cross-rank edges
    crossed = con.execute(
        "SELECT count(*) FROM _cp_arrivals a JOIN collectives c ON c.rank = a.rank AND c.event_id = a.event_id "
        "WHERE c.seq IN (4, 5)").fetchone()
    assert crossed == (0,)
    assert con.execute("SELECT count(*) FROM _cp_arrivals").fetchone() == (6,)  # rank 0 of each good instance


def test_group_size_from_shapes():
    from tracekit.ingest.attribute import group_size_from_shapes as k

    ag = {"name": "c10d::_allgather_base_", "input_dims": [[65536, 64], [8192, 64], []]}
    rs = {"name": "c10d::_reduce_scatter_base_", "input_dims": [[8192, 384], [65536, 384], [], [], []]}
    into = {"name": "c10d::allgather_into_tensor_coalesced_", "input_dims": [[96], [24]]}
    assert k("all_gather", [ag], None, None) == 8
    assert k("reduce_scatter", [rs], None, None) == 8
    assert k("all_gather", [into], None, None) == 4
    assert k("all_gather", [rs], None, None) is None  # not a gather's op
    assert k("all_gather", [{"name": "c10d::_allgather_base_", "input_dims": [[100], [30]]}], None, None) is None  # 100/30
    assert k("all_gather", [], {"in_nelems": 512, "out_nelems": 2048}, None) == 4  # record_param_comms counts
    assert k("all_gather", [], {"in_nelems": 512, "out_nelems": 512}, None) is None  # one count for both: no k
    assert k("reduce_scatter", [], {"in_nelems": 4096, "out_nelems": 256}, None) == 16
    assert k("all_to_all", [], None, "[3, 1, 2, 2]") == 4  # one split per peer
    assert k("all_to_all", [], None, "[]") is None  # even splits name no k
    assert k("all_reduce", [ag], None, None) is None


def _finish(res, world_size=16, pg_config=None):
    from tracekit.ingest.attribute import _finish_row

    base = dict(op="all_gather", meta_source="cpu_op_dims", size_bytes=1024, nbytes=4)
    row = _finish_row("r", 0, {"event_id": 1, "ts_ns": 0, "dur_ns": 1}, dict(base, **res), 0, world_size,
                      pg_config or {})
    return row["group_size"], row["k_source"]


def test_group_size_evidence_in_order():
    # metadata first, over the shapes
    assert _finish(dict(group_size=4, shape_k=8)) == (4, "metadata")
    assert _finish(dict(pg_ranks=[0, 1], shape_k=8)) == (2, "metadata")
    # then the shapes, over the group's recorded membership and the world
    assert _finish(dict(pg_name="7", shape_k=8), pg_config={"7": [0, 1, 2, 3]}) == (8, "shapes")
    # then the membership of the group the call names
    assert _finish(dict(pg_name="7"), pg_config={"7": [0, 1, 2, 3]}) == (4, "membership")
    # the default group's membership or the world size: a guess, flagged
    assert _finish(dict(), pg_config={"0": list(range(16)), "1": [0, 1]}) == (16, "world")
    assert _finish(dict(), pg_config={"0": list(range(16))}) == (16, "membership")  # the rank's only group
    # a GPU kernel is no 1-rank group's: rank 0's groups of 2+ ranks all have 16 → 16 (a CPU call could be the 1-rank one's)
    from tracekit.ingest.attribute import _finish_row
    cfg = {"0": list(range(16)), "5": [0]}
    kernel = _finish_row("r", 0, {"event_id": 1, "ts_ns": 0, "dur_ns": 1, "gpu": True},
                         dict(op="all_reduce", meta_source="name_only"), 0, 16, cfg)
    assert (kernel["group_size"], kernel["k_source"]) == (16, "membership")
    assert _finish(dict(), pg_config=cfg) == (16, "world")
    # every group of rank 0 has 16 ranks (a group without rank 0 does not count): k = 16 whichever it was
    assert _finish(dict(), pg_config={"0": list(range(16)), "1": list(range(16)), "2": [5, 6]}) == (16, "membership")
    assert _finish(dict()) == (16, "world")
    # nothing at all: unknown, not 1
    assert _finish(dict(), world_size=None) == (None, None)


def test_mismatched_pair_leaves_the_story_as_if_absent(mismatch, tmp_path):
    """The same two ranks without the crossed calls (seq 4 and 5 removed from both): stragglers,
    straggler ranks, counts, waits and verdict counts are the same as with them."""
    d = tmp_path / "without"
    d.mkdir()
    for r in range(2):
        ev = [e for e in _mismatch_rank(r) if e["args"]["Seq"] not in (4, 5)]
        _write(d / f"rank{r}.json", r, 2, ev, device="Handmade GPU")
    store = Store(tmp_path / "s")
    ingest_paths([d], store, run_id="mm")

    def story(st):
        rep = json.loads(subprocess.run([sys.executable, "-m", "tracekit", "analyze", "--store", str(st.path),
                                         "--json"], capture_output=True, text=True, check=True).stdout)
        return (sorted((r["op"], r["count"], r["total_wait_ns"], r["incomplete"]) for r in rep["collectives"]),
                [(s["seq"], s["op"], s["straggler"], s["skew_ns"], s["sync_time_ns"]) for s in rep["stragglers"]],
                rep["straggler_ranks"], rep["instances"],
                sorted((v["op"], v["verdict"], v["count"]) for v in rep["verdicts"]))

    assert story(mismatch) == story(store)


def test_html_names_a_peak_above_the_cap(tmp_path):
    """Two ranks, reduce_scatters of two sizes (k = 2 from the tensors): 100,663,296 B in 100 µs is
    1006.6 GB/s algbw, × 1/2 = 503.3 GB/s busbw > A100's 300; 25,165,824 B in 100 µs → 125.8 GB/s."""
    d = tmp_path / "t"
    d.mkdir()
    for r in range(2):
        ev: list = []
        for n, (rows, ts) in enumerate(((65536, 1000), (16384, 2000))):
            _call(ev, pid=1, tid=1, corr=n + 1, ts=ts - 10, kernel=RS, k_ts=ts, k_dur=100, cpu_ops=[
                ("c10d::_reduce_scatter_base_", {"Input Dims": [[rows // 2, 384], [rows, 384], [], [], []],
                                                 "Input type": ["float", "float", "", "", "Scalar"]})])
        _write(d / f"rank{r}.json", r, 2, ev)
    store = Store(tmp_path / "s")
    ingest_paths([d], store, run_id="h")
    subprocess.run([sys.executable, "-m", "tracekit", "analyze", "--store", str(store.path), "--html",
                    str(tmp_path / "r.html")], capture_output=True, text=True, check=True)
    page = (tmp_path / "r.html").read_text()
    assert page.count("! above the device&#x27;s 300.00 GB/s") + page.count("! above the device's 300.00 GB/s") == 1
    con = analyses.connect(store)
    got = con.execute("SELECT size_bytes, busbw_gbps, over_cap FROM collective_bandwidth ORDER BY size_bytes").fetchall()
    assert got == [(25165824, pytest.approx(25165824 / 100_000 / 2), False),
                   (100663296, pytest.approx(100663296 / 100_000 / 2), True)]


def test_size_from_c10d_output_input_ops_alone():
    """Without an nccl:* op, S comes from the c10d (output, input) op's right tensor: the all-gather's
    output (not × k again), the reduce-scatter's input."""
    from tracekit.ingest.attribute import _finish_row, _resolve

    def size(kernel, op_row):
        res = _resolve({"name": kernel, "gpu": True}, [op_row])
        return _finish_row("r", 0, {"event_id": 1, "ts_ns": 0, "dur_ns": 1}, res, 0, 16, {})["size_bytes"], res["shape_k"]

    ag = {"name": "c10d::_allgather_base_", "input_dims": [[65536, 64], [8192, 64], []], "input_type": ["float", "float", ""]}
    rs = {"name": "c10d::_reduce_scatter_base_", "input_dims": [[8192, 384], [65536, 384], [], [], []],
          "input_type": ["float", "float", "", "", "Scalar"]}
    assert size(AG, ag) == (65536 * 64 * 4, 8)
    assert size(RS, rs) == (65536 * 384 * 4, 8)
