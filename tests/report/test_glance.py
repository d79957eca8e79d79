"""The report's "At a glance" (tracekit/report/glance.py): one ``summary`` dict, rendered first by
the terminal and the HTML page; the long per-size tables behind --detail / --section; one size
style per table; the line and pixel budgets on the shared traces (skipped without ../shared)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tracekit.ingest import ingest_paths
from tracekit.report.data import build_report
from tracekit.report.glance import glance_lines
from tracekit.report.textfmt import fmt_size
from tracekit.store import Store

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
TRACES = ROOT.parent / "shared" / "traces"
ENV = dict(os.environ, COLUMNS="120", PYTHONPATH=str(ROOT))


def _analyze(store: Store, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracekit", "analyze", "--store", str(store.path), *args],
                          capture_output=True, text=True, env=ENV, timeout=300)


def _answers(head: str) -> None:
    """The three questions, answered in these lines: cost vs model, hidden vs exposed, what to do."""
    assert "At a glance" in head
    assert re.search(r"worst collectives, by .*?\n\s+1\. .*?efficiency\s.*?against ", head, re.S), head
    assert "exposed communication:" in head
    assert "do next:" in head


@pytest.fixture(scope="module")
def tp(tmp_path_factory):
    st = Store(tmp_path_factory.mktemp("glance") / "s")
    ingest_paths([FIXTURES / "tp_2rank"], st, run_id="tp", workload="tp",
                 config=json.loads((FIXTURES / "tp_2rank" / "run_config.json").read_text()))
    return st


def test_summary_numbers_on_a_collected_tp_run(tp):
    rep = build_report(tp, "tp")
    assert next(iter(rep)) == "summary"  # the JSON opens with the answer
    s = rep["summary"]
    e = s["exposed"]
    # the parts of the exposed communication sum to it (measured_vs_model's gap decomposition)
    assert e["straggler_wait_ns"] + e["transfer_ns"] + e["not_hidden_ns"] == pytest.approx(e["exposed_ns"])
    # rank means of the per-step rows, by hand
    rows = rep["measured_vs_model"]
    assert e["exposed_ns"] == pytest.approx(sum(r["exposed_ns"] for r in rows) / len(rows))
    # a CPU gloo run: nothing overlaps (overlap 0 on both ranks), one op at one size; so that op's cost per step
    # (its mean wait + sync time, from the matched instances) is the exposed communication per step, which the
    # overlap analysis measures independently as |∪ comm| − |∪ comm ∩ ∪ compute|
    assert all(r["overlap_ns"] == 0 for r in rep["overlap_by_rank"])
    (w,) = s["worst"]
    assert (w["op"], w["group_size"], w["bucket_bytes"], w["per"]) == ("all_reduce", 2, 1 << 17, "step")
    assert w["cost_ns"] == pytest.approx(e["exposed_ns"], rel=1e-3)
    assert w["reference"] == "loopback_gloo" and w["basis"] == "preset"
    # no GPU: the step's wall time is not claimed, and the reason is given
    assert s["step"]["step_ns"] is None
    assert any("no GPU timeline" in n for n in s["not_judged"])
    # the recommendation is the largest positive gap part, with that part as its saving
    parts = {"straggler": e["straggler_wait_ns"], "transfer": e["transfer_ns"] - e["predicted_exposed_ns"],
             "exposure": e["not_hidden_ns"]}
    assert s["recommendation"]["kind"] == max(parts, key=parts.get)
    assert s["recommendation"]["saving_ns"] == pytest.approx(max(parts.values()))


def test_terminal_opens_with_the_answer_and_hides_the_long_tables(tp):
    p = _analyze(tp)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    _answers("\n".join(lines[:40]))
    assert "not shown: sizes" in p.stdout and "Collectives per op, class and size" not in p.stdout
    detail = _analyze(tp, "--detail").stdout
    assert "Collectives per op, class and size" in detail and "α–β fit per op and process group" in detail
    assert len(detail.splitlines()) > len(lines)
    only = _analyze(tp, "--section", "sizes").stdout
    assert "Collectives per op, class and size" in only and "At a glance" not in only and "Overlap per rank" not in only


def test_section_help_and_a_bad_name(tp):
    p = _analyze(tp, "--section", "help")
    assert p.returncode == 0 and p.stdout.splitlines()[0].startswith("glance") and "sizes" in p.stdout
    p = _analyze(tp, "--section", "nope")
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "unknown --section 'nope'" in p.stderr and "sizes" in p.stderr
    assert "Traceback" not in p.stderr


def test_html_renders_the_same_summary(tp, tmp_path):
    from tracekit.report.html import html_data, render_html

    rep = build_report(tp, "tp")
    page = render_html(html_data(tp, "tp", report=rep))
    glance = page.split('<section id="tk-summary">')[1].split("</section>")[0]
    import html as _html

    assert [_html.unescape(x) for x in re.findall(r"<li>(.*?)</li>", glance)] == glance_lines(rep["summary"])


def test_size_style_binary_like_the_buckets():
    assert fmt_size(8 * (1 << 30)) == "8 GiB" and fmt_size(4 * (1 << 30)) == "4 GiB"
    assert fmt_size(1576964) == "1.504 MiB" and fmt_size(448) == "448 B" and fmt_size(None) == "—"


def _shared(name: str) -> Path:
    p = TRACES / name
    if not p.exists():
        pytest.skip(f"../shared/traces/{name} is not available (a fresh clone has no ../shared)")
    return p


@pytest.fixture(scope="module")
def a100(tmp_path_factory):
    src = _shared("superbench_nccl_tests_a100x8")
    st = Store(tmp_path_factory.mktemp("a100") / "s")
    ingest_paths([src], st, run_id="a100")
    return st


def test_nccl_tests_sweep_budget_and_answers(a100):
    p = _analyze(a100)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) < 150, len(lines)
    head = "\n".join(lines[:40])
    _answers(head)
    assert "exposed communication: —" in head  # a log has no timeline: said, not invented
    assert "a nccl-tests log has no timeline" in head
    # one size style: the buckets are binary, so are the sizes beside them (8 GiB, not 8.59 GB)
    assert "8.59 GB" not in p.stdout and "8 GiB" in p.stdout
    s = build_report(a100, "a100")["summary"]
    assert s["step"] is None and s["exposed"] is None and len(s["worst"]) == 3
    # the worst are the sizes furthest below their reference: efficiencies < 1, ascending
    effs = [w["efficiency"] for w in s["worst"]]
    assert effs == sorted(effs) and all(0 < x < 1 for x in effs)
    assert any("reduce" in n and "no verdict" in n for n in s["not_judged"])  # the model has no reduce


def test_first_screen_on_the_dlrm_set_and_the_h100_fleet(session_store, tmp_path):
    st = session_store("dlrm")
    p = _analyze(st)
    head = "\n".join(p.stdout.splitlines()[:40])
    _answers(head)
    assert re.search(r"step: [\d.]+ ms", head) and "waiting for stragglers" in head
    s = build_report(st, "dlrm")["summary"]
    # the step's parts (GPU time breakdown) sum to its window
    st_ = s["step"]
    parts = ("compute_ns", "comm_hidden_ns", "comm_exposed_ns", "memory_ns", "sync_other_ns", "idle_ns")
    assert sum(st_[k] for k in parts) \
        == pytest.approx(st_["step_ns"])
    st = Store(tmp_path / "h100")
    ingest_paths([_shared("nccltests_h100_fleet") / "multi_node"], st, run_id="h100")
    _answers("\n".join(_analyze(st).stdout.splitlines()[:40]))


def test_html_of_the_sweep_under_6000_px(a100, tmp_path):
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
    if exe is None:
        pytest.skip("Debian's chromium is not installed (run `bash tests/setup_chromium.sh`)")
    page = tmp_path / "a100.html"
    p = _analyze(a100, "--html", str(page))
    assert p.returncode == 0, p.stderr
    out = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
         "--virtual-time-budget=10000", "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'ud'}",
         "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=180, errors="replace")
    m = re.search(r'<div id="tk-status"[^>]*data-scroll-height="(\d+)"', out.stdout)
    assert m, out.stderr[-2000:]
    assert int(m.group(1)) < 6000


def test_html_folds_the_long_tables(a100):
    from tracekit.report.html import FOLD_ROWS, html_data, render_html

    rep = build_report(a100, "a100")
    page = render_html(html_data(a100, "a100", report=rep))
    # the per-size table (one row per op and size bucket, far more than FOLD_ROWS) sits in a closed <details>,
    # with the efficiency against the link as a column of it; no separate efficiency-by-size table
    assert len(rep["by_size"]) > FOLD_ROWS
    folded = re.search(r'<details class="tk-long"><summary>(\d+) rows: show the table</summary>'
                       r'<div class="table-wrap"><table id="tk-table-per-size">', page)
    assert folded and int(folded.group(1)) == len(rep["by_size"])
    assert "vs link" in page.split('id="tk-table-per-size"')[1].split("</thead>")[0]
    assert "tk-table-efficiency-by-size" not in page
    # the verdicts stay open: they are the answer, not a detail
    assert '<details class="tk-long"><summary>' not in page.split('id="tk-table-verdicts"')[0].rsplit("<h3>", 1)[1]
