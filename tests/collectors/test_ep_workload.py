"""The EP (MoE) workload: the expert-parallel forward equals a single-process
reference, the skew bias does what it says, bad configurations are refused, and
the recorded traces hold exactly the all-to-alls the model issues, with split
sizes read from the traces' own metadata.

How the all-to-alls are counted: per MoE layer and micro-batch the workload
issues one *split exchange* (``E`` int64 counts, even splits, "Concrete Inputs"
split lists ``[]``) and two *data* all-to-alls (dispatch inside the
``layer{i}.dispatch`` range, combine inside ``layer{i}.combine``; float rows of
``hidden`` elements with the router's uneven splits). The "2 per layer per
micro-batch" of the issue counts only the data ones; the split exchanges are
counted separately (1 per layer per micro-batch), told apart by their int64 type.

What torch 2.13 + gloo records for ``all_to_all_single`` (see the fixture's NOTE.md):
on the calling thread a ``c10d::alltoall_base_`` cpu_op whose ``Input Dims`` are
``[output dims, input dims, [], [], [], [], []]`` and whose ``Concrete Inputs``
are ``["", "", "", "<output_split_sizes>", "<input_split_sizes>", "<async_op>",
"-1"]``; on a ``pt_gloo_runloop`` thread a ``gloo:all_to_all`` user_annotation
whose ``Input Dims`` hold only the input tensor's dims (no splits).

Fast tests run the model in-process (several "ranks" as threads exchanging
through a fake all-to-all) and read the recorded fixtures (fixtures/ep_2rank and
fixtures/ep_2rank/tbo); the `slow` ones launch real 2-rank gloo jobs.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import threading
from pathlib import Path

import pytest

from tracekit.errors import BadInputError

torch = pytest.importorskip("torch")

from tracekit.collectors import launch  # noqa: E402
from tracekit.collectors.workloads import ep  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "ep_2rank"
FIXTURE_TBO = FIXTURE / "tbo"
TYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8}


# --------------------------------------------------------------------------- a fake world of thread "ranks"


class _Done:
    def wait(self):
        return True


class FakeWorld:
    """`n` ranks as threads; all_to_all_single through a shared table and a barrier
    (every rank must call the collectives in the same order, as with a real group)."""

    def __init__(self, n: int):
        self.n = n
        self.barrier = threading.Barrier(n, timeout=60)
        self.slots: list = [None] * n

    def _exchange(self, rank: int, obj):
        self.slots[rank] = obj
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()
        return got

    def a2a(self, rank: int):
        def all_to_all(out, inp, out_splits=None, in_splits=None, async_op=False):
            ins = in_splits if in_splits is not None else [inp.shape[0] // self.n] * self.n
            table = self._exchange(rank, list(torch.split(inp, ins)))
            mine = [table[s][rank] for s in range(self.n)]
            if out_splits is not None:
                assert [t.shape[0] for t in mine] == list(out_splits), "output splits disagree with what peers sent"
            out.copy_(torch.cat(mine))
            return _Done() if async_op else None

        return all_to_all

    def run(self, fn):
        """fn(rank) on every rank (thread); returns the results by rank, re-raises the first error."""
        results: list = [None] * self.n
        errors: list = []

        def body(r):
            try:
                with torch.no_grad():
                    results[r] = fn(r)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


def _small(**kw) -> ep.EPConfig:
    base = dict(ranks=2, layers=2, hidden=64, heads=4, ffn=96, experts=4, top_k=2, seq=16, batch=4)
    base.update(kw)
    return ep.EPConfig(**base).resolved()


def _simulate(cfg: ep.EPConfig, step: int = 0, full=None):
    """Run ep_forward on cfg.ranks thread ranks; returns [(x, out, routing)] by rank."""
    full = full or ep.init_weights(cfg)
    world = FakeWorld(cfg.ranks)

    def rank_fn(r):
        x = ep.make_input(cfg, r, step)
        out, routing = ep.ep_forward(x, ep.shard_weights(full, r, cfg.ranks), cfg, r, cfg.ranks, world.a2a(r))
        return x, out, routing

    return full, world.run(rank_fn)


# --------------------------------------------------------------------------- in-process model


def _dense_moe_reference(cfg: ep.EPConfig, full, x):
    """The MoE layers written out densely (every expert on every token, masked by
    the top-k), independent of ep.reference_forward's gather/scatter."""
    import torch.nn.functional as F

    H = cfg.hidden
    for L in full["layers"]:
        if cfg.attention:
            x = x + ep.attention_partial(ep.rms_norm(x, L["attn_norm"], cfg.eps), L)
        h = ep.rms_norm(x, L["mlp_norm"], cfg.eps).reshape(-1, H)
        logits = h.float() @ L["w_router"].T + L["router_bias"]
        top, idx = logits.topk(cfg.top_k, dim=-1)
        w = torch.zeros_like(logits).scatter(1, idx, torch.softmax(top, dim=-1)).to(x.dtype)  # (T, E)
        y = torch.zeros_like(h)
        for e, E_ in enumerate(L["experts"]):
            g, u = (h @ E_["w_gate_up"].T).chunk(2, dim=-1)
            y = y + w[:, e : e + 1] * ((F.silu(g) * u) @ E_["w_down"].T)
        x = x + y.reshape(x.shape)
    return ep.rms_norm(x, full["final_norm"], cfg.eps)


@pytest.mark.parametrize("tbo", [False, True])
def test_single_rank_forward_equals_dense_reference(tbo):
    cfg = _small(ranks=1, two_batch_overlap=tbo, skew=2.0)
    full = ep.init_weights(cfg)
    x = ep.make_input(cfg, 0, 0)
    with torch.no_grad():
        out, routing = ep.ep_forward(x, ep.shard_weights(full, 0, 1), cfg, 0, 1)
        ref, swapped = ep.reference_forward(x, full, cfg, routing)
        dense = _dense_moe_reference(cfg, full, x)
    torch.testing.assert_close(out, dense, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref, dense, atol=1e-5, rtol=1e-5)
    assert swapped == 0


@pytest.mark.parametrize(
    "kw",
    [
        dict(ranks=2),
        dict(ranks=2, two_batch_overlap=True, skew=2.5),
        dict(ranks=4, experts=8, top_k=3, skew=1.5),
        dict(ranks=4, experts=4, top_k=1, two_batch_overlap=True, batch=3, skew=3.0),
        dict(ranks=2, attention=False, heads=5),
    ],
)
def test_multi_rank_forward_equals_reference_and_splits_add_up(kw):
    cfg = _small(**kw)
    full, per_rank = _simulate(cfg)
    R, k = cfg.ranks, cfg.top_k
    for r, (x, out, routing) in enumerate(per_rank):
        ref, _ = ep.reference_forward(x, full, cfg, routing)
        assert ep.compare(out, ref, cfg.dtype)["passed"]
        torch.testing.assert_close(out, _dense_moe_reference(cfg, full, x), atol=1e-5, rtol=1e-5)
    for layer in range(cfg.layers):
        for mb, b in enumerate(cfg.microbatch_sizes()):
            ins = [per_rank[r][2][layer]["in_splits"][mb] for r in range(R)]
            outs = [per_rank[r][2][layer]["out_splits"][mb] for r in range(R)]
            # every rank sends all its assignments; what r receives from s is what s sent to r
            assert all(sum(i) == b * cfg.seq * k for i in ins)
            assert outs == [[ins[s][r] for s in range(R)] for r in range(R)]
            counts = [per_rank[r][2][layer]["expert_counts"][mb] for r in range(R)]
            El = cfg.experts_per_rank
            assert [[sum(c[d * El:(d + 1) * El]) for d in range(R)] for c in counts] == ins


def test_bfloat16_ep_passes_its_check():
    cfg = _small(dtype="bf16", layers=3, two_batch_overlap=True, skew=2.0)
    full, per_rank = _simulate(cfg)
    for x, out, routing in per_rank:
        assert out.dtype == torch.bfloat16
        ref, _ = ep.reference_forward(x, full, cfg, routing)
        res = ep.compare(out, ref, "bfloat16")
        assert res["passed"], res


@pytest.mark.parametrize("layers", [1, 2])
def test_a_wrong_expert_is_caught(layers):
    cfg = _small(layers=layers)
    full = ep.init_weights(cfg)
    world = FakeWorld(2)

    def rank_fn(r):  # rank 1 holds a corrupted copy of its first expert (global expert 2)
        shard = ep.shard_weights(full, r, 2)
        if r == 1:
            shard["layers"][0] = dict(shard["layers"][0])
            e = shard["layers"][0]["experts"][0]
            shard["layers"][0]["experts"] = [dict(e, w_down=e["w_down"] * 1.5)] + shard["layers"][0]["experts"][1:]
        x = ep.make_input(cfg, r, 0)
        return (x, *ep.ep_forward(x, shard, cfg, r, 2, world.a2a(r)))

    for x, out, routing in world.run(rank_fn):  # both ranks' tokens used that expert
        try:
            ref, _ = ep.reference_forward(x, full, cfg, routing)
        except ep.EPMismatchError as exc:  # a wrong layer-0 output can change layer 1's routing
            assert layers > 1 and "EP routing at layer 1 is not a top-2" in str(exc)
            continue
        res = ep.compare(out, ref, "float32")
        assert not res["passed"] and res["max_abs_err"] > 1e-3


def test_routing_that_is_not_a_top_k_is_refused():
    cfg = _small()
    full, per_rank = _simulate(cfg)
    x, out, routing = per_rank[0]
    ref, _ = ep.reference_forward(x, full, cfg, routing)
    assert ep.compare(out, ref, "float32")["passed"]
    shifted = [dict(r, idx=(r["idx"] + 1) % cfg.experts) for r in routing]
    with pytest.raises(ep.EPMismatchError, match="EP routing at layer 0 is not a top-2"):
        ep.reference_forward(x, full, cfg, shifted)


def test_weights_and_inputs_are_deterministic():
    cfg = _small(seed=3)
    a, b = ep.init_weights(cfg), ep.init_weights(cfg)
    assert torch.equal(a["layers"][1]["experts"][2]["w_down"], b["layers"][1]["experts"][2]["w_down"])
    assert not torch.equal(a["layers"][1]["experts"][2]["w_down"], ep.init_weights(_small(seed=4))["layers"][1]["experts"][2]["w_down"])
    assert torch.equal(ep.make_input(cfg, 1, 2), ep.make_input(cfg, 1, 2))
    assert not torch.equal(ep.make_input(cfg, 0, 2), ep.make_input(cfg, 1, 2))
    assert not torch.equal(ep.make_input(cfg, 0, 1), ep.make_input(cfg, 0, 2))


def test_shard_keeps_the_ranks_experts():
    cfg = _small(ranks=2, experts=4)
    full = ep.init_weights(cfg)
    s1 = ep.shard_weights(full, 1, 2)["layers"][0]
    assert len(s1["experts"]) == 2
    assert s1["experts"][0]["w_down"] is full["layers"][0]["experts"][2]["w_down"]
    assert s1["wqkv"] is full["layers"][0]["wqkv"]  # attention and router are replicated


# --------------------------------------------------------------------------- skew


def test_skew_limit():
    assert ep.skew_limit(8, 2) == 7
    assert ep.skew_limit(8, 1) == math.inf
    assert ep.skew_limit(4, 4) == 1


@pytest.mark.parametrize("E, k, F", [(8, 2, 4.0), (8, 1, 3.0), (16, 4, 2.0)])
def test_skew_bias_gives_the_ratio_under_its_model(E, k, F):
    b = ep.skew_bias(E, k, F)
    assert b > 0 and ep.skew_bias(E, k, 1.0) == 0.0
    g = torch.Generator().manual_seed(123)  # fresh draws, not the calibration sample
    z = torch.randn(100_000, E, generator=g)
    z[:, 0] += b
    counts = torch.bincount(z.topk(k, dim=1).indices.reshape(-1), minlength=E).double()
    assert counts[0] / counts[1:].mean() == pytest.approx(F, rel=0.05)


def test_skewed_router_on_real_activations():
    cfg = _small(ranks=2, experts=8, top_k=2, skew=4.0, seq=64)
    full, per_rank = _simulate(cfg)
    totals = [0] * cfg.experts
    for _, _, routing in per_rank:
        for layer in routing:
            for counts in layer["expert_counts"]:
                totals = [a + b for a, b in zip(totals, counts)]
    ratio = totals[0] / (sum(totals[1:]) / (cfg.experts - 1))
    assert 3.0 < ratio < 5.0


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(experts=1, ranks=2), "experts (1) must be at least ranks (2)"),
        (dict(experts=6, ranks=4), "experts (6) must be divisible by ranks (4)"),
        (dict(top_k=9, experts=8), "top_k (9) must not exceed experts (8)"),
        (dict(hidden=100, heads=8), "hidden (100) must be divisible by heads (8)"),
        (dict(skew=0.5), "skew must be a finite number >= 1"),
        (dict(skew=float("nan")), "skew must be a finite number >= 1"),
        (dict(skew=7.0, experts=8, top_k=2), "skew 7 is unreachable with 8 experts and top-k 2"),
        (dict(skew=2.0, experts=4, top_k=4), "skew 2 is unreachable"),
        (dict(two_batch_overlap=True, batch=1), "batch must be >= 2"),
        (dict(ranks=0), "ranks must be between 1 and 8"),
        (dict(dtype="int8"), "unsupported dtype"),
        (dict(steps=2), "steps=2 is fewer than the profiler schedule needs"),
        (dict(top_k=0), "top_k must be a positive integer"),
        (dict(ffn=0), "ffn must be a positive integer"),
        (dict(backend="mpi"), "unknown backend"),
    ],
)
def test_bad_configs_raise_bad_input(kw, words):
    with pytest.raises(BadInputError) as ei:
        ep.EPConfig(**kw).resolved()
    assert words in str(ei.value)
    assert "\n" not in str(ei.value)


def test_resolved_defaults():
    c = ep.EPConfig().resolved()
    assert (c.steps, c.ffn, c.dtype, c.microbatches, c.tokens_per_rank) == (5, 1024, "float32", 1, 512)
    assert ep.EPConfig(batch=5, two_batch_overlap=True).resolved().microbatch_sizes() == [3, 2]
    assert ep.EPConfig(attention=False, hidden=100, heads=8).resolved().hidden == 100


@pytest.mark.parametrize(
    "args, message",
    [
        (["--experts", "3"], "tracekit: experts (3) must be divisible by ranks (2): each rank holds experts/ranks experts"),
        (["--experts", "1"], "tracekit: experts (1) must be at least ranks (2): every rank holds experts"),
        (["--top-k", "9"], "tracekit: top_k (9) must not exceed experts (8)"),
        (["--heads", "7"], "tracekit: hidden (512) must be divisible by heads (7)"),
        (["--two-batch-overlap", "--batch", "1"], None),
        (["--skew", "9"], None),
    ],
)
def test_cli_bad_config_exits_2(capsys, args, message):
    from tracekit.cli import main

    assert main(["collect", "ep", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("tracekit: ")
    if message:
        assert err == message


# --------------------------------------------------------------------------- traces


def load_trace(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _splits(text: str) -> list[int]:
    return json.loads(text) if text else []


def a2a_calls(doc: dict) -> list[dict]:
    """The all-to-alls of a rank's active window, in call order, from the trace alone:
    each c10d::alltoall_base_ with its dims, splits, async flag and enclosing
    layer range, paired (by order and shape) with its gloo:all_to_all span."""
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    main_tid = steps[0]["tid"]
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    win = [e for e in ev if lo <= e["ts"] and e["ts"] + e["dur"] <= hi]
    ranges = [e for e in win if e["tid"] == main_tid and re.fullmatch(r"layer\d+\.\w+(\.wait)?", e["name"])]
    c10d = sorted((e for e in win if e["name"] == "c10d::alltoall_base_"), key=lambda e: e["ts"])
    gloo = sorted((e for e in win if e["name"] == "gloo:all_to_all"), key=lambda e: e["ts"])
    assert all(e["tid"] == main_tid for e in c10d) and all(e["tid"] != main_tid for e in gloo)
    assert len(c10d) == len(gloo)
    # gloo's two worker threads can start spans out of issue order under load: pair each call
    # with the first unpaired span (in time order) whose tensor shape is its input's
    pairs, left = [], list(gloo)
    for c in c10d:
        j = next((i for i, g in enumerate(left[:4]) if g["args"]["Input Dims"][0] == c["args"]["Input Dims"][1]), 0)
        pairs.append((c, left.pop(j)))
    calls = []
    for c, g in pairs:
        a = c["args"]
        inside = [r["name"] for r in ranges if r["ts"] <= c["ts"] and c["ts"] + c["dur"] <= r["ts"] + r["dur"]]
        assert len(inside) == 1, inside
        layer, block = inside[0].split(".", 1)
        conc = a["Concrete Inputs"]
        calls.append(
            {
                "layer": int(layer[5:]),
                "block": block,
                "type": a["Input type"][0],
                "out_dims": a["Input Dims"][0],
                "in_dims": a["Input Dims"][1],
                "out_splits": _splits(conc[3]),
                "in_splits": _splits(conc[4]),
                "async": conc[5] == "True",
                "gloo_dims": g["args"]["Input Dims"][0],
                "gloo_type": g["args"]["Input type"][0],
                "gloo_cat": g["cat"],
                "step": next(s["name"] for s in steps if s["ts"] <= c["ts"] <= s["ts"] + s["dur"]),
            }
        )
    return calls


def check_ep_run_folder(run_dir: Path, cfg: ep.EPConfig) -> None:
    """Everything the traces and run_config.json of an EP run must agree on."""
    conf = json.loads((run_dir / "run_config.json").read_text())
    assert conf["workload"] == "ep" and conf["world_size"] == cfg.ranks and conf["backend"] == "gloo"
    assert conf["ep_check"]["passed"] and conf["ep_check"]["max_abs_err"] < 1e-4
    exp = conf["expected"]
    R, E, H, k, m = cfg.ranks, cfg.experts, cfg.hidden, cfg.top_k, cfg.microbatches
    assert exp == json.loads(json.dumps(ep.expected_counts(cfg)))
    for key in ("tokens_per_rank", "top_k", "hidden", "dtype_bytes", "experts", "skew", "two_batch_overlap"):
        assert conf[key] == getattr(cfg, key), key
    active = conf["profiler"]["active_steps"]
    measured = {(s["step"], s["layer"], s["microbatch"]): s for s in conf["measured"]["splits"]}
    assert len(measured) == cfg.steps * cfg.layers * m
    rows = exp["dispatch_rows_per_microbatch"]
    per_rank = []
    for r in range(R):
        doc = load_trace(run_dir / f"rank{r}.pt.trace.json.gz")
        info = doc["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (r, R, "gloo")
        calls = a2a_calls(doc)
        per_rank.append(calls)
        assert len(calls) == exp["all_to_all_per_rank_active"]
        counts = [c for c in calls if c["type"] == "long int"]
        data = [c for c in calls if c["type"] != "long int"]
        assert len(counts) == exp["split_exchange_per_rank_active"] == cfg.layers * m * cfg.active
        assert len(data) == exp["data_all_to_all_per_rank_active"] == 2 * cfg.layers * m * cfg.active
        for c in counts:  # split exchange: E int64 each way, even splits, always blocking
            assert c["block"] == "dispatch" and c["in_dims"] == c["out_dims"] == [E] and c["gloo_dims"] == [E]
            assert c["in_splits"] == c["out_splits"] == [] and not c["async"]
            assert E * TYPE_BYTES[c["type"]] == exp["split_exchange_bytes"]
        for c in data:
            assert c["block"] in ("dispatch", "combine") and c["async"] == cfg.two_batch_overlap
            assert c["in_dims"] == [sum(c["in_splits"]), H] and c["out_dims"] == [sum(c["out_splits"]), H]
            assert c["gloo_dims"] == c["in_dims"] and c["gloo_cat"] == "user_annotation"
            assert len(c["in_splits"]) == len(c["out_splits"]) == R
        # per layer and micro-batch: 1 split exchange + dispatch + combine, the combine the dispatch reversed
        for step in sorted({c["step"] for c in calls}):
            for layer in range(cfg.layers):
                mine = [c for c in calls if c["step"] == step and c["layer"] == layer]
                disp = [c for c in mine if c["type"] != "long int" and c["block"] == "dispatch"]
                comb = [c for c in mine if c["block"] == "combine"]
                assert len(mine) == 3 * m and len(disp) == len(comb) == m
                for mb, (d, c) in enumerate(zip(disp, comb)):
                    assert sum(d["in_splits"]) == rows[mb]  # tokens × top_k of the micro-batch
                    assert d["in_dims"][0] * H * cfg.dtype_bytes == exp["dispatch_bytes_per_microbatch"][mb]
                    assert (c["in_splits"], c["out_splits"]) == (d["out_splits"], d["in_splits"])
                    s = int(step.split("#")[1])
                    assert s in active
                    rec = measured[(s, layer, mb)]
                    assert rec["active"]
                    assert rec["in_splits"][r] == d["in_splits"] and rec["out_splits"][r] == d["out_splits"]
    # across ranks (same call order everywhere): what r received from s is what s sent to r
    for j in range(len(per_rank[0])):
        call = [per_rank[r][j] for r in range(R)]
        assert len({(c["layer"], c["block"], c["type"], c["step"]) for c in call}) == 1
        if call[0]["type"] != "long int":
            assert all(call[r]["out_splits"][s] == call[s]["in_splits"][r] for r in range(R) for s in range(R))
    totals = conf["measured"]["expert_tokens_active_total"]
    assert sum(totals) == R * cfg.tokens_per_rank * k * cfg.active * cfg.layers


def _uneven(run_dir: Path) -> list[list[int]]:
    conf = json.loads((run_dir / "run_config.json").read_text())
    return [sp for s in conf["measured"]["splits"] for sp in s["in_splits"]]


FIXTURE_CFG = ep.EPConfig(
    ranks=2, layers=2, hidden=128, heads=4, ffn=256, experts=8, top_k=2, seq=32, batch=4, skew=4.0,
    wait=1, warmup=1, active=2,
)


@pytest.mark.parametrize("where, tbo", [(FIXTURE, False), (FIXTURE_TBO, True)])
def test_fixture_traces_hold_exactly_the_models_all_to_alls(where, tbo):
    cfg = ep.EPConfig(**{**FIXTURE_CFG.__dict__, "two_batch_overlap": tbo}).resolved()
    check_ep_run_folder(where, cfg)
    for r in range(2):
        assert (where / f"rank{r}.pt.trace.json.gz").stat().st_size < 1_000_000
    conf = json.loads((where / "run_config.json").read_text())
    for key in ("ranks", "layers", "hidden", "heads", "ffn", "experts", "top_k", "seq", "batch", "skew",
                "two_batch_overlap", "wait", "warmup", "active", "dtype"):
        assert conf[key] == getattr(cfg, key), key


@pytest.mark.parametrize("where", [FIXTURE, FIXTURE_TBO])
def test_fixture_splits_are_uneven_and_skewed(where):
    conf = json.loads((where / "run_config.json").read_text())
    splits = _uneven(where)
    assert any(len(set(s)) > 1 for s in splits)
    # rank 0 owns the hot expert 0: it receives clearly more rows than rank 1
    rows_in = conf["measured"]["rows_received_per_rank_active"]
    assert all(layer[0] > 1.3 * layer[1] for layer in rows_in)
    assert 3.0 < conf["measured"]["skew_measured"] < 5.0


def test_fixture_ranges():
    doc = load_trace(FIXTURE_TBO / "rank0.pt.trace.json.gz")
    names = {e["name"] for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("layer")}
    blocks = ("attention", "router", "dispatch", "dispatch.wait", "experts", "combine", "combine.wait", "unpermute")
    assert names == {f"layer{i}.{b}" for i in range(2) for b in blocks}
    doc = load_trace(FIXTURE / "rank0.pt.trace.json.gz")
    names = {e["name"] for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("layer")}
    assert names == {f"layer{i}.{b}" for i in range(2) for b in blocks if not b.endswith(".wait")}


# --------------------------------------------------------------------------- real jobs


@pytest.mark.slow
def test_real_2rank_gloo_run_with_two_batch_overlap(tmp_path):
    cfg = ep.EPConfig(
        ranks=2, layers=2, hidden=64, heads=4, experts=4, top_k=2, seq=16, batch=4, skew=2.0,
        two_batch_overlap=True, active=2, out=str(tmp_path),
    ).resolved()
    run_dir = ep.run_ep(cfg)
    assert run_dir.parent == tmp_path and run_dir.name.startswith("ep-")
    check_ep_run_folder(run_dir, cfg)
    assert sorted(p.name for p in run_dir.iterdir() if p.is_file()) == [
        "rank0.pt.trace.json.gz",
        "rank1.pt.trace.json.gz",
        "run_config.json",
    ]


@pytest.mark.slow
def test_wrong_ep_fails_loudly(tmp_path):
    cfg = ep.EPConfig(ranks=2, layers=1, hidden=32, heads=2, experts=2, top_k=1, seq=8, batch=2, out=str(tmp_path),
                      fault="corrupt_expert")
    with pytest.raises(launch.RankFailedError) as ei:
        ep.run_ep(cfg)
    msg = str(ei.value)
    assert "EP output differs from the single-process reference" in msg and "\n" not in msg
    assert ei.value.exit_code == 1
    assert not (next(tmp_path.iterdir()) / "run_config.json").exists()


# --------------------------------------------------------------------------- EP x DP (collectors/workloads/epdp.py)

from tracekit.collectors.workloads import epdp  # noqa: E402

EPDP_CFG = dict(dp=2, layers=2, hidden=32, heads=2, ffn=48, experts=4, top_k=2, seq=8, batch=2,
                wait=0, warmup=1, active=1, bucket_kb=32)


def test_epdp_layout_and_counts():
    lay = epdp.layout(2, 2)
    assert lay == {"ep": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]]}
    cfg = ep.EPConfig(**EPDP_CFG).resolved()
    assert (cfg.ranks, cfg.experts_per_rank) == (4, 2)  # default ranks: 2 x dp
    # per (layer, local expert): w_gate_up 96 x 32, w_down 32 x 48, float32 = 12,288 + 6,144 bytes;
    # reversed, layer 1's two experts (36,864 B >= 32 KiB) close bucket 0, layer 0's make bucket 1
    c = epdp.expected_counts(cfg)
    assert c["dp_bucket_bytes"] == [36_864, 36_864] and c["dp_all_reduce"] == 2
    # forward 3 per layer (split counts, dispatch, combine); backward 2 per layer but layer 0's dispatch
    assert (c["ep_all_to_all_forward"], c["ep_all_to_all_backward"], c["ep_all_to_all"]) == (6, 3, 9)


@pytest.mark.parametrize("kw, words", [
    (dict(dp=2, ranks=3), "ranks \\(3\\) must be divisible by dp \\(2\\)"),
    (dict(dp=2, ranks=4, experts=3), "experts \\(3\\) must be divisible by the EP group size \\(2\\)"),
    (dict(dp=2, two_batch_overlap=True), "two-batch overlap is a forward-only"),
    (dict(dp=0), "dp must be a positive integer"),
])
def test_epdp_bad_configs(kw, words):
    with pytest.raises(BadInputError, match=words):
        ep.EPConfig(**kw).resolved()


def test_run_ep_sends_ep_x_dp_to_epdp(tmp_path):
    # ep.py does not import epdp (no circle): a dp > 1 config is refused there, before any process starts
    with pytest.raises(BadInputError, match="dp = 2: EP x DP runs through .*epdp.run_epdp"):
        ep.run_ep(ep.EPConfig(dp=2, ranks=4, experts=4, out=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


def _a2a_by_range(path) -> tuple[dict, int]:
    """{range name: all-to-alls issued inside it} within the profiled steps, and their total."""
    doc = load_trace(path)
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    lo, hi = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    calls = [e for e in ev if e["name"] == "c10d::alltoall_base_" and lo <= e["ts"] <= hi]
    ranges = [e for e in ev if e["name"].startswith("layer") and e["name"].endswith((".dispatch", ".combine"))]
    inside = {r["name"]: sum(r["ts"] <= c["ts"] <= r["ts"] + r["dur"] and r["tid"] == c["tid"] for c in calls)
              for r in ranges if lo <= r["ts"] <= hi}
    return inside, len(calls)


def _call_labels(path) -> dict:
    """{(c10d op, description of the group its innermost tracekit.process_group range names): calls}
    within the profiled steps (None: no range around it)."""
    from tracekit.collectors.pg_labels import LABEL_PREFIX

    doc = load_trace(path)
    desc = {g["pg_name"]: g["pg_desc"] for g in doc["distributedInfo"]["pg_config"]}
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    lo, hi = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    labels = [e for e in ev if e["name"].startswith(LABEL_PREFIX)]
    out: dict = {}
    for c in ev:
        if c["name"].startswith("c10d::") and c["name"] != "c10d::wait" and lo <= c["ts"] <= hi:
            around = [e for e in labels if e["tid"] == c["tid"] and e["ts"] <= c["ts"]
                      and c["ts"] + c["dur"] <= e["ts"] + e["dur"]]
            g = max(around, key=lambda e: e["ts"])["name"][len(LABEL_PREFIX):] if around else None
            key = (c["name"], desc.get(g))
            out[key] = out.get(key, 0) + 1
    return out


@pytest.mark.slow
def test_real_ep2_dp2_gloo_run(tmp_path, capsys):
    from tracekit.analyses import connect
    from tracekit.cli import main
    from tracekit.ingest import ingest_paths
    from tracekit.store import Store

    argv = [x for k, v in EPDP_CFG.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    assert main(["collect", "ep", *argv, "--out", str(tmp_path), "--no-ingest"]) == 0
    assert "ep 2 x dp 2 (experts trained" in capsys.readouterr().err
    (run_dir,) = tmp_path.glob("ep-*")
    conf = json.loads((run_dir / "run_config.json").read_text())
    assert conf["ranks"] == 4 and conf["overlap_models"]["dp"] == {"kind": "bucket_overlap", "params": {"buckets": 2}}
    assert conf["check"]["passed"] and conf["check"]["max_grad_rel_rms_err"] < 1e-4
    assert sorted((g["desc"], g["ranks"]) for g in conf["process_groups"]) == [
        ("dp", [0, 2]), ("dp", [1, 3]), ("ep", [0, 1]), ("ep", [2, 3])]
    for r in range(4):  # forward, per layer: split counts + dispatch, then combine; 9 in all with backward
        inside, total = _a2a_by_range(run_dir / f"rank{r}.pt.trace.json.gz")
        assert inside == {"layer0.dispatch": 2, "layer0.combine": 1, "layer1.dispatch": 2, "layer1.combine": 1}
        assert total == 9
        # every call inside its group's range (tracekit/collectors/pg_labels.py): all-to-alls ep, buckets dp
        assert _call_labels(run_dir / f"rank{r}.pt.trace.json.gz") == {
            ("c10d::alltoall_base_", "ep"): 9, ("c10d::allreduce_", "dp"): 2}
    store = Store(tmp_path / "store")
    ingest_paths([str(run_dir)], store, workload="ep", config=conf, run_id="epdp")
    con = connect(store)
    names = {g["pg_name"]: g for g in conf["process_groups"]}
    got = {pg: rest for pg, *rest in con.execute(
        "SELECT pg_name, dimension, ops, instances, incomplete, bytes FROM process_groups").fetchall()}
    # every call in its own group, none in the world group, none unassigned: the collector names
    # each call's group in the trace (tracekit/collectors/pg_labels.py), which the timing alone cannot
    # (the DP all-reduces of ranks 0 and 1 often run at once: EP {0,1} would explain them too)
    assert con.execute("SELECT count(*) FROM collectives WHERE pg_name IS NULL").fetchone() == (0,)
    for _, warns in con.execute("SELECT rank, warnings FROM ranks").fetchall():
        assert not [w for w in warns if "process group" in w], warns
    assert set(got) == set(names)
    for pg, g in names.items():
        dim, ops, inst, inc, nbytes = got[pg]
        assert (dim, inc) == (g["desc"], 0)
        if dim == "ep":  # 5 x 2 layers - 1 per step, one active step
            assert (ops, inst) == ("all_to_all", 9)
        else:  # one all-reduce per bucket per step, of the bucket's bytes
            assert (ops, inst, nbytes) == ("all_reduce", 2, 2 * 36_864)
    # the DP buckets are launched during the backward: they overlap it
    (ov,) = con.execute("SELECT min(overlap_ns) FROM process_groups WHERE dimension = 'dp'").fetchone()
    assert ov > 0
    # measured vs model per dimension, with nvlink4 (α 2 µs, β 3.6e11 B/s): ep all-to-alls exposed,
    # pairwise on k = 2: (k−1)·α + (k−1)/k·S/β each; dp: the last of 2 buckets, 2α + 36,864/β
    con = connect(store, link="nvlink4")
    rows = con.execute("SELECT rank, dimension, calls, model, predicted_comm_ns, predicted_exposed_ns "
                       "FROM measured_vs_model_by_dimension ORDER BY rank, dimension").fetchall()
    sizes = dict(((r, d), s) for r, d, s in con.execute(
        "SELECT c.rank, g.dimension, sum(c.size_bytes) FROM collectives c JOIN process_groups g USING (run_id, pg_name) "
        "JOIN events e USING (run_id, rank, event_id) WHERE e.step IS NOT NULL GROUP BY ALL").fetchall())
    assert [(r, d, n, m) for r, d, n, m, _, _ in rows] == [
        (r, d, n, m) for r in range(4) for d, n, m in (("dp", 2, "bucket_overlap"), ("ep", 9, "no_overlap"))]
    for r, d, _, _, comm, exposed in rows:
        if d == "ep":
            assert comm == pytest.approx((9 * 2e-6 + sizes[(r, d)] / 2 / 3.6e11) * 1e9) == exposed
        else:
            assert comm == pytest.approx(2 * (4e-6 + 36_864 / 3.6e11) * 1e9) and exposed == pytest.approx(comm / 2)
