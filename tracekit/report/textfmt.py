"""How the terminal report, the HTML report and the diff write numbers: one helper per unit.

Every helper writes ``—`` for None (a missing value, never 0). Times come in ns, bandwidths in
GB/s (GB = 1e9), fractions as 0..1; byte counts take decimal prefixes (kB = 1e3 B, MB = 1e6 B,
GB = 1e9 B, TB = 1e12 B), as the nccl-tests sizes and the store do.
"""

from __future__ import annotations

import os
import re
import sys

NONE = "—"


def output_console(piped_width: int):
    """A rich console for a command's output (:func:`literal_console`): the terminal's width on a
    terminal; when the output is piped or redirected, ``$COLUMNS`` if it is set to a number, else
    ``piped_width`` (not rich's 80, which would fold the tables)."""
    return literal_console() if sys.stdout.isatty() else literal_console(width=piped_width_of(piped_width))


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def literal(s: str) -> str:
    """``s`` with every control character (C0, DEL, C1, and the Unicode line/paragraph separators)
    written as a visible escape: a newline as ``\\n``, a tab as ``\\t``, ESC as ``\\x1b``,
    U+2028 as ``\\u2028``. Text from a trace, a run config or a query result can then neither
    break a table row nor send a terminal control sequence."""
    if not _CONTROL.search(s):
        return s
    return _CONTROL.sub(lambda m: _NAMED.get(m.group()) or (
        f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}"), s)


def literal_console(**kwargs):
    """A rich Console that prints data as it is: no markup (``[bold]`` or ``[/pg]`` is text), no
    emoji codes (``:smile:`` is text), no highlighting, and control characters escaped
    (:func:`literal`) in every string it renders, table cells included. Styled text is passed as
    :class:`rich.text.Text` (its plain text is escaped too). ``kwargs`` go to Console."""
    from rich.console import Console
    from rich.text import Text

    class _LiteralConsole(Console):
        def render_str(self, text, **kw):  # every str printed or put in a table passes here
            kw["markup"], kw["emoji"], kw["highlight"] = False, False, False
            return super().render_str(literal(text), **kw)

        def print(self, *objects, **kw):
            objects = tuple(_literal_text(o) if isinstance(o, Text) else o for o in objects)
            super().print(*objects, **kw)

    kwargs.setdefault("markup", False)
    kwargs.setdefault("emoji", False)
    kwargs.setdefault("highlight", False)
    return _LiteralConsole(**kwargs)


def _is_literal(console) -> bool:
    """Whether ``console`` prints strings as they are (:func:`literal_console`'s): no markup, no
    emoji codes, control characters escaped."""
    return type(console).__name__ == "_LiteralConsole" and type(console).__module__ == __name__


def _literal_text(t):
    """A rich Text with control characters escaped (:func:`literal`); the same object if it has none."""
    from rich.text import Text

    if not _CONTROL.search(t.plain):
        return t
    return Text(literal(t.plain), style=t.style)


def piped_width_of(default: int) -> int:
    """The width for output that is piped or redirected: ``$COLUMNS`` when it is a positive number,
    else ``default``."""
    cols = os.environ.get("COLUMNS", "")
    return int(cols) if cols.isdigit() and int(cols) > 0 else default


def fmt_bytes(b) -> str:
    """Decimal prefixes, 4 significant digits: 131072 → '131.1 kB', 512 → '512 B'."""
    if b is None:
        return NONE
    b = float(b)
    for unit, f in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= f:
            return f"{b / f:,.4g} {unit}"
    return f"{b:,.0f} B"


def fmt_size(b) -> str:
    """A message size in binary prefixes, as the report's power-of-two size buckets are written
    (one size style per table): 8589934592 → '8 GiB', 1576964 → '1.504 MiB', 448 → '448 B'; at most
    4 significant digits; None → '—'."""
    if b is None:
        return NONE
    b = float(b)
    for unit, f in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= f:
            return f"{b / f:,.4g} {unit}"
    return f"{b:,.0f} B"


def fmt_us(ns) -> str:
    """ns → µs with one decimal: 12345 → '12.3'."""
    return NONE if ns is None else f"{ns / 1e3:,.1f}"


def fmt_ms(ns, signed: bool = False) -> str:
    """ns → ms with three decimals: 1234567 → '1.235' ('+1.235' when ``signed``)."""
    if ns is None:
        return NONE
    return f"{ns / 1e6:+,.3f}" if signed else f"{ns / 1e6:,.3f}"


def fmt_pct(x, signed: bool = False) -> str:
    """A fraction as a percentage with one decimal: 0.1234 → '12.3%' ('+12.3%' when ``signed``)."""
    if x is None:
        return NONE
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def fmt_pp(x) -> str:
    """A difference of two fractions in percentage points: 0.05 → '+5.0 pp'."""
    return NONE if x is None else f"{100 * x:+.1f} pp"


def fmt_num(x, digits: int = 2) -> str:
    """Thousands separators; an int as it is, anything else with ``digits`` decimals."""
    if x is None:
        return NONE
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:,.{digits}f}"


_NAMESPACES = re.compile(r"\b(?:at::native::|at::detail::|at::cuda::|c10::|at::|std::)")
_LAMBDA = re.compile(r"\{lambda\([^(){}]*\)#\d+\}")
_CALL_CONST = re.compile(r"::operator\(\)\(\)(?: const)?")


def short_kernel_name(name: str | None, limit: int = 120) -> str:
    """A demangled GPU kernel (or CPU op) name as the terminal tables print it: without a leading
    ``void``, the ``at::native::``/``at::``/``c10::``/``std::`` namespaces, with each
    ``{lambda(...)#N}`` as ``λ`` and ``::operator()() const`` dropped; then at most ``limit``
    characters (``…`` at the end when cut). The JSON and HTML keep the full name."""
    if not name:
        return "—" if name is None else name
    s = name[5:] if name.startswith("void ") else name
    s = _CALL_CONST.sub("", _LAMBDA.sub("λ", _NAMESPACES.sub("", s)))
    s = re.sub(r"\s+", " ", s).strip()
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _cell_lens(texts: list[str]) -> list[int]:
    """rich's ``cell_len`` of each string (the cells it takes on a terminal): ``len`` for them all when
    together they are printable ASCII (one cell a character), checked once for the lot; else
    cell_len each (the tables measure every cell and every word)."""
    if "".join(texts).isascii() and "".join(texts).isprintable():
        return [len(t) for t in texts]
    from rich.cells import cell_len

    return [cell_len(t) for t in texts]


FOLD_FLOOR = 12
"""The narrowest a column of long names (kernels, launchers) is folded to when its words cannot
all fit whole (:func:`fit_table`)."""


def fit_table(table, width: int) -> list[int]:
    """Give every column of a rich ``table`` a fixed width so that the table, padding and rules
    included, is at most ``width`` cells wide and no cell is cut: a console crops a wider table's
    lines, and rich's own collapse ignores the columns' minimum widths (rich 15), which together cut
    a header to ``share of s`` and a cell to ``3`` at 120 columns.

    Each column starts at its longest line (header and cells) and the widest column gives up one
    cell at a time, never below its longest word, so cells wrap between words. When even the
    longest words do not fit, a column whose longest word is over :data:`FOLD_FLOOR` cells (a
    kernel name) may go down to that floor, folding inside its words; as a last resort every
    column folds down to one cell. Every column folds (``overflow='fold'``) rather than ending in
    an ellipsis, so each character of each cell is printed. Returns the widths (cells, without
    padding); ``table.tk_widths`` keeps them for tests.
    """
    cols = table.columns
    n = len(cols)
    if not n:
        return []
    lines = [[ln for c in [str(col.header)] + [str(c) for c in col._cells] for ln in (c.splitlines() or [""])]
             for col in cols]
    longest = [max(_cell_lens(ls) + [1]) for ls in lines]
    word = [max(_cell_lens([w for ln in ls for w in ln.split()]) + [1]) for ls in lines]
    avail = width - table._extra_width - sum(table._get_padding_width(i) for i in range(n))
    widths = list(longest)
    for floors in (word, [min(w, FOLD_FLOOR) for w in word], [1] * n):
        while sum(widths) > avail:
            free = [i for i in range(n) if widths[i] > floors[i]]
            if not free:
                break
            i = max(free, key=lambda j: (widths[j], -j))
            widths[i] -= 1
        if sum(widths) <= avail:
            break
    for col, w in zip(cols, widths):
        col.width, col.min_width, col.max_width = w, None, None
        col.no_wrap, col.overflow = False, "fold"
    table.tk_widths = widths
    return widths


PARAMS_DROPPED = "(…)"
"""What :func:`terminal_kernel_name` writes in place of a templated kernel's parameter list."""


def terminal_kernel_name(name: str | None) -> str:
    """A kernel (or CPU op) name as the terminal's tables print it: :func:`short_kernel_name`
    without a length limit, and, for a templated kernel (``...>(...)``), the parameter list
    written as :data:`PARAMS_DROPPED` (its types repeat the template arguments). A table printing
    such names says so in its caption; the JSON and HTML keep the full name. Nothing else is cut:
    a long name folds over lines in its column (:func:`fit_table`)."""
    s = short_kernel_name(name, limit=1 << 30)
    if not name or not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):  # the '(' that opens the trailing parameter list
        depth += {")": 1, "(": -1}.get(s[i], 0)
        if depth == 0:
            break
    if depth == 0 and i > 0 and s[i - 1] == ">" and i + 1 < len(s) - 1:
        return s[:i] + PARAMS_DROPPED
    return s


class _PlainLines:
    """A rich renderable of ready-made lines (one Segment and a line break each): what
    :func:`plain_table` hands to ``console.print``, so a captured console gets it too."""

    def __init__(self, lines: list[str]):
        self.lines = lines

    def __rich_console__(self, console, options):
        from rich.segment import Segment

        brk = Segment.line()
        for ln in self.lines:
            yield Segment(ln)
            yield brk


def plain_table(table, console):
    """The lines of a report table (``tracekit.report.data._table``: box SIMPLE_HEAD, no edge, no
    edge padding, padding (0, 1, 0, 0), header shown, no row styles) as rich writes them on a console
    without colour, once :func:`fit_table` has fixed every column's width — or None where this
    shortcut does not apply and rich must lay the table out: a console other than
    :func:`literal_console`'s (markup, emoji codes), a colour console, a table of another
    shape, a cell that is not a plain ``str``, holds a line break, or is wider than its column (rich
    would wrap or fold it), a column that is not left/right justified, or a table wider than the
    console. Cells are written through :func:`literal` as the console writes them.

    A line is each column's text justified to its width, followed by one space of padding (none
    after the last column) and joined by the box's one-space column separator; the rule under the
    header is ``─`` across the same width. Returns a renderable for ``console.print``. Checked
    against rich's own rendering in tests/report/test_plain_table.py."""
    from rich import box

    if not _is_literal(console) or console.color_system is not None or console.record or table.box is not box.SIMPLE_HEAD:
        return None
    if table.show_edge or table.pad_edge or table.padding != (0, 1, 0, 0) or not table.show_header:
        return None
    if table.title or table.caption or table.show_footer or table.show_lines or table.row_styles or table.expand:
        return None
    if table.leading or table.min_width is not None or table.width is not None:
        return None
    cols = table.columns
    n = len(cols)
    if not n or any(r.style or r.end_section for r in table.rows):
        return None
    widths = getattr(table, "tk_widths", None)
    if widths is None or len(widths) != n:
        return None
    columns = []
    for col, w in zip(cols, widths):
        if col.justify not in ("left", "right") or col.width != w or col.style or col.header_style:
            return None
        cells = [col.header, *col._cells]
        if not all(type(c) is str for c in cells):
            return None
        texts = [literal(c) for c in cells]
        lens = _cell_lens(texts)
        if max(lens) > w or any("\n" in s for s in texts):
            return None
        if col.justify == "right":
            columns.append([" " * (w - m) + s for s, m in zip(texts, lens)])
        else:
            columns.append([s + " " * (w - m) for s, m in zip(texts, lens)])
    total = sum(widths) + 2 * (n - 1)
    if total > console.width:
        return None
    rows = ["  ".join(parts) for parts in zip(*columns)]
    return _PlainLines([rows[0], "─" * total, *rows[1:]])
