"""analyses/process_groups.sql and the report's per-dimension section, on hand-written 4-rank
NCCL-style traces (tp 2 × dp 2, Megatron order: tp groups [0,1] [2,3], dp groups [0,2] [1,3]).

Every rank, in µs: its tp group's all-reduce at 1000 for 50 (1 MiB), its dp group's all-reduce
at 2000 for 100 (4 MiB) with a GEMM on another stream at 2050–2150 (so 50 of the 100 µs overlap
compute), a world all-reduce at 3000 for 10 (4 bytes). All ranks start together: sync = duration.
"""

from __future__ import annotations

import json

import pytest

from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.report.data import build_report, by_dimension
from tracekit.store import Store

GROUPS = {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
DESC = {"1": "tp", "2": "tp", "3": "dp", "4": "dp"}
LAYOUT = {"order": "tp-dp", "tp": 2, "dp": 2}


def _kernel(name, ts, dur, stream, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": 0, **args}}


def _ar(pg, ts, dur, nelems):
    ranks = GROUPS[pg]
    return _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ts, dur, 7,
                   Seq=0, **{"Collective name": "allreduce", "In msg nelems": nelems, "Out msg nelems": nelems,
                             "dtype": "Float", "Group size": len(ranks), "Process Group Name": pg,
                             "Process Group Ranks": json.dumps(ranks), "In split size": "[]", "Out split size": "[]"})


def write_run(folder, pg_desc=True):
    folder.mkdir()
    for r in range(4):
        tp = "1" if r < 2 else "2"
        dp = "3" if r % 2 == 0 else "4"
        ev = [_ar(tp, 1000.0, 50.0, 262_144), _ar(dp, 2000.0, 100.0, 1_048_576),
              _kernel("sm90_xmma_gemm_f32f32_f32f32", 2050.0, 100.0, 13), _ar("0", 3000.0, 10.0, 1)]
        pgc = [{"pg_name": n, "pg_desc": DESC.get(n, "default_pg"), "ranks": g} for n, g in GROUPS.items() if r in g]
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Handmade GPU"}],
               "distributedInfo": {"backend": "nccl", "rank": r, "world_size": 4, "pg_config": pgc},
               "traceEvents": ev}
        (folder / f"rank{r}.json").write_text(json.dumps(doc))
    return folder


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    base = tmp_path_factory.mktemp("pg")
    st = Store(base / "store")
    named = {"parallel_layout": LAYOUT, "process_groups": [
        {"pg_name": n, "desc": d, "ranks": GROUPS[n]} for n, d in DESC.items()] + [
        {"pg_name": "0", "desc": "default_pg", "ranks": GROUPS["0"]}]}
    ingest_paths([str(write_run(base / "a"))], st, run_id="named", config=named)
    ingest_paths([str(write_run(base / "b"))], st, run_id="layout", config={"parallel_layout": LAYOUT})
    ingest_paths([str(write_run(base / "c"))], st, run_id="bare", config={})
    # a description overrides the layout: group 1 called 'pp' is pp
    wrong = {"parallel_layout": LAYOUT, "process_groups": [{"pg_name": "1", "desc": "pp", "ranks": [0, 1]}]}
    ingest_paths([str(write_run(base / "d"))], st, run_id="desc_wins", config=wrong)
    return st


def _rows(store, run_id):
    con = analyses.connect(store, [run_id])
    try:
        return con.execute(
            "SELECT pg_name, description, dimension, group_size, ranks, ops, calls, instances, incomplete, bytes, "
            "sync_time_ns, comm_ns, overlap_ns, overlap_fraction FROM process_groups ORDER BY pg_name").fetchall()
    finally:
        con.close()


def test_named_groups_by_description(store):
    assert _rows(store, "named") == [
        # world: 4 ranks × 10 µs; no dimension of size 4 in the layout
        ("0", "default_pg", "other", 4, [0, 1, 2, 3], "all_reduce", 4, 1, 0, 4, 10_000.0, 40_000, 0, 0.0),
        # tp: 262,144 floats = 1 MiB; 2 ranks × 50 µs, no compute then
        ("1", "tp", "tp", 2, [0, 1], "all_reduce", 2, 1, 0, 1_048_576, 50_000.0, 100_000, 0, 0.0),
        ("2", "tp", "tp", 2, [2, 3], "all_reduce", 2, 1, 0, 1_048_576, 50_000.0, 100_000, 0, 0.0),
        # dp: 4 MiB; each rank's 100 µs call has the GEMM over its last 50 µs
        ("3", "dp", "dp", 2, [0, 2], "all_reduce", 2, 1, 0, 4_194_304, 100_000.0, 200_000, 100_000, 0.5),
        ("4", "dp", "dp", 2, [1, 3], "all_reduce", 2, 1, 0, 4_194_304, 100_000.0, 200_000, 100_000, 0.5),
    ]


def test_dimension_inferred_from_the_layout(store):
    rows = _rows(store, "layout")
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("0", None, "other"), ("1", None, "tp"), ("2", None, "tp"), ("3", None, "dp"), ("4", None, "dp")]


def test_no_description_no_layout_is_other(store):
    assert {r[2] for r in _rows(store, "bare")} == {"other"}


def test_description_wins_over_the_layout(store):
    dims = {r[0]: r[2] for r in _rows(store, "desc_wins")}
    assert dims == {"0": "other", "1": "pp", "2": "tp", "3": "dp", "4": "dp"}


def test_report_sums_per_dimension(store):
    rep = build_report(store, "named")
    assert [g["pg_name"] for g in rep["process_groups"]] == ["3", "4", "0", "1", "2"]  # by dimension, then name
    dims = {d["dimension"]: d for d in rep["by_dimension"]}
    assert [d["dimension"] for d in rep["by_dimension"]] == ["dp", "tp", "other"]
    assert (dims["dp"]["groups"], dims["dp"]["bytes"], dims["dp"]["overlap_fraction"]) == (2, 8_388_608, 0.5)
    assert (dims["tp"]["calls"], dims["tp"]["comm_ns"], dims["tp"]["overlap_fraction"]) == (4, 200_000, 0.0)
    assert by_dimension([]) == []


def test_p2p_pair_inferred_along_its_dimension():
    """A send/recv pair whose ranks differ by a dimension's stride, inside one of its groups, is that
    dimension (tp 2 × dp 2 × pp 2: strides 1, 2, 4); a pair that crosses two groups is not."""
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE runs AS SELECT 'r' AS run_id, ? AS config, 'kineto' AS source",
                [json.dumps({"parallel_layout": {"order": "tp-dp-pp", "tp": 2, "dp": 2, "pp": 2}})])
    pairs = {"p2p:0->4": [0, 4], "p2p:0->2": [0, 2], "p2p:2->1": [2, 1], "p2p:5->4": [5, 4]}
    con.execute("CREATE TABLE collectives (run_id VARCHAR, rank INTEGER, event_id BIGINT, pg_name VARCHAR, "
                "pg_ranks INTEGER[], group_size INTEGER, op VARCHAR, dur_ns BIGINT)")
    for i, (name, ranks) in enumerate(pairs.items()):
        con.execute("INSERT INTO collectives VALUES ('r', ?, ?, ?, ?, 2, 'send', 10)", [ranks[0], i, name, ranks])
    con.execute("CREATE TABLE collective_instances AS SELECT 'r' AS run_id, 'x' AS pg_name, true AS complete, "
                "1::BIGINT AS size_bytes, 1.0::DOUBLE AS sync_time_ns, 'send' AS op, false AS mismatched")
    from tracekit.model import SIZE_BUCKET_SQL

    con.execute(SIZE_BUCKET_SQL)
    con.execute("CREATE TABLE collective_overlap AS SELECT 'r' AS run_id, 0 AS rank, 0::BIGINT AS event_id, "
                "0::BIGINT AS overlap_ns")
    con.execute(analyses.sql_text("process_groups"))
    assert sorted(con.execute("SELECT dim, size, stride FROM _pg_layout").fetchall()) == [
        ("dp", 2, 2), ("pp", 2, 4), ("tp", 2, 1)]
    got = dict(con.execute("SELECT pg_name, dimension FROM process_groups").fetchall())
    # [1, 2]: stride 1 but ranks 1 and 2 are in different tp groups ([0, 1], [2, 3])
    assert got == {"p2p:0->4": "pp", "p2p:0->2": "dp", "p2p:2->1": "other", "p2p:5->4": "tp"}
