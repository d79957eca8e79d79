"""The terminal report's table shortcut (tracekit.report.textfmt.plain_table) writes what rich writes
for the same table, byte for byte, and steps aside wherever rich must lay the table out."""

from __future__ import annotations

import io

from rich.text import Text

from tracekit.report.data import _show, _table
from tracekit.report.textfmt import fit_table, literal_console, plain_table


def _printed(t, width: int, shortcut: bool) -> str:
    out = io.StringIO()
    console = literal_console(file=out, width=width)
    fit_table(t, console.width)
    console.print((plain_table(t, console) if shortcut else None) or t)
    return out.getvalue()


def _make(rows, cols=(("op", "left"), ("count", "right"), ("total ms", "right"), ("note", "left"))):
    t = _table("t")
    for name, justify in cols:
        t.add_column(name, justify=justify, no_wrap=(name == "op"))
    for r in rows:
        t.add_row(*r)
    return t


ROWS = [
    ("all_reduce", "5,140", "214.212", "—"),
    ("broadcast", "2", "85.880", "bandwidth-bound"),
    ("送信", "3", "1.000", "wide ✓ cells"),
]
CONTROL = [("all_to_all\tx", "17", "—", "ctl\x1b[31m")]  # escaped by the console: wider than fit_table measured


def test_same_bytes_as_rich_on_report_like_tables():
    for rows in (ROWS, ROWS[:1], []):
        for width in (200, 60):
            t1, t2 = _make(rows), _make(rows)
            assert plain_table(_fit(t1, width), literal_console(file=io.StringIO(), width=width)) is not None
            assert _printed(t1, width, True) == _printed(t2, width, False), (rows, width)
    for rows in (ROWS + CONTROL, CONTROL):
        assert _printed(_make(rows), 200, True) == _printed(_make(rows), 200, False)


def _fit(t, width):
    fit_table(t, width)
    return t


def test_hand_written_layout():
    # widths: op 10 ("all_reduce"), count 5 ("count"); one space of padding + one separator between
    t = _make([("all_reduce", "7"), ("bc", "1,024")], cols=(("op", "left"), ("count", "right")))
    assert _printed(t, 80, True) == ("op          count\n"
                                     "─────────────────\n"
                                     "all_reduce      7\n"
                                     "bc          1,024\n")


def test_steps_aside_where_rich_must_lay_out():
    narrow = _make(ROWS)
    assert plain_table(_fit(narrow, 30), literal_console(file=io.StringIO(), width=30)) is None  # cells wrap
    styled = _make([("a", Text("1", style="bold"), "2", "3")])
    assert plain_table(_fit(styled, 80), literal_console(file=io.StringIO(), width=80)) is None
    multi = [("a", "1\n2", "2", "3")]  # the console writes the line break as \n: one line either way
    assert _printed(_make(multi), 80, True) == _printed(_make(multi), 80, False)
    coloured = _make(ROWS[:2])
    assert plain_table(_fit(coloured, 200), literal_console(file=io.StringIO(), width=200, force_terminal=True,
                                                            color_system="standard")) is None
    unfitted = _make(ROWS[:2])  # no fit_table: no fixed widths
    assert plain_table(unfitted, literal_console(file=io.StringIO(), width=200)) is None


def test_show_prints_title_table_and_caption_as_rich_does():
    outs = []
    for shortcut in (True, False):
        t = _make(ROWS)
        t.caption = "a caption"
        out = io.StringIO()
        console = literal_console(file=out, width=120)
        if not shortcut:
            import tracekit.report.data as data
            real, data.plain_table = data.plain_table, lambda *a: None
            try:
                _show(console, t)
            finally:
                data.plain_table = real
        else:
            _show(console, t)
        outs.append(out.getvalue())
    assert outs[0] == outs[1]
    assert "all_reduce" in outs[0] and "a caption" in outs[0]


def test_a_console_with_markup_is_left_to_rich():
    from rich.console import Console

    t = _make([("[sweep]", "1", "2", "3")])
    fit_table(t, 80)
    assert plain_table(t, Console(file=io.StringIO(), width=80, no_color=True)) is None
