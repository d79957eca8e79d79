"""Intra- vs inter-node classing (analyses/node_locality.sql): fixtures/defects/two_hosts (ranks on
node-a and node-b), fixtures/ep_2rank (one host), and one rank of two_hosts alone (the other
rank's host unknown)."""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES
from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.store import Store


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("store"))
    ingest_paths([FIXTURES / "defects" / "two_hosts"], store, run_id="hosts")
    ingest_paths([FIXTURES / "ep_2rank"], store, run_id="ep")
    ingest_paths([FIXTURES / "defects" / "two_hosts" / "rank0.json"], store, run_id="half")
    c = analyses.connect(store)
    yield c
    c.close()


def test_instances_classed_by_hosts(con):
    rows = con.execute("SELECT run_id, locality, hosts, hosts_unknown, count(*) FROM instance_locality "
                       "GROUP BY ALL ORDER BY ALL").fetchall()
    assert rows == [
        ("ep", "intra_node", 1, 0, 12),      # both ranks on the recording machine
        ("half", "unknown", 1, 1, 5),        # group [0, 1], rank 1's trace not ingested: one known host only
        ("hosts", "inter_node", 2, 0, 5),    # node-a and node-b
    ]


def test_bandwidth_per_class_by_hand(con):
    (row,) = con.execute("SELECT op, instances, total_bytes, median_sync_time_ns, median_algbw_gbps, median_busbw_gbps, "
                         "max_busbw_gbps, bucket_bytes FROM bandwidth_by_locality WHERE run_id = 'hosts'").fetchall()
    assert row[7] == 4096  # one size: one power-of-two bucket, [4 KiB, 8 KiB)
    # 5 all-reduces of 4,096 B; after the clock offset, sync times 28, 28, 28, 28 and 128 µs (instance 4:
    # rank 1 leaves 200 µs late, fixtures/defects/make_defects.py); median 28 µs;
    # algbw = 4,096 B / 28,000 ns = 0.146286 GB/s, busbw = algbw × 2(2−1)/2
    assert row[:4] == ("all_reduce", 5, 20_480, 28_000.0)
    assert row[4] == pytest.approx(4096 / 28_000) and row[5] == pytest.approx(4096 / 28_000)
    assert row[6] == pytest.approx(4096 / 28_000)


def test_report_section(con):
    from tracekit.report.html import locality_figure
    from tracekit.report.data import build_report

    rep = build_report(run_id="hosts", con=con)
    assert [(r["locality"], r["op"], r["instances"]) for r in rep["bandwidth_by_locality"]] == [
        ("inter_node", "all_reduce", 5)]
    # one (op, class, size) point: no plot, one line with the point (tests/report/test_plots_carry_information.py)
    assert locality_figure({"report": rep}) == ("a single point (all_reduce, inter-node, 4 KiB–8 KiB: median busbw "
                                                "0.15 GB/s over 5 instances)")
