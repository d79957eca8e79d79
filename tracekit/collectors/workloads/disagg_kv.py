"""The disaggregated prefill/decode workload: prefill ranks compute a prompt's KV
cache and ship it to decode ranks, which then generate tokens from it.

Ranks are paired: with N ranks (N even), rank r < N/2 is a *prefill* rank and
sends to its *decode* partner r + N/2 (with 2 ranks: rank 0 prefills, rank 1
decodes). Both hold the same model (:func:`tracekit.collectors.workloads.pp.init_model`:
token and position embeddings, ``layers`` pre-norm blocks with grouped-query
attention — ``heads`` query heads, ``kv_heads`` key/value heads of
``head_dim`` — and a SwiGLU MLP unless ``ffn=0``, final norm, LM head).

One step (one request per pair) on the prefill rank: embed the pair's
``batch × prompt_len`` prompt; run the layers one by one, each producing its
K and V (``batch × kv_heads × prompt_len × head_dim`` each), packed into one
``(2, batch, kv_heads, prompt_len, head_dim)`` tensor per layer; sample the
first new token from the last position. The KV of layer i goes to the decode
rank as one message (tag i):

- ``bulk``: all layers' messages are sent after the whole prefill;
- ``layerwise``: layer i's message is sent as soon as layer i is computed,
  while layer i+1 computes.

Then the first token's ids (``batch`` int64, tag ``layers``) follow. So per step
and pair: ``layers`` KV messages of ``kv_bytes_per_layer = 2 × batch ×
prompt_len × kv_heads × head_dim × dtype_bytes`` and one of ``batch × 8`` bytes,
all from prefill to decode, and nothing else on the process group.

Transfer protocol (notify, then pull; as KV connectors that have the decode
side read a layer once the prefill side announces it). The prefill rank posts
each message's ``isend`` and then announces it on the control plane (the job's
TCP store, :func:`control_store`, outside the process group and the trace);
the decode rank waits for each announcement and only then posts that
message's ``irecv``. The order matters on gloo/TCP: an isend whose recv is
already posted writes the data inside the ``isend`` call, on the computing
thread (``c10d::send`` lasts the transfer, nothing can overlap it), while an
isend posted first returns at once and gloo's own thread moves the data when
the recv arrives, so the transfer of layer i really runs while layer i+1
computes. On the prefill rank a helper thread
(:class:`tracekit.collectors.workloads.pp.WorkWaiter`) makes each announcement (its
round trip does not hold up the next layer) and then waits for the send, which
cannot complete before the announcement is out, so the ``gloo:send`` span ends
when the transfer did; on the decode rank helper threads wait for the recvs.
The GIL switch interval is 0.2 ms while the steps run, so a helper does not
wait long behind the computing thread. A step ends when every transfer has.

Each step begins when the decode rank, idle, says *ready* (control plane
again; the prefill rank's wait for it is the ``kv.wait_ready`` range), so
prefill never waits for a decode rank still busy with the previous request.
The price: the two roles do not overlap across requests (a step is prefill +
decode, not the larger of the two). After its KV has arrived the decode rank
decodes ``decode_tokens`` tokens greedily with the received cache (no prefill
of its own).

After the run the decode rank recomputes the whole request single-process
(prefill and decode with the same functions and shapes) and compares: the
generated tokens must be identical and the last logits within tolerance. A
mismatch fails the job.

Public API: :class:`KVConfig`, :func:`run_disagg_kv`; :func:`prefill`,
:func:`decode` and :func:`reference` for tests.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tracekit.collectors import launch as _launch
from tracekit.collectors.workloads.pp import (
    REL_TOLERANCE,
    TOKEN_ID_BYTES,
    ModelSpec,
    WorkWaiter,
    block,
    canonical_dtype,
    default_ffn,
    embed,
    greedy,
    init_model,
    lm_head,
    positive,
    rel_error,
)
from tracekit.collectors.workloads.tp import DTYPES, torch_dtype
from tracekit.errors import BadInputError, TracekitError

MODES = ("bulk", "layerwise")
#: Python's GIL switch interval while a rank runs its steps (default 5 ms): how
#: long a helper thread can wait for the GIL behind the computing thread.
SWITCH_INTERVAL_S = 2e-4


class KVMismatchError(TracekitError):
    """The decode output differs from the single-process reference (exit 1)."""


@dataclass
class KVConfig(_launch.RunOptions):
    """Options of the disagg-kv workload. ``steps=None`` means wait + warmup +
    active; ``ffn=None`` means 8/3 × hidden rounded up to 64, ``ffn=0`` no MLP."""

    ranks: int = _launch.option(2, "Ranks, an even number: the first half prefill, the second half decode.")
    layers: int = _launch.option(8, "Transformer layers (one KV message each).")
    hidden: int = _launch.option(512, "Hidden size.")
    heads: int = _launch.option(8, "Query heads.")
    kv_heads: int = _launch.option(2, "Key/value heads (divide --heads).")
    head_dim: int = _launch.option(64, "Head dimension.")
    ffn: int | None = _launch.option(
        None, "MLP inner size (default: 8/3 x hidden, rounded up to 64; 0: attention only)."
    )
    vocab: int = _launch.option(512, "Vocabulary size.")
    prompt_len: int = _launch.option(256, "Prompt tokens per sequence.")
    batch: int = _launch.option(2, "Sequences per request.")
    decode_tokens: int = _launch.option(8, "Tokens the decode rank generates per request.")
    mode: str = _launch.option(
        "layerwise", "layerwise (send each layer's KV as it is computed) or bulk (after the prefill)."
    )
    # fault (from RunOptions), testing only: "corrupt_kv" scales the V half of layer 0's KV message before
    # sending (the decode check must then fail); "raise" makes the last rank raise

    def resolved(self) -> "KVConfig":
        """A validated copy with steps, ffn and dtype filled in / canonical. Raises
        BadInputError (one line) for an impossible configuration."""
        c = dataclasses.replace(self)
        _launch.validate_ranks(c.ranks)
        if c.ranks % 2:
            raise BadInputError(
                f"disagg-kv pairs a prefill rank with a decode rank: ranks must be even, got {c.ranks}"
            )
        if not isinstance(c.prompt_len, int) or isinstance(c.prompt_len, bool) or c.prompt_len < 1:
            raise BadInputError(f"prompt_len must be at least 1, got {c.prompt_len}")
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "batch", "decode_tokens"):
            positive(name, getattr(c, name))
        if c.heads % c.kv_heads:
            raise BadInputError(f"kv_heads ({c.kv_heads}) must divide heads ({c.heads}): each KV head serves heads/kv_heads query heads")
        if c.vocab < 2:
            raise BadInputError(f"vocab must be at least 2, got {c.vocab}")
        if c.mode not in MODES:
            raise BadInputError(f"unknown mode {c.mode!r} (choose one of {', '.join(MODES)})")
        c.dtype = canonical_dtype(c.dtype)
        if c.ffn is None:
            c.ffn = default_ffn(c.hidden)
        if isinstance(c.ffn, bool) or not isinstance(c.ffn, int) or c.ffn < 0:
            raise BadInputError(f"ffn must be a non-negative integer (0: no MLP), got {c.ffn}")
        c.steps = _launch.validate_schedule(c.wait, c.warmup, c.active, c.steps)
        _launch.validate_run_options(c.backend, c.timeout_s, c.fault, (None, "corrupt_kv", "raise"))
        return c

    @property
    def dtype_bytes(self) -> int:
        return DTYPES[canonical_dtype(self.dtype)]

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """(prefill rank, decode rank) per pair."""
        half = self.ranks // 2
        return [(r, r + half) for r in range(half)]

    @property
    def kv_bytes_per_layer(self) -> int:
        """2 (K and V) × batch × prompt_len × kv_heads × head_dim × dtype bytes."""
        return 2 * self.batch * self.prompt_len * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_total(self) -> int:
        """KV bytes one pair moves per step: layers × kv_bytes_per_layer."""
        return self.layers * self.kv_bytes_per_layer

    @property
    def token_ids_bytes(self) -> int:
        return self.batch * TOKEN_ID_BYTES

    def spec(self) -> ModelSpec:
        return ModelSpec(
            layers=self.layers,
            hidden=self.hidden,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            ffn=self.ffn if self.ffn is not None else default_ffn(self.hidden),
            vocab=self.vocab,
            max_pos=self.prompt_len + self.decode_tokens,
            dtype=canonical_dtype(self.dtype),
            seed=self.seed,
            eps=self.eps,
        )


# --------------------------------------------------------------------------- the model's two halves


def make_prompt(cfg: KVConfig, pair: int, device="cpu"):
    """The pair's prompt ids (batch, prompt_len), from the seed and the pair index."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(cfg.seed + 1_000_003 + pair)
    return torch.randint(0, cfg.vocab, (cfg.batch, cfg.prompt_len), generator=g).to(device)


def prefill(model, spec: ModelSpec, ids, on_layer: Callable[[int, Any], None] | None = None):
    """Run the prompt `ids` (B, S) through every layer. After layer i, ``on_layer(i,
    kv)`` gets its packed KV (2, B, kv_heads, S, head_dim). Each layer's compute
    runs inside ``prefill.layer{i}``. Returns (list of packed KV, first token ids
    (B, 1) int64)."""
    import torch
    from torch.profiler import record_function

    with record_function("prefill.embed"):
        x = embed(ids, 0, model)
    kvs = []
    for i, layer in enumerate(model["layers"]):
        with record_function(f"prefill.layer{i}"):
            x, k, v = block(x, layer, spec, None)
            kv = torch.stack([k, v])
        kvs.append(kv)
        if on_layer is not None:
            on_layer(i, kv)
    with record_function("prefill.head"):
        first = greedy(lm_head(x[:, -1:], model, spec))
    return kvs, first


def decode(model, spec: ModelSpec, kvs: list, first, prompt_len: int, tokens: int):
    """Greedy decoding of `tokens` tokens from the prompt's cache `kvs` (packed per
    layer) after the first token `first` (B, 1). Token t runs inside
    ``decode.token{t}``. Returns (ids (B, tokens) int64, last logits (B, 1, V))."""
    import torch
    from torch.profiler import record_function

    cache = [(kv[0], kv[1]) for kv in kvs]
    tok, out, logits = first, [], None
    for t in range(tokens):
        with record_function(f"decode.token{t}"):
            x = embed(tok, prompt_len + t, model)
            for i, layer in enumerate(model["layers"]):
                x, k, v = block(x, layer, spec, cache[i])
                cache[i] = (k, v)
            logits = lm_head(x, model, spec)
            tok = greedy(logits)
        out.append(tok)
    return torch.cat(out, dim=1), logits


def reference(model, spec: ModelSpec, ids, tokens: int):
    """The whole request in one process: (first ids (B, 1), ids (B, tokens), last logits)."""
    import torch

    with torch.no_grad():
        kvs, first = prefill(model, spec, ids)
        toks, logits = decode(model, spec, kvs, first, ids.shape[1], tokens)
    return first, toks, logits


# --------------------------------------------------------------------------- one rank


def control_store(timeout_s: float):
    """A client of the job's TCP store (the rendezvous store of
    :func:`tracekit.collectors.launch.launch`, at MASTER_ADDR:MASTER_PORT): the control
    plane for the *ready* and *sent* flags, outside the process group and the trace."""
    import os

    import torch.distributed as dist

    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=_dt.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def _kv_rank(ctx: _launch.RankContext, cfg: KVConfig) -> dict[str, Any]:
    """What each rank process runs: its role's step loop, then (decode) the check."""
    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    pairs = cfg.pairs
    pair = next(i for i, p in enumerate(pairs) if ctx.rank in p)
    prefill_rank, decode_rank = pairs[pair]
    role = "prefill" if ctx.rank == prefill_rank else "decode"
    spec = cfg.spec()
    model = init_model(spec, device=ctx.device)
    ids = make_prompt(cfg, pair, ctx.device)
    if cfg.fault == "raise" and ctx.rank == cfg.ranks - 1:
        raise RuntimeError("injected fault (KVConfig.fault='raise')")
    waiter = WorkWaiter(f"kv-{role}-waiter")
    store = control_store(cfg.timeout_s)
    L = cfg.layers
    dt = torch_dtype(cfg.dtype)
    kv_shape = (2, cfg.batch, cfg.kv_heads, cfg.prompt_len, cfg.head_dim)
    timing: dict[str, list] = {"step_s": []}

    def key(what: str, tag: int | None = None) -> str:
        step = len(timing["step_s"])
        return f"disagg_kv/{pair}/{step}/{what}" + ("" if tag is None else f"/{tag}")

    def send(t, tag: int) -> None:
        if cfg.fault == "corrupt_kv" and tag == 0:
            t = torch.stack([t[0], t[1] * 1.5])
        work = dist.isend(t, dst=decode_rank, tag=tag)
        k = key("sent", tag)

        def announce_and_wait() -> None:
            store.set(k, "1")  # the decode rank may now post its irecv
            work.wait()  # blocking before the transfer can complete: the span ends on time

        waiter.call(announce_and_wait, t, wait_start=False)

    def prefill_step() -> None:
        with record_function("kv.wait_ready"):
            store.get(key("ready"))
        t0 = time.perf_counter()
        layer_s: list[float] = []
        mark = [t0]

        def on_layer(i: int, kv) -> None:
            now = time.perf_counter()
            layer_s.append(now - mark[0])
            if cfg.mode == "layerwise":
                send(kv, i)
            mark[0] = time.perf_counter()

        kvs, first = prefill(model, spec, ids, on_layer)
        computed = time.perf_counter()
        if cfg.mode == "bulk":
            for i, kv in enumerate(kvs):
                send(kv, i)
        send(first, L)
        waiter.drain()
        done = time.perf_counter()
        timing.setdefault("layer_s", []).append(layer_s)
        timing.setdefault("compute_s", []).append(computed - t0)
        timing.setdefault("exposed_send_s", []).append(done - computed)
        timing["step_s"].append(done - t0)

    result: dict[str, Any] = {}

    def decode_step() -> None:
        t0 = time.perf_counter()
        bufs = [torch.empty(kv_shape, dtype=dt, device=ctx.device) for _ in range(L)]
        first = torch.empty((cfg.batch, 1), dtype=torch.int64, device=ctx.device)
        store.set(key("ready"), "1")
        with record_function("kv.pull"):
            for tag, buf in enumerate(bufs + [first]):
                store.get(key("sent", tag))  # announced: its isend is posted
                waiter.put(dist.irecv(buf, src=prefill_rank, tag=tag), buf)
            waiter.drain()
        received = time.perf_counter()
        toks, logits = decode(model, spec, bufs, first, cfg.prompt_len, cfg.decode_tokens)
        done = time.perf_counter()
        result.update(first=first, tokens=toks, logits=logits)
        timing.setdefault("kv_wait_s", []).append(received - t0)
        timing.setdefault("decode_s", []).append(done - received)
        timing["step_s"].append(done - t0)

    step_fn = prefill_step if role == "prefill" else decode_step
    dist.barrier()
    # a helper thread that wants the GIL gets it within ~0.2 ms of a computing thread
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    schedule = _launch.ProfileSchedule(cfg.wait, cfg.warmup, cfg.active)
    out_file = ctx.trace_path()
    prof = _launch.make_profiler(schedule, out_file, use_cuda=ctx.is_cuda)
    try:
        with torch.no_grad(), prof:
            for _step in ctx.profiled_steps(prof, cfg.steps):
                step_fn()
    finally:
        sys.setswitchinterval(switch)
        waiter.close()
    ctx.check_trace(out_file)

    check: dict[str, Any] = {"role": role}
    if role == "decode":
        if pair == 0:
            ctx.progress("checking the decode output against the single-process reference")
        ref_first, ref_toks, ref_logits = reference(model, spec, ids, cfg.decode_tokens)
        rel, mx, finite = rel_error(result["logits"], ref_logits)
        tol = REL_TOLERANCE[cfg.dtype]
        check.update(
            first_token_equal=bool(torch.equal(result["first"], ref_first)),
            tokens_equal=bool(torch.equal(result["tokens"], ref_toks)),
            rel_rms_err=rel,
            max_abs_err=mx,
            criterion=f"first and generated token ids equal to the reference's; last logits relative RMS error <= {tol:g}",
        )
        check["passed"] = bool(check["first_token_equal"] and check["tokens_equal"] and finite and rel <= tol)
        if not check["passed"]:
            what = "token ids differ" if not (check["first_token_equal"] and check["tokens_equal"]) else "logits differ"
            raise KVMismatchError(
                f"decode output differs from the single-process reference on rank {ctx.rank} ({what}): "
                f"last logits relative RMS error {rel:.3g}, max abs error {mx:.3g} (needs {check['criterion']})"
            )
    return {
        "rank": ctx.rank,
        "role": role,
        "pair": pair,
        "partner": decode_rank if role == "prefill" else prefill_rank,
        "check": check,
        "timing": timing,
        "threads": torch.get_num_threads(),
        "trace": out_file.name,
        "trace_bytes": out_file.stat().st_size,
    }


# --------------------------------------------------------------------------- the job


def run_disagg_kv(config: KVConfig, on_progress: Callable[[str], None] | None = None) -> Path:
    """Run the disagg-kv workload on ``config.ranks`` processes with the profiler on.

    Returns the run folder (``<out>/disagg_kv-YYYYmmdd-HHMMSS-xxxx``) holding
    ``rank{r}.pt.trace.json.gz`` per rank and ``run_config.json``. Raises
    BadInputError for an impossible configuration, RankFailedError when a rank
    fails (including a mismatch: "decode output differs ...")."""
    cfg = config.resolved()
    backend = _launch.resolve_backend(cfg.backend, cfg.ranks)
    info = _launch.host_info()
    run_dir = _launch.new_run_dir(cfg.out, "disagg_kv")
    results, wall, created = _launch.timed_launch(_kv_rank, cfg, backend, run_dir, on_progress)
    _launch.write_json(run_dir / "run_config.json", build_run_config(run_dir.name, cfg, backend, info, results, wall, created))
    return run_dir


def _median(values) -> float | None:
    return round(statistics.median(values), 6) if values else None


def build_run_config(run_id, cfg: KVConfig, backend, info, results, wall_s, created) -> dict[str, Any]:
    """The run_config.json document (see fixtures/kv_bulk_2rank/NOTE.md)."""
    options = _launch.config_options(cfg)
    L = cfg.layers

    def steady(values: list) -> list:  # the steps after the first (cold) one
        return values[1:] if len(values) > 1 else values

    timing_rows = []
    for r in results:
        t = r["timing"]
        row: dict[str, Any] = {"rank": r["rank"], "role": r["role"], "step_wall_s": [round(s, 6) for s in t["step_s"]]}
        if r["role"] == "prefill":
            layers = [s for step in steady(t["layer_s"]) for s in step]
            row.update(
                layer_compute_s=_median(layers),
                prefill_compute_s=_median(steady(t["compute_s"])),
                exposed_send_s=_median(steady(t["exposed_send_s"])),
            )
        else:
            row.update(kv_wait_s=_median(steady(t["kv_wait_s"])), decode_s=_median(steady(t["decode_s"])))
        timing_rows.append(row)
    decode_checks = [r["check"] for r in results if r["role"] == "decode"]
    return {
        "workload": "disagg_kv",
        "run_id": run_id,
        "created_at": created.isoformat(timespec="seconds"),
        **options,
        "world_size": cfg.ranks,
        "backend": backend,
        "dtype_bytes": cfg.dtype_bytes,
        "pairs": [list(p) for p in cfg.pairs],
        "role_of_rank": [r["role"] for r in results],
        **_launch.run_config_base(info, results, backend, cfg.wait, cfg.warmup, cfg.active),
        "kv": {
            "bytes_per_layer": cfg.kv_bytes_per_layer,
            "bytes_per_layer_formula": "2 x batch x prompt_len x kv_heads x head_dim x dtype_bytes",
            "total_bytes": cfg.kv_bytes_total,
            "bytes_per_token": 2 * L * cfg.kv_heads * cfg.head_dim * cfg.dtype_bytes,
            "message_shape": [2, cfg.batch, cfg.kv_heads, cfg.prompt_len, cfg.head_dim],
            "mode": cfg.mode,
            "layers": L,
        },
        "expected": {
            "kv_sends_per_step_per_pair": L,
            "kv_send_bytes": cfg.kv_bytes_per_layer,
            "kv_bytes_per_step_per_pair": cfg.kv_bytes_total,
            "token_sends_per_step_per_pair": 1,
            "token_send_bytes": cfg.token_ids_bytes,
            "sends_per_step_by_rank": [L + 1 if r < cfg.ranks // 2 else 0 for r in range(cfg.ranks)],
            "recvs_per_step_by_rank": [0 if r < cfg.ranks // 2 else L + 1 for r in range(cfg.ranks)],
            "p2p_pairs_per_step": (L + 1) * len(cfg.pairs),
            "p2p_pairs_active": (L + 1) * cfg.active * len(cfg.pairs),
            "tags": f"KV of layer i: tag i (0..{L - 1}); first token ids: tag {L}",
        },
        "model": {
            "overlap": "layer-by-layer transfer: exposed = alpha + (total_bytes / layers) / beta when each layer's compute exceeds its transfer"
            if cfg.mode == "layerwise"
            else "no overlap: exposed = layers x (alpha + bytes_per_layer / beta) after the prefill",
        },
        "kv_check": {
            "passed": True,
            "reference": "single-process prefill + greedy decode on the decode rank (same functions and shapes)",
            "per_decode_rank": decode_checks,
            "max_rel_rms_err": max((c["rel_rms_err"] for c in decode_checks), default=0.0),
            "tolerance_rel_rms": REL_TOLERANCE[cfg.dtype],
        },
        "timing": {
            "job_wall_s": round(wall_s, 3),
            "clock": "time.perf_counter per rank; medians over the steps after the first; warmup/active steps include profiler overhead",
            "per_rank": timing_rows,
        },
        "traces": [r["trace"] for r in results],
        "overlap_model": _launch.overlap_model("layerwise", layers=L) if cfg.mode == "layerwise"
        else _launch.overlap_model("no_overlap"),
    }
