"""Every command's --help: a snapshot at 100 columns, typed metavars (no <bool>/<str>), flags as
--flag/--no-flag, and what each command accepts listed (formats, predict subcommands).

Snapshots live in tests/snapshots/help/<command>.txt; after a deliberate change of options or help
text, regenerate them with TRACEKIT_UPDATE_SNAPSHOTS=1 and review the diff.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import REPO
from tracekit.cli import app, main

SNAPSHOTS = REPO / "tests" / "snapshots" / "help"


def _commands():
    import typer.main

    out = []

    def walk(cmd, path):
        out.append(path)
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            if not getattr(sub, "hidden", False):
                walk(sub, path + [name])

    walk(typer.main.get_command(app), [])
    return out


COMMANDS = _commands()


def _help(path, monkeypatch, capsys) -> str:
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert main(path + ["--help"]) == 0
    text = capsys.readouterr().out
    return "\n".join(line.rstrip() for line in text.splitlines()).strip() + "\n"


def test_every_command_is_listed():
    names = {" ".join(p) for p in COMMANDS}
    assert {"ingest", "analyze", "runs", "sql", "export", "diff", "profile", "collect tp", "collect sweep",
            "predict all_reduce", "predict broadcast", "predict send", "predict links"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "tracekit")
def test_help_snapshot(path, monkeypatch, capsys):
    text = _help(path, monkeypatch, capsys)
    assert not re.search(r"<(bool|str|int|float|path|list\[[^\]]*\])>", text), text
    for line in text.splitlines():  # every boolean is a --flag/--no-flag pair
        m = re.match(r"[│|]\s+\*?\s*(--[a-z-]+)\s+(--no-[a-z-]+)?", line)
        if m and m.group(1) in ("--json", "--replace", "--analyze", "--ingest") and "--help" not in line:
            assert m.group(2) == "--no-" + m.group(1)[2:], line
    f = SNAPSHOTS / (("_".join(path) or "tracekit") + ".txt")
    if os.environ.get("TRACEKIT_UPDATE_SNAPSHOTS"):
        f.write_text(text, encoding="utf-8")
    assert f.is_file(), f"{f.name}: no snapshot (TRACEKIT_UPDATE_SNAPSHOTS=1 writes it)"
    assert text == f.read_text(encoding="utf-8")


def test_help_lists_what_commands_accept(monkeypatch, capsys):
    predict = _help(["predict"], monkeypatch, capsys)
    for sub in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "overlap",
                "transfer", "pp-decode", "links"):
        assert re.search(rf"│ {re.escape(sub)}\s", predict), sub
    ingest = _help(["ingest"], monkeypatch, capsys)
    assert "Kineto" in ingest and "Nsight" in ingest and "nccl-tests" in ingest
    sql = _help(["sql"], monkeypatch, capsys)
    assert "table|csv|json|parquet" in sql and "--output" in sql
    assert re.search(r"--json +--no-json", _help(["analyze"], monkeypatch, capsys))
    assert re.search(r"--replace +--no-replace", ingest)


def test_the_collectors_load_only_for_collect():
    """`tracekit collect`'s subcommands (and the collectors' workload configs they read their options
    from) are imported when that group is first looked up: another command never loads them."""
    import ast
    import subprocess
    import sys

    probe = ("import sys; from tracekit.cli import main; rc = main(sys.argv[1:]); "
             "print(rc, sorted({m.split('.')[2] for m in sys.modules if m.startswith('tracekit.collectors.')}))")

    def run(*args):
        out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=REPO, check=True)
        return out.stdout.strip().splitlines()[-1]

    assert run("predict", "links") == "0 []"
    rc, loaded = run("collect", "tp", "--help").split(" ", 1)
    assert rc == "0" and {"launch", "workloads"} <= set(ast.literal_eval(loaded))
