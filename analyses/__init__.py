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


PYTHON_ANALYSES = ("fit", "measured_vs_model", "overlap_windows", "collective_instances")
"""Analyses computed in Python (``analyses/<name>.py`` with DEPENDS, CREATES and ``create(con)``)."""


def modules() -> dict[str, str]:
    """name → SQL text of every analysis module shipped in this package.

    A Python analysis appears as a pseudo-SQL text made of its ``Depends on`` and
    ``CREATE`` lines, so that ordering treats both kinds alike.
    """
    out = {}
    for f in resources.files(__package__).iterdir():
        if f.name.endswith(".sql"):
            out[f.name[:-4]] = f.read_text(encoding="utf-8")
    for name in PYTHON_ANALYSES:
        mod = _py_module(name)
        out[name] = "-- Depends on: " + ", ".join(mod.DEPENDS) + "\n" + "".join(
            f"-- CREATE OR REPLACE TABLE {obj}\n" for obj in mod.CREATES
        )
    return out


def _py_module(name: str):
    import importlib

    return importlib.import_module(f"{__package__}.{name}")


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


# NCCL's TREE kernels run the pipelined double binary tree (tracekit.model.collectives)
_KERNEL_ALGOS = {"RING": "ring", "TREE": "double_binary_tree", "NVLS": "nvls", "NVLSTREE": "nvls"}


def register_udfs(con) -> None:
    """Register the model functions the SQL uses; each returns NULL where the model has no answer.

    tk_busbw_factor(op, n) → DOUBLE            nccl-tests bus-bandwidth factor
    tk_algbw(S, t_ns) → DOUBLE                 S / t in GB/s (NULL for t = 0)
    tk_busbw(op, S, t_ns, n) → DOUBLE          algbw × factor, GB/s
    tk_verdict(α term, β term) → VARCHAR       latency-bound when α term >= β term, else bandwidth-bound
    tk_model_algo(op, kernel_algo, n) → VARCHAR the algorithm to model (kernel's if modelled, else default)
    tk_alpha_coeff(op, algo, n) → DOUBLE       A of T = A·α + B·D/β
    tk_beta_coeff(op, algo, n) → DOUBLE        B of T = A·α + B·D/β
    tk_link_alpha(preset) → DOUBLE             preset α, s
    tk_link_beta(preset) → DOUBLE              preset effective β, bytes/s
    tk_best_algo(op, D, n, α, β, sw) → VARCHAR fastest applicable algorithm under (α, β); in-switch
                                               (nvls) only when sw (an NVLink/NVSwitch preset)
    tk_best_time(op, D, n, α, β, sw) → DOUBLE  its time, s
    """
    from tracekit.errors import TracekitError
    from tracekit.model import (
        ALGORITHMS,
        algbw,
        algorithm_coefficients,
        busbw,
        verdict,
        applicable_algorithms,
        busbw_factor,
        custom_link,
        link_from_preset,
        predict_collective,
    )

    import functools

    def safe(fn):
        @functools.wraps(fn)
        def wrapped(*args):
            if None in args:  # DuckDB passes plain Python values: the same as any(a is None ...), faster
                return None
            try:
                return fn(*args)
            except (TracekitError, ValueError, ZeroDivisionError):
                return None

        return wrapped

    def model_algo(op, kernel_algo, n):
        algos = ALGORITHMS.get(op)
        if not algos:
            return None
        cand = _KERNEL_ALGOS.get(str(kernel_algo or "").upper())
        if cand in algos and cand in applicable_algorithms(op, int(n)):
            return cand
        return algos[0]

    def best_uncached(op, size, n, alpha, beta, in_switch):
        link = custom_link(alpha, beta)
        preds = predict_collective(op, float(size), int(n), link, algo="all")
        if not in_switch:  # NVLS/SHARP needs switch hardware the fit cannot vouch for
            preds = [p for p in preds if p.algo != "nvls"] or preds
        return min(preds, key=lambda p: p.time_s)

    # predict_collective over every algorithm costs ~45 µs and tk_best_algo / tk_best_time ask it
    # twice per instance with arguments that repeat (same op, size, k, α, β): remember the answers.
    best_cache: dict = {}

    def best(*args):
        if any(type(a) is float and a == 0.0 for a in args):
            return best_uncached(*args)  # 0.0 and -0.0 are one dict key but may give different results
        try:
            return best_cache[args]
        except KeyError:
            pass
        got = best_uncached(*args)  # exceptions are not cached: safe() turns them into NULL each time
        if len(best_cache) >= 1 << 16:
            best_cache.clear()
        best_cache[args] = got
        return got

    def reg(name, fn, args, ret):
        # "special": safe() answers NULL itself (DuckDB's default null handling would skip the call
        # for NULL arguments, but then refuses a UDF that returns NULL, as safe() does on no answer)
        con.create_function(name, safe(fn), args, ret, null_handling="special")

    reg("tk_busbw_factor", lambda op, n: float(busbw_factor(op, int(n))), ["VARCHAR", "INTEGER"], "DOUBLE")
    reg("tk_algbw", lambda d, t_ns: algbw(float(d), float(t_ns) * 1e-9), ["BIGINT", "DOUBLE"], "DOUBLE")
    reg("tk_busbw", lambda op, d, t_ns, n: busbw(op, float(d), float(t_ns) * 1e-9, int(n)),
        ["VARCHAR", "BIGINT", "DOUBLE", "INTEGER"], "DOUBLE")
    reg("tk_verdict", lambda a, b: verdict(float(a), float(b)), ["DOUBLE", "DOUBLE"], "VARCHAR")
    def model_algo_or_none(op, ka, n):
        if op is None or n is None:
            return None
        try:
            return model_algo(op, ka, n)
        except (TracekitError, ValueError):
            return None

    con.create_function(
        "tk_model_algo", model_algo_or_none, ["VARCHAR", "VARCHAR", "INTEGER"], "VARCHAR", null_handling="special"
    )
    reg("tk_alpha_coeff", lambda op, a, n: float(algorithm_coefficients(op, a, int(n)).alpha_coeff),
        ["VARCHAR", "VARCHAR", "INTEGER"], "DOUBLE")
    reg("tk_beta_coeff", lambda op, a, n: float(algorithm_coefficients(op, a, int(n)).beta_coeff),
        ["VARCHAR", "VARCHAR", "INTEGER"], "DOUBLE")
    reg("tk_link_alpha", lambda name: link_from_preset(name).alpha_s, ["VARCHAR"], "DOUBLE")
    reg("tk_link_beta", lambda name: link_from_preset(name).beta_Bps, ["VARCHAR"], "DOUBLE")
    reg("tk_best_algo", lambda op, d, n, a, b, sw: best(op, d, n, a, b, sw).algo,
        ["VARCHAR", "BIGINT", "INTEGER", "DOUBLE", "DOUBLE", "BOOLEAN"], "VARCHAR")
    reg("tk_best_time", lambda op, d, n, a, b, sw: best(op, d, n, a, b, sw).time_s,
        ["VARCHAR", "BIGINT", "INTEGER", "DOUBLE", "DOUBLE", "BOOLEAN"], "DOUBLE")


_DUCKDB_TYPES = {"int32": "INTEGER", "int64": "BIGINT", "double": "DOUBLE", "string": "VARCHAR", "bool": "BOOLEAN"}
_PY_CONVERT = {"int32": int, "int64": int, "double": float, "string": str, "bool": bool}


def create_table_from_rows(con, name: str, schema, rows: list[dict]) -> None:
    """``CREATE OR REPLACE TABLE name`` with ``schema``'s columns (a pyarrow schema of int32, int64,
    double, string and bool fields) holding ``rows`` (dicts; a missing key is NULL), in order.

    The values go to DuckDB as one typed list per column, unnested side by side, not through a
    pyarrow table: building one from Python objects imports pandas (~0.15 s on every analyze).
    """
    names, types, cols = [], [], []
    for field in schema:
        t = str(field.type)
        conv = _PY_CONVERT[t]
        names.append(field.name)
        types.append(_DUCKDB_TYPES[t])
        cols.append([None if r.get(field.name) is None else conv(r[field.name]) for r in rows])
    sel = ", ".join(f'unnest(?::{t}[]) AS "{n}"' for n, t in zip(names, types))
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT {sel}", cols)


def load_analyses(con, link: str | None = None) -> None:
    """Create every analysis view/macro/table on a DuckDB connection that has the base tables.

    ``link``: the preset the verdicts compare with (sets the DuckDB variable ``tk_link``).
    Raises BadInputError for an unknown preset.
    """
    if link is not None:
        from tracekit.model import link_from_preset

        link_from_preset(link)  # validates, one-line BadInputError otherwise
    con.execute("SET VARIABLE tk_link = ?", [link])
    register_udfs(con)
    mods = modules()
    for name in load_order(mods):
        if name in PYTHON_ANALYSES:
            _py_module(name).create(con)
        else:
            con.execute(mods[name])
