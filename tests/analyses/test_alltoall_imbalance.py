"""All-to-all imbalance (analyses/alltoall_imbalance.sql) on fixtures/ep_2rank, against the splits
the EP workload itself recorded (run_config.json "measured.splits", rows of 128 float32 = 512 B),
which the trace's splits never pass through."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FIXTURES
from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.store import Store

ROW = 128 * 4  # hidden 128, float32


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("store"))
    ingest_paths([FIXTURES / "ep_2rank"], store, run_id="ep")
    c = analyses.connect(store)
    yield c
    c.close()


def _expected():
    """seq → {(src, dst): bytes}. Per step and layer the trace has a split exchange (int64 [8] even:
    64 B, 32 B to each rank), the dispatch (rank s sends in_splits[s][d] rows to d) and the combine
    (the rows go back: s sends d what d dispatched to s)."""
    cfg = json.loads((FIXTURES / "ep_2rank" / "run_config.json").read_text())
    active = [s for s in cfg["measured"]["splits"] if s["active"]]
    assert [(s["step"], s["layer"]) for s in active] == [(2, 0), (2, 1), (3, 0), (3, 1)]
    out = {}
    for k, s in enumerate(active):
        sp = s["in_splits"]
        out[3 * k] = {(a, b): 32 for a in range(2) for b in range(2)}
        out[3 * k + 1] = {(a, b): sp[a][b] * ROW for a in range(2) for b in range(2)}
        out[3 * k + 2] = {(a, b): sp[b][a] * ROW for a in range(2) for b in range(2)}
    return out


def test_matrix_per_call_is_the_workloads_splits(con):
    want = _expected()
    got: dict = {}
    for seq, src, dst, b, rb in con.execute("SELECT seq, src, dst, bytes, recv_bytes FROM alltoall_matrix").fetchall():
        assert b == rb  # the receiver's out_splits agree with the sender's in_splits
        got.setdefault(seq, {})[(src, dst)] = b
    assert got == want
    # e.g. the first dispatch: rank 0 sends [171, 85] rows, rank 1 [169, 87] (fixtures/ep_2rank/NOTE.md)
    assert got[1] == {(0, 0): 171 * ROW, (0, 1): 85 * ROW, (1, 0): 169 * ROW, (1, 1): 87 * ROW}


def test_matrix_summed_over_the_run(con):
    want: dict = {}
    for cells in _expected().values():
        for k, v in cells.items():
            want[k] = want.get(k, 0) + v
    got = {(s, d): (n, b) for s, d, n, b in con.execute("SELECT src, dst, calls, bytes FROM alltoall_matrix_total").fetchall()}
    assert got == {k: (12, v) for k, v in want.items()}


def test_imbalance_per_call_by_hand(con):
    rows = {r[0]: r[1:] for r in con.execute(
        "SELECT seq, send_max_bytes, send_mean_bytes, send_imbalance, recv_max_bytes, recv_mean_bytes, recv_imbalance, "
        "heaviest_sender, heaviest_receiver, sync_time_ns, imbalance_cost_ns FROM alltoall_imbalance").fetchall()}
    assert len(rows) == 12
    for seq, cells in _expected().items():
        send = [sum(cells[(s, d)] for d in range(2)) for s in range(2)]
        recv = [sum(cells[(s, d)] for s in range(2)) for d in range(2)]
        smax, smean, si, rmax, rmean, ri, hs, hr, sync, cost = rows[seq]
        assert (smax, smean, rmax, rmean) == (max(send), sum(send) / 2, max(recv), sum(recv) / 2)
        assert si == pytest.approx(max(send) / (sum(send) / 2)) and ri == pytest.approx(max(recv) / (sum(recv) / 2))
        assert hs == send.index(max(send)) and hr == recv.index(max(recv))
        assert cost == pytest.approx(sync * (1 - 1 / max(si, ri)))
    # the first dispatch by hand: receivers get 171+169 = 340 and 85+87 = 172 rows; mean 256 → 340/256
    assert rows[1][5] == pytest.approx(340 / 256) and rows[1][7] == 0
    assert rows[0][2] == rows[0][5] == 1.0 and rows[0][9] == 0.0  # the even split exchange costs nothing


def test_slowest_rank_excess(con):
    ends = {}
    for seq, rank, end in con.execute("SELECT seq, rank, ts_ns + dur_ns FROM collectives").fetchall():
        ends.setdefault(seq, {})[rank] = end
    got = {s: (r, x) for s, r, x in con.execute("SELECT seq, slowest_rank, slowest_excess_ns FROM alltoall_imbalance").fetchall()}
    for seq, e in ends.items():
        last = max(e, key=lambda r: (e[r], -r))
        # two ranks: the median by quantile_disc is the lower end, so the excess is the difference of the ends
        assert got[seq] == (last, max(e.values()) - min(e.values()))


def test_report_section_heatmap_and_chromium(con, tmp_path):
    from tests.report.test_html_report import _run_chromium
    from tracekit.report.html import alltoall_heatmap, write_html_report
    from tracekit.report.data import build_report, report_json

    rep = build_report(run_id="ep", con=con)
    sec = json.loads(report_json(rep))["alltoall_imbalance"]
    assert sec["instances"] == 12 and len(sec["calls"]) == 10
    costs = [r["imbalance_cost_ns"] for r in sec["calls"]]
    assert costs == sorted(costs, reverse=True)
    (total,) = con.execute("SELECT sum(imbalance_cost_ns) FROM alltoall_imbalance").fetchone()
    assert sec["imbalance_cost_ns"] == pytest.approx(total)
    fig = alltoall_heatmap({"report": rep})
    want: dict = {}
    for cells in _expected().values():
        for k, v in cells.items():
            want[k] = want.get(k, 0) + v
    assert [list(r) for r in fig.data[0].z] == [[want[(0, 0)], want[(0, 1)]], [want[(1, 0)], want[(1, 1)]]]
    page = write_html_report(None, tmp_path / "ep.html", run_id="ep", report=rep, con=con)
    dom, log = _run_chromium(page, tmp_path, None)
    for name in ("alltoall", "locality"):  # and the intra/inter-node bars (one host: intra-node)
        part = dom.split(f'id="tk-sec-{name}"', 1)[1].split("</section>", 1)[0]
        assert f'id="tk-fig-{name}"' in part and 'class="main-svg"' in part, name
    assert "Uncaught" not in log
