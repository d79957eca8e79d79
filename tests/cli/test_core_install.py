"""The analyzer installs and works without torch: a fresh venv (no system site packages) with
`pip install <repo>` (the core dependencies from the package index), then ingest + analyze +
report + sql on the TP fixture, torch not importable, `collect` refused with exit 2.

Skipped with the reason when the package index cannot be reached. Minutes, not seconds: it
downloads (or takes from pip's cache) duckdb, pyarrow, pandas, numpy and the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import FIXTURES, REPO

pytestmark = pytest.mark.slow

INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def _index_reachable() -> str | None:
    try:
        urllib.request.urlopen(f"{INDEX}/duckdb/", timeout=10).close()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means: no index here
        return f"package index {INDEX} unreachable ({type(exc).__name__}): cannot build a core-only venv"


def _sources(dst):
    """The installable sources only (no .venv, no build outputs, no fixtures)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build")
    for name in ("tracekit",):
        shutil.copytree(REPO / name, dst / name, ignore=ignore)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dst / name)


def test_core_install_without_torch(tmp_path):
    why = _index_reachable()
    if why:
        pytest.skip(why)
    src, venv, store = tmp_path / "src", tmp_path / "venv", tmp_path / "store"
    src.mkdir()
    _sources(src)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py, tk = venv / "bin" / "python", venv / "bin" / "tracekit"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # --no-compile: what is installed is the same, without pip's bytecode pass over every file of the
    # dependencies, which costs more than the five commands below spend compiling the modules they
    # import (benchmarks/README.md)
    p = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-compile", str(src)], capture_output=True,
                       text=True, timeout=1500, env=env)
    assert p.returncode == 0, p.stderr[-3000:]

    def run(*args, check=True):
        r = subprocess.run([str(tk), *args], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
        if check:
            assert r.returncode == 0, r.stderr[-3000:]
        return r

    probe = subprocess.run([str(py), "-c", "import importlib.util as u, tracekit, sys; "
                            "print(u.find_spec('torch') is None, tracekit.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    no_torch, where = probe.stdout.split()
    assert no_torch == "True" and where.startswith(str(venv))  # the venv's own copy, without torch
    run("ingest", "--store", str(store), str(FIXTURES / "tp_2rank"))
    rep = json.loads(run("analyze", "--store", str(store), "--json").stdout)
    # fixtures/tp_2rank: 2 all-reduces per layer per active step, 2 layers, 2 steps = 8 instances
    assert {c["op"]: c["count"] for c in rep["collectives"]} == {"all_reduce": 8}
    assert "all_reduce" in run("analyze", "--store", str(store)).stdout
    out = json.loads(run("sql", "--store", str(store), "SELECT count(*) AS n FROM collective_instances",
                         "--format", "json").stdout)
    assert out == [{"n": 8}]
    r = run("collect", "tp", check=False)
    assert r.returncode == 2 and "needs torch" in r.stderr
