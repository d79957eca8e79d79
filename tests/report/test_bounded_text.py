"""Text is data: markup-like and control-character strings from a trace, a run config or a query
are printed as they are (control characters as visible escapes) by every command, never read as
rich markup or sent to the terminal raw."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FIXTURES
from tracekit.cli import main
from tracekit.report.textfmt import literal, literal_console

PG = "[/pg]"  # a closing tag with no opening one: rich raised MarkupError on it
KERNEL = "[bold red]gemm[/bold red] :smile:"
CTRL = "evil\x1b[31m\nname"
WORKLOAD = "[/wl]"


@pytest.fixture
def marked(tmp_path):
    """A store with two runs of the handmade 2-rank trace whose string fields hold markup and
    control characters, and whose run_config.json labels the workload ``[/wl]``."""
    d = tmp_path / "traces"
    d.mkdir()
    for r in (0, 1):
        doc = json.loads((FIXTURES / "handmade" / "two_rank" / f"rank{r}.json").read_text())
        for ev in doc["traceEvents"]:
            args = ev.get("args") or {}
            if "Process Group Name" in args:
                args["Process Group Name"] = PG
            if ev.get("name", "").startswith("sm90"):
                ev["name"] = KERNEL + CTRL
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    (d / "run_config.json").write_text(json.dumps({"workload": WORKLOAD, "backend": "nccl", "device_name": CTRL}))
    s = tmp_path / "store"
    assert main(["ingest", str(d), "--store", str(s), "--run-id", "a"]) == 0
    assert main(["ingest", str(d), "--store", str(s), "--run-id", "b", "--replace"]) in (0,)
    return s


def test_literal_escapes_control_characters():
    assert literal("a\nb\tc\x1b[31m\x7f\x85\u2028") == "a\\nb\\tc\\x1b[31m\\x7f\\x85\\u2028"
    assert literal("[/pg] :smile: é") == "[/pg] :smile: é"


def test_console_prints_markup_and_emoji_codes_as_text(capsys):
    from rich.table import Table
    from rich.text import Text

    con = literal_console(width=100)
    t = Table()
    t.add_column("v")
    t.add_row(PG + KERNEL + CTRL)
    con.print(t)
    con.print("[bold red]hi[/bold red]")
    con.print("x\x07y")
    con.print(Text(literal("u\x07v"), style="bold"))
    out = capsys.readouterr().out
    assert PG in out and KERNEL in out and "evil\\x1b[31m\\nname" in out
    assert "[bold red]hi[/bold red]" in out and "x\\x07y" in out and "u\\x07v" in out
    assert "\x1b" not in out and "\x07" not in out


def _no_raw_control(text: str) -> None:
    assert "\x1b" not in text, repr(text[:200])
    assert "evil\n" not in text


def test_analyze_prints_the_names_as_they_are(marked, capsys):
    capsys.readouterr()
    assert main(["analyze", "--store", str(marked), "--run", "a"]) == 0
    out = capsys.readouterr().out
    assert f"workload={WORKLOAD}" in out
    assert f"  {PG}  " in out  # the process-group column
    assert KERNEL + "evil\\x1b[31m name" in out  # the top-ops table (blanks folded to one space)
    _no_raw_control(out)


def test_runs_survives_any_label(marked, capsys):
    capsys.readouterr()
    assert main(["runs", "--store", str(marked)]) == 0
    out = capsys.readouterr().out
    assert WORKLOAD in out and " a " in out and " b " in out


def test_diff_prints_the_labels(marked, capsys):
    capsys.readouterr()
    assert main(["diff", "a", "b", "--store", str(marked)]) == 0
    out = capsys.readouterr().out
    assert f"A = a ({WORKLOAD}, 2 ranks)" in out
    _no_raw_control(out)


def test_sql_values_print_literally(marked, capsys):
    capsys.readouterr()
    assert main(["sql", "SELECT '[bold red]hi[/bold red]' AS v", "--store", str(marked)]) == 0
    assert "[bold red]hi[/bold red]" in capsys.readouterr().out
    assert main(["sql", "SELECT DISTINCT pg_name FROM collectives", "--store", str(marked)]) == 0
    assert PG in capsys.readouterr().out
    assert main(["sql", "SELECT name FROM events WHERE name LIKE '%gemm%' LIMIT 1", "--store", str(marked)]) == 0
    out = capsys.readouterr().out
    assert KERNEL in out and "evil\\x1b[31m\\nname" in out
    _no_raw_control(out)
    # the JSON output keeps the exact string (JSON escapes it)
    assert main(["sql", "SELECT name FROM events WHERE name LIKE '%gemm%' LIMIT 1", "--store", str(marked),
                 "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"name": KERNEL + CTRL}]


def test_error_messages_stay_one_line(tmp_path, capsys):
    p = tmp_path / "bad\nname[x].json"
    p.write_text("{}")
    assert main(["ingest", str(p), "--store", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "name[x].json" in err


def test_html_report_and_export_keep_names_inert(tmp_path, capsys):
    """HTML-like names (a process group, a kernel, the workload) are escaped in the HTML report
    and kept exactly in the Perfetto export's JSON."""
    d = tmp_path / "traces"
    d.mkdir()
    pg, kernel, wl = "<script>alert(1)</script>[/pg]", "<img src=x onerror=alert(2)>gemm", "<b>wl</b>"
    for r in (0, 1):
        doc = json.loads((FIXTURES / "handmade" / "two_rank" / f"rank{r}.json").read_text())
        for ev in doc["traceEvents"]:
            args = ev.get("args") or {}
            if "Process Group Name" in args:
                args["Process Group Name"] = pg
            if ev.get("name", "").startswith("sm90"):
                ev["name"] = kernel
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    (d / "run_config.json").write_text(json.dumps({"workload": wl}))
    s = tmp_path / "s"
    assert main(["ingest", str(d), "--store", str(s), "--run-id", "a"]) == 0
    html_out, perfetto = tmp_path / "r.html", tmp_path / "p.json"
    assert main(["analyze", "--store", str(s), "--html", str(html_out)]) == 0
    page = html_out.read_text()
    for raw in (pg, kernel, wl, "<script>alert", "<img src=x"):
        assert raw not in page
    assert main(["export", "--store", str(s), "--run", "a", "--perfetto", str(perfetto)]) == 0
    names = {e.get("name") for e in json.loads(perfetto.read_text())["traceEvents"]}
    assert kernel in names
