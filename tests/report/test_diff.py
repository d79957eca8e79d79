"""`tracekit diff RUN_A RUN_B`: per op and size bucket side by side, and the run totals.

The TP run against the same TP run recorded with `--overlap-chunks 4` (fixtures/tp_chunks_2rank;
the hand-made 2-rank trace stands in when that fixture is absent): the change in exposed
communication is the difference of the two runs' overlap_by_rank sums, computed here directly.
"""

from __future__ import annotations

from tracekit import analyses
import json

import pytest

from tests.conftest import FIXTURES
from tracekit.cli import main
from tracekit.report.diff import diff_runs, size_bucket
from tracekit.ingest import ingest_paths
from tracekit.store import Store

CHUNKS = FIXTURES / "tp_chunks_2rank"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = Store(tmp_path_factory.mktemp("diff-store"))
    ingest_paths([FIXTURES / "tp_2rank"], st, run_id="tp")
    ingest_paths([FIXTURES / "handmade" / "two_rank"], st, run_id="hand")
    if CHUNKS.exists():
        ingest_paths([CHUNKS], st, run_id="tp_chunks")
    ingest_paths([FIXTURES / "nccl_tests" / "two_runs.md"], st, run_id="log")
    return st


def _overlap_sums(store: Store, run_id: str) -> dict[str, int]:
    con = analyses.connect(store, run_ids=[run_id])
    comm, overlap, exposed = con.execute(
        "SELECT sum(comm_ns), sum(overlap_ns), sum(exposed_comm_ns) FROM overlap_by_rank WHERE run_id = ?", [run_id]
    ).fetchone()
    con.close()
    return dict(comm_ns=int(comm), overlap_ns=int(overlap), exposed_comm_ns=int(exposed))


def test_size_buckets():
    assert size_bucket(131072) == {"lo_bytes": 131072, "hi_bytes": 262144, "label": "128 KiB–256 KiB"}
    assert size_bucket(131071)["lo_bytes"] == 65536
    assert size_bucket(1)["label"] == "1 B–2 B"
    assert size_bucket(0)["label"] == "0 B" and size_bucket(None)["label"] == "unknown"
    assert size_bucket((1 << 40) - 1)["hi_bytes"] == 1 << 40


def test_tp_vs_chunked_exposed_change(store):
    other = "tp_chunks" if CHUNKS.exists() else "hand"
    d = diff_runs(store, "tp", other)
    a, b = _overlap_sums(store, "tp"), _overlap_sums(store, other)
    assert d["totals"]["a"]["exposed_comm_ns"] == a["exposed_comm_ns"]
    assert d["totals"]["b"]["exposed_comm_ns"] == b["exposed_comm_ns"]
    assert d["totals"]["delta"]["exposed_comm_ns"] == b["exposed_comm_ns"] - a["exposed_comm_ns"] != 0
    assert d["totals"]["delta"]["overlap_ns"] == b["overlap_ns"] - a["overlap_ns"]
    # rows are ordered by the size of the change in communication time
    changes = [abs(r["delta"]["comm_ns"] or 0) for r in d["rows"]]
    assert changes == sorted(changes, reverse=True)
    if other == "tp_chunks":
        # the same all-reduces cut into pieces: the unchunked run's bucket holds 131,072-byte calls,
        # the chunked run's a smaller bucket; overlap appears only with chunking
        assert a["overlap_ns"] == 0 and b["overlap_ns"] > 0
        ops = {(r["op"], r["bucket"]["lo_bytes"]) for r in d["rows"]}
        assert ("all_reduce", 131072) in ops


def test_handmade_rows_exact(store):
    d = diff_runs(store, "tp", "hand")
    rows = {(r["op"], r["bucket"]["label"]): r for r in d["rows"]}
    ar = rows[("all_reduce", "4 MiB–8 MiB")]
    assert ar["a"] is None and ar["delta"]["count"] == 1
    b = ar["b"]
    # NOTE.md: sync 35 µs, busbw = 4,194,304 B / 35 µs × 2(2−1)/2, waits 20 + 0 µs,
    # spans 50 + 40 µs, of which 20 µs under rank 0's GEMM
    assert (b["count"], b["median_sync_time_ns"], b["wait_ns"], b["comm_ns"], b["overlap_ns"], b["exposed_comm_ns"]) == (
        1, 35000.0, 20000, 90000, 20000, 70000)
    assert b["median_busbw_gbps"] == pytest.approx(4194304 / 35000)
    assert b["overlap_ratio"] == pytest.approx(20000 / 90000)
    ag = rows[("all_gather", "1 MiB–2 MiB")]["b"]
    assert (ag["count"], ag["median_sync_time_ns"], ag["wait_ns"], ag["comm_ns"], ag["overlap_ns"]) == (1, 9000.0, 4000, 22000, 0)
    tp = rows[("all_reduce", "128 KiB–256 KiB")]
    assert tp["b"] is None and tp["a"]["count"] == 8 and tp["delta"]["count"] == -8


def test_self_diff_is_zero(store):
    d = diff_runs(store, "tp", "tp")
    assert all(v in (0, None) for v in d["totals"]["delta"].values())
    for r in d["rows"]:
        assert r["a"] == r["b"] and r["sync_time_change"] == 0
        assert all(v in (0, 0.0, None) for v in r["delta"].values())


def test_diff_cli(store, capsys):
    assert main(["diff", "tp", "hand", "--store", str(store.path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["run_a"]["run_id"] == "tp" and d["run_b"]["run_id"] == "hand" and d["rows"]
    assert main(["diff", "tp", "hand", "--store", str(store.path)]) == 0
    out = capsys.readouterr().out
    assert "exposed comm ms" in out and "all_reduce" in out
    assert main(["diff", "tp", "nope", "--store", str(store.path)]) == 2


def test_log_has_no_timeline_values(store, capsys):
    """An nccl-tests log has no events: its comm, compute, overlap and wait are None (not 0), and so
    are their deltas; the counts and medians it does have stay. two_runs.md holds two all_reduce runs
    (sizes 1, 4, 64 MiB on 8 H100; 1, 8, 64 MiB on 2 A100), so the 1 MiB and 64 MiB buckets pool
    two benchmark runs and the 4 MiB and 8 MiB buckets one; each size is two instances (out-of-place
    and in-place)."""
    d = diff_runs(store, "log", "tp")
    assert d["run_a"]["timeline"] is False and d["run_b"]["timeline"] is True
    ta, td = d["totals"]["a"], d["totals"]["delta"]
    assert ta["ranks"] == 1 and all(ta[k] is None for k in ("comm_ns", "compute_ns", "overlap_ns", "exposed_comm_ns"))
    assert all(td[k] is None for k in ("comm_ns", "compute_ns", "overlap_ns", "exposed_comm_ns", "overlap_ratio"))
    rows = {(r["op"], r["bucket"]["lo_bytes"]): r for r in d["rows"]}
    assert {k[1]: rows[k]["a"]["groups"] for k in rows if rows[k]["a"]} == {
        1 << 20: 2, 4 << 20: 1, 8 << 20: 1, 64 << 20: 2}
    one = rows[("all_reduce", 1 << 20)]
    assert one["a"]["count"] == 4 and one["a"]["wait_ns"] is None and one["a"]["overlap_ratio"] is None
    assert one["delta"]["comm_ns"] is None and one["delta"]["count"] == -4
    # the trace's bucket, absent from the log: the log's side is unknown, not 0
    tp = rows[("all_reduce", 131072)]
    assert tp["a"] is None and tp["delta"]["comm_ns"] is None and tp["delta"]["count"] == 8
    assert main(["diff", "log", "tp", "--store", str(store.path)]) == 0
    out = capsys.readouterr().out
    assert "A (log) has no timeline" in out and "A all_reduce 1 MiB–2 MiB: 2" in out
