"""A figure is drawn only when its data can carry it: the intra-/inter-node plot needs a known
locality and more than one point; otherwise the page says, in one line, why there is no plot."""

from __future__ import annotations

import re

from tests.conftest import FIXTURES
from tracekit.ingest import ingest_paths
from tracekit.report.html import NotDrawn, html_data, locality_figure, render_html
from tracekit.store import Store


def _row(op, loc, bucket, busbw, n=4):
    return dict(op=op, locality=loc, bucket_bytes=bucket, median_busbw_gbps=busbw, max_busbw_gbps=busbw,
                instances=n, total_bytes=bucket * n, median_sync_time_ns=1000.0)


def test_every_locality_unknown_is_not_drawn():
    rows = [_row("all_reduce", "unknown", 1 << 20, 10.0), _row("all_reduce", "unknown", 1 << 22, 20.0)]
    got = locality_figure({"report": {"bandwidth_by_locality": rows}})
    assert isinstance(got, NotDrawn) and "locality of every collective is unknown" in got


def test_single_point_is_not_drawn_and_two_are():
    one = locality_figure({"report": {"bandwidth_by_locality": [_row("all_gather", "intra_node", 1 << 20, 12.5, 3)]}})
    assert one == "a single point (all_gather, intra-node, 1 MiB–2 MiB: median busbw 12.50 GB/s over 3 instances)"
    # an unknown class beside a known one: still drawn (the known class carries the comparison)
    two = locality_figure({"report": {"bandwidth_by_locality": [
        _row("all_gather", "intra_node", 1 << 20, 12.5), _row("all_gather", "unknown", 1 << 20, 3.0)]}})
    assert not isinstance(two, str) and [t.name for t in two.data] == ["all_gather, intra-node", "all_gather, unknown"]


def _locality_in_page(page: str) -> tuple[bool, str | None]:
    line = re.search(r'<p class="note" id="tk-not-drawn-locality">(.*?)</p>', page)
    return 'id="tk-sec-locality"' in page, line and line.group(1)


def test_page_says_why_instead_of_an_empty_plot(tmp_path):
    st = Store(tmp_path / "s")
    data = html_data(st, ingest_paths([FIXTURES / "sweep_2rank"], st, run_id="sweep"))
    drawn, line = _locality_in_page(render_html(data))
    assert drawn and line is None  # one host, many sizes: the plot
    for r in data["report"]["bandwidth_by_locality"]:
        r["locality"] = "unknown"  # as a trace with no host names
    drawn, line = _locality_in_page(render_html(data))
    assert not drawn
    assert line.startswith("Intra- vs inter-node — not drawn: the locality of every collective is unknown")


def test_dlrm_set_has_no_locality_plot(session_store):
    data = html_data(session_store("dlrm"), "dlrm")
    assert {r["locality"] for r in data["report"]["bandwidth_by_locality"]} == {"unknown"}  # its traces name no host
    drawn, line = _locality_in_page(render_html(data))
    assert not drawn and "unknown" in line
