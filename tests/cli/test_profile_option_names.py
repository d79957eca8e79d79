"""`tracekit profile`: the profiler schedule's --wait (steps) and the multi-node --nodes-timeout
(seconds) have names that cannot be confused; the old --wait-timeout still works, hidden, with a
warning. The job is not run: profile_command is replaced by a recorder of the options it gets."""

from __future__ import annotations

import pytest

import tracekit.collectors.profile.runner as runner
from tracekit.cli import main

pytest.importorskip("torch")  # `tracekit profile` checks for torch before anything else


STARTED = 99
"""The exit code the recorder stops with, once it has the options (main() returns a SystemExit's code)."""


@pytest.fixture
def seen(monkeypatch, tmp_path):
    got = []

    def record(command, opts, store=None, on_progress=None):
        got.append(opts)
        raise SystemExit(STARTED)

    monkeypatch.setattr(runner, "profile_command", record)
    monkeypatch.chdir(tmp_path)
    return got


def _run(*args):
    return main(["profile", "--store", "st", *args, "--", "python", "-c", "pass"])


def test_new_name_and_schedule_wait(seen):
    assert _run("--wait", "2", "--nodes-timeout", "42") == STARTED
    assert seen[0].wait == 2 and seen[0].wait_timeout_s == 42.0


def test_old_name_still_read_with_a_warning(seen, capsys):
    assert _run("--wait-timeout", "7") == STARTED
    assert seen[0].wait_timeout_s == 7.0 and seen[0].wait == 1  # the schedule's default wait is untouched
    assert "--wait-timeout is deprecated, use --nodes-timeout" in capsys.readouterr().err


def test_negative_timeout_names_the_option(seen, capsys):
    assert _run("--nodes-timeout", "-1") == 2
    assert "--nodes-timeout must be >= 0 s, got -1.0" in capsys.readouterr().err
    assert not seen


def test_help_shows_the_new_name_only(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["profile", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--nodes-timeout" in out and "--wait-timeout" not in out
    assert "torch.profiler.schedule's wait" in out
