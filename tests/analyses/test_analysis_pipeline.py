"""The analyses declared as data: every module listed once in MODULES with what it defines and
reads, built on first use (what a statement names and what that reads, nothing more), once per
report, and every view and table exactly as its module's header documents it (DESCRIBE against the
header).
"""

from __future__ import annotations

import ast
import json
import re
import time
from importlib import resources

import pytest

from tracekit import analyses
from tracekit.cli import main
from tracekit.errors import BadInputError
from tracekit.store import TABLES

_TYPES = {"VARCHAR", "BIGINT", "INTEGER", "DOUBLE", "BOOLEAN"}


@pytest.fixture(scope="module")
def tp_store(session_store):
    return session_store("tp")


def _created(monkeypatch) -> list[str]:
    """The names of the modules created from now on, in order (analyses.create_module recorded)."""
    made: list[str] = []
    real = analyses.create_module

    def record(con, name):
        made.append(name)
        real(con, name)

    monkeypatch.setattr(analyses, "create_module", record)
    return made


def _objects(con) -> set[str]:
    """Every view, table and macro on ``con`` (the store's, the analyses', temporary ones)."""
    return {n for (n,) in con.duckdb.execute(
        "SELECT view_name FROM duckdb_views() WHERE NOT internal UNION SELECT table_name FROM duckdb_tables() "
        "UNION SELECT function_name FROM duckdb_functions() "
        "WHERE function_type IN ('macro', 'table_macro') AND NOT internal").fetchall()}


def test_the_modules_list_every_module_file_once():
    files = sorted(f.name.rsplit(".", 1)[0] for f in resources.files(analyses).iterdir()
                   if f.name.endswith((".sql", ".py")) and not f.name.startswith("_"))  # _*: helpers (UDFs), no relation
    names = [m.name for m in analyses.MODULES]
    assert sorted(names) == files and len(set(names)) == len(names)
    defined = [r for m in analyses.MODULES for r in m.defines]
    assert len(defined) == len(set(defined))  # each relation defined once
    assert not set(defined) & set(TABLES)


def test_a_base_table_query_builds_no_analysis(tp_store, monkeypatch, capsys):
    made = _created(monkeypatch)
    assert main(["sql", "--store", str(tp_store.path), "--json", "SELECT count(*) AS n FROM events"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["n"] > 0 and made == []


def test_a_view_builds_what_it_reads_and_nothing_else(tp_store, monkeypatch):
    made = _created(monkeypatch)
    con = analyses.connect(tp_store)
    (n,) = con.execute("SELECT count(*) FROM collective_bandwidth").fetchone()
    # collective_bandwidth reads collective_instances, which reads instance_rows' view and macro
    assert made == ["instance_rows", "collective_instances", "collective_bandwidth"] == con.analyses.built
    assert n == con.execute("SELECT count(*) FROM collective_instances").fetchone()[0] > 0
    assert len(made) == 3  # already there: nothing built again
    # a late module builds its own closure only: the islands read the interval macros
    con.execute("SELECT count(*) FROM compute_islands").fetchone()
    assert made[3:] == ["intervals", "overlap_islands"]


@pytest.mark.serial  # asserts a wall-time bound: not beside the multi-process tests
def test_a_misspelt_view_in_sql_fails_at_once_building_nothing(tp_store, monkeypatch, capsys):
    """Replaces test_a_misspelt_name_still_fails_once_everything_is_built (the whole pipeline,
    critical path included, was built before DuckDB refused the name)."""
    made = _created(monkeypatch)
    t0 = time.perf_counter()
    code = main(["sql", "--store", str(tp_store.path), "SELECT * FROM collective_verdictz"])
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert code == 2 and made == [] and elapsed < 1.0
    assert err.count("\n") == 1 and "collective_verdictz" in err and err.startswith("tracekit: SQL error")
    # beside a real view: that view's modules only, and DuckDB's binder refuses the misspelt one
    import duckdb

    con = analyses.connect(tp_store)
    with pytest.raises(duckdb.CatalogException, match="collective_verdictz"):
        con.execute("SELECT * FROM collective_bandwidth JOIN collective_verdictz USING (run_id)")
    assert made == ["instance_rows", "collective_instances", "collective_bandwidth"] == con.analyses.built


def test_any_statement_type_builds_what_it_names(tp_store, monkeypatch, capsys):
    """EXPLAIN and DESCRIBE are not SELECTs to DuckDB's JSON serializer; the tokenizer reads them all."""
    made = _created(monkeypatch)
    assert main(["sql", "--store", str(tp_store.path), "--json", "EXPLAIN SELECT * FROM collective_samples"]) == 0
    assert made == ["instance_rows", "collective_instances", "collective_samples"]
    capsys.readouterr()
    made.clear()
    assert main(["sql", "--store", str(tp_store.path), "--json", "DESCRIBE alpha_beta_fit"]) == 0
    assert [r["column_name"] for r in json.loads(capsys.readouterr().out)][:2] == ["run_id", "source"]
    # fit reads collective_instances, collective_samples, group_machine (machine) and instance_locality
    # (node_locality, which reads collective_bandwidth and group_machine), each built once, before it
    assert made == ["instance_rows", "collective_instances", "collective_samples", "machine", "collective_bandwidth",
                    "node_locality", "fit"]


def test_ensure_of_an_unknown_name_fails_at_once(tp_store, monkeypatch):
    made = _created(monkeypatch)
    con = analyses.connect(tp_store)
    with pytest.raises(BadInputError, match=r"'collective_verdictz' \(did you mean collective_verdicts\?\)"):
        con.analyses.ensure(["collective_bandwidth", "collective_verdictz"])
    assert made == []
    con.analyses.ensure("collective_samples")  # a module's name, or a relation it defines
    assert made == ["instance_rows", "collective_instances", "collective_samples"]


def test_statement_names_read_by_the_tokenizer():
    named = analyses.statement_names(
        "WITH w AS (SELECT * FROM collective_waits) -- FROM not_this\n"
        "SELECT 'αβ', x.y FROM w JOIN main.runs ON 1 JOIN \"Verdicts\" v ON 1, merge_intervals('_comm_spans')")
    # identifiers (quotes off, lower case) and string constants; no keyword, no comment; the
    # non-ASCII constant before them checks the tokenizer's byte offsets
    assert named == {"w", "collective_waits", "αβ", "x", "y", "main", "runs", "verdicts", "v", "merge_intervals",
                     "_comm_spans"}


def test_analyze_with_json_and_html_builds_each_module_once(tp_store, monkeypatch, tmp_path, capsys):
    made = _created(monkeypatch)
    html = tmp_path / "r.html"
    assert main(["analyze", "--store", str(tp_store.path), "--json", "--html", str(html)]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["run_id"] == "tp"
    assert html.stat().st_size > 10_000
    # every module but the per-GPU-op tables, which no report reads, and the all-to-all imbalance,
    # which the report asks for only when the run has all-to-alls (TP: none), the Flight Recorder's
    # collectives, only when it has dumps (TP: none), the replay, which `tracekit whatif` reads, and the
    # diff's per-size rows; none twice
    assert sorted(made) == sorted({m.name for m in analyses.MODULES} - {
        "gpu_launchers", "alltoall_imbalance", "fr_collectives", "replay", "collective_sizes_by_op"})


def test_the_terminal_report_builds_no_island_or_gpu_op_table(tp_store, monkeypatch, capsys):
    """The terminal/JSON report never names the island views (they read every rank's events file)
    nor the per-GPU-op tables; a user's statement naming one builds that module and what it reads."""
    made = _created(monkeypatch)
    assert main(["analyze", "--store", str(tp_store.path), "--json"]) == 0
    capsys.readouterr()
    assert "overlap_islands" not in made and "gpu_launchers" not in made and "critical_path" in made
    made.clear()
    assert main(["sql", "--store", str(tp_store.path), "--json", "SELECT count(*) AS n FROM gpu_launchers"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["n"] == 0 and made == ["gpu_launchers"]  # CPU-only (gloo)
    made.clear()
    assert main(["sql", "--store", str(tp_store.path), "--json",
                 "SELECT count(*) AS n FROM overlap_islands o JOIN compute_islands c USING (run_id, rank, grp)"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["n"] >= 0 and made == ["intervals", "overlap_islands"]


def test_only_json_and_html_reports_compute_the_path_strips(tp_store, monkeypatch, capsys, tmp_path):
    """critical_path.paths (the HTML page's strips) is computed for --json (and --html, on the same
    report), not for the terminal report, which does not draw them and prints the same either way;
    ``ingest --analyze`` prints it the terminal's way (print_run_report)."""
    from tracekit.analyses import critical_path

    calls = []
    real = critical_path.path_strips
    monkeypatch.setattr(critical_path, "path_strips", lambda *a: calls.append(a) or real(*a))
    assert main(["analyze", "--store", str(tp_store.path)]) == 0
    terminal = capsys.readouterr().out
    assert calls == [] and "Critical path per step and rank" in terminal
    assert main(["analyze", "--store", str(tp_store.path), "--json"]) == 0
    paths = json.loads(capsys.readouterr().out)["critical_path"]["paths"]
    assert len(calls) == 1 and len(paths) == 4  # tp_2rank: 2 ranks × 2 steps
    from tracekit.report.data import build_report, print_report, print_run_report

    for strips in (True, False):  # the terminal's text is the same either way
        rep = build_report(tp_store, strips=strips)
        assert (rep["critical_path"]["paths"] is None) == (not strips)
        print_report(rep)
        assert capsys.readouterr().out == terminal
    from tracekit.report.html import write_html_report

    with pytest.raises(ValueError, match="strips=False"):  # the page would draw no strips
        write_html_report(tp_store, tmp_path / "page.html", report=rep)
    assert not (tmp_path / "page.html").exists()
    calls.clear()
    print_run_report(tp_store, tp_store.resolve_run())  # the newest run, as analyze's default
    assert calls == [] and capsys.readouterr().out == terminal


def _named_in_source(name: str) -> set[str]:
    """The names a module's statements hold: SQL tokens but comments (statement_names), or for a
    Python module those of every string constant but docstrings (its SQL)."""
    sql = analyses.sql_text(name)
    if sql is not None:
        return analyses.statement_names(sql)
    tree = ast.parse(resources.files(analyses).joinpath(f"{name}.py").read_text(encoding="utf-8"))
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            out |= set(re.findall(r"[a-z_][a-z0-9_]*", n.value.lower()))
    return out


@pytest.mark.parametrize("module", analyses.MODULES, ids=lambda m: m.name)
def test_each_module_creates_what_it_declares_and_binds_with_what_it_reads(tp_store, module):
    con = analyses.connect(tp_store, link="nvlink4")
    base = _objects(con)
    assert set(module.reads) <= base | set(analyses.DEFINED_BY), module.reads  # each read exists somewhere
    deps = sorted({analyses.DEFINED_BY[r] for r in module.reads if r in analyses.DEFINED_BY} - {module.name})
    if deps:
        con.analyses.ensure(deps)  # what it reads, built
    assert module.name not in con.analyses.built
    before = _objects(con)
    assert set(module.reads) <= before
    con.analyses = None  # nothing built on the way: the module binds with what is there, or fails
    analyses.create_module(con, module.name)
    assert _objects(con) - before == set(module.defines)
    con.close()
    # and its statements name no relation of another module, nor a base view, that it does not declare
    known = set(analyses.DEFINED_BY) | set(TABLES)
    undeclared = (_named_in_source(module.name) & known) - set(module.reads) - set(module.defines)
    assert not undeclared, f"{module.name} names {sorted(undeclared)} without declaring them"


def test_no_column_is_named_as_a_relation(tp_store):
    """statement_names takes every identifier for a possible relation: a column named as one would
    build its module needlessly (never wrongly)."""
    con = analyses.connect(tp_store, link="nvlink4")
    con.analyses.ensure_all()
    cols = {c for (c,) in con.duckdb.execute("SELECT DISTINCT column_name FROM duckdb_columns()").fetchall()}
    assert not cols & set(analyses.DEFINED_BY)


def _documented(names: set[str]) -> dict[str, list[tuple[str, str]]]:
    """object name → [(column, TYPE)] from the module headers.

    A header line ``name: text`` or ``name, name2: text`` (SQL: after ``--``; Python: in the module
    docstring) whose names are among ``names`` (the views, tables and macros) starts a block; each following ``column  TYPE  meaning`` line is
    one of its columns, in order.
    """
    import importlib

    texts = []
    for name in (m.name for m in analyses.MODULES):
        sql = analyses.sql_text(name)
        if sql is not None:
            texts.append("\n".join(l[2:].strip() for l in sql.splitlines() if l.startswith("--")))
        else:
            texts.append(importlib.import_module(f"tracekit.analyses.{name}").__doc__ or "")
    head = re.compile(r"^([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*):(?:\s|$)")
    col = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s+([A-Z]+(?:\[\])?)(?:\s|$)")
    blocks: dict[str, list[list]] = {}
    for text in texts:
        cur = None
        for line in text.splitlines():
            line = line.strip()
            if (m := head.match(line)) and set(m.group(1).split(", ")) <= names:
                cur = []
                for n in m.group(1).split(", "):
                    blocks.setdefault(n, []).append(cur)
            elif cur is not None and (m := col.match(line)) and m.group(2).rstrip("[]") in _TYPES:
                cur.append((m.group(1), m.group(2)))
    out = {}
    for n, bl in blocks.items():
        full = [b for b in bl if b]
        assert len(full) <= 1, f"{n}: columns documented in {len(full)} places"
        if full:
            out[n] = full[0]
    return out


def test_every_view_and_table_matches_its_documented_columns(tp_store):
    con = analyses.connect(tp_store, link="nvlink4")
    con.analyses.ensure_all()
    objects = [n for (n,) in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE NOT internal AND schema_name = 'main' "
        "UNION ALL SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' ORDER BY 1").fetchall()
        if not n.startswith("_") and n not in TABLES]
    assert len(objects) >= 14
    macros = {n for (n,) in con.execute("SELECT function_name FROM duckdb_functions() WHERE NOT internal").fetchall()}
    doc = _documented(set(objects) | macros | {n for (n,) in con.execute(
        "SELECT view_name FROM duckdb_views() UNION ALL SELECT table_name FROM duckdb_tables()").fetchall()})
    missing = [n for n in objects if n not in doc]
    assert not missing, f"views/tables without a documented column list: {missing}"
    for name in objects:
        got = [(r[0], r[1]) for r in con.execute(f"DESCRIBE {name}").fetchall()]
        assert got == doc[name], name
