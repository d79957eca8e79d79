"""The TP workload: the sharded forward equals the single-process one, bad
configurations are refused, and the recorded traces hold exactly the
all-reduces the model issues, with sizes read from the traces' own metadata.

Fast tests run the model in-process and read the recorded fixture
(fixtures/tp_2rank); the `slow` ones launch real 2-rank gloo jobs.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import pytest

from tracekit.errors import BadInputError

torch = pytest.importorskip("torch")

from tracekit.collectors import launch  # noqa: E402
from tracekit.collectors.workloads import tp  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "tp_2rank"

# Kineto's "Input type" spelling → bytes per element
TYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8}


# --------------------------------------------------------------------------- in-process model


def _small(**kw) -> tp.TPConfig:
    base = dict(ranks=2, layers=2, hidden=64, heads=4, seq=16, batch=2)
    base.update(kw)
    return tp.TPConfig(**base).resolved()


def _simulated_tp_forward(cfg: tp.TPConfig, full, x, world: int):
    """TP by hand, in one process: every rank's partial of each block, summed
    (what the all-reduce does), written independently of tp.forward."""
    shards = [tp.shard_weights(full, r, world, cfg.heads) for r in range(world)]
    for i in range(cfg.layers):
        h = tp.rms_norm(x, full["layers"][i]["attn_norm"], cfg.eps)
        x = x + sum(tp.attention_partial(h, s["layers"][i]) for s in shards)
        h = tp.rms_norm(x, full["layers"][i]["mlp_norm"], cfg.eps)
        x = x + sum(tp.mlp_partial(h, s["layers"][i]) for s in shards)
    return tp.rms_norm(x, full["final_norm"], cfg.eps)


def _reference_forward(cfg: tp.TPConfig, full, x):
    """The plain transformer with the full weights, written out without shards."""
    import torch.nn.functional as F

    B, S, H = x.shape
    nh, d = cfg.heads, cfg.head_dim
    for L in full["layers"]:
        h = tp.rms_norm(x, L["attn_norm"], cfg.eps)
        q, k, v = ((h @ w.T).reshape(B, S, nh, d).transpose(1, 2) for w in (L["wq"], L["wk"], L["wv"]))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, H)
        x = x + a @ L["wo"].T
        h = tp.rms_norm(x, L["mlp_norm"], cfg.eps)
        x = x + (F.silu(h @ L["w_gate"].T) * (h @ L["w_up"].T)) @ L["w_down"].T
    return tp.rms_norm(x, full["final_norm"], cfg.eps)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_sharded_forward_equals_single_process(world):
    cfg = _small(ranks=world)
    full = tp.init_weights(cfg)
    x = tp.make_input(cfg)
    with torch.no_grad():
        ref = _reference_forward(cfg, full, x)
        single = tp.forward(x, tp.shard_weights(full, 0, 1, cfg.heads), None, cfg.eps)
        sim = _simulated_tp_forward(cfg, full, x, world)
    torch.testing.assert_close(single, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sim, ref, atol=1e-5, rtol=1e-5)
    assert tp.compare(sim, ref, "float32")["passed"]


def test_forward_calls_all_reduce_twice_per_layer_on_partial_sums():
    cfg = _small(layers=3)
    full = tp.init_weights(cfg)
    x = tp.make_input(cfg)
    seen = []
    with torch.no_grad():
        tp.forward(x, tp.shard_weights(full, 1, 2, cfg.heads), lambda t: seen.append(tuple(t.shape)), cfg.eps)
    assert seen == [(cfg.batch, cfg.seq, cfg.hidden)] * (2 * cfg.layers)


def test_shard_shapes_and_slices():
    cfg = _small(ranks=2, hidden=64, heads=4, ffn=128)
    full = tp.init_weights(cfg)
    s1 = tp.shard_weights(full, 1, 2, cfg.heads)["layers"][0]
    f0 = full["layers"][0]
    assert s1["wqkv"].shape == (3 * 32, 64) and s1["wo"].shape == (64, 32)
    assert s1["w_gate_up"].shape == (2 * 64, 64) and s1["w_down"].shape == (64, 64)
    assert s1["local_heads"] == 2
    torch.testing.assert_close(s1["wqkv"][32:64], f0["wk"][32:64])  # rank 1's key heads
    torch.testing.assert_close(s1["wo"], f0["wo"][:, 32:])
    torch.testing.assert_close(s1["w_gate_up"][64:], f0["w_up"][64:])
    torch.testing.assert_close(s1["w_down"], f0["w_down"][:, 64:])


def test_weights_are_deterministic_in_the_seed():
    a = tp.init_weights(_small(seed=3))["layers"][1]["w_down"]
    b = tp.init_weights(_small(seed=3))["layers"][1]["w_down"]
    c = tp.init_weights(_small(seed=4))["layers"][1]["w_down"]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_compare_catches_a_wrong_shard():
    cfg = _small()
    full = tp.init_weights(cfg)
    x = tp.make_input(cfg)
    with torch.no_grad():
        ref = tp.forward(x, tp.shard_weights(full, 0, 1, cfg.heads), None)
        # a "TP" that forgets the all-reduce: one rank's partials only
        shard = tp.shard_weights(full, 0, 2, cfg.heads)
        wrong = tp.forward(x, shard, None)
    res = tp.compare(wrong, ref, "float32")
    assert not res["passed"] and res["max_abs_err"] > 0.1
    assert not tp.compare(wrong.bfloat16(), ref.bfloat16(), "bfloat16")["passed"]


def test_bfloat16_tp_passes_its_check():
    cfg = _small(dtype="bf16", layers=4)
    full = tp.init_weights(cfg)
    x = tp.make_input(cfg)
    with torch.no_grad():
        ref = tp.forward(x, tp.shard_weights(full, 0, 1, cfg.heads), None)
        sim = _simulated_tp_forward(cfg, full, x, 2)
    assert sim.dtype == torch.bfloat16
    res = tp.compare(sim, ref, "bfloat16")
    assert res["passed"], res


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(heads=6, ranks=4), "heads (6) must be divisible by ranks (4)"),
        (dict(hidden=100, heads=8), "hidden (100) must be divisible by heads (8)"),
        (dict(ranks=0), "ranks must be between 1 and 8"),
        (dict(ranks=9, heads=9), "ranks must be between 1 and 8"),
        (dict(dtype="int8"), "unsupported dtype"),
        (dict(steps=3), "steps=3 is fewer than the profiler schedule needs"),
        (dict(active=0), "active must be >= 1"),
        (dict(layers=0), "layers must be a positive integer"),
        (dict(ffn=100, ranks=8), "ffn (100) must be divisible by ranks (8)"),
        (dict(backend="mpi"), "unknown backend"),
    ],
)
def test_bad_configs_raise_bad_input(kw, words):
    with pytest.raises(BadInputError) as ei:
        tp.TPConfig(**kw).resolved()
    assert words in str(ei.value)
    assert "\n" not in str(ei.value)


def test_resolved_defaults():
    c = tp.TPConfig().resolved()
    assert (c.steps, c.ffn, c.dtype) == (5, 1408, "float32")
    assert tp.TPConfig(dtype="bf16").resolved().dtype == "bfloat16"
    assert c.all_reduce_bytes == 4 * 128 * 512 * 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: nccl is allowed")
def test_nccl_without_cuda_is_bad_input(tmp_path):
    with pytest.raises(BadInputError, match="needs CUDA"):
        tp.run_tp(tp.TPConfig(backend="nccl", out=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []  # refused before anything was created


def test_cli_bad_config_exits_2(capsys):
    from tracekit.cli import main

    assert main(["collect", "tp", "--heads", "6"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "tracekit: hidden (512) must be divisible by heads (6)"


def test_run_id_shape():
    import re

    assert re.fullmatch(r"tp-\d{8}-\d{6}-[0-9a-f]{4}", launch.new_run_id("tp"))


# --------------------------------------------------------------------------- traces


def load_trace(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def comm_summary(doc: dict) -> dict:
    """What a rank's trace says about its all-reduces, from the trace alone."""
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    in_window = [e for e in ev if lo <= e["ts"] and e["ts"] + e["dur"] <= hi]
    gloo = [e for e in in_window if e["name"] == "gloo:all_reduce"]
    c10d = [e for e in in_window if e["name"] == "c10d::allreduce_"]
    gloo_bytes = [math.prod(e["args"]["Input Dims"][0]) * TYPE_BYTES[e["args"]["Input type"][0]] for e in gloo]
    c10d_elems = [math.prod(e["args"]["Input Dims"][0][0]) for e in c10d]
    ranges = sorted({e["name"] for e in in_window if e["name"].startswith("layer")})
    return {
        "steps": len(steps),
        "gloo": len(gloo),
        "gloo_all": sum(e["name"] == "gloo:all_reduce" for e in ev),
        "c10d": len(c10d),
        "gloo_bytes": set(gloo_bytes),
        "c10d_elems": set(c10d_elems),
        "gloo_threads": {e["tid"] for e in gloo},
        "gloo_cat": {e["cat"] for e in gloo},
        "ranges": ranges,
    }


def check_run_folder(run_dir: Path, cfg: tp.TPConfig) -> None:
    conf = json.loads((run_dir / "run_config.json").read_text())
    assert conf["workload"] == "tp" and conf["world_size"] == cfg.ranks and conf["backend"] == "gloo"
    assert conf["tp_check"]["passed"] and conf["tp_check"]["max_abs_err"] < 1e-4
    assert conf["expected"]["all_reduce_bytes"] == cfg.batch * cfg.seq * cfg.hidden * cfg.dtype_bytes
    for key in ("torch_version", "device_name", "hostname"):
        assert conf[key]
    assert len(conf["timing"]["step_wall_s"]) == cfg.ranks
    assert all(len(s) == cfg.steps for s in conf["timing"]["step_wall_s"])
    n_expected = 2 * cfg.layers * cfg.active
    size = cfg.batch * cfg.seq * cfg.hidden * cfg.dtype_bytes
    for r in range(cfg.ranks):
        doc = load_trace(run_dir / f"rank{r}.pt.trace.json.gz")
        info = doc["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (r, cfg.ranks, "gloo")
        s = comm_summary(doc)
        assert s["steps"] == cfg.active
        assert s["gloo"] == s["gloo_all"] == n_expected
        assert s["c10d"] == n_expected
        assert s["gloo_bytes"] == {size}
        assert s["c10d_elems"] == {cfg.batch * cfg.seq * cfg.hidden}
        assert s["gloo_cat"] == {"user_annotation"}
        assert s["ranges"] == sorted(f"layer{i}.{b}" for i in range(cfg.layers) for b in ("attention", "mlp"))


FIXTURE_CFG = tp.TPConfig(ranks=2, layers=2, hidden=256, heads=4, seq=64, batch=2, wait=1, warmup=1, active=2)


def test_fixture_traces_hold_exactly_the_models_all_reduces():
    cfg = FIXTURE_CFG.resolved()
    check_run_folder(FIXTURE, cfg)
    for r in range(2):
        assert (FIXTURE / f"rank{r}.pt.trace.json.gz").stat().st_size < 1_000_000
    conf = json.loads((FIXTURE / "run_config.json").read_text())
    for k in ("ranks", "layers", "hidden", "heads", "seq", "batch", "wait", "warmup", "active", "dtype"):
        assert conf[k] == getattr(cfg, k), k


# --------------------------------------------------------------------------- real jobs


def _no_rank_processes_left() -> bool:
    import subprocess

    out = subprocess.run(["ps", "-o", "pid=,ppid=,args=", "--ppid", str(os.getpid())], capture_output=True, text=True)
    return "tracekit.collectors._rank" not in out.stdout


@pytest.mark.slow
def test_real_2rank_gloo_run(tmp_path):
    cfg = tp.TPConfig(ranks=2, layers=2, hidden=128, heads=4, seq=32, batch=2, active=2, out=str(tmp_path)).resolved()
    run_dir = tp.run_tp(cfg)
    assert run_dir.parent == tmp_path and run_dir.name.startswith("tp-")
    check_run_folder(run_dir, cfg)
    # only the traces and the config at the top level (logs in a subfolder)
    assert sorted(p.name for p in run_dir.iterdir() if p.is_file()) == [
        "rank0.pt.trace.json.gz",
        "rank1.pt.trace.json.gz",
        "run_config.json",
    ]
    assert _no_rank_processes_left()


@pytest.mark.slow
def test_wrong_tp_fails_loudly(tmp_path):
    cfg = tp.TPConfig(ranks=2, layers=1, hidden=64, heads=2, seq=8, batch=1, out=str(tmp_path), fault="corrupt_shard")
    with pytest.raises(launch.RankFailedError) as ei:
        tp.run_tp(cfg)
    msg = str(ei.value)
    assert "TP output differs from the single-process forward: max abs error" in msg
    assert ei.value.exit_code == 1 and "\n" not in msg
    run_dir = next(tmp_path.iterdir())
    assert not (run_dir / "run_config.json").exists()
    assert _no_rank_processes_left()


@pytest.mark.slow
def test_a_raising_rank_fails_the_job_with_its_message(tmp_path):
    cfg = tp.TPConfig(ranks=2, layers=1, hidden=64, heads=2, seq=8, batch=1, out=str(tmp_path), fault="raise")
    with pytest.raises(launch.RankFailedError) as ei:
        tp.run_tp(cfg)
    assert ei.value.rank == 1
    assert "rank 1 failed: RuntimeError: injected fault" in str(ei.value)
    assert ei.value.log_path and Path(ei.value.log_path).read_text().startswith("Traceback")
    assert _no_rank_processes_left()
