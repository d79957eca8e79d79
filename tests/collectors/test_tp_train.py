"""`collect tp --mode train`: Megatron's f/g conjugate all-reduces, the gradient check, and
the recorded trace's all-reduce count (4 × layers per step).

Fast tests run the training step in-process: TP ranks are threads whose all-reduce is a sum
through a barrier, checked against an unsharded model written out here (not tp.forward_train);
the `slow` one launches a real 2-rank gloo job.
"""

from __future__ import annotations

import json
import threading

import pytest

from tracekit.errors import BadInputError

torch = pytest.importorskip("torch")

from tracekit.collectors.workloads import tp  # noqa: E402
from test_tp_workload import _no_rank_processes_left, comm_summary, load_trace  # noqa: E402


def _cfg(**kw) -> tp.TPConfig:
    base = dict(ranks=2, layers=2, hidden=64, heads=4, seq=16, batch=2, mode="train")
    base.update(kw)
    return tp.TPConfig(**base).resolved()


class ThreadGroup:
    """`world` threads acting as a TP group: all_reduce(t) sums t in place over them."""

    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world)
        self.slots: list = [None] * world
        self.calls = [0] * world

    def all_reduce_for(self, rank: int):
        def all_reduce(t):
            self.calls[rank] += 1
            self.slots[rank] = t.clone()
            self.barrier.wait()
            total = sum(self.slots)
            self.barrier.wait()
            t.copy_(total)

        return all_reduce


def _train_on_threads(cfg, full, x, target, world):
    """One training step's gradients on every simulated rank: {rank: {name: grad}}, and the calls."""
    group = ThreadGroup(world)
    grads, losses, errors = {}, {}, []

    def run(r):
        try:
            shard = tp.shard_weights(full, r, world, cfg.heads)
            params = tp.shard_parameters(shard)
            loss = tp.mse_loss(tp.forward_train(x, shard, group.all_reduce_for(r), cfg.eps), target)
            loss.backward()
            grads[r] = {n: p.grad for n, p in params}
            losses[r] = loss.item()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return grads, losses, group.calls


def _unsharded_grads(cfg, full, x, target):
    """The gradients of the plain transformer (full weights, no shards, no f/g), by autograd."""
    import torch.nn.functional as F

    leaves = {}

    def leaf(name, t):
        leaves[name] = t.detach().clone().requires_grad_(True)
        return leaves[name]

    B, S, H = x.shape
    nh, d = cfg.heads, cfg.head_dim
    h_ = x
    for i, L in enumerate(full["layers"]):
        W = {k: leaf(f"{i}.{k}", v) for k, v in L.items()}
        h = tp.rms_norm(h_, W["attn_norm"], cfg.eps)
        q, k, v = ((h @ W[w].T).reshape(B, S, nh, d).transpose(1, 2) for w in ("wq", "wk", "wv"))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, H)
        h_ = h_ + a @ W["wo"].T
        h = tp.rms_norm(h_, W["mlp_norm"], cfg.eps)
        h_ = h_ + (F.silu(h @ W["w_gate"].T) * (h @ W["w_up"].T)) @ W["w_down"].T
    out = tp.rms_norm(h_, leaf("final_norm", full["final_norm"]), cfg.eps)
    loss = ((out - target) ** 2).mean()
    loss.backward()
    return loss.item(), {k: v.grad for k, v in leaves.items()}


@pytest.mark.parametrize("world", [2, 4])
def test_tp_gradients_equal_the_unsharded_models(world):
    cfg = _cfg(ranks=world, heads=4)
    full, x, target = tp.init_weights(cfg), tp.make_input(cfg), tp.make_target(cfg)
    ref_loss, ref = _unsharded_grads(cfg, full, x, target)
    grads, losses, calls = _train_on_threads(cfg, full, x, target, world)
    # f in backward and g in forward of both blocks: 4 all-reduces per layer per rank
    assert calls == [4 * cfg.layers] * world
    assert all(abs(v - ref_loss) < 1e-5 for v in losses.values())
    H, F_ = cfg.hidden, cfg.ffn
    hs, fs = H // world, F_ // world
    for r in range(world):
        rows, frows = slice(r * hs, (r + 1) * hs), slice(r * fs, (r + 1) * fs)
        for i in range(cfg.layers):
            g = grads[r]
            want_qkv = torch.cat([ref[f"{i}.wq"][rows], ref[f"{i}.wk"][rows], ref[f"{i}.wv"][rows]])
            want_gu = torch.cat([ref[f"{i}.w_gate"][frows], ref[f"{i}.w_up"][frows]])
            torch.testing.assert_close(g[f"layers.{i}.wqkv"], want_qkv, atol=1e-6, rtol=1e-4)
            torch.testing.assert_close(g[f"layers.{i}.wo"], ref[f"{i}.wo"][:, rows], atol=1e-6, rtol=1e-4)
            torch.testing.assert_close(g[f"layers.{i}.w_gate_up"], want_gu, atol=1e-6, rtol=1e-4)
            torch.testing.assert_close(g[f"layers.{i}.w_down"], ref[f"{i}.w_down"][:, frows], atol=1e-6, rtol=1e-4)
            # replicated norms: the full gradient on every rank (f's backward all-reduce makes it so)
            torch.testing.assert_close(g[f"layers.{i}.attn_norm"], ref[f"{i}.attn_norm"], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(grads[r]["final_norm"], ref["final_norm"], atol=1e-6, rtol=1e-4)


def test_reference_grads_sharded_match_the_unsharded_model():
    cfg = _cfg(ranks=2)
    full, x, target = tp.init_weights(cfg), tp.make_input(cfg), tp.make_target(cfg)
    ref_loss, ref = _unsharded_grads(cfg, full, x, target)
    loss, grads = tp.reference_grads(cfg, full, x, target)
    assert abs(loss.item() - ref_loss) < 1e-6
    r1 = tp.sharded_grads(grads, 1, 2, cfg.heads)
    H = cfg.hidden
    torch.testing.assert_close(r1["layers.0.wo"], ref["0.wo"][:, H // 2 :], atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(r1["layers.1.wqkv"][: H // 2], ref["1.wq"][H // 2 :], atol=1e-7, rtol=1e-5)
    assert len(r1) == 6 * cfg.layers + 1


def test_a_missing_backward_all_reduce_fails_the_gradient_check():
    cfg = _cfg(ranks=2)
    full, x, target = tp.init_weights(cfg), tp.make_input(cfg), tp.make_target(cfg)
    _, ref = tp.reference_grads(cfg, full, x, target)
    grads, _, _ = _train_on_threads(cfg, full, x, target, 2)
    good = tp.compare_grads(grads[0], tp.sharded_grads(ref, 0, 2, cfg.heads), "float32")
    assert good["passed"] and good["max_rel_rms_err"] < 1e-5
    # f without its backward all-reduce: each rank keeps only its partial input gradient
    orig = tp.copy_to_tp
    try:
        tp.copy_to_tp = lambda x, all_reduce: x
        bad_grads, _, calls = _train_on_threads(cfg, full, x, target, 2)
    finally:
        tp.copy_to_tp = orig
    assert calls == [2 * cfg.layers] * 2
    bad = tp.compare_grads(bad_grads[0], tp.sharded_grads(ref, 0, 2, cfg.heads), "float32")
    assert not bad["passed"] and bad["max_rel_rms_err"] > 1e-2


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(mode="backward"), "unknown mode"),
        (dict(overlap_chunks=2), "forward-only"),
        (dict(lr=0.0), "lr must be a positive"),
    ],
)
def test_bad_train_configs(kw, words):
    with pytest.raises(BadInputError, match=words):
        _cfg(**kw)


def test_expected_counts_in_train_mode():
    assert _cfg(layers=3).all_reduces_per_layer * 3 == 12
    assert tp.TPConfig(layers=3).resolved().all_reduces_per_layer == 2


@pytest.mark.slow
def test_real_2rank_train_run(tmp_path):
    cfg = _cfg(hidden=64, heads=4, seq=16, batch=2, wait=1, warmup=1, active=2, out=str(tmp_path))
    run_dir = tp.run_tp(cfg)
    conf = json.loads((run_dir / "run_config.json").read_text())
    check = conf["tp_check"]
    assert check["passed"] and check["max_grad_rel_rms_err"] < 1e-4
    assert check["grads_checked_per_rank"] == 6 * cfg.layers + 1
    assert abs(check["loss"] - check["ref_loss"]) < 1e-5
    assert conf["mode"] == "train" and conf["expected"]["all_reduce_per_step"] == 4 * cfg.layers
    size = cfg.batch * cfg.seq * cfg.hidden * 4
    for r in range(cfg.ranks):
        doc = load_trace(run_dir / f"rank{r}.pt.trace.json.gz")
        s = comm_summary(doc)
        assert s["steps"] == cfg.active
        # per step: g twice in forward, f twice in backward, per layer
        assert s["gloo"] == s["gloo_all"] == 4 * cfg.layers * cfg.active
        assert s["gloo_bytes"] == {size}
        names = {e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"}
        assert any("SGD" in n for n in names) and any("Backward" in n for n in names)
    assert _no_rank_processes_left()


def test_cli_train_with_chunks_exits_2(capsys):
    from tracekit.cli import main

    assert main(["collect", "tp", "--mode", "train", "--overlap-chunks", "2"]) == 2
    assert capsys.readouterr().err.strip() == "tracekit: overlap_chunks > 1 is a forward-only option (mode 'forward')"
