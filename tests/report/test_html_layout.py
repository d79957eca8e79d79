"""The HTML report's layout: reference links from the device and topology, versions, nothing
that points outside the page, empty sections as one line, the per-size table of sweeps, and no
horizontal overflow at 1400 px in headless Chromium (DLRM and nccl-tests traces when ../shared
has them, the repository's fixtures always)."""

from __future__ import annotations

import json

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import CHROMIUM_PAGES_AT_ONCE, FIXTURES, TRACES
from tracekit.report.html import html_data, reference_presets, render_html, run_versions, write_html_report
from tracekit.ingest import ingest_paths
from tracekit.store import Store


@pytest.mark.parametrize("device, backend, hosts, want", [
    ("NVIDIA H100 80GB HBM3", "nccl", 1, ["nvlink4"]),
    ("NVIDIA H100 80GB HBM3", "nccl", 2, ["nvlink4", "ib_ndr"]),
    ("NVIDIA B200", "nccl", 1, ["nvlink5"]),
    ("NVIDIA A100-SXM4-40GB", "nccl", 4, ["nvlink3", "ib_hdr"]),
    ("Tesla V100-SXM2-16GB", "nccl", 1, ["nvlink2"]),  # the model's device table (tracekit.model.links)
    ("NVIDIA B200", "nccl", 2, ["nvlink5", "ib_xdr"]),
    ("CPU: AMD EPYC", "gloo", 1, ["eth25", "eth100"]),
    ("Some Future GPU", "nccl", 1, ["nvlink4", "pcie4"]),
])
def test_reference_presets_from_device_and_topology(device, backend, hosts, want):
    ranks = [{"host": f"h{i % hosts}"} for i in range(8)]
    assert reference_presets({"device_name": device, "backend": backend}, ranks) == want
    assert reference_presets({"device_name": device, "backend": backend}, ranks, link="pcie5") == ["pcie5"]


def test_versions_only_when_recorded():
    assert run_versions({"torch_version": "2.13.0+cpu", "nccl_version": None}) == ["torch 2.13.0+cpu"]
    assert run_versions({"config": {"versions": {"nccl": "2.21.5"}}}) == ["NCCL 2.21.5"]
    assert run_versions({}) == []


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = Store(tmp_path_factory.mktemp("layout"))
    ingest_paths([FIXTURES / "tp_2rank"], st, run_id="tp")
    ingest_paths([FIXTURES / "sweep_2rank"], st, run_id="sweep")
    return st


def test_page_header_sections_and_no_outside_references(store):
    page = render_html(html_data(store, "tp"))
    header = re.search(r"<header>(.*?)</header>", page, re.S).group(1)
    assert "torch 2.13.0+cpu" in header and "NCCL —" not in header and "torch —" not in header
    assert "reference links: eth25, eth100" in header  # CPU / gloo: Ethernet, as the verdicts' default
    for ref in ("DESIGN.md", "alpha-beta.md", "STYLE.md", "../shared", "README"):
        assert ref not in page, ref
    assert "Nothing to draw" not in page


def test_per_size_table_for_sweeps(store):
    page = render_html(html_data(store, "sweep"))
    assert 'id="tk-table-per-size"' in page
    body = page.split('id="tk-table-per-size"')[1].split("</table>")[0]
    # sweep_2rank: sizes 1 KiB ... ×4: the 1 KiB bucket of all_reduce is there, one row per op and bucket
    assert "all_reduce" in body and "1 KiB–2 KiB" in body
    assert 'id="tk-table-per-size"' not in render_html(html_data(store, "tp"))  # one size: no table


def test_empty_sections_collapse_into_one_line(tmp_path):
    """fixtures/defects/ts_zero.json has no matched instances: no bandwidth dots, no waits, no
    model rows; those three are one line, not three empty boxes."""
    st = Store(tmp_path / "s")
    rid = ingest_paths([FIXTURES / "defects" / "ts_zero.json"], st)
    page = render_html(html_data(st, rid))
    sections = re.findall(r'<section id="tk-sec-([a-z-]+)"', page)
    assert sections.count("empty") == 1
    assert not {"bandwidth", "waits", "model"} & set(sections)
    line = re.search(r'<section id="tk-sec-empty">(.*?)</section>', page, re.S).group(1)
    assert {"Bandwidth vs message size", "Who waits for whom", "Measured vs model"} <= set(
        s.strip() for s in line.split(":", 1)[1].split("<", 1)[0].rstrip(".").split(","))


def _scroll(page, tmp_path):
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
    if exe is None:
        pytest.skip("Debian's chromium is not installed (run `bash tests/setup_chromium.sh`)")
    p = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
         "--disable-background-networking", "--virtual-time-budget=10000", "--window-size=1400,1000",
         f"--user-data-dir={tmp_path / ('ud-' + page.stem)}", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180, encoding="utf-8", errors="replace")
    assert p.returncode == 0, p.stderr[-2000:]
    m = re.search(r'<div id="tk-status"[^>]*>', p.stdout)
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', m.group(0)))
    return int(attrs["scroll-width"]), int(attrs["inner-width"]), int(attrs["box-overflow"]), attrs.get("box-overflow-at")


def _runs(store, session_store, tmp_path):
    yield store, "tp"
    yield store, "sweep"
    st = Store(tmp_path / "3d")  # many process groups, measured vs model per dimension
    yield st, ingest_paths([FIXTURES / "3d_2x2x2"], st, workload="3d", run_id="3d",
                           config=json.loads((FIXTURES / "3d_2x2x2" / "run_config.json").read_text()))
    st = Store(tmp_path / "two_runs")  # two benchmark runs: the per-size table's benchmark-run column
    yield st, ingest_paths([FIXTURES / "nccl_tests" / "two_runs.md"], st, run_id="two_runs")
    if (TRACES / "param_dlrm_8rank_v100").exists():
        yield session_store("dlrm"), "dlrm"
    nccl = TRACES / "superbench_nccl_tests_a100x8"
    if nccl.exists():
        st = Store(tmp_path / "nccl")
        logs = sorted(nccl.glob("*allreduce*.log")) or sorted(nccl.glob("*.log"))[:1]
        yield st, ingest_paths(logs[:1], st, run_id="nccl")


def test_overflow_measure_sees_a_wide_table(store, tmp_path):
    """The page's measure is not blind: a table with a 600-word cell that may not wrap does overflow its box."""
    page = render_html(html_data(store, "tp"))
    wide = "<div class='table-wrap'><table><tr>" + "<td style='white-space: nowrap'>" + "word " * 600 + "</td></tr></table></div>"
    f = tmp_path / "wide.html"
    f.write_text(page.replace('<section id="tk-summary">', f'<section id="tk-wide">{wide}</section><section id="tk-summary">'),
                 encoding="utf-8")
    sw, iw, over, _ = _scroll(f, tmp_path)
    assert over > 1000


def test_no_horizontal_overflow_at_1400px(store, session_store, tmp_path):
    seen = []
    with ThreadPoolExecutor(CHROMIUM_PAGES_AT_ONCE) as pool:  # each page drawn while the next is written
        for st, rid in _runs(store, session_store, tmp_path):
            page = write_html_report(st, tmp_path / f"{rid}.html", run_id=rid)
            seen.append((rid, pool.submit(_scroll, page, tmp_path)))
        for rid, drawn in seen:
            sw, iw, over, where = drawn.result()
            assert iw == 1400 and sw <= iw and over <= 0, (rid, sw, iw, over, where)
    assert {"tp", "sweep", "3d"} <= {rid for rid, _ in seen}
