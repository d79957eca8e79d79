"""The layers point one way (README, "Architecture"), checked on the import statements of the source.

collectors → tracekit (ingest, store) ← analyses ← report/cli: the store imports no analysis, the
ingest and the model import neither analyses nor reports, and only tracekit/cli (and collectors
itself) imports collectors.
"""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO


def _imports(path) -> set[str]:
    """Absolute module names a file imports (``import a.b`` and ``from a.b import c`` give a.b)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _files(*parts):
    return sorted(p for part in parts for p in (REPO / part).rglob("*.py"))


def _hits(files, banned) -> list[str]:
    bad = []
    for f in files:
        for mod in _imports(f):
            if any(mod == b or mod.startswith(b + ".") for b in banned):
                bad.append(f"{f.relative_to(REPO)} imports {mod}")
    return bad


COLLECTORS = ("tracekit.collectors",)
ABOVE_STORE = ("tracekit.analyses", "tracekit.report", "tracekit.cli", "tracekit.api")


def test_only_the_cli_imports_the_collectors():
    files = [f for f in _files("tracekit") if not {"cli", "collectors"} & set(f.relative_to(REPO).parts)
             and f != REPO / "tracekit" / "__init__.py"]  # the package face: its lazy tracekit.profile
    assert len(files) > 20
    assert _hits(files, COLLECTORS) == []


def test_store_ingest_and_model_import_nothing_above_them():
    files = _files("tracekit/store", "tracekit/timeline", "tracekit/ingest", "tracekit/model")
    assert _hits(files, ABOVE_STORE + COLLECTORS) == []


def test_analyses_import_no_report_cli_or_collector():
    assert _hits(_files("tracekit/analyses"), ABOVE_STORE[1:] + COLLECTORS) == []


@pytest.mark.parametrize("banned", [("tracekit.collectors",), ("tracekit.analyses",)])
def test_the_check_sees_an_import(tmp_path, banned):
    f = tmp_path / "x.py"
    f.write_text(f"def g():\n    from {banned[0]}.sub import thing\n")
    assert _imports(f) == {f"{banned[0]}.sub", f"{banned[0]}.sub.thing"}
