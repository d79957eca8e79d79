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
    """A rich console for a command's output: the terminal's width on a terminal; when the output is
    piped or redirected, ``$COLUMNS`` if it is set to a number, else ``piped_width`` (not rich's 80,
    which would fold the tables)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=piped_width_of(piped_width))


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
