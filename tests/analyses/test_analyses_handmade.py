"""Matching, waits, sync time, straggler, bandwidth and overlap on a hand-written 2-rank trace.

Every expected number is worked out in fixtures/handmade/NOTE.md.
"""

from __future__ import annotations

from tracekit import analyses
import pytest



@pytest.fixture(scope="module")
def con(session_store):
    c = analyses.connect(session_store("two"))
    yield c
    c.close()


def test_collectives_rows_from_kernel_args(con):
    rows = con.execute(
        "SELECT rank, seq, op, size_bytes, wire_bytes, group_size, dtype, meta_source, algo, proto "
        "FROM collectives ORDER BY rank, seq"
    ).fetchall()
    assert rows == [
        # all_reduce: S = 1,048,576 × 4 B; wire = 2(2−1)/2 · S
        (0, 0, "all_reduce", 4194304, 4194304, 2, "Float", "kernel_args", "RING", "LL"),
        # all_gather: S = output 524,288 × 2 B; wire = (2−1)/2 · S
        (0, 1, "all_gather", 1048576, 524288, 2, "BFloat16", "kernel_args", "RING", "LL"),
        (1, 0, "all_reduce", 4194304, 4194304, 2, "Float", "kernel_args", "RING", "LL"),
        (1, 1, "all_gather", 1048576, 524288, 2, "BFloat16", "kernel_args", "RING", "LL"),
    ]


def test_instances_exact(con):
    rows = con.execute(
        "SELECT seq, op, ranks_seen, complete, last_arrival_ns, first_arrival_ns, skew_ns, sync_time_ns, straggler "
        "FROM collective_instances ORDER BY seq"
    ).fetchall()
    assert rows == [
        # Kineto ts are µs: 1020 µs = 1,020,000 ns; sync = median(30, 40) µs = 35 µs.
        (0, "all_reduce", 2, True, 1_020_000, 1_000_000, 20_000, 35_000.0, 1),
        # sync = median(2010 − 2004, 2016 − 2004) µs = 9 µs.
        (1, "all_gather", 2, True, 2_004_000, 2_000_000, 4_000, 9_000.0, 1),
    ]


def test_waits_exact(con):
    rows = con.execute("SELECT seq, rank, wait_ns, is_straggler FROM collective_waits ORDER BY seq, rank").fetchall()
    assert rows == [(0, 0, 20_000, False), (0, 1, 0, True), (1, 0, 4_000, False), (1, 1, 0, True)]


def test_bandwidth_exact(con):
    rows = con.execute("SELECT seq, algbw_gbps, bus_factor, busbw_gbps FROM collective_bandwidth ORDER BY seq").fetchall()
    ar, ag = rows
    assert ar[1] == pytest.approx(4194304 / 35_000, rel=1e-12)  # 119.837257 GB/s
    assert ar[2] == 1.0  # all_reduce 2(n−1)/n, n = 2
    assert ar[3] == pytest.approx(119.8372571, rel=1e-9)
    assert ag[1] == pytest.approx(1048576 / 9_000, rel=1e-12)  # 116.508444 GB/s
    assert ag[2] == 0.5  # all_gather (n−1)/n
    assert ag[3] == pytest.approx(58.2542222, rel=1e-9)


def test_overlap_exact(con):
    rows = con.execute(
        "SELECT rank, comm_ns, compute_ns, overlap_ns, exposed_comm_ns, overlap_ratio FROM overlap_by_rank ORDER BY rank"
    ).fetchall()
    assert rows[0] == (0, 60_000, 70_000, 20_000, 40_000, pytest.approx(1 / 3, rel=1e-12))
    assert rows[1] == (1, 52_000, 0, 0, 52_000, 0.0)


def test_collective_overlap_per_call(con):
    rows = con.execute(
        "SELECT rank, ts_ns, overlap_ns, overlap_fraction FROM collective_overlap ORDER BY rank, ts_ns"
    ).fetchall()
    # rank 0 all_reduce [1000, 1050] µs vs GEMM [1030, 1100]: 20 µs of 50 covered.
    assert rows[0] == (0, 1_000_000, 20_000, pytest.approx(0.4))
    assert rows[1] == (0, 2_000_000, 0, 0.0)
    assert rows[2][2:] == (0, 0.0)
