"""The HTML report's figures in headless Chromium at 1,000 and 1,600 px: no two text boxes overlap.

A script added to the page (here, not in the product) collects the bounding boxes of each plotly
figure's title, legend, colour bars, annotations (panel titles included), axis titles, tick labels
and plot areas, and of the page's section headings; it writes every overlapping pair of boxes with
different owners, and every figure text drawn outside its figure (cut off), into a DOM node read
back with ``--dump-dom``. A tick label, axis title, legend or title over another panel's plot area
counts as an overlap. Reports: the EP fixture (all-to-all), the nccl-tests sweep fixture, and, when
../shared/traces has them, the 8-rank DLRM set, the nccl-tests logs of 8 A100s and the pairwise
nccl-tests logs of a 10-node H100 fleet.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import CHROMIUM_PAGES_AT_ONCE, FIXTURES, TRACES
from tracekit.ingest import ingest_paths
from tracekit.report.html import TITLE_CHARS, _figure_html, wrap_title, write_html_report
from tracekit.store import Store

WIDTHS = (1000, 1600)

OVERLAP_JS = r"""
(function () {
  function box(el) { var r = el.getBoundingClientRect(); return {x0: r.left, y0: r.top, x1: r.right, y1: r.bottom}; }
  function collect() {
    var items = [];
    function add(el, kind, owner, what) {
      var b = box(el);
      if (b.x1 - b.x0 < 1 || b.y1 - b.y0 < 1) { return; }
      b.kind = kind; b.owner = owner; b.what = owner.split(':')[0] + ' ' + what; items.push(b);
    }
    document.querySelectorAll('h2, h3').forEach(function (h) { add(h, 'heading', 'page', h.textContent.slice(0, 40)); });
    document.querySelectorAll('.plotly-graph-div').forEach(function (fig) {
      var f = fig.id;
      fig.querySelectorAll('.gtitle').forEach(function (e) { add(e, 'title', f + ':title', 'title ' + e.textContent.slice(0, 40)); });
      fig.querySelectorAll('.legend').forEach(function (e) { add(e, 'legend', f + ':legend', 'legend'); });
      fig.querySelectorAll('.colorbar').forEach(function (e, i) { add(e, 'colorbar', f + ':cb' + i, 'colorbar'); });
      fig.querySelectorAll('.infolayer .annotation').forEach(function (e, i) {
        add(e, 'annotation', f + ':a' + i, 'annotation ' + e.textContent.slice(0, 40)); });
      fig.querySelectorAll('.infolayer [class*="title"]').forEach(function (e) {
        var m = (e.getAttribute('class') || '').match(/^g-(x|y)(\d*)title$/);
        if (m) { add(e, 'axistitle', f + ':' + m[1] + (m[2] || ''), m[0] + ' ' + e.textContent.slice(0, 30)); }
      });
      fig.querySelectorAll('.cartesianlayer .subplot').forEach(function (sp) {
        var id = (sp.getAttribute('class') || '').replace('subplot', '').trim();  // xy, x2y2, ...
        sp.querySelectorAll('g[class$="tick"] > text, g[class$="tick2"] > text').forEach(function (t) {
          var ax = (t.parentNode.getAttribute('class') || '').charAt(0);  // xtick, x2tick, ytick, y3tick ...
          add(t, 'tick', f + ':' + id + ':' + ax, 'tick ' + id + ' ' + t.textContent.slice(0, 30)); });
      });
      fig.querySelectorAll('.draglayer > g').forEach(function (g) {  // each subplot's drag rectangle = its plot area
        var r = g.querySelector('rect.nsewdrag');
        if (r) { add(r, 'area', f + ':' + (g.getAttribute('class') || '').trim(), 'plot area ' + g.getAttribute('class')); }
      });
    });
    return items;
  }
  function meet(a, b) { return Math.min(a.x1, b.x1) - Math.max(a.x0, b.x0) > 1 && Math.min(a.y1, b.y1) - Math.max(a.y0, b.y0) > 1; }
  function run() {
    var items = collect(), bad = [], kinds = {};
    items.forEach(function (b) { kinds[b.kind] = (kinds[b.kind] || 0) + 1; });
    for (var i = 0; i < items.length; i++) {
      for (var j = i + 1; j < items.length; j++) {
        var a = items[i], b = items[j];
        if (a.owner === b.owner || (a.kind === 'heading' && b.kind === 'heading')) { continue; }
        if (a.kind === 'area' || b.kind === 'area') {  // only text that is not the panel's own content
          var other = a.kind === 'area' ? b : a;
          if (other.kind === 'area' || other.kind === 'annotation' || other.kind === 'heading') { continue; }
        }
        if (meet(a, b)) { bad.push(a.what + ' | ' + b.what); }
      }
    }
    document.querySelectorAll('.plotly-graph-div').forEach(function (fig) {  // svg text past the figure is cut off
      var fb = box(fig);
      items.forEach(function (b) {
        if (b.kind === 'heading' || b.kind === 'area' || b.owner.split(':')[0] !== fig.id) { return; }
        if (b.x0 < fb.x0 - 1 || b.x1 > fb.x1 + 1 || b.y0 < fb.y0 - 1 || b.y1 > fb.y1 + 1) {
          bad.push(b.what + ' | outside its figure'); }
      });
    });
    var s = document.createElement('div');
    s.id = 'tk-overlaps'; s.hidden = true;
    s.setAttribute('data-kinds', JSON.stringify(kinds));
    s.textContent = JSON.stringify(bad);
    document.body.appendChild(s);
  }
  window.addEventListener('load', function () { setTimeout(run, 1500); });
})();
"""


def _chromium():
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
    if exe is None:
        pytest.skip("Debian's chromium is not installed (run `bash tests/setup_chromium.sh`)")
    return exe


def overlaps(page, width: int, tmp_path) -> tuple[list[str], dict]:
    """The overlapping pairs (and the boxes collected, by kind) of ``page`` drawn at ``width`` px."""
    exe = _chromium()
    probe = tmp_path / f"{page.stem}.{width}.probe.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", f"<script>{OVERLAP_JS}</script></body>"),
                     encoding="utf-8")
    p = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
         "--disable-background-networking", "--virtual-time-budget=15000", f"--window-size={width},1000",
         f"--user-data-dir={tmp_path / ('ud-' + probe.stem)}", "--dump-dom", probe.resolve().as_uri()],
        capture_output=True, text=True, timeout=180, encoding="utf-8", errors="replace")
    assert p.returncode == 0, p.stderr[-2000:]
    m = re.search(r'<div id="tk-overlaps"[^>]*data-kinds="([^"]*)"[^>]*>([^<]*)</div>', p.stdout)
    assert m, "the overlap probe wrote nothing (the page did not finish drawing?)"
    return json.loads(html.unescape(m.group(2))), json.loads(html.unescape(m.group(1)))


def _pages(tmp_path):
    st = Store(tmp_path / "s")
    yield write_html_report(st, tmp_path / "ep.html", run_id=ingest_paths([FIXTURES / "ep_2rank"], st, run_id="ep"))
    yield write_html_report(st, tmp_path / "sweep.html",
                            run_id=ingest_paths([FIXTURES / "sweep_2rank"], st, run_id="sweep"))
    if (TRACES / "param_dlrm_8rank_v100").exists():
        yield write_html_report(st, tmp_path / "dlrm.html",
                                run_id=ingest_paths([TRACES / "param_dlrm_8rank_v100"], st, run_id="dlrm"))
    logs = sorted((TRACES / "superbench_nccl_tests_a100x8").glob("*.log"))
    if logs:
        yield write_html_report(st, tmp_path / "nccl.html", run_id=ingest_paths(logs, st, run_id="nccl"))
    fleet = TRACES / "nccltests_h100_fleet" / "pairwise"  # 10 nodes, every pair: the fleet's panels
    if fleet.exists():
        yield write_html_report(st, tmp_path / "fleet.html", run_id=ingest_paths([fleet], st, run_id="fleet"))


def test_no_overlapping_text_in_figures(tmp_path):
    _chromium()
    bad, seen, probes = [], [], []
    with ThreadPoolExecutor(CHROMIUM_PAGES_AT_ONCE) as pool:  # each page drawn while the next is written
        for page in _pages(tmp_path):
            probes += [(page, width, pool.submit(overlaps, page, width, tmp_path)) for width in WIDTHS]
            seen.append(page.stem)
        for page, width, probe in probes:
            pairs, kinds = probe.result()
            # the probe saw the figures' parts (not a page whose plots failed to draw)
            assert kinds.get("title", 0) >= 2 and kinds.get("tick", 0) >= 20 and kinds.get("area", 0) >= 3, (page.stem, kinds)
            bad += [f"{page.stem} @{width}px: {p}" for p in pairs]
    assert not bad, "\n".join(bad)
    assert {"ep", "sweep"} <= set(seen)


def test_probe_finds_a_legend_over_a_title(tmp_path):
    """The probe is not blind: a legend placed on the figure's title and a title longer than the
    figure are both reported."""
    import plotly.graph_objects as go

    st = Store(tmp_path / "s")
    page = write_html_report(st, tmp_path / "tp.html", run_id=ingest_paths([FIXTURES / "tp_2rank"], st, run_id="tp"))
    fig = go.Figure(go.Scatter(x=[1, 2], y=[1, 2], name="a series with a long legend name"))
    fig.update_layout(title=dict(text="probe title " + "word " * 60, x=0.01, xanchor="left", y=0.95, yanchor="middle"),
                      height=400, margin=dict(t=80), showlegend=True,
                      legend=dict(orientation="h", x=0.02, y=0.95, yanchor="middle", yref="container"))
    div = _figure_html(fig.to_dict(), "probe")  # a dict: written as it is (no title wrapping)
    page.write_text(page.read_text(encoding="utf-8").replace(
        '<section id="tk-summary">', f'<section id="tk-probe">{div}</section><section id="tk-summary">', 1),
        encoding="utf-8")
    pairs, _ = overlaps(page, 1000, tmp_path)
    assert any(p.startswith("tk-fig-probe title") and "tk-fig-probe legend" in p for p in pairs), pairs
    assert any(p.startswith("tk-fig-probe title") and p.endswith("outside its figure") for p in pairs), pairs


def test_wrap_title():
    text = "Bus bandwidth vs message size (measured instances by verdict; α–β fit and preset links from the model)"
    wrapped, added = wrap_title(text + "<br><sup>" + "note " * 40 + "</sup>")
    lines = wrapped.split("<br>")
    assert added == 2 and len(lines) == 4  # 103 characters → 2 lines; a 199-character note → 2 lines
    assert all(len(ln) <= TITLE_CHARS for ln in lines[:2]) and " ".join(lines[:2]) == text
    assert all(ln.startswith("<sup>") and ln.endswith("</sup>") for ln in lines[2:])
    assert wrap_title("short") == ("short", 0)
