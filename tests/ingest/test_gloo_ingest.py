"""CPU-only (gloo) traces of our own collectors: issuer ↔ worker-span pairing, splits, p2p pairs.

Expected values are read off the raw traces by hand (see each fixture's NOTE.md).
"""

from __future__ import annotations

from tracekit import analyses
import gzip
import json

import pytest

from tests.conftest import FIXTURES
from tracekit.ingest import ingest_paths
from tracekit.store import Store


def _con(tmp_path, rel):
    store = Store(tmp_path / "s")
    ingest_paths([FIXTURES / rel], store)
    return analyses.connect(store)


def test_uneven_all_to_all_splits_and_wire_bytes(tmp_path):
    """ep_2rank rank 0: c10d::alltoall_base_ Concrete Inputs [3] = out splits, [4] = in splits, in rows
    of 128 floats. Dispatch in [171, 85] rows: sends the 85 rows for rank 1 = 85·128·4 = 43,520 B;
    combine in [171, 169]: sends 169·128·4 = 86,528 B."""
    con = _con(tmp_path, "ep_2rank")
    rows = con.execute(
        "SELECT seq, dtype, size_bytes, wire_bytes, in_splits, out_splits FROM collectives WHERE rank = 0 ORDER BY seq LIMIT 3"
    ).fetchall()
    assert rows[0] == (0, "long int", 64, 32, [], [])  # the split-count exchange: 8 int64, even
    assert rows[1] == (1, "float", 256 * 128 * 4, 43_520, [171 * 128, 85 * 128], [171 * 128, 169 * 128])
    assert rows[2] == (2, "float", 340 * 128 * 4, 86_528, [171 * 128, 169 * 128], [171 * 128, 85 * 128])
    # uneven sizes per rank are not a disagreement
    assert con.execute("SELECT count(*), bool_or(disagree), bool_and(complete) FROM collective_instances").fetchone() == (12, False, True)


def test_every_split_pair_is_consistent_across_ranks(tmp_path):
    """What rank s sends to rank r equals what r receives from s (in_splits[s][r] == out_splits[r][s])."""
    con = _con(tmp_path, "ep_2rank")
    bad = con.execute(
        """
        SELECT count(*) FROM collectives a JOIN collectives b ON a.pg_name = b.pg_name AND a.seq = b.seq
        WHERE len(a.in_splits) = 2 AND len(b.out_splits) = 2 AND a.in_splits[b.rank + 1] <> b.out_splits[a.rank + 1]
        """
    ).fetchone()[0]
    assert bad == 0


def test_sweep_pairs_issuers_with_gloo_spans(tmp_path):
    """sweep_2rank: 18 calls per op per rank; gloo runs reduce_scatter as 'gloo:all_reduce' and the
    issuing c10d::_reduce_scatter_base_ names it; barriers are their own op."""
    con = _con(tmp_path, "sweep_2rank")
    rows = dict(((r, op), n) for r, op, n in con.execute("SELECT rank, op, count(*) FROM collectives GROUP BY ALL").fetchall())
    for r in (0, 1):
        for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
            assert rows[(r, op)] == 18
        assert rows[(r, "barrier")] == 30
    assert rows[(0, "send")] == 18 and rows[(1, "recv")] == 18
    sizes = [r[0] for r in con.execute(
        "SELECT DISTINCT size_bytes FROM collectives WHERE op = 'reduce_scatter' ORDER BY 1").fetchall()]
    assert sizes == [1024 * 4**i for i in range(6)]  # 1 KiB .. 1 MiB, the reduce-scatter input


def test_sweep_send_recv_pairs_match(tmp_path):
    """c10d::send Concrete Inputs [2] = dst 1 on rank 0; c10d::recv_ [2] = src 0 on rank 1: one p2p
    group 'p2p:0->1', matched in order; the send's wire bytes are its size, the recv's 0."""
    con = _con(tmp_path, "sweep_2rank")
    assert con.execute(
        "SELECT count(*), bool_and(complete), bool_or(disagree), min(op), max(op) FROM collective_instances WHERE pg_name = 'p2p:0->1'"
    ).fetchone() == (18, True, False, "send", "send")
    assert con.execute(
        "SELECT rank, op, peer, sum(wire_bytes) = sum(size_bytes) FROM collectives WHERE pg_name = 'p2p:0->1' GROUP BY ALL ORDER BY rank"
    ).fetchall() == [(0, "send", 1, True), (1, "recv", 0, False)]
    # a recv's span covers its blocking wait: it starts no later than the c10d::recv_ call
    raw = json.loads(gzip.decompress((FIXTURES / "sweep_2rank" / "rank1.pt.trace.json.gz").read_bytes()))["traceEvents"]
    first_recv = min(e["ts"] for e in raw if e.get("name") == "c10d::recv_")
    t0 = con.execute("SELECT min(ts_ns) FROM collectives WHERE rank = 1 AND op = 'recv'").fetchone()[0]
    assert t0 == round(first_recv * 1000)


def test_main_thread_stays_compute_when_it_sends(tmp_path):
    """gloo:send/recv run on the caller's thread: that thread's aten ops remain compute."""
    con = _con(tmp_path, "sweep_2rank")
    n = con.execute(
        "SELECT count(*) FROM events WHERE class = 'compute' AND track IN "
        "(SELECT track FROM events WHERE name IN ('gloo:send', 'gloo:recv'))"
    ).fetchone()[0]
    assert n > 0


@pytest.mark.parametrize("rel", ["tp_chunks_2rank"])
def test_tp_chunks_counts(tmp_path, rel):
    """overlap-chunks 4: 32 all-reduces of 32,768 B per rank (see its NOTE.md)."""
    con = _con(tmp_path, rel)
    assert con.execute("SELECT rank, count(*), max(size_bytes) FROM collectives GROUP BY rank ORDER BY rank").fetchall() == [
        (0, 32, 32768), (1, 32, 32768)
    ]


def test_worker_spans_out_of_issue_order_pair_by_shape(tmp_path):
    """Two async all-to-alls issued A (100 rows) then B (60 rows); gloo's second worker thread
    starts B's span first. Pairing by order alone would swap them; by shape it does not."""
    def c10d(ts, rows, in_splits):
        return {"ph": "X", "cat": "cpu_op", "name": "c10d::alltoall_base_", "pid": 1, "tid": 1, "ts": ts, "dur": 2.0,
                "args": {"Input Dims": [[rows, 8], [rows, 8], [], [], [], [], []],
                         "Input type": ["float", "float", "", "ScalarList", "ScalarList", "Scalar", "Scalar"],
                         "Concrete Inputs": ["", "", "", str(in_splits), str(in_splits), "True", "-1"]}}

    def span(ts, tid, rows):
        return {"ph": "X", "cat": "user_annotation", "name": "gloo:all_to_all", "pid": 1, "tid": tid, "ts": ts,
                "dur": 50.0, "args": {"Input Dims": [[rows, 8]], "Input type": ["float"]}}

    evs = [c10d(1000.0, 100, [40, 60]), c10d(1005.0, 60, [30, 30]), span(1007.0, 3, 60), span(1010.0, 2, 100),
           {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1020.0, "dur": 5.0}]
    (tmp_path / "rank0.json").write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": evs}))
    store = Store(tmp_path / "s")
    ingest_paths([tmp_path / "rank0.json"], store)
    rows = analyses.connect(store).execute("SELECT ts_ns, size_bytes, in_splits FROM collectives ORDER BY issue_ts_ns").fetchall()
    # A: 100 rows × 8 floats = 3,200 B, its span starts at 1010 µs; B: 60 × 8 × 4 = 1,920 B at 1007 µs
    assert rows == [(1_010_000, 3200, [320, 480]), (1_007_000, 1920, [240, 240])]
