"""`--help` shows typed metavars for numbers and complete choice lists (tests/snapshots/help/ holds
the full texts; tests/cli/test_cli_help.py compares them).

Independent of the snapshots: every option of every command whose default is a number (or that
the commands read as a number, listed here by name) shows a metavar other than TEXT, and no help
text, at 100 columns, cuts a line with "…" (rich's ellipsis for a word longer than its column)."""

from __future__ import annotations

import re

import pytest

from tests.cli.test_cli_help import COMMANDS, SNAPSHOTS, _help
from tracekit.cli import app

NUMERIC = {"--ranks", "--nodes", "--gpus-per-node", "--nics-per-node", "--nics", "--layers", "--stages",
           "--microbatches", "--tokens", "--max-chunks", "--efficiency", "--stage-time", "--transfer",
           "--layer-compute", "--chunks"}


def _options():
    import typer.main

    out = []

    def walk(cmd, path):
        for p in getattr(cmd, "params", []):
            if getattr(p, "param_type_name", "") == "option" and not getattr(p, "is_flag", False):
                out.append((" ".join(path), p))
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, path + [name])

    walk(typer.main.get_command(app), [])
    return out


def _numeric(default) -> bool:
    if isinstance(default, bool) or default is None:
        return False
    if isinstance(default, (int, float)):
        return True
    return bool(re.fullmatch(r"[0-9.eE+-]+", str(default)))


def test_no_text_metavar_for_numbers():
    bad = []
    for path, p in _options():
        long = next((o for o in p.opts if o.startswith("--")), "")
        if (long in NUMERIC or _numeric(p.default)) and (p.metavar or "TEXT") == "TEXT":
            bad.append(f"{path} {long}")
    assert not bad, bad


@pytest.mark.parametrize("path", [p for p in COMMANDS if p[:1] in (["predict"], ["collect"])],
                         ids=lambda p: " ".join(p))
def test_no_cut_lines(path, monkeypatch, capsys):
    text = _help(path, monkeypatch, capsys)
    assert "…" not in text, [line for line in text.splitlines() if "…" in line]


def test_algo_lists_hierarchical(monkeypatch, capsys):
    text = _help(["predict", "all_reduce"], monkeypatch, capsys)
    assert "hierarchical." in text and "double_binary_tree" in text
    assert not any("…" in f.read_text(encoding="utf-8") for f in SNAPSHOTS.glob("*.txt"))
