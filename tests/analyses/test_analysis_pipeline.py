"""The analyses as an explicit pipeline: every module listed once, built on first use, once per report,
and every view and table exactly as its module's header documents it (DESCRIBE against the header).
"""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from tracekit import analyses
from tracekit.cli import main
from tracekit.ingest import ingest_paths
from tracekit.store import TABLES, Store

from conftest import FIXTURES

_TYPES = {"VARCHAR", "BIGINT", "INTEGER", "DOUBLE", "BOOLEAN"}


@pytest.fixture(scope="module")
def tp_store(tmp_path_factory):
    st = Store(tmp_path_factory.mktemp("pipeline") / "s")
    ingest_paths([FIXTURES / "tp_2rank"], st, run_id="tp")
    return st


def _created(monkeypatch) -> list[str]:
    """The names of the modules created from now on, in order (analyses.create_module recorded)."""
    made: list[str] = []
    real = analyses.create_module

    def record(con, name):
        made.append(name)
        real(con, name)

    monkeypatch.setattr(analyses, "create_module", record)
    return made


def test_the_pipeline_lists_every_module_file_once():
    files = sorted(f.name.rsplit(".", 1)[0] for f in resources.files(analyses).iterdir()
                   if f.name.endswith((".sql", ".py")) and f.name != "__init__.py")
    assert sorted(analyses.PIPELINE) == files
    assert len(set(analyses.PIPELINE)) == len(analyses.PIPELINE)


def test_a_base_table_query_builds_no_analysis(tp_store, monkeypatch, capsys):
    made = _created(monkeypatch)
    assert main(["sql", "--store", str(tp_store.path), "--json", "SELECT count(*) AS n FROM events"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["n"] > 0 and made == []


def test_a_view_builds_the_modules_up_to_it_and_no_further(tp_store, monkeypatch):
    made = _created(monkeypatch)
    con = analyses.connect(tp_store)
    (n,) = con.execute("SELECT count(*) FROM collective_bandwidth").fetchone()
    upto = analyses.PIPELINE[: analyses.PIPELINE.index("collective_bandwidth") + 1]
    assert made == list(upto) and con.loaded == list(upto)
    assert n == con.execute("SELECT count(*) FROM collective_instances").fetchone()[0] > 0
    assert made == list(upto)  # already there: nothing built again
    assert "overlap_windows" not in made and "fit" not in made


def test_a_misspelt_name_still_fails_once_everything_is_built(tp_store):
    import duckdb

    con = analyses.connect(tp_store)
    with pytest.raises(duckdb.CatalogException):
        con.execute("SELECT * FROM collective_verdictz")
    assert con.loaded == list(analyses.PIPELINE)


def test_analyze_with_json_and_html_builds_each_module_once(tp_store, monkeypatch, tmp_path, capsys):
    made = _created(monkeypatch)
    html = tmp_path / "r.html"
    assert main(["analyze", "--store", str(tp_store.path), "--json", "--html", str(html)]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["run_id"] == "tp"
    assert html.stat().st_size > 10_000
    # every module but the per-GPU-op tables, which no report reads; none twice
    assert sorted(made) == sorted(set(analyses.PIPELINE) - {"gpu_launchers"})


def test_the_islands_are_built_only_when_asked(tp_store, monkeypatch, capsys):
    """The terminal/JSON report never binds the island views (they read every rank's events file);
    ensure() creates them, and the interval macros they read, without the modules between."""
    made = _created(monkeypatch)
    assert main(["analyze", "--store", str(tp_store.path), "--json"]) == 0
    capsys.readouterr()
    assert "overlap_islands" not in made and "critical_path" in made
    made.clear()
    con = analyses.connect(tp_store)
    con.ensure("overlap_islands")
    assert made == ["intervals", "overlap_islands"] and con.loaded == []
    (n,) = con.execute("SELECT count(*) FROM compute_islands WHERE run_id = 'tp'").fetchone()
    assert n > 0 and made == ["intervals", "overlap_islands"]  # bound: nothing else built
    con.ensure("overlap_islands")
    assert made == ["intervals", "overlap_islands"]
    con.load_all()  # the pipeline skips what ensure() created
    assert sorted(made) == sorted(analyses.PIPELINE) and con.loaded == list(analyses.PIPELINE)
    made.clear()  # a user's statement naming an island view creates that module alone; so does one
    assert main(["sql", "--store", str(tp_store.path), "--json",  # naming a per-GPU-op table
                 "SELECT count(*) AS n FROM gpu_launchers"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["n"] == 0 and made == ["gpu_launchers"]  # CPU-only (gloo)
    made.clear()
    assert main(["sql", "--store", str(tp_store.path), "--json",
                 "SELECT count(*) AS n FROM overlap_islands o JOIN compute_islands c USING (run_id, rank, grp)"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["n"] >= 0 and made == ["intervals", "overlap_islands"]


def _documented(names: set[str]) -> dict[str, list[tuple[str, str]]]:
    """object name → [(column, TYPE)] from the module headers.

    A header line ``name: text`` or ``name, name2: text`` (SQL: after ``--``; Python: in the module
    docstring) whose names are among ``names`` (the views, tables and macros) starts a block; each following ``column  TYPE  meaning`` line is
    one of its columns, in order.
    """
    import importlib

    texts = []
    for name in analyses.PIPELINE:
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
    con = analyses.connect(tp_store, link="nvlink4").load_all()
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
