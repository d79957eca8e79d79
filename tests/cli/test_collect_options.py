"""`tracekit collect` options are declared once, on the workload configs (collectors.launch.option):
each command's options are exactly its config's documented fields, with their defaults, and what
the command line says reaches the config."""

from __future__ import annotations

import dataclasses

import pytest
import typer.main

from tracekit.collectors.workloads.disagg_kv import KVConfig
from tracekit.collectors.workloads.ep import EPConfig
from tracekit.collectors.workloads.pp import PPConfig
from tracekit.collectors.workloads.sweep import SweepConfig
from tracekit.collectors.workloads.tp import TPConfig
from tracekit.cli import app, main
from tracekit.errors import BadInputError

CONFIGS = {"tp": TPConfig, "ep": EPConfig, "pp": PPConfig, "disagg-kv": KVConfig, "sweep": SweepConfig}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_options_are_the_configs_documented_fields(name):
    cls = CONFIGS[name]
    cmd = typer.main.get_command(app).commands["collect"].commands[name]
    got = {p.name: p.default for p in cmd.params}
    documented = {f.name: f.metadata.get("cli_default", f.default) for f in dataclasses.fields(cls) if "help" in f.metadata}
    assert {k: v for k, v in got.items() if k not in ("out", "store", "ingest")} == documented
    assert {"ranks", "backend"} <= set(documented) and "timeout_s" not in got and "fault" not in got
    assert all(p.help for p in cmd.params)


def test_the_command_line_reaches_the_config(monkeypatch, tmp_path):
    seen = {}

    def fake_run_ep(cfg, on_progress=None):
        seen["cfg"] = cfg
        raise BadInputError("stop here")

    monkeypatch.setattr("tracekit.collectors.workloads.ep.run_ep", fake_run_ep)
    rc = main(["collect", "ep", "--top-k", "3", "--two-batch-overlap", "--no-attention", "--skew", "2.5",
               "--ffn", "256", "--wait", "0", "--out", str(tmp_path), "--no-ingest"])
    assert rc == 2
    cfg = seen["cfg"]
    assert (cfg.top_k, cfg.two_batch_overlap, cfg.attention, cfg.skew, cfg.ffn, cfg.wait) == (3, True, False, 2.5, 256, 0)
    assert (cfg.ranks, cfg.experts, cfg.active, cfg.out) == (2, 8, 3, str(tmp_path))  # defaults, and --out


def test_sweep_sizes_are_text_on_the_command_line(monkeypatch, tmp_path):
    seen = {}

    def fake_run_sweep(cfg, on_progress=None):
        seen["cfg"] = cfg
        raise BadInputError("stop here")

    monkeypatch.setattr("tracekit.collectors.workloads.sweep.run_sweep", fake_run_sweep)
    assert main(["collect", "sweep", "--ops", "all_reduce,send_recv", "--min-bytes", "4K", "--max-bytes", "1M",
                 "--out", str(tmp_path), "--no-ingest"]) == 2
    cfg = seen["cfg"]
    assert cfg.ops == ("all_reduce", "send_recv") and (cfg.min_bytes, cfg.max_bytes) == (4096, 1 << 20)
