"""The terminal report piped at 80 and 120 columns: every table of every section is fitted to the
width (tracekit.report.textfmt.fit_table) and prints each character of each header and cell.

Each table is checked column by column: the text printed in the column's slice of the lines, read
top to bottom, is exactly its header followed by its cells (whitespace aside). A header cut to
``share of s``, a cell cut to ``3`` or ending in an ellipsis, or a line cropped at the console's
edge therefore fails. Reports: the repository's fixtures always; the 8-rank DLRM set, the
nccl-tests logs and the 1-of-8-ranks B200 trace when ../shared/traces has them.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

import tracekit.report.data as data
from tests.conftest import FIXTURES, TRACES
from tracekit.ingest import ingest_paths
from tracekit.report.diff import diff_runs, print_diff
from tracekit.report.textfmt import PARAMS_DROPPED, fit_table, terminal_kernel_name
from tracekit.store import Store

WIDTHS = (80, 120)
BOX = set("─━┃│┏┓┗┛╇╈┡┩┳┻┼╭╮╰╯├┤┬┴═║╔╗╚╝╠╣╦╩╬┠┨┯┷┿╂")


def _console(width: int, buf) -> Console:
    return Console(file=buf, width=width, no_color=True, force_terminal=False, markup=False,
                   emoji=False, highlight=False)


def _cell_text(c) -> str:
    return "".join(str(c).split())


def _column_offsets(t: Table, widths: list[int]) -> list[int]:
    """Where each column's content starts on a rendered line (rich 15's layout: left edge, each
    column's left padding, its width, its right padding, a one-cell divider between columns)."""
    top, right, bottom, left = t.padding
    edge = 1 if (t.box and t.show_edge) else 0
    div = 1 if t.box else 0
    out, x = [], edge
    for i, w in enumerate(widths):
        lp = 0 if (i == 0 and not t.pad_edge) else left
        rp = 0 if (i == len(widths) - 1 and not t.pad_edge) else right
        if t.collapse_padding and i > 0:
            lp = max(0, lp - right)
        out.append(x + lp)
        x += lp + w + rp + div
    return out


def check_rendered(t: Table, text: str, width: int, where: str) -> None:
    """Assert that ``text``, ``t`` as printed at ``width`` (title and caption aside), holds every
    character of its header and cells, each in its column, and ends no cell in a bare ellipsis."""
    widths = getattr(t, "tk_widths", None)
    assert widths is not None, (where, "printed without fit_table")
    lines = text.splitlines()
    assert max(cell_len(ln) for ln in lines) <= width, (where, width)
    rows = [ln for ln in lines if set(ln.strip()) - BOX - {" "}]
    for col, x, w in zip(t.columns, _column_offsets(t, widths), widths):
        printed = "".join("".join(ln[x:x + w].split()) for ln in rows)
        want = _cell_text(col.header) + "".join(_cell_text(c) for c in col._cells)
        assert printed == want, (where, width, str(col.header), want[:80], printed[:80])
        for c in col._cells:  # an abbreviation is only the legend's (…), never a cut name
            s = str(c).rstrip()
            assert not s.endswith("…") or s.endswith(PARAMS_DROPPED), (where, s)


def _render(t: Table, width: int) -> str:
    buf = io.StringIO()
    _console(width, buf).print(t)
    return buf.getvalue()


def check_table(t: Table, width: int, where: str) -> None:
    """Fit ``t`` to ``width``, render it alone (no title or caption) and check it (:func:`check_rendered`)."""
    fit_table(t, width)
    t.title = t.caption = None
    check_rendered(t, _render(t, width), width, where)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    st = Store(tmp_path_factory.mktemp("piped"))
    out = {}
    for name in ("sweep_2rank", "tp_2rank", "ep_2rank", "pp_2rank", "kv_layerwise_2rank"):
        rid = ingest_paths([FIXTURES / name], st, run_id=name)
        out[name] = data.build_report(st, rid, "eth100" if name == "tp_2rank" else None)
    conf = json.loads((FIXTURES / "3d_2x2x2" / "run_config.json").read_text())
    rid = ingest_paths([FIXTURES / "3d_2x2x2"], st, workload="3d", config=conf, run_id="3d")
    out["3d"] = data.build_report(st, rid, "nvlink4")
    for name, paths in (("dlrm", [TRACES / "param_dlrm_8rank_v100"]),
                        ("nccl", sorted((TRACES / "superbench_nccl_tests_a100x8").glob("*.log"))),
                        ("b200", [TRACES / "tracelens_b200_r0of8"])):
        if paths and paths[0].exists():
            out[name] = data.build_report(st, ingest_paths(paths, st, run_id=name), None)
    return st, out


def _tables_of(rep: dict, width: int, monkeypatch, name: str = "") -> list[Table]:
    """Print ``rep`` at ``width`` and check each table as the report printed it: every table went
    through fit_table (one header rule each) and lost nothing (:func:`check_rendered`)."""
    seen = []
    real = data.fit_table

    def record(t, w):
        seen.append(t)
        return real(t, w)

    monkeypatch.setattr(data, "fit_table", record)
    buf = io.StringIO()
    data.print_report(rep, _console(width, buf))
    text = buf.getvalue()
    assert max(cell_len(ln) for ln in text.splitlines()) <= width
    assert sum(1 for ln in text.splitlines() if ln.startswith("───")) == len(seen)
    for t in seen:
        one = _render(t, width)  # as the report printed it (its caption was taken off before)
        assert one in text
        check_rendered(t, one, width, f"{name}: {getattr(t, 'tk_title', '')}")
    return seen


@pytest.mark.parametrize("width", WIDTHS)
def test_every_table_of_every_report_prints_whole(reports, width, monkeypatch):
    _, reps = reports
    n = 0
    for name, rep in reps.items():
        n += len(_tables_of(rep, width, monkeypatch, name))
    assert n >= 40, n  # the reports have tables: the check is not vacuous


def test_kernel_table_header_and_share_whole_at_120(reports, monkeypatch):
    """DLRM's top-GPU-ops table was 125 cells wide at 120 columns: its last header printed as
    ``share of s`` and the SendRecv kernel's 32.3 % share as ``3``."""
    _, reps = reports
    if "dlrm" not in reps:
        pytest.skip("../shared/traces/param_dlrm_8rank_v100 is absent")
    t = next(t for t in _tables_of(reps["dlrm"], 120, monkeypatch) if t.tk_title.startswith("Top GPU ops"))
    text = _render(t, 120)
    head, first = text.split("───")[0], text.split("\n")[3]
    assert head.split()[:2] == ["share", "of"] and head.split()[-1] == "steps"  # wrapped between its words
    assert first.split()[-1] == "32.3%"


def test_diff_tables_fit(reports):
    st, reps = reports
    for a, b in (("tp_2rank", "pp_2rank"), ("sweep_2rank", "3d")) + ((("dlrm", "b200"),) if "b200" in reps else ()):
        d = diff_runs(st, a, b)
        for width in WIDTHS:
            buf = io.StringIO()
            print_diff(d, _console(width, buf))
            assert max(cell_len(ln) for ln in buf.getvalue().splitlines()) <= width, (a, b, width)
            assert "…" not in buf.getvalue()


def test_fit_table_folds_a_long_name_and_keeps_numbers_whole():
    t = Table(box=None, padding=(0, 1, 0, 0), pad_edge=False)
    for h in ("name", "count", "share of steps"):
        t.add_column(h)
    t.add_row("x" * 70, "1,234", "32.3%")
    widths = fit_table(t, 40)
    # 40 cells: dividers none (box=None), right padding 1 on the first two columns -> 38 for content;
    # count and share keep their longest words (5 each), the name takes the remaining 28
    assert widths == [28, 5, 5]
    check_table(t, 40, "hand-made")


@pytest.mark.parametrize("name, want", [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<float>, "
     "at::detail::Array<char*, 2> >(int, at::native::CUDAFunctorOnSelf_add<float>, at::detail::Array<char*, 2>)",
     "vectorized_elementwise_kernel<4, CUDAFunctorOnSelf_add<float>, Array<char*, 2> >(…)"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
     "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"),  # not templated: whole
    ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pageable -> Device)"),
    ("f<int>()", "f<int>()"),  # an empty parameter list stays
    ("x" * 300, "x" * 300),  # no length limit: the column folds it
])
def test_terminal_kernel_name(name, want):
    assert terminal_kernel_name(name) == want


@pytest.mark.parametrize("columns, width", [(None, 120), ("80", 80)])
def test_cli_analyze_piped(reports, columns, width, monkeypatch, capsys):
    """`tracekit analyze ... | cat`: stdout is no terminal, so the width is $COLUMNS, else 120; each
    table printed is checked as above. The DLRM run when ../shared has it (the widest kernel names),
    else the EP fixture."""
    from tracekit.cli import main

    st, reps = reports
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    seen, real = [], data.fit_table
    monkeypatch.setattr(data, "fit_table", lambda t, w: (seen.append(t), real(t, w))[1])
    run = "dlrm" if "dlrm" in reps else "ep_2rank"
    assert main(["analyze", "--run", run, "--store", str(st.path)]) == 0
    out = capsys.readouterr().out
    assert max(cell_len(ln) for ln in out.splitlines()) <= width
    assert out.count("…") == out.count(PARAMS_DROPPED)  # every ellipsis is the legend's
    assert len(seen) >= 5 and sum(1 for ln in out.splitlines() if ln.startswith("───")) == len(seen)
    for t in seen:
        one = _render(t, width)
        assert one in out
        check_rendered(t, one, width, f"cli {run}: {getattr(t, 'tk_title', '')}")
