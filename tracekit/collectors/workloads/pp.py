"""The pipeline-parallel (PP) workload: a small decoder-only transformer cut into
stages, one stage per rank, with activations (and gradients) sent point-to-point.

The model (shared with :mod:`tracekit.collectors.workloads.disagg_kv`): token embedding +
learned absolute position embedding, ``layers`` pre-norm blocks (grouped-query
causal attention with a KV cache, SwiGLU MLP), a final RMSNorm and an LM head.
Stage ``s`` of ``p`` holds layers ``[s·L/p, (s+1)·L/p)``; stage 0 also holds the
embeddings, the last stage the final norm and the LM head.

Two modes:

- ``train``: the batch is split into ``microbatches`` equal micro-batches. A
  forward of micro-batch m on stage s receives its input activation
  (mb, seq, hidden) from stage s−1 and sends its output to s+1; the last stage
  computes the cross-entropy loss (scaled by 1/microbatches, so that the summed
  gradients equal the full batch's). A backward receives the gradient of the
  stage's output from s+1 and sends the gradient of its input to s−1. Order of
  the forwards (F) and backwards (B) per stage: ``gpipe`` = all F in order,
  then all B in reverse order; ``1f1b`` = Megatron's one-forward-one-backward
  (``min(p−s−1, M)`` warm-up forwards, steady F/B pairs, cool-down backwards).
  There is no optimizer step: every step computes the same gradients, so the
  profiled steps are alike. Per step: boundaries × microbatches activation
  sends and as many gradient sends.
- ``decode``: autoregressive generation with greedy sampling. Each step is a
  whole generation: a prefill pass of the ``seq``-token prompt, then ``tokens``
  decode passes. In every pass each micro-batch's hidden state crosses all
  stages (stage s waits for s−1); the last stage samples the next token and
  sends its ids (mb × int64) back to stage 0, which embeds it for the next
  pass, so token t+1 of a micro-batch cannot start before token t has left the
  last stage. Per step: boundaries × microbatches × (tokens + 1) activation
  sends (the first microbatches × boundaries of prefill size) and
  microbatches × tokens token-id sends (last → first stage; none with 1 stage).

Communication: ``torch.distributed.isend``/``irecv`` and ``wait()``. Each
stage runs a fixed program, the ordered list of its F/B (or decode) actions
(:func:`stage_program`); after each action it posts the send of that action's
output and the recv of the next action's input, then waits for the recv only.
gloo's send is a rendezvous (it completes only once the peer has posted the
matching recv), so a thread that waited on its sends could deadlock against a
peer doing the same (2 stages, decode, 4 micro-batches does). Sends are instead
waited on by helper threads (:class:`WorkWaiter`); every send of a step has
completed before the step ends. (On gloo/TCP an isend whose recv is already
posted writes the data inside the ``isend`` call, so its ``c10d::send`` op
lasts the transfer; otherwise gloo's own thread sends it once the recv comes.) A stage thus blocks only on data
it needs, and a schedule whose dependencies are acyclic cannot deadlock (tests
check all of them). Every message has its own tag (:meth:`Msg.tag`), visible in
the trace.

Every rank builds the full model from the seed and keeps its stage. After the
run each rank recomputes the single-process reference and compares (train:
this stage's weight gradients, and on the last stage the loss and the logits,
against a full-batch forward/backward; decode: the generated tokens exactly and
the last logits, against a micro-batch-by-micro-batch single-process
generation). A mismatch fails the job.

Public API: :class:`PPConfig`, :func:`run_pp`; the model (:class:`ModelSpec`,
:func:`init_model`, :func:`embed`, :func:`block`, :func:`lm_head`) and the
schedule (:func:`stage_program`, :class:`Msg`, :class:`Action`) for tests and
for the disagg-kv workload.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tracekit.collectors import launch as _launch
from tracekit.collectors.workloads.tp import _DTYPE_ALIASES, DTYPES, rms_norm, torch_dtype
from tracekit.errors import BadInputError, TracekitError

SCHEDULES = ("gpipe", "1f1b")
MODES = ("train", "decode")
#: Relative RMS error ‖out − ref‖₂ / ‖ref‖₂ allowed against the reference, per
#: dtype. float32: micro-batching reorders sums (observed ~1e-7); half
#: precisions round every stage output and accumulate gradients in that dtype.
REL_TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}
TOKEN_ID_BYTES = 8  # sampled token ids travel as int64


class PPMismatchError(TracekitError):
    """The pipeline's output differs from the single-process reference (exit 1)."""


def canonical_dtype(name: str) -> str:
    """'bf16' → 'bfloat16' etc.; raises BadInputError for an unsupported dtype."""
    c = _DTYPE_ALIASES.get(name, name)
    if c not in DTYPES:
        raise BadInputError(f"unsupported dtype {name!r} (choose one of {', '.join(DTYPES)})")
    return c


def default_ffn(hidden: int) -> int:
    """8/3 × hidden rounded up to a multiple of 64 (Llama-like)."""
    return -(-8 * hidden // 3 // 64) * 64


def positive(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise BadInputError(f"{name} must be a positive integer, got {v}")


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class ModelSpec:
    """Shape of the decoder-only transformer. Attention projects hidden →
    heads × head_dim (queries) and kv_heads × head_dim (keys, values)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # 0: attention-only blocks
    vocab: int
    max_pos: int
    dtype: str = "float32"
    seed: int = 0
    eps: float = 1e-6

    @property
    def dtype_bytes(self) -> int:
        return DTYPES[self.dtype]


def init_model(spec: ModelSpec, device="cpu") -> dict[str, Any]:
    """The full model, drawn deterministically from ``spec.seed`` in float32 on the
    CPU (identical everywhere), then cast. Linear weights ~ N(0, 1/fan_in), norm
    weights 1 + N(0, 0.1²), embeddings N(0, 1). Returns {"embed" (V, H), "pos"
    (max_pos, H), "layers": [{attn_norm, wq (nh·d, H), wk/wv (nkv·d, H), wo (H, nh·d),
    mlp_norm, w_gate/w_up (F, H), w_down (H, F)}], "final_norm" (H,), "lm_head" (V, H)}."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(spec.seed)
    dt = torch_dtype(spec.dtype)
    H, F, d = spec.hidden, spec.ffn, spec.head_dim

    def lin(out_f: int, in_f: int):
        return (torch.randn(out_f, in_f, generator=g) / in_f**0.5).to(device=device, dtype=dt)

    def norm():
        return (1.0 + 0.1 * torch.randn(H, generator=g)).to(device=device, dtype=dt)

    def table(n: int):
        return torch.randn(n, H, generator=g).to(device=device, dtype=dt)

    model: dict[str, Any] = {"embed": table(spec.vocab), "pos": table(spec.max_pos), "layers": []}
    for _ in range(spec.layers):
        layer = {
            "attn_norm": norm(),
            "wq": lin(spec.heads * d, H),
            "wk": lin(spec.kv_heads * d, H),
            "wv": lin(spec.kv_heads * d, H),
            "wo": lin(H, spec.heads * d),
        }
        if F:
            layer.update(mlp_norm=norm(), w_gate=lin(F, H), w_up=lin(F, H), w_down=lin(H, F))
        model["layers"].append(layer)
    model["final_norm"] = norm()
    model["lm_head"] = lin(spec.vocab, H)
    return model


def embed(ids, start: int, model: dict[str, Any]):
    """Token + position embedding of `ids` (B, S) at positions start .. start+S−1 → (B, S, H)."""
    S = ids.shape[1]
    return model["embed"][ids] + model["pos"][start : start + S]


def block(x, layer: dict[str, Any], spec: ModelSpec, past=None):
    """One pre-norm block on x (B, S, H). `past`: this layer's cached (k, v), each
    (B, kv_heads, T, head_dim), or None. With a cache, S must be 1 (a decode
    step attends to all cached positions); without, attention is causal over S.
    Returns (x_out (B, S, H), k, v) with k, v the full (B, kv_heads, T+S, head_dim)."""
    import torch
    import torch.nn.functional as Fn

    B, S, _ = x.shape
    nh, nkv, d = spec.heads, spec.kv_heads, spec.head_dim
    h = rms_norm(x, layer["attn_norm"], spec.eps)
    q = (h @ layer["wq"].T).reshape(B, S, nh, d).transpose(1, 2)
    k = (h @ layer["wk"].T).reshape(B, S, nkv, d).transpose(1, 2)
    v = (h @ layer["wv"].T).reshape(B, S, nkv, d).transpose(1, 2)
    if past is not None:
        if S != 1:
            raise ValueError(f"a block with a KV cache takes one new token, got {S}")
        k = torch.cat([past[0], k], dim=2)
        v = torch.cat([past[1], v], dim=2)
    kr, vr = k, v
    if nkv != nh:
        kr = k.repeat_interleave(nh // nkv, dim=1)
        vr = v.repeat_interleave(nh // nkv, dim=1)
    a = Fn.scaled_dot_product_attention(q, kr, vr, is_causal=past is None and S > 1)
    x = x + a.transpose(1, 2).reshape(B, S, nh * d) @ layer["wo"].T
    if "w_gate" in layer:
        h = rms_norm(x, layer["mlp_norm"], spec.eps)
        x = x + (Fn.silu(h @ layer["w_gate"].T) * (h @ layer["w_up"].T)) @ layer["w_down"].T
    return x, k, v


def lm_head(x, model: dict[str, Any], spec: ModelSpec):
    """Final RMSNorm and the LM head: (B, S, H) → logits (B, S, V), in the model dtype."""
    return rms_norm(x, model["final_norm"], spec.eps) @ model["lm_head"].T


def greedy(logits):
    """The next token ids (B, 1) int64 from logits (B, 1, V)."""
    return logits[:, -1, :].float().argmax(dim=-1, keepdim=True)


# --------------------------------------------------------------------------- config


@dataclass
class PPConfig(_launch.RunOptions):
    """Options of the PP workload. ``stages=None`` means ``ranks`` (one stage per
    rank); ``steps=None`` means wait + warmup + active; ``ffn=None`` means 8/3 ×
    hidden rounded up to 64. ``seq`` is the training sequence length, or the
    prompt length in decode mode."""

    ranks: int = _launch.option(2, "Ranks (processes), one pipeline stage each, 1-8.")
    stages: int | None = _launch.option(None, "Pipeline stages (must equal --ranks; default: --ranks).")
    layers: int = _launch.option(4, "Transformer layers (divisible by --stages).")
    hidden: int = _launch.option(256, "Hidden size.")
    heads: int = _launch.option(4, "Attention heads (divide --hidden).")
    ffn: int | None = _launch.option(None, "MLP inner size (default: 8/3 x hidden, rounded up to 64; 0: no MLP).")
    vocab: int = _launch.option(512, "Vocabulary size.")
    seq: int = _launch.option(64, "Sequence length (train) or prompt length (decode).")
    batch: int = _launch.option(8, "Batch size (divisible by --microbatches).")
    microbatches: int = _launch.option(4, "Micro-batches per step.")
    schedule: str = _launch.option("gpipe", "gpipe or 1f1b (train only).")
    mode: str = _launch.option("train", "train (forward + backward) or decode (prefill + greedy decode).")
    tokens: int = _launch.option(8, "Decode steps per generation (decode mode).")
    # fault (from RunOptions), testing only: "corrupt_activation" scales stage 0's first outgoing message
    # of every step by 1.5 (the check must then fail); "raise" makes the last rank raise

    def resolved(self) -> "PPConfig":
        """A validated copy with stages, steps, ffn and dtype filled in / canonical.
        Raises BadInputError (one line) for an impossible configuration. Does not
        look at the backend's availability (see :func:`tracekit.collectors.launch.resolve_backend`)."""
        c = dataclasses.replace(self)
        _launch.validate_ranks(c.ranks)
        if c.stages is None:
            c.stages = c.ranks
        positive("stages", c.stages)
        for name in ("layers", "hidden", "heads", "vocab", "seq", "batch", "microbatches"):
            positive(name, getattr(c, name))
        if c.stages > c.layers:
            raise BadInputError(f"stages ({c.stages}) must not exceed layers ({c.layers}): each stage holds at least one layer")
        if c.stages != c.ranks:
            raise BadInputError(f"stages ({c.stages}) must equal ranks ({c.ranks}): one pipeline stage per rank")
        if c.layers % c.stages:
            raise BadInputError(f"layers ({c.layers}) must be divisible by stages ({c.stages})")
        if c.hidden % c.heads:
            raise BadInputError(f"hidden ({c.hidden}) must be divisible by heads ({c.heads})")
        if c.vocab < 2:
            raise BadInputError(f"vocab must be at least 2, got {c.vocab}")
        if c.batch % c.microbatches:
            raise BadInputError(f"batch ({c.batch}) must be divisible by microbatches ({c.microbatches})")
        if c.schedule not in SCHEDULES:
            raise BadInputError(f"unknown schedule {c.schedule!r} (choose one of {', '.join(SCHEDULES)})")
        if c.mode not in MODES:
            raise BadInputError(f"unknown mode {c.mode!r} (choose one of {', '.join(MODES)})")
        if c.mode == "decode":
            positive("tokens", c.tokens)
            if c.schedule != "gpipe":
                raise BadInputError(f"schedule {c.schedule!r} applies to --mode train only (decode runs each pass through the stages in order)")
        c.dtype = canonical_dtype(c.dtype)
        if c.ffn is None:
            c.ffn = default_ffn(c.hidden)
        if isinstance(c.ffn, bool) or not isinstance(c.ffn, int) or c.ffn < 0:
            raise BadInputError(f"ffn must be a non-negative integer (0: no MLP), got {c.ffn}")
        c.steps = _launch.validate_schedule(c.wait, c.warmup, c.active, c.steps)
        _launch.validate_run_options(c.backend, c.timeout_s, c.fault, (None, "corrupt_activation", "raise"))
        return c

    # ---- derived sizes
    @property
    def dtype_bytes(self) -> int:
        return DTYPES[canonical_dtype(self.dtype)]

    @property
    def micro_batch(self) -> int:
        return self.batch // self.microbatches

    @property
    def layers_per_stage(self) -> int:
        return self.layers // (self.stages or self.ranks)

    @property
    def boundaries(self) -> int:
        return (self.stages or self.ranks) - 1

    @property
    def activation_bytes(self) -> int:
        """Bytes of one activation (or gradient) message in train mode, or of a
        prefill activation in decode mode: micro_batch × seq × hidden × dtype bytes."""
        return self.micro_batch * self.seq * self.hidden * self.dtype_bytes

    @property
    def decode_activation_bytes(self) -> int:
        """Bytes of one decode-pass activation: micro_batch × 1 × hidden × dtype bytes."""
        return self.micro_batch * self.hidden * self.dtype_bytes

    @property
    def token_ids_bytes(self) -> int:
        return self.micro_batch * TOKEN_ID_BYTES

    def spec(self) -> ModelSpec:
        return ModelSpec(
            layers=self.layers,
            hidden=self.hidden,
            heads=self.heads,
            kv_heads=self.heads,
            head_dim=self.hidden // self.heads,
            ffn=self.ffn if self.ffn is not None else default_ffn(self.hidden),
            vocab=self.vocab,
            max_pos=self.seq + (self.tokens if self.mode == "decode" else 0),
            dtype=canonical_dtype(self.dtype),
            seed=self.seed,
            eps=self.eps,
        )


# --------------------------------------------------------------------------- the schedule


_KIND_CODE = {"activation": 0, "gradient": 1, "token_ids": 2}


@dataclass(frozen=True)
class Msg:
    """One point-to-point message of a step: `kind` from stage `src` to stage
    `dst` for micro-batch `mb` (and, in decode mode, pass `t`: 0 = prefill)."""

    kind: str  # activation | gradient | token_ids
    src: int
    dst: int
    mb: int
    t: int = 0

    def tag(self, microbatches: int, passes: int = 1) -> int:
        """The message's unique tag within a step: (kind, t, mb) packed."""
        return (_KIND_CODE[self.kind] * passes + self.t) * microbatches + self.mb


@dataclass(frozen=True)
class Action:
    """One compute action of a stage: `op` (forward, backward, prefill, decode)
    on micro-batch `mb` (pass `t` in decode), with the message that brings its
    input (None: the input is local) and the one that carries its output away
    (None: nothing to send)."""

    op: str
    mb: int
    t: int = 0
    input: Msg | None = None
    output: Msg | None = None


def _train_order(schedule: str, stages: int, stage: int, m: int) -> list[tuple[str, int]]:
    if schedule == "gpipe":
        return [("forward", i) for i in range(m)] + [("backward", i) for i in reversed(range(m))]
    warm = min(stages - stage - 1, m)
    order = [("forward", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("forward", warm + i), ("backward", i)]
    order += [("backward", i) for i in range(m - warm, m)]
    return order


def stage_program(schedule: str, mode: str, stages: int, stage: int, microbatches: int, tokens: int = 0) -> list[Action]:
    """The ordered compute actions of `stage` in one step, with their messages.

    train: forward(m) takes an activation from stage−1 (stage 0: local tokens)
    and sends one to stage+1 (last stage: keeps the loss); backward(m) takes a
    gradient from stage+1 (last stage: its loss) and sends one to stage−1
    (stage 0: none). decode: for pass t = 0 (prefill) .. tokens, for each
    micro-batch, in that order on every stage; stage 0 takes the prompt (t = 0)
    or the token ids the last stage sampled in pass t−1; the last stage sends
    the ids it samples to stage 0 (except after the final pass)."""
    last = stages - 1
    prog: list[Action] = []
    if mode == "train":
        for op, m in _train_order(schedule, stages, stage, microbatches):
            if op == "forward":
                inp = Msg("activation", stage - 1, stage, m) if stage > 0 else None
                out = Msg("activation", stage, stage + 1, m) if stage < last else None
            else:
                inp = Msg("gradient", stage + 1, stage, m) if stage < last else None
                out = Msg("gradient", stage, stage - 1, m) if stage > 0 else None
            prog.append(Action(op, m, 0, inp, out))
        return prog
    for t in range(tokens + 1):
        for m in range(microbatches):
            if stage > 0:
                inp = Msg("activation", stage - 1, stage, m, t)
            elif t > 0 and stages > 1:
                inp = Msg("token_ids", last, 0, m, t - 1)
            else:
                inp = None
            if stage < last:
                out = Msg("activation", stage, stage + 1, m, t)
            elif t < tokens and stages > 1:
                out = Msg("token_ids", last, 0, m, t)
            else:
                out = None
            prog.append(Action("prefill" if t == 0 else "decode", m, t, inp, out))
    return prog


def message_bytes(cfg: PPConfig, msg: Msg) -> int:
    """Bytes of `msg` for the (resolved) config."""
    if msg.kind == "token_ids":
        return cfg.token_ids_bytes
    if cfg.mode == "decode" and msg.t > 0:
        return cfg.decode_activation_bytes
    return cfg.activation_bytes


def run_program(program: list[Action], compute: Callable[[Action, Any], Any], exchange: Callable[[list, list], dict]) -> None:
    """Execute a stage's program: receive the first action's input; then after
    each action hand over the send of its output and the recv of the next
    action's input in one ``exchange(sends, recvs) → {msg: tensor}`` call (sends
    a list of (Msg, tensor), recvs a list of Msg), which must return once the
    recvs have arrived (the sends may still be in flight). ``compute(action,
    input)`` returns the tensor for ``action.output`` (ignored when that is None)."""
    if not program:
        return
    inp = exchange([], [program[0].input])[program[0].input] if program[0].input else None
    for k, act in enumerate(program):
        out = compute(act, inp)
        nxt = program[k + 1].input if k + 1 < len(program) else None
        sends = [(act.output, out)] if act.output is not None else []
        recvs = [nxt] if nxt is not None else []
        got = exchange(sends, recvs) if (sends or recvs) else {}
        inp = got.get(nxt) if nxt is not None else None


# --------------------------------------------------------------------------- one stage


def _stage_params(model: dict[str, Any], stage: int, stages: int, per_stage: int) -> dict[str, Any]:
    params: dict[str, Any] = {"layers": model["layers"][stage * per_stage : (stage + 1) * per_stage]}
    if stage == 0:
        params["embed"], params["pos"] = model["embed"], model["pos"]
    if stage == stages - 1:
        params["final_norm"], params["lm_head"] = model["final_norm"], model["lm_head"]
    return params


def named_tensors(params: dict[str, Any], first_layer: int = 0) -> dict[str, Any]:
    """Flat {name: tensor} of a (stage's) parameter dict, layers numbered globally."""
    out = {k: v for k, v in params.items() if k != "layers"}
    for i, layer in enumerate(params["layers"]):
        for k, v in layer.items():
            out[f"layers.{first_layer + i}.{k}"] = v
    return out


def make_batch(cfg: PPConfig):
    """(ids, targets), each (batch, seq) int64, from the seed (targets: next ids,
    the last position's drawn at random)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(cfg.seed + 1_000_003)
    ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


class _StageRunner:
    """The compute of one stage (train or decode), with its per-step state."""

    def __init__(self, cfg: PPConfig, stage: int, params: dict[str, Any], ids, targets, timer: dict[str, list]):
        self.cfg, self.stage, self.params = cfg, stage, params
        self.spec = cfg.spec()
        self.last = stage == cfg.stages - 1
        mb = cfg.micro_batch
        self.ids = [ids[m * mb : (m + 1) * mb] for m in range(cfg.microbatches)]
        self.targets = [targets[m * mb : (m + 1) * mb] for m in range(cfg.microbatches)] if targets is not None else None
        self.timer = timer
        self.reset()

    def reset(self) -> None:
        M = self.cfg.microbatches
        self.saved: dict[int, tuple] = {}
        self.losses: dict[int, Any] = {}
        self.logits: dict[int, Any] = {}
        self.caches: dict[int, list] = {m: [None] * len(self.params["layers"]) for m in range(M)}
        self.generated: dict[int, list] = {m: [] for m in range(M)}
        self.received_ids: dict[int, list] = {m: [] for m in range(M)}

    def layers(self, x, cache: list | None):
        for j, layer in enumerate(self.params["layers"]):
            past = cache[j] if cache is not None else None
            x, k, v = block(x, layer, self.spec, past)
            if cache is not None:
                cache[j] = (k, v)
        return x

    def __call__(self, act: Action, inp):
        from torch.profiler import record_function

        t0 = time.perf_counter()
        with record_function(f"stage{self.stage}.{act.op}.mb{act.mb}"):
            out = getattr(self, "_" + act.op)(act, inp)
        self.timer.setdefault(act.op, []).append(time.perf_counter() - t0)
        return out

    # train
    def _forward(self, act: Action, inp):
        import torch.nn.functional as Fn

        m = act.mb
        if self.stage == 0:
            x_in = None
            x = embed(self.ids[m], 0, self.params)
        else:
            x_in = inp.requires_grad_(True)
            x = x_in
        y = self.layers(x, None)
        if self.last:
            logits = lm_head(y, self.params, self.spec)
            loss = Fn.cross_entropy(logits.float().reshape(-1, self.cfg.vocab), self.targets[m].reshape(-1))
            loss = loss / self.cfg.microbatches
            self.saved[m] = (x_in, loss)
            self.losses[m] = loss.detach()
            self.logits[m] = logits.detach()
            return None
        self.saved[m] = (x_in, y)
        return y.detach()

    def _backward(self, act: Action, inp):
        import torch

        x_in, y = self.saved.pop(act.mb)
        if self.last:
            torch.autograd.backward(y)
        else:
            torch.autograd.backward(y, grad_tensors=inp)
        return x_in.grad if x_in is not None else None

    # decode
    def _prefill(self, act: Action, inp):
        return self._pass(act, inp)

    def _decode(self, act: Action, inp):
        return self._pass(act, inp)

    def _pass(self, act: Action, inp):
        m, t = act.mb, act.t
        cache = self.caches[m]
        if self.stage == 0:
            if t == 0:
                x = embed(self.ids[m], 0, self.params)
            else:
                tok = inp if inp is not None else self.generated[m][t - 1]  # 1 stage: local feedback
                if inp is not None:
                    self.received_ids[m].append(inp)
                x = embed(tok, self.cfg.seq + t - 1, self.params)
        else:
            x = inp
        y = self.layers(x, cache)  # t = 0: the cache is empty, causal attention over the prompt
        if not self.last:
            return y
        logits = lm_head(y[:, -1:], self.params, self.spec)
        tok = greedy(logits)
        self.generated[m].append(tok)
        self.logits[m] = logits
        return tok


class WorkWaiter:
    """Waits for async works (isend / irecv) on helper threads, so the thread that
    posts them never blocks on them, and so that each trace span ends when its
    transfer really completed.

    A work's ``gloo:send`` / ``gloo:recv`` span opens at the isend/irecv (on the
    posting thread's track) and closes inside ``wait()``: when the transfer is
    done if ``wait()`` was already blocking then, else when ``wait()`` is called.
    :meth:`put` therefore returns only once a helper thread is about to call
    ``wait()`` (helper threads are added when all are busy): a helper could
    otherwise sit waiting for the GIL while the posting thread computes, and the
    span would end late. :meth:`call` does the same for any blocking call that
    releases the GIL. :meth:`drain` blocks until every call so far has returned.
    """

    def __init__(self, name: str = "work-waiter"):
        import queue
        import threading

        self._name = name
        self._q: "queue.Queue" = queue.Queue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads: list = []
        self._errors: list[BaseException] = []

    def put(self, work, tensor) -> None:
        """Have a helper thread wait for `work`, keeping `tensor` (its buffer) alive until then."""
        self.call(work.wait, tensor)

    def call(self, fn: Callable[[], Any], keep: Any = None, wait_start: bool = True) -> None:
        """Run the blocking ``fn()`` on a helper thread (which keeps `keep` alive
        meanwhile); returns once that thread has started it (at once with
        ``wait_start=False``)."""
        import threading

        with self._lock:
            if self._idle == 0:
                t = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                self._idle += 1
                t.start()
            self._idle -= 1
        started = threading.Event()
        self._q.put((fn, keep, started))
        if wait_start:
            started.wait()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                fn, _keep, started = item
                started.set()
                fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised on the posting thread
                self._errors.append(exc)
            finally:
                if item is not None:
                    with self._lock:
                        self._idle += 1
                self._q.task_done()

    def drain(self) -> None:
        """Block until every work put so far has completed; re-raise a failed wait."""
        self._q.join()
        if self._errors:
            raise self._errors[0]

    def close(self) -> None:
        for _ in self._threads:
            self._q.put(None)
        for t in self._threads:
            t.join(timeout=5)


class _DistExchange:
    """Post the recvs, then the sends (each handed to a :class:`WorkWaiter`), then
    wait for the recvs only (inside ``stage{s}.p2p``). :meth:`drain` at the end of
    a step waits for the sends still in flight."""

    def __init__(self, cfg: PPConfig, stage: int, device, fault: bool):
        self.cfg, self.stage, self.device = cfg, stage, device
        self.passes = cfg.tokens + 1 if cfg.mode == "decode" else 1
        self.fault = fault
        self.sent_first = False
        self.waiter = WorkWaiter(f"pp-send-waiter-{stage}")

    def shape_dtype(self, msg: Msg):
        import torch

        mb = self.cfg.micro_batch
        if msg.kind == "token_ids":
            return (mb, 1), torch.int64
        S = self.cfg.seq if (self.cfg.mode == "train" or msg.t == 0) else 1
        return (mb, S, self.cfg.hidden), torch_dtype(self.cfg.dtype)

    def __call__(self, sends: list, recvs: list) -> dict:
        import torch
        import torch.distributed as dist
        from torch.profiler import record_function

        M = self.cfg.microbatches
        got: dict = {}
        with record_function(f"stage{self.stage}.p2p"):
            works = []
            for msg in recvs:
                shape, dt = self.shape_dtype(msg)
                buf = torch.empty(shape, dtype=dt, device=self.device)
                got[msg] = buf
                works.append(dist.irecv(buf, src=msg.src, tag=msg.tag(M, self.passes)))
            for msg, t in sends:
                t = t.contiguous()
                if self.fault and not self.sent_first:
                    t = t * 1.5 if t.is_floating_point() else (t + 1) % self.cfg.vocab
                self.sent_first = True
                self.waiter.put(dist.isend(t, dst=msg.dst, tag=msg.tag(M, self.passes)), t)
            for w in works:
                w.wait()
        return got

    def drain(self) -> None:
        self.waiter.drain()

    def close(self) -> None:
        self.waiter.close()


def reference_train(cfg: PPConfig, model: dict[str, Any], ids, targets):
    """Single-process full-batch forward/backward: returns (loss, logits, {name: grad})."""
    import torch
    import torch.nn.functional as Fn

    spec = cfg.spec()
    model = _leaf_copy(model)
    x = embed(ids, 0, model)
    for layer in model["layers"]:
        x, _, _ = block(x, layer, spec, None)
    logits = lm_head(x, model, spec)
    loss = Fn.cross_entropy(logits.float().reshape(-1, cfg.vocab), targets.reshape(-1))
    loss.backward()
    grads = {k: v.grad for k, v in named_tensors(model).items()}
    return loss.detach(), logits.detach(), grads


def reference_decode(cfg: PPConfig, model: dict[str, Any], ids):
    """Single-process generation, micro-batch by micro-batch (the same shapes as
    the pipeline): returns (tokens (batch, tokens+1) int64, last logits (batch, 1, V))."""
    import torch

    spec = cfg.spec()
    mb = cfg.micro_batch
    toks, lasts = [], []
    with torch.no_grad():
        for m in range(cfg.microbatches):
            cache: list = [None] * cfg.layers
            x = embed(ids[m * mb : (m + 1) * mb], 0, model)
            for j, layer in enumerate(model["layers"]):
                x, k, v = block(x, layer, spec, None)
                cache[j] = (k, v)
            logits = lm_head(x[:, -1:], model, spec)
            seq = [greedy(logits)]
            for t in range(1, cfg.tokens + 1):
                x = embed(seq[-1], cfg.seq + t - 1, model)
                for j, layer in enumerate(model["layers"]):
                    x, k, v = block(x, layer, spec, cache[j])
                    cache[j] = (k, v)
                logits = lm_head(x, model, spec)
                seq.append(greedy(logits))
            toks.append(torch.cat(seq, dim=1))
            lasts.append(logits)
    return torch.cat(toks), torch.cat(lasts)


def _leaf_copy(model: dict[str, Any]) -> dict[str, Any]:
    def leaf(t):
        return t.detach().clone().requires_grad_(True)

    out = {k: leaf(v) for k, v in model.items() if k != "layers"}
    out["layers"] = [{k: leaf(v) for k, v in layer.items()} for layer in model["layers"]]
    return out


def rel_error(out, ref) -> tuple[float, float, bool]:
    """(relative RMS error ‖out − ref‖/‖ref‖, max abs error, all finite) in float32."""
    import torch

    o, r = out.detach().float().cpu(), ref.detach().float().cpu()
    diff = o - r
    n = r.norm().item()
    rel = diff.norm().item() / n if n > 0 else diff.norm().item()
    return rel, (diff.abs().max().item() if o.numel() else 0.0), bool(torch.isfinite(o).all())


def _check(rows: list[tuple[str, Any, Any]], dtype: str) -> dict[str, Any]:
    """Compare each (name, out, ref); returns the worst relative error and a verdict."""
    tol = REL_TOLERANCE[dtype]
    worst_name, worst_rel, worst_abs, finite = None, 0.0, 0.0, True
    for name, out, ref in rows:
        if ref is None and out is None:
            continue
        if out is None or ref is None or tuple(out.shape) != tuple(ref.shape):
            return {"passed": False, "worst": name, "rel_rms_err": float("inf"), "max_abs_err": float("inf"),
                    "criterion": "missing or misshapen tensor"}
        rel, mx, fin = rel_error(out, ref)
        finite &= fin
        if rel >= worst_rel:
            worst_name, worst_rel = name, rel
        worst_abs = max(worst_abs, mx)
    return {
        "passed": bool(finite and worst_rel <= tol),
        "worst": worst_name,
        "rel_rms_err": worst_rel,
        "max_abs_err": worst_abs,
        "criterion": f"relative RMS error <= {tol:g} per tensor",
        "compared": len(rows),
    }


def _pp_rank(ctx: _launch.RankContext, cfg: PPConfig) -> dict[str, Any]:
    """What each rank process runs: its stage's program for every step, then the check."""
    import torch
    import torch.distributed as dist

    stage, stages = ctx.rank, cfg.stages
    spec = cfg.spec()
    model = init_model(spec, device=ctx.device)
    per = cfg.layers_per_stage
    ids, targets = make_batch(cfg)
    ids, targets = ids.to(ctx.device), targets.to(ctx.device)
    params = _stage_params(model, stage, stages, per)
    if cfg.mode == "train":
        params = _leaf_copy(params)  # this stage's weights, as leaves that collect gradients
    if cfg.fault == "raise" and stage == stages - 1:
        raise RuntimeError("injected fault (PPConfig.fault='raise')")
    timer: dict[str, list] = {}
    runner = _StageRunner(cfg, stage, params, ids, targets if cfg.mode == "train" else None, timer)
    program = stage_program(cfg.schedule, cfg.mode, stages, stage, cfg.microbatches, cfg.tokens)
    exchange = _DistExchange(cfg, stage, ctx.device, fault=cfg.fault == "corrupt_activation" and stage == 0)
    leaves = list(named_tensors(params, stage * per).values())

    dist.barrier()
    schedule = _launch.ProfileSchedule(cfg.wait, cfg.warmup, cfg.active)
    out_file = ctx.trace_path()
    prof = _launch.make_profiler(schedule, out_file, use_cuda=ctx.is_cuda)
    step_s: list[float] = []
    grad_mode = torch.enable_grad() if cfg.mode == "train" else torch.no_grad()
    with grad_mode, prof:
        for _step in ctx.profiled_steps(prof, cfg.steps, step_s, report=stage == 0):
            runner.reset()
            exchange.sent_first = False
            for p in leaves:
                p.grad = None
            run_program(program, runner, exchange)
            exchange.drain()  # every send of the step has completed
    exchange.close()
    ctx.check_trace(out_file)

    if stage == 0:
        ctx.progress("checking the pipeline against the single-process reference")
    check = _check_stage(cfg, stage, model, runner, params, ids, targets)
    if not check["passed"]:
        raise PPMismatchError(
            f"PP output differs from the single-process reference on stage {stage} ({check['worst']}): "
            f"relative RMS error {check['rel_rms_err']:.3g}, max abs error {check['max_abs_err']:.3g} "
            f"(needs {check['criterion']} for {cfg.dtype})"
        )
    return {
        "rank": ctx.rank,
        "stage": stage,
        "check": check,
        "step_s": step_s,
        "compute_s": {op: v for op, v in timer.items()},
        "threads": torch.get_num_threads(),
        "trace": out_file.name,
        "trace_bytes": out_file.stat().st_size,
    }


def _check_stage(cfg: PPConfig, stage: int, model, runner: _StageRunner, params, ids, targets) -> dict[str, Any]:
    import torch

    per = cfg.layers_per_stage
    last = stage == cfg.stages - 1
    if cfg.mode == "train":
        loss, logits, grads = reference_train(cfg, model, ids, targets)
        rows = [(f"grad {k}", v.grad, grads[k]) for k, v in named_tensors(params, stage * per).items()]
        if last:
            got_loss = sum(runner.losses[m] for m in range(cfg.microbatches))
            got_logits = torch.cat([runner.logits[m] for m in range(cfg.microbatches)])
            rows += [("loss", got_loss.reshape(1), loss.reshape(1)), ("logits", got_logits, logits)]
        res = _check(rows, cfg.dtype)
        if last:
            res["loss"] = float(sum(runner.losses.values()))
            res["reference_loss"] = float(loss)
        return res
    ref_tokens, ref_logits = reference_decode(cfg, model, ids)
    rows: list = []
    res_tokens: dict[str, Any] = {}
    if last:
        got = torch.cat([torch.cat(runner.generated[m], dim=1) for m in range(cfg.microbatches)])
        rows.append(("last logits", torch.cat([runner.logits[m] for m in range(cfg.microbatches)]), ref_logits))
        res_tokens = {"tokens_equal": bool(torch.equal(got, ref_tokens)), "generated": int(got.numel())}
    if stage == 0 and cfg.stages > 1:
        got = torch.cat([torch.cat(runner.received_ids[m], dim=1) for m in range(cfg.microbatches)])
        res_tokens["received_ids_equal"] = bool(torch.equal(got, ref_tokens[:, :-1]))
    res = _check(rows, cfg.dtype) if rows else {"passed": True, "worst": None, "rel_rms_err": 0.0, "max_abs_err": 0.0,
                                                 "criterion": "token ids equal to the reference's", "compared": 0}
    res.update(res_tokens)
    for key in ("tokens_equal", "received_ids_equal"):
        if key in res and not res[key]:
            res["passed"] = False
            res["worst"] = key.replace("_equal", "")
            res["criterion"] = "sampled token ids equal to the reference's; " + res["criterion"]
    return res


# --------------------------------------------------------------------------- the job


def run_pp(config: PPConfig, on_progress: Callable[[str], None] | None = None) -> Path:
    """Run the PP workload on ``config.ranks`` processes with the profiler on.

    Returns the run folder (``<out>/pp-YYYYmmdd-HHMMSS-xxxx``) holding
    ``rank{r}.pt.trace.json.gz`` per rank and ``run_config.json``. Raises
    BadInputError for an impossible configuration, RankFailedError when a rank
    fails (including a mismatch with the reference: "PP output differs ...")."""
    cfg = config.resolved()
    backend = _launch.resolve_backend(cfg.backend, cfg.ranks)
    info = _launch.host_info()
    run_dir = _launch.new_run_dir(cfg.out, "pp")
    results, wall, created = _launch.timed_launch(_pp_rank, cfg, backend, run_dir, on_progress)
    doc = build_run_config(run_dir.name, cfg, backend, info, results, wall, created)
    _launch.write_json(run_dir / "run_config.json", doc)
    return run_dir


def expected_messages(cfg: PPConfig) -> list[dict[str, Any]]:
    """Every message kind of one step, per (src, dst) stage pair: count and bytes,
    from :func:`stage_program` (the same plan the ranks execute)."""
    counts: dict[tuple, int] = {}
    for s in range(cfg.stages):
        for act in stage_program(cfg.schedule, cfg.mode, cfg.stages, s, cfg.microbatches, cfg.tokens):
            if act.output is not None:
                msg = act.output
                phase = "train" if cfg.mode == "train" else ("prefill" if msg.t == 0 and msg.kind == "activation" else "decode")
                key = (msg.kind, phase, msg.src, msg.dst, message_bytes(cfg, msg))
                counts[key] = counts.get(key, 0) + 1
    return [
        {"kind": k, "phase": ph, "src": s, "dst": d, "bytes": b, "count_per_step": n}
        for (k, ph, s, d, b), n in sorted(counts.items(), key=lambda kv: (kv[0][2], kv[0][3], kv[0][0], kv[0][1]))
    ]


def build_run_config(run_id, cfg: PPConfig, backend, info, results, wall_s, created) -> dict[str, Any]:
    """The run_config.json document (see fixtures/pp_2rank/NOTE.md)."""
    from tracekit.model import pipeline_bubble_fraction  # here: `tracekit collect`'s options import this module

    options = _launch.config_options(cfg)
    active_steps = _launch.active_steps(cfg.wait, cfg.warmup, cfg.active)
    msgs = expected_messages(cfg)
    p, M = cfg.stages, cfg.microbatches
    sends_by_rank = [sum(m["count_per_step"] for m in msgs if m["src"] == r) for r in range(p)]
    recvs_by_rank = [sum(m["count_per_step"] for m in msgs if m["dst"] == r) for r in range(p)]
    bytes_by_rank = [sum(m["count_per_step"] * m["bytes"] for m in msgs if m["src"] == r) for r in range(p)]
    per_step = sum(m["count_per_step"] for m in msgs)
    expected = {
        "boundaries": p - 1,
        "p2p_pairs_per_step": per_step,
        "p2p_pairs_per_step_formula": (
            "boundaries x microbatches x 2 (activations forward, gradients backward)"
            if cfg.mode == "train"
            else "boundaries x microbatches x (tokens + 1) activations + microbatches x tokens token ids (last -> first stage, if stages > 1)"
        ),
        "sends_per_step_by_rank": sends_by_rank,
        "recvs_per_step_by_rank": recvs_by_rank,
        "send_bytes_per_step_by_rank": bytes_by_rank,
        "p2p_pairs_active": per_step * cfg.active,
        "messages": msgs,
        "activation_bytes": cfg.activation_bytes,
        "activation_bytes_formula": "micro_batch x seq x hidden x dtype_bytes",
    }
    if cfg.mode == "decode":
        expected.update(decode_activation_bytes=cfg.decode_activation_bytes, token_ids_bytes=cfg.token_ids_bytes)
    compute = []
    for r in results:
        row = {"stage": r["stage"]}
        for op, vals in sorted(r["compute_s"].items()):
            row[f"{op}_per_microbatch_s"] = round(statistics.median(vals), 6)
            row[f"{op}_actions"] = len(vals)
        compute.append(row)
    return {
        "workload": "pp",
        "run_id": run_id,
        "created_at": created.isoformat(timespec="seconds"),
        **options,
        "world_size": cfg.ranks,
        "backend": backend,
        "dtype_bytes": cfg.dtype_bytes,
        "micro_batch": cfg.micro_batch,
        "layers_per_stage": cfg.layers_per_stage,
        "head_dim": cfg.hidden // cfg.heads,
        "stage_of_rank": list(range(cfg.ranks)),
        **_launch.run_config_base(info, results, backend, cfg.wait, cfg.warmup, cfg.active),
        "model": {
            "pipeline": "gpipe bubble fraction (p-1)/(M+p-1)" if cfg.mode == "train" else "decode token interval >= p*s + (p-1)*x",
            "bubble_fraction_ideal": pipeline_bubble_fraction(p, M) if cfg.mode == "train" else None,
            # per stage, its actions in order: F3 = forward of micro-batch 3, B3 its backward
            # (train); decode: the number of (pass, micro-batch) actions
            "program_by_stage": [_program_summary(cfg, s) for s in range(p)],
        },
        "expected": expected,
        "pp_check": {
            "passed": True,
            "reference": (
                "single-process full-batch forward and backward with the full model, on every rank"
                if cfg.mode == "train"
                else "single-process greedy generation, micro-batch by micro-batch, on every rank"
            ),
            "per_stage": [r["check"] for r in results],
            "max_rel_rms_err": max(r["check"]["rel_rms_err"] for r in results),
            "tolerance_rel_rms": REL_TOLERANCE[cfg.dtype],
        },
        "timing": {
            "job_wall_s": round(wall_s, 3),
            "clock": "time.perf_counter per rank; warmup/active steps include profiler overhead",
            "step_wall_s": [[round(s, 6) for s in r["step_s"]] for r in results],
            **_launch.step_medians([r["step_s"] for r in results], active_steps),
            # median compute time of one action (one micro-batch through this stage), all steps
            "stage_compute_s": compute,
        },
        "traces": [r["trace"] for r in results],
        "overlap_model": _pp_overlap_model(cfg, msgs, compute),
    }


def _pp_overlap_model(cfg: PPConfig, msgs: list[dict], compute: list[dict]) -> dict[str, Any]:
    """The run's overlap model: training, no overlap of the sends plus the GPipe bubble; decode, the
    token interval from the median per-token stage compute (the upper one of two) and one decode
    activation message."""
    if cfg.mode == "train":
        return _launch.overlap_model("pipeline", stages=cfg.stages, microbatches=cfg.microbatches)
    per_token = sorted(v for row in compute if (v := row.get("decode_per_microbatch_s")) and v > 0)
    msg = next((m["bytes"] for m in msgs if m.get("kind") == "activation" and m.get("phase") == "decode"), None)
    return _launch.overlap_model("pp_decode", stages=cfg.stages,
                                 stage_compute_s=per_token[len(per_token) // 2] if per_token else None,
                                 message_bytes=msg)


def _program_summary(cfg: PPConfig, stage: int):
    prog = stage_program(cfg.schedule, cfg.mode, cfg.stages, stage, cfg.microbatches, cfg.tokens)
    if cfg.mode == "train":
        return " ".join(f"{a.op[0].upper()}{a.mb}" for a in prog)
    return len(prog)
