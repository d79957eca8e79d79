"""The PP workload: every schedule completes and pairs its messages in order, the
pipeline (run in-process, one thread per stage) equals the single-process
reference, bad configurations are refused, and the recorded traces hold exactly
the sends and recvs the schedule makes, with sizes from the traces' own metadata.

Fast tests use threads and the recorded fixtures (fixtures/pp_2rank,
fixtures/pp_decode_2rank); the one `slow` test runs `tracekit collect pp` for real.
"""

from __future__ import annotations

import gzip
import json
import math
import queue
import threading
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tracekit.errors import BadInputError

torch = pytest.importorskip("torch")

from tracekit.collectors.workloads import pp  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
# Kineto's "Input type" spelling → bytes per element
TYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8}


# --------------------------------------------------------------------------- the schedule


def simulate(programs: list[list[pp.Action]]):
    """Run the stages' programs with sends that never block (as the workload's
    helper threads make them): an action runs once its input message was sent.
    Returns (completed, {(src, dst): [msgs in send order]}, {(src, dst): [msgs in recv order]})."""
    sent: set = set()
    pos = [0] * len(programs)
    sends: dict = defaultdict(list)
    recvs: dict = defaultdict(list)
    moved = True
    while moved:
        moved = False
        for s, prog in enumerate(programs):
            while pos[s] < len(prog):
                act = prog[pos[s]]
                if act.input is not None:
                    if act.input not in sent:
                        break
                    recvs[(act.input.src, act.input.dst)].append(act.input)
                if act.output is not None:
                    sent.add(act.output)
                    sends[(act.output.src, act.output.dst)].append(act.output)
                pos[s] += 1
                moved = True
    return all(pos[s] == len(p) for s, p in enumerate(programs)), sends, recvs


CASES = [("train", sched, p, m, 0) for sched in pp.SCHEDULES for p in range(1, 9) for m in (1, 2, 3, 4, 8, 9)] + [
    ("decode", "gpipe", p, m, t) for p in range(1, 9) for m in (1, 2, 3, 4, 8) for t in (1, 3)
]


@pytest.mark.parametrize("mode, schedule, stages, m, tokens", CASES)
def test_every_schedule_completes_and_pairs_messages_in_order(mode, schedule, stages, m, tokens):
    programs = [pp.stage_program(schedule, mode, stages, s, m, tokens) for s in range(stages)]
    done, sends, recvs = simulate(programs)
    assert done, "the programs deadlock"
    # every message is received once, and each (src, dst) pair receives in send order,
    # so pairing sends and recvs by (src, dst, order) in a trace is right
    assert dict(sends) == dict(recvs)
    b = stages - 1
    n = sum(len(v) for v in sends.values())
    if mode == "train":
        assert n == 2 * b * m
    else:
        assert n == b * m * (tokens + 1) + (m * tokens if stages > 1 else 0)
    passes = tokens + 1 if mode == "decode" else 1
    tags = [(msg.src, msg.dst, msg.tag(m, passes)) for v in sends.values() for msg in v]
    assert len(tags) == len(set(tags)), "tags are unique within a step"


def test_1f1b_order_is_megatrons():
    # stage 0 of 4 with 6 micro-batches: 3 warm-up forwards, then F/B pairs, then 3 backwards
    ops = [f"{a.op[0].upper()}{a.mb}" for a in pp.stage_program("1f1b", "train", 4, 0, 6)]
    assert ops == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5".split()
    last = [f"{a.op[0].upper()}{a.mb}" for a in pp.stage_program("1f1b", "train", 4, 3, 6)]
    assert last == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5".split()
    gpipe = [f"{a.op[0].upper()}{a.mb}" for a in pp.stage_program("gpipe", "train", 2, 1, 3)]
    assert gpipe == "F0 F1 F2 B2 B1 B0".split()


def test_decode_program_feeds_tokens_back_to_the_first_stage():
    first = pp.stage_program("gpipe", "decode", 3, 0, 2, 2)
    last = pp.stage_program("gpipe", "decode", 3, 2, 2, 2)
    assert [(a.op, a.t, a.mb) for a in first][:3] == [("prefill", 0, 0), ("prefill", 0, 1), ("decode", 1, 0)]
    assert first[2].input == pp.Msg("token_ids", 2, 0, 0, 0)
    assert [a.output for a in last[-3:]] == [pp.Msg("token_ids", 2, 0, 1, 1), None, None]  # nothing after the last pass
    assert all(a.input is None for a in pp.stage_program("gpipe", "decode", 1, 0, 2, 2))


def test_expected_messages_match_the_formulas():
    cfg = pp.PPConfig(ranks=4, layers=4, hidden=64, heads=4, seq=16, batch=8, microbatches=4).resolved()
    msgs = pp.expected_messages(cfg)
    assert sum(m["count_per_step"] for m in msgs) == 3 * 4 * 2
    assert {m["bytes"] for m in msgs} == {2 * 16 * 64 * 4}
    dec = pp.PPConfig(ranks=2, layers=2, hidden=64, heads=4, seq=16, batch=4, microbatches=2, mode="decode", tokens=3).resolved()
    by_kind = {(m["kind"], m["phase"]): (m["count_per_step"], m["bytes"]) for m in pp.expected_messages(dec)}
    assert by_kind == {
        ("activation", "prefill"): (2, 2 * 16 * 64 * 4),
        ("activation", "decode"): (2 * 3, 2 * 64 * 4),
        ("token_ids", "decode"): (2 * 3, 2 * 8),
    }


# --------------------------------------------------------------------------- the pipeline, in process


def run_threaded(cfg: pp.PPConfig, corrupt=None):
    """Every stage on its own thread, messages through in-memory queues (a clone
    of the tensor, as the wire would deliver); returns each stage's check."""
    cfg = cfg.resolved()
    model = pp.init_model(cfg.spec())
    ids, targets = pp.make_batch(cfg)
    boxes: dict = {}
    lock = threading.Lock()

    def box(msg):
        with lock:
            return boxes.setdefault(msg, queue.Queue())

    def exchange(sends, recvs):
        for msg, t in sends:
            t = t.detach().clone()
            if corrupt is not None and corrupt(msg):
                t = t * 1.5 if t.is_floating_point() else (t + 1) % cfg.vocab
            box(msg).put(t)
        return {msg: box(msg).get(timeout=60) for msg in recvs}

    per = cfg.layers_per_stage
    runners, params, errors = [], [], []
    for s in range(cfg.stages):
        prm = pp._stage_params(model, s, cfg.stages, per)
        if cfg.mode == "train":
            prm = pp._leaf_copy(prm)
        params.append(prm)
        runners.append(pp._StageRunner(cfg, s, prm, ids, targets if cfg.mode == "train" else None, {}))

    def stage_main(s):
        try:
            grad = torch.enable_grad() if cfg.mode == "train" else torch.no_grad()
            with grad:
                pp.run_program(pp.stage_program(cfg.schedule, cfg.mode, cfg.stages, s, cfg.microbatches, cfg.tokens), runners[s], exchange)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=stage_main, args=(s,)) for s in range(cfg.stages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return [pp._check_stage(cfg, s, model, runners[s], params[s], ids, targets) for s in range(cfg.stages)], runners


def _small(**kw) -> pp.PPConfig:
    base = dict(ranks=2, layers=4, hidden=64, heads=4, vocab=97, seq=8, batch=4, microbatches=2)
    base.update(kw)
    return pp.PPConfig(**base)


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(schedule="1f1b"),
        dict(ranks=4, microbatches=4, schedule="1f1b"),
        dict(ranks=1),
        dict(ranks=2, ffn=0),
    ],
)
def test_training_pipeline_equals_the_full_batch_reference(kw):
    checks, runners = run_threaded(_small(**kw))
    for c in checks:
        assert c["passed"], c
        assert c["rel_rms_err"] < 1e-5
    last = checks[-1]
    assert abs(last["loss"] - last["reference_loss"]) < 1e-5 * abs(last["reference_loss"])
    assert last["compared"] > 2  # gradients, the loss and the logits


def test_gpipe_and_1f1b_compute_the_same_gradients():
    _, a = run_threaded(_small(schedule="gpipe"))
    _, b = run_threaded(_small(schedule="1f1b"))
    ga = pp.named_tensors(a[0].params)
    gb = pp.named_tensors(b[0].params)
    assert ga and ga.keys() == gb.keys()
    for k in ga:
        assert ga[k].grad is not None and gb[k].grad is not None, k
        torch.testing.assert_close(ga[k].grad, gb[k].grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("ranks, microbatches", [(1, 2), (2, 2), (2, 4), (4, 1)])
def test_decode_pipeline_generates_the_reference_tokens(ranks, microbatches):
    checks, runners = run_threaded(_small(ranks=ranks, mode="decode", tokens=3, batch=4, microbatches=microbatches))
    for c in checks:
        assert c["passed"], c
    assert checks[-1]["tokens_equal"] and checks[-1]["generated"] == 4 * 4
    if ranks > 1:
        assert checks[0]["received_ids_equal"]


def test_bfloat16_training_passes_its_check():
    checks, _ = run_threaded(_small(dtype="bf16"))
    assert all(c["passed"] for c in checks), checks
    assert max(c["rel_rms_err"] for c in checks) < pp.REL_TOLERANCE["bfloat16"]


def test_a_corrupted_activation_fails_the_check():
    checks, _ = run_threaded(_small(), corrupt=lambda m: m.kind == "activation" and m.mb == 0)
    assert not checks[-1]["passed"] and checks[-1]["rel_rms_err"] > 1e-2
    checks, _ = run_threaded(_small(mode="decode", tokens=3), corrupt=lambda m: m.kind == "activation" and m.mb == 0 and m.t == 0)
    assert not checks[-1]["passed"]


def test_a_corrupted_gradient_fails_the_first_stages_check():
    checks, _ = run_threaded(_small(), corrupt=lambda m: m.kind == "gradient")
    assert not checks[0]["passed"] and checks[0]["worst"].startswith("grad ")
    assert checks[1]["passed"]  # the last stage's own gradients are right


def test_block_with_cache_equals_full_causal_attention():
    spec = pp.ModelSpec(layers=1, hidden=32, heads=4, kv_heads=2, head_dim=8, ffn=64, vocab=11, max_pos=8)
    layer = pp.init_model(spec)["layers"][0]
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(1))
    full, k, v = pp.block(x, layer, spec)
    assert k.shape == (2, 2, 6, 8)
    _, k5, v5 = pp.block(x[:, :5], layer, spec)
    last, k6, _ = pp.block(x[:, 5:], layer, spec, (k5, v5))
    torch.testing.assert_close(last, full[:, 5:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k6, k, atol=1e-6, rtol=1e-6)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(ranks=2, layers=1), "stages (2) must not exceed layers (1)"),
        (dict(ranks=2, stages=4, layers=4), "stages (4) must equal ranks (2)"),
        (dict(ranks=2, layers=3), "layers (3) must be divisible by stages (2)"),
        (dict(batch=6, microbatches=4), "batch (6) must be divisible by microbatches (4)"),
        (dict(hidden=100, heads=8), "hidden (100) must be divisible by heads (8)"),
        (dict(schedule="zb"), "unknown schedule 'zb'"),
        (dict(mode="serve"), "unknown mode 'serve'"),
        (dict(mode="decode", schedule="1f1b"), "applies to --mode train only"),
        (dict(mode="decode", tokens=0), "tokens must be a positive integer"),
        (dict(microbatches=0), "microbatches must be a positive integer"),
        (dict(seq=0), "seq must be a positive integer"),
        (dict(ranks=9), "ranks must be between 1 and 8"),
        (dict(dtype="int8"), "unsupported dtype"),
        (dict(ffn=-1), "ffn must be a non-negative integer"),
        (dict(steps=2), "steps=2 is fewer than the profiler schedule needs"),
        (dict(backend="mpi"), "unknown backend"),
    ],
)
def test_bad_configs_raise_bad_input(kw, words):
    with pytest.raises(BadInputError) as ei:
        pp.PPConfig(**kw).resolved()
    assert words in str(ei.value)
    assert "\n" not in str(ei.value)


def test_resolved_defaults_and_sizes():
    c = pp.PPConfig().resolved()
    assert (c.stages, c.steps, c.ffn, c.micro_batch, c.layers_per_stage) == (2, 5, 704, 2, 2)
    assert c.activation_bytes == 2 * 64 * 256 * 4
    d = pp.PPConfig(mode="decode", dtype="bf16").resolved()
    assert (d.decode_activation_bytes, d.token_ids_bytes) == (2 * 256 * 2, 2 * 8)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["collect", "pp", "--layers", "3"], "tracekit: layers (3) must be divisible by stages (2)"),
        (["collect", "pp", "--stages", "3", "--layers", "6"], "tracekit: stages (3) must equal ranks (2): one pipeline stage per rank"),
        (["collect", "pp", "--layers", "1"], "tracekit: stages (2) must not exceed layers (1): each stage holds at least one layer"),
    ],
)
def test_cli_bad_config_exits_2(argv, message, capsys):
    from tracekit.cli import main

    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == message


# --------------------------------------------------------------------------- the recorded traces


def load_trace(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def p2p_ops(doc: dict) -> dict:
    """A rank's sends and recvs inside the profiled steps, read from the trace alone.

    Each `c10d::send` / `c10d::recv_` cpu_op carries the peer and the tag
    (Concrete Inputs [2] and [3]); the `gloo:send` / `gloo:recv` span that it
    opens (next on the same thread) carries the element type, hence the bytes."""
    ev = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
    steps = sorted((e for e in ev if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    out = {"steps": len(steps), "send": [], "recv": []}
    for kind, c10d, gloo in (("send", "c10d::send", "gloo:send"), ("recv", "c10d::recv_", "gloo:recv")):
        spans = [e for e in ev if e["name"] == gloo]
        for e in (e for e in ev if e["name"] == c10d):
            step = next(i for i, s in enumerate(steps) if s["ts"] <= e["ts"] <= s["ts"] + s["dur"])
            span = next(g for g in spans if g["ts"] >= e["ts"] and g["tid"] == e["tid"])
            args = span["args"]
            nbytes = math.prod(args["Input Dims"][0]) * TYPE_BYTES[args["Input type"][0]]
            assert e["args"]["Input Dims"][0][0] == args["Input Dims"][0]
            peer, tag = int(e["args"]["Concrete Inputs"][2]), int(e["args"]["Concrete Inputs"][3])
            out[kind].append({"step": step, "peer": peer, "tag": tag, "bytes": nbytes, "ts": e["ts"], "span": span})
    return out


def check_p2p(run_dir: Path, cfg: pp.PPConfig) -> dict:
    """Counts, sizes and pairing of every send/recv in a PP run folder, against
    counts written out independently of the workload's own plan."""
    cfg = cfg.resolved()
    conf = json.loads((run_dir / "run_config.json").read_text())
    assert conf["workload"] == "pp" and conf["pp_check"]["passed"]
    ops = [p2p_ops(load_trace(run_dir / f"rank{r}.pt.trace.json.gz")) for r in range(cfg.ranks)]
    b, M, T = cfg.stages - 1, cfg.microbatches, cfg.tokens
    for r, o in enumerate(ops):
        assert o["steps"] == cfg.active
    sends = sum(len(o["send"]) for o in ops)
    recvs = sum(len(o["recv"]) for o in ops)
    per_step = 2 * b * M if cfg.mode == "train" else b * M * (T + 1) + M * T
    assert sends == recvs == per_step * cfg.active
    assert conf["expected"]["p2p_pairs_per_step"] == per_step
    # pair every send with the recv of the same (src, dst, step, order) and compare
    pairs = 0
    for src, o in enumerate(ops):
        for dst in range(cfg.ranks):
            out = [s for s in o["send"] if s["peer"] == dst]
            inc = [x for x in ops[dst]["recv"] if x["peer"] == src]
            assert len(out) == len(inc)
            for s, x in zip(out, inc):
                assert (s["step"], s["tag"], s["bytes"]) == (x["step"], x["tag"], x["bytes"])
                pairs += 1
    assert pairs == per_step * cfg.active
    return {"ops": ops, "conf": conf}


PP_FIXTURE_CFG = pp.PPConfig(ranks=2, layers=2, hidden=128, heads=4, seq=32, batch=8, microbatches=4, schedule="gpipe", wait=1, warmup=1, active=2)
PP_DECODE_FIXTURE_CFG = pp.PPConfig(
    ranks=2, mode="decode", layers=2, hidden=128, heads=4, seq=16, batch=4, microbatches=2, tokens=4, wait=1, warmup=1, active=2
)


def test_pp_fixture_holds_boundaries_x_microbatches_x_2_pairs_per_step():
    cfg = PP_FIXTURE_CFG.resolved()
    got = check_p2p(FIXTURES / "pp_2rank", cfg)
    conf, ops = got["conf"], got["ops"]
    for k in ("ranks", "stages", "layers", "hidden", "heads", "seq", "batch", "microbatches", "schedule", "mode", "active"):
        assert conf[k] == getattr(cfg, k), k
    act = 2 * 32 * 128 * 4  # micro-batch × seq × hidden × float32
    # stage 0 sends 4 activations and receives 4 gradients per step; stage 1 the reverse
    for r in range(2):
        for kind in ("send", "recv"):
            assert Counter(x["step"] for x in ops[r][kind]) == {0: 4, 1: 4}
            assert {x["bytes"] for x in ops[r][kind]} == {act}
    assert conf["expected"]["activation_bytes"] == act
    # gpipe: stage 0 has sent every activation before any gradient arrives
    s0 = ops[0]
    for step in range(2):
        last_send = max(x["ts"] for x in s0["send"] if x["step"] == step)
        first_grad = min(x["span"]["ts"] + x["span"]["dur"] for x in s0["recv"] if x["step"] == step)
        assert last_send < first_grad
    for r in range(2):
        assert (FIXTURES / "pp_2rank" / f"rank{r}.pt.trace.json.gz").stat().st_size < 1_000_000


def test_pp_decode_fixture_sends_every_token_through_every_stage():
    cfg = PP_DECODE_FIXTURE_CFG.resolved()
    got = check_p2p(FIXTURES / "pp_decode_2rank", cfg)
    ops = got["ops"]
    mb, M, T = 2, 2, 4
    # stage 0 → 1: per step M prefill activations (mb × seq × hidden) and M × T decode ones (mb × 1 × hidden)
    sizes = Counter(x["bytes"] for x in ops[0]["send"] if x["step"] == 0)
    assert sizes == {mb * 16 * 128 * 4: M, mb * 1 * 128 * 4: M * T}
    # stage 1 → 0: the sampled token ids, M × T per step, mb int64 each
    assert Counter(x["bytes"] for x in ops[1]["send"] if x["step"] == 0) == {mb * 8: M * T}
    # every token crosses the stages in order: stage 0 sends a decode activation of a
    # micro-batch only after it received that micro-batch's token ids
    recv_ids = sorted(x["ts"] for x in ops[0]["recv"] if x["step"] == 0)
    decode_sends = sorted(x["ts"] for x in ops[0]["send"] if x["step"] == 0 and x["bytes"] == mb * 128 * 4)
    assert all(r < s for r, s in zip(recv_ids, decode_sends))
    assert got["conf"]["pp_check"]["per_stage"][1]["tokens_equal"]


def test_send_spans_sit_on_the_computing_thread():
    # gloo's p2p spans are on the thread that issued them (not on pt_gloo_runloop threads)
    doc = load_trace(FIXTURES / "pp_2rank" / "rank0.pt.trace.json.gz")
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    main_tid = next(e["tid"] for e in ev if e["name"].startswith("stage0.forward"))
    assert {e["tid"] for e in ev if e["name"] in ("gloo:send", "gloo:recv", "c10d::send", "c10d::recv_")} == {main_tid}
    assert {e["cat"] for e in ev if e["name"].startswith("gloo:")} == {"user_annotation"}


@pytest.mark.parametrize("name", ["pp_2rank", "pp_decode_2rank"])
def test_pp_fixtures_ingest(name, tmp_path):
    from tracekit.ingest import ingest_paths
    from tracekit.store import Store

    run_id = ingest_paths([str(FIXTURES / name)], store=str(tmp_path))
    con = Store(str(tmp_path)).connect(run_ids=[run_id])
    assert con.execute("SELECT workload, world_size FROM runs").fetchall() == [("pp", 2)]


# --------------------------------------------------------------------------- a real job


@pytest.mark.slow
def test_collect_pp_1f1b_end_to_end(tmp_path, capsys):
    from tracekit.cli import main

    argv = ["collect", "pp", "--ranks", "2", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "16",
            "--batch", "4", "--microbatches", "4", "--schedule", "1f1b", "--active", "2",
            "--out", str(tmp_path / "runs"), "--store", str(tmp_path / "store")]
    assert main(argv) == 0
    run_dir = next((tmp_path / "runs").iterdir())
    cfg = pp.PPConfig(ranks=2, layers=2, hidden=64, heads=4, seq=16, batch=4, microbatches=4, schedule="1f1b", active=2)
    got = check_p2p(run_dir, cfg)
    assert {x["bytes"] for o in got["ops"] for x in o["send"]} == {1 * 16 * 64 * 4}
    assert "check passed" in capsys.readouterr().err
