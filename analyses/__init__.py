"""The DuckDB analyses: one ``.sql`` module per analysis, loaded in dependency order.

Each module starts with a header comment documenting every output column
(name, type, unit, meaning) and a ``-- Depends on:`` line naming the tables,
views or modules it reads; :func:`load_analyses` orders the modules by those
lines. The α–β formulas are not re-typed in SQL: :func:`register_udfs` exposes
``tracekit.model`` functions to DuckDB (prefixed ``tk_``).
"""

from __future__ import annotations

import re
from importlib import resources

BASE_TABLES = {"runs", "ranks", "events", "collectives"}
_DEPENDS = re.compile(r"^--\s*Depends on:\s*(.*)$", re.M)
_CREATES = re.compile(r"CREATE\s+OR\s+REPLACE\s+(?:VIEW|MACRO|TABLE)\s+([A-Za-z_][A-Za-z0-9_]*)", re.I)


def modules() -> dict[str, str]:
    """name → SQL text of every analysis module shipped in this package."""
    out = {}
    for f in resources.files(__package__).iterdir():
        if f.name.endswith(".sql"):
            out[f.name[:-4]] = f.read_text(encoding="utf-8")
    return out


def load_order(mods: dict[str, str] | None = None) -> list[str]:
    """Module names in dependency order (a module after every module it depends on).

    A dependency may name a module or any view/macro a module creates. Raises
    ValueError on a cycle or an unknown dependency.
    """
    mods = modules() if mods is None else mods
    provider = {}
    for name, sql in mods.items():
        provider[name] = name
        for obj in _CREATES.findall(sql):
            provider.setdefault(obj, name)
    deps: dict[str, set[str]] = {}
    for name, sql in mods.items():
        d = set()
        for line in _DEPENDS.findall(sql):
            for tok in re.split(r"[,\s]+", line.strip()):
                tok = tok.strip("()")
                if not tok or tok == "nothing" or tok in BASE_TABLES:
                    continue
                if tok not in provider:
                    raise ValueError(f"analysis {name}: unknown dependency {tok!r}")
                if provider[tok] != name:
                    d.add(provider[tok])
        deps[name] = d
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(n: str) -> None:
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            raise ValueError(f"analysis dependency cycle through {n}")
        state[n] = 1
        for m in sorted(deps[n]):
            visit(m)
        state[n] = 2
        order.append(n)

    for n in sorted(mods):
        visit(n)
    return order


def register_udfs(con) -> None:
    """Register the model functions the SQL uses (``tk_busbw_factor(op, n) → DOUBLE``...)."""
    from tracekit.model import busbw_factor

    def _factor(op, n):
        if op is None or n is None:
            return None
        try:
            return float(busbw_factor(op, int(n)))
        except Exception:
            return None

    con.create_function("tk_busbw_factor", _factor, ["VARCHAR", "INTEGER"], "DOUBLE", null_handling="special")


def load_analyses(con) -> None:
    """Create every analysis view/macro on a DuckDB connection that has the base tables."""
    register_udfs(con)
    mods = modules()
    for name in load_order(mods):
        con.execute(mods[name])
