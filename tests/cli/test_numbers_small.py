"""AMD devices never run programmatic dependent launch; ``Run.sql`` answers for its own run."""

from __future__ import annotations

import pytest

import tracekit
from tests.conftest import FIXTURES
from tracekit.ingest.linkpass import supports_pdl


@pytest.mark.parametrize("props, pdl", [
    ([{"name": "", "computeMajor": 9, "warpSize": 64}], False),  # an unnamed AMD gfx9 device
    ([{"name": "", "computeMajor": 9}], False),  # unnamed, no warp size: not known to be NVIDIA's
    ([{"name": "", "computeMajor": 9, "warpSize": 32}], True),  # a 32-wide warp: NVIDIA sm_90
    ([{"name": "gfx942", "computeMajor": 9}], False),
    ([{"name": "some GPU", "computeMajor": 9, "gcnArchName": "gfx90a:sramecc+:xnack-"}], False),
    ([{"name": "AMD Radeon Graphics", "computeMajor": 9, "warpSize": 64}], False),  # the shared MI250 trace's
    ([{"name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "warpSize": 32}], True),
])
def test_amd_devices_never_pdl(props, pdl):
    assert supports_pdl(props) is pdl


def test_run_sql_is_scoped_to_its_run(tmp_path):
    """Two runs in one store: each run's ``sql`` gives its own median, as its own ``bandwidth()`` does."""
    tk = tracekit.open(tmp_path / "store")
    a = tk.ingest(FIXTURES / "handmade" / "two_rank", run_id="a")
    b = tk.ingest(FIXTURES / "tp_2rank", run_id="b")
    for run in (a, b):
        want = run.bandwidth().groupby("op")["busbw_GBps"].median().to_dict()
        got = dict(run.sql("SELECT op, median(busbw_gbps) FROM collective_bandwidth GROUP BY op").fetchall())
        assert got.keys() == want.keys()
        for op, v in want.items():
            assert got[op] == pytest.approx(v, rel=1e-12)
        assert run.sql("SELECT DISTINCT run_id FROM collective_instances").fetchall() == [(run.run_id,)]
        assert run.sql("SELECT DISTINCT run_id FROM collectives").fetchall() == [(run.run_id,)]
    # the handmade run, by hand: all_reduce busbw 119.837 GB/s, all_gather 58.254 GB/s (tests/analyses/test_analyses_handmade.py)
    got = dict(a.sql("SELECT op, median(busbw_gbps) FROM collective_bandwidth GROUP BY op").fetchall())
    assert got == {"all_reduce": pytest.approx(119.8372571, rel=1e-9), "all_gather": pytest.approx(58.2542222, rel=1e-9)}
    # a second query on the same run, naming another analysis, is scoped too
    assert a.sql("SELECT count(*) FROM collective_waits").fetchall() == [(4,)]

    assert len(a.sql("EXPLAIN SELECT count(*) FROM collective_bandwidth").fetchall()) >= 1
