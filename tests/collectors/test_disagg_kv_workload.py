"""The disagg-kv workload: prefill + transferred KV + decode equals the
single-process request, bad configurations are refused, and the recorded traces
(fixtures/kv_bulk_2rank, fixtures/kv_layerwise_2rank: one config, two modes)
hold exactly `layers` KV messages of the configured size per step, with the
layer-wise run overlapping its transfers with compute and the bulk run not.

Overlap is measured here from the trace alone, independently of tracekit's
analyses: on the prefill rank, |union of gloo:send spans ∩ union of aten op
spans| / |union of gloo:send spans|.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from tracekit.errors import BadInputError

torch = pytest.importorskip("torch")

from tracekit.collectors.workloads import disagg_kv as kv  # noqa: E402
from tracekit.collectors.workloads import pp  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8}


# --------------------------------------------------------------------------- the model, in process


def _small(**kw) -> kv.KVConfig:
    base = dict(layers=3, hidden=64, heads=4, kv_heads=2, head_dim=16, vocab=101, prompt_len=12, batch=2, decode_tokens=5)
    base.update(kw)
    return kv.KVConfig(**base).resolved()


def _request(cfg: kv.KVConfig, corrupt=None):
    """Prefill → (possibly corrupted) KV handed over as a copy → decode, in one process."""
    spec = cfg.spec()
    model = pp.init_model(spec)
    ids = kv.make_prompt(cfg, 0)
    seen = []
    with torch.no_grad():
        kvs, first = kv.prefill(model, spec, ids, lambda i, t: seen.append((i, tuple(t.shape), t.nbytes)))
        wire = [t.clone() for t in kvs]
        if corrupt is not None:
            corrupt(wire)
        toks, logits = kv.decode(model, spec, wire, first.clone(), cfg.prompt_len, cfg.decode_tokens)
    return (first, toks, logits), kv.reference(model, spec, ids, cfg.decode_tokens), seen


@pytest.mark.parametrize("kw", [dict(), dict(kv_heads=4), dict(kv_heads=1, ffn=0), dict(prompt_len=1), dict(dtype="bf16")])
def test_transferred_kv_decodes_like_the_single_process_request(kw):
    cfg = _small(**kw)
    (first, toks, logits), (rf, rt, rl), seen = _request(cfg)
    assert torch.equal(first, rf) and torch.equal(toks, rt)
    assert toks.shape == (cfg.batch, cfg.decode_tokens)
    rel, _, finite = pp.rel_error(logits, rl)
    assert finite and rel <= pp.REL_TOLERANCE[cfg.dtype]
    # one packed KV per layer, in layer order, of exactly the advertised size
    shape = (2, cfg.batch, cfg.kv_heads, cfg.prompt_len, cfg.head_dim)
    assert seen == [(i, shape, cfg.kv_bytes_per_layer) for i in range(cfg.layers)]


def test_kv_bytes_formula():
    cfg = _small(batch=3, prompt_len=7, kv_heads=2, head_dim=16, dtype="bf16")
    assert cfg.kv_bytes_per_layer == 2 * 3 * 7 * 2 * 16 * 2
    assert cfg.kv_bytes_total == cfg.layers * cfg.kv_bytes_per_layer
    assert kv.KVConfig(ranks=6).resolved().pairs == [(0, 3), (1, 4), (2, 5)]


def test_corrupted_kv_changes_the_decode():
    cfg = _small()

    def scale_v0(wire):
        wire[0][1].mul_(1.5)

    (first, toks, logits), (rf, rt, rl), _ = _request(cfg, scale_v0)
    rel, _, _ = pp.rel_error(logits, rl)
    assert rel > pp.REL_TOLERANCE["float32"] * 100  # the check cannot miss it


def test_decode_needs_the_kv_in_layer_order():
    cfg = _small()
    (first, toks, logits), (rf, rt, rl), _ = _request(cfg, lambda wire: wire.reverse())
    assert pp.rel_error(logits, rl)[0] > 1e-2


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(ranks=3), "ranks must be even, got 3"),
        (dict(ranks=1), "ranks must be even, got 1"),
        (dict(prompt_len=0), "prompt_len must be at least 1, got 0"),
        (dict(kv_heads=3), "kv_heads (3) must divide heads (8)"),
        (dict(kv_heads=0), "kv_heads must be a positive integer"),
        (dict(mode="chunked"), "unknown mode 'chunked'"),
        (dict(layers=0), "layers must be a positive integer"),
        (dict(decode_tokens=0), "decode_tokens must be a positive integer"),
        (dict(head_dim=0), "head_dim must be a positive integer"),
        (dict(dtype="int4"), "unsupported dtype"),
        (dict(ffn=-2), "ffn must be a non-negative integer"),
        (dict(ranks=10), "ranks must be between 1 and 8"),
        (dict(active=0), "active must be >= 1"),
    ],
)
def test_bad_configs_raise_bad_input(kw, words):
    with pytest.raises(BadInputError) as ei:
        kv.KVConfig(**kw).resolved()
    assert words in str(ei.value)
    assert "\n" not in str(ei.value)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["collect", "disagg-kv", "--ranks", "3"], "tracekit: disagg-kv pairs a prefill rank with a decode rank: ranks must be even, got 3"),
        (["collect", "disagg-kv", "--kv-heads", "3"], "tracekit: kv_heads (3) must divide heads (8): each KV head serves heads/kv_heads query heads"),
        (["collect", "disagg-kv", "--prompt-len", "0"], "tracekit: prompt_len must be at least 1, got 0"),
    ],
)
def test_cli_bad_config_exits_2(argv, message, capsys):
    from tracekit.cli import main

    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == message


# --------------------------------------------------------------------------- the recorded traces


def union(spans):
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def length(spans) -> float:
    return sum(b - a for a, b in spans)


def intersection(x, y) -> float:
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if lo < hi:
            total += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def rank_view(run_dir: Path, rank: int) -> dict:
    """One rank's profiled steps: its p2p spans (with bytes, tag, step) and its compute spans."""
    with gzip.open(run_dir / f"rank{rank}.pt.trace.json.gz", "rt") as f:
        doc = json.load(f)
    ev = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]

    def step_of(e):
        return next(i for i, s in enumerate(steps) if s["ts"] <= e["ts"] <= s["ts"] + s["dur"])

    p2p = []
    for c10d, gloo in (("c10d::send", "gloo:send"), ("c10d::recv_", "gloo:recv")):
        spans = [e for e in ev if e["name"] == gloo]
        for e in (e for e in ev if e["name"] == c10d):
            g = next(s for s in spans if s["ts"] >= e["ts"] and s["tid"] == e["tid"])
            p2p.append(
                {
                    "kind": gloo[5:],
                    "step": step_of(e),
                    "peer": int(e["args"]["Concrete Inputs"][2]),
                    "tag": int(e["args"]["Concrete Inputs"][3]),
                    "bytes": math.prod(g["args"]["Input Dims"][0]) * TYPE_BYTES[g["args"]["Input type"][0]],
                    "start": g["ts"],
                    "end": g["ts"] + g["dur"],
                }
            )
    lo, hi = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"].startswith("aten::") and lo <= e["ts"] <= hi]
    layers = {(step_of(e), int(e["name"][len("prefill.layer"):])): (e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"].startswith("prefill.layer")}
    return {"steps": len(steps), "p2p": p2p, "compute": union(compute), "layers": layers}


def send_overlap(view: dict) -> tuple[float, float]:
    """(overlap ratio, exposed send µs) of the sends on a prefill rank."""
    sends = union([(x["start"], x["end"]) for x in view["p2p"] if x["kind"] == "send"])
    ov = intersection(sends, view["compute"])
    return ov / length(sends), length(sends) - ov


FIXTURE_CFG = dict(ranks=2, layers=4, hidden=256, heads=8, kv_heads=8, head_dim=128, prompt_len=256, batch=2, decode_tokens=4, wait=1, warmup=1, active=2)


def check_run(run_dir: Path, cfg: kv.KVConfig) -> tuple[dict, dict]:
    """Counts, sizes, tags and pairing of a 2-rank disagg-kv run, from its traces."""
    conf = json.loads((run_dir / "run_config.json").read_text())
    assert conf["workload"] == "disagg_kv" and conf["kv_check"]["passed"]
    assert conf["kv"]["bytes_per_layer"] == cfg.kv_bytes_per_layer
    assert conf["expected"]["kv_bytes_per_step_per_pair"] == cfg.layers * cfg.kv_bytes_per_layer
    pre, dec = rank_view(run_dir, 0), rank_view(run_dir, 1)
    assert pre["steps"] == dec["steps"] == cfg.active
    assert all(x["kind"] == "send" and x["peer"] == 1 for x in pre["p2p"])
    assert all(x["kind"] == "recv" and x["peer"] == 0 for x in dec["p2p"])
    L = cfg.layers
    for step in range(cfg.active):
        sent = [x for x in pre["p2p"] if x["step"] == step]
        got = [x for x in dec["p2p"] if x["step"] == step]
        # per step: L KV messages of kv_bytes_per_layer (tags 0..L-1), then the first token's ids
        kv_msgs = [x for x in sent if x["bytes"] == cfg.kv_bytes_per_layer]
        assert [x["tag"] for x in kv_msgs] == list(range(L))
        assert sum(x["bytes"] for x in kv_msgs) == L * cfg.kv_bytes_per_layer
        assert [(x["tag"], x["bytes"]) for x in sent if x not in kv_msgs] == [(L, cfg.batch * 8)]
        assert [(x["tag"], x["bytes"]) for x in got] == [(x["tag"], x["bytes"]) for x in sent]
    return pre, dec


def test_fixtures_share_one_config_and_differ_only_in_mode():
    a = json.loads((FIXTURES / "kv_bulk_2rank" / "run_config.json").read_text())
    b = json.loads((FIXTURES / "kv_layerwise_2rank" / "run_config.json").read_text())
    for k, v in FIXTURE_CFG.items():
        assert a[k] == b[k] == v, k
    assert (a["mode"], b["mode"]) == ("bulk", "layerwise")
    for name in ("kv_bulk_2rank", "kv_layerwise_2rank"):
        for r in range(2):
            assert (FIXTURES / name / f"rank{r}.pt.trace.json.gz").stat().st_size < 1_000_000


@pytest.mark.parametrize("mode", ["bulk", "layerwise"])
def test_fixture_sends_layers_x_bytes_per_layer_per_step(mode):
    cfg = kv.KVConfig(mode=mode, **FIXTURE_CFG).resolved()
    assert cfg.kv_bytes_per_layer == 2 * 2 * 256 * 8 * 128 * 4
    check_run(FIXTURES / f"kv_{mode}_2rank", cfg)


def test_layerwise_sends_during_the_prefill_and_bulk_after_it():
    cfg = kv.KVConfig(**FIXTURE_CFG).resolved()
    L = cfg.layers
    for mode in ("bulk", "layerwise"):
        pre = rank_view(FIXTURES / f"kv_{mode}_2rank", 0)
        for step in range(cfg.active):
            kv_sends = {x["tag"]: x for x in pre["p2p"] if x["step"] == step and x["tag"] < L}
            last_layer_end = pre["layers"][(step, L - 1)][1]
            for i in range(L - 1):
                start = kv_sends[i]["start"]
                if mode == "layerwise":  # after its own layer, before the next one starts
                    assert pre["layers"][(step, i)][1] <= start <= pre["layers"][(step, i + 1)][0]
                else:
                    assert start >= last_layer_end


def test_layerwise_overlaps_more_than_bulk_on_the_same_config():
    bulk, _ = send_overlap(rank_view(FIXTURES / "kv_bulk_2rank", 0))
    layer, _ = send_overlap(rank_view(FIXTURES / "kv_layerwise_2rank", 0))
    assert bulk == 0.0  # every send starts after the last layer: nothing to overlap with
    # measured 0.60 when recorded (see NOTE.md); a loaded machine gives less, but never 0
    assert layer > 0.3
    # and the exposed part after the prefill is smaller, by the run's own clock
    a = json.loads((FIXTURES / "kv_bulk_2rank" / "run_config.json").read_text())["timing"]["per_rank"][0]
    b = json.loads((FIXTURES / "kv_layerwise_2rank" / "run_config.json").read_text())["timing"]["per_rank"][0]
    assert b["exposed_send_s"] < a["exposed_send_s"]


@pytest.mark.parametrize("name", ["kv_bulk_2rank", "kv_layerwise_2rank"])
def test_kv_fixtures_ingest(name, tmp_path):
    from tracekit.ingest import ingest_paths
    from tracekit.store import Store

    run_id = ingest_paths([str(FIXTURES / name)], store=str(tmp_path))
    con = Store(str(tmp_path)).connect(run_ids=[run_id])
    assert con.execute("SELECT workload, world_size FROM runs").fetchall() == [("disagg_kv", 2)]


# --------------------------------------------------------------------------- a real job


@pytest.mark.slow
def test_real_layerwise_run(tmp_path):
    cfg = kv.KVConfig(ranks=2, layers=3, hidden=128, heads=4, kv_heads=4, head_dim=64, prompt_len=128, batch=2,
                      decode_tokens=3, mode="layerwise", active=2, out=str(tmp_path)).resolved()
    run_dir = kv.run_disagg_kv(cfg)
    assert run_dir.name.startswith("disagg_kv-")
    conf = json.loads((run_dir / "run_config.json").read_text())
    dec = conf["kv_check"]["per_decode_rank"][0]
    assert dec["tokens_equal"] and dec["first_token_equal"]
    pre, _ = check_run(run_dir, cfg)
    for step in range(cfg.active):  # each layer's KV leaves between its layer and the next
        for x in (x for x in pre["p2p"] if x["step"] == step and x["tag"] < cfg.layers - 1):
            assert pre["layers"][(step, x["tag"])][1] <= x["start"] <= pre["layers"][(step, x["tag"] + 1)][0]
    assert sorted(p.name for p in run_dir.iterdir() if p.is_file()) == [
        "rank0.pt.trace.json.gz",
        "rank1.pt.trace.json.gz",
        "run_config.json",
    ]
