"""The terminal report at 100 and 160 columns: no line wider than the console, nothing cut
(no ellipsis), and no word broken: the words printed are exactly those of a 400-column render,
where nothing wraps (a cell folded mid-word would print fragments instead)."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from tests.conftest import FIXTURES
from tracekit.ingest import ingest_paths
from tracekit.report.data import build_report, print_report
from tracekit.store import Store


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    st = Store(tmp_path_factory.mktemp("width"))
    ingest_paths([FIXTURES / "sweep_2rank"], st)  # the newest sweep feeds measured vs model
    out = {}
    for name in ("sweep_2rank", "tp_2rank", "ep_2rank", "pp_2rank"):
        rid = ingest_paths([FIXTURES / name], st)
        for link in (None, "eth100"):
            out[f"{name}-{link}"] = build_report(st, rid, link)
    # many process groups at once; measured vs model per dimension
    conf = json.loads((FIXTURES / "3d_2x2x2" / "run_config.json").read_text())
    rid = ingest_paths([FIXTURES / "3d_2x2x2"], st, workload="3d", config=conf, run_id="3d")
    out["3d_2x2x2-nvlink4"] = build_report(st, rid, "nvlink4")
    assert out["3d_2x2x2-nvlink4"]["model_by_dimension"]
    return out


def _render(rep, width: int) -> str:
    buf = io.StringIO()
    print_report(rep, Console(file=buf, width=width, no_color=True, force_terminal=False), detail=True)  # every table
    return buf.getvalue()


def _words(text: str) -> set[str]:
    return {w for w in text.split() if not re.fullmatch(r"[─━┃│┏┓┗┛╇╈┡┩┳┻┼]+", w)}


@pytest.mark.parametrize("width", [100, 160])
def test_report_fits_without_cutting_words(reports, width):
    for key, rep in reports.items():
        text = _render(rep, width)
        assert max(len(line) for line in text.splitlines()) <= width, key
        assert "…" not in text, key
        wide = _words(_render(rep, 400))
        got = _words(text)
        assert got == wide, (key, sorted(wide - got)[:5], sorted(got - wide)[:5])


def test_model_and_measurement_are_told_apart(reports):
    text = _render(reports["tp_2rank-eth100"], 160)
    assert "Measured per step" in text and "Model per step" in text
    assert "no overlap assumed" in text and "every collective exposed" not in text
