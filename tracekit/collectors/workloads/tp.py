"""The tensor-parallel (TP) workload: a Megatron-style transformer on N ranks.

Each layer, on every rank (N = world size, the rank holds heads/N heads and
ffn/N MLP columns):

    h = RMSNorm(x)
    q, k, v = h @ Wqkv_r.T                 column-parallel QKV (the rank's heads)
    a = causal_attention(q, k, v)          over the rank's heads only
    x = x + all_reduce(a @ Wo_r.T)         row-parallel output projection   (all-reduce 1)
    h = RMSNorm(x)
    g, u = h @ Wgu_r.T                     column-parallel gate/up
    x = x + all_reduce((silu(g) * u) @ Wd_r.T)   row-parallel down          (all-reduce 2)

and a final RMSNorm. The forward runs under ``torch.no_grad()`` (inference
style), so a step issues exactly ``2 × layers`` all-reduces of
``batch × seq × hidden`` elements each, and nothing else communicates inside
the profiled steps.

**Chunked overlap** (``overlap_chunks=N`` > 1, :func:`forward_chunked`): the
``batch × seq`` token rows are cut into N equal chunks. In each layer the
attention core runs on all tokens, then chunk c's output projection is
computed and its all-reduce launched with ``async_op=True`` while chunk c+1's
projection computes; the MLP then walks the chunks again, waiting for chunk
c's attention all-reduce, computing chunk c's MLP (while later chunks'
all-reduces are in flight) and launching its all-reduce asynchronously; the
layer ends by waiting for the MLP all-reduces. A step then issues
``2 × layers × N`` all-reduces of ``batch × seq × hidden / N`` elements.

**Training** (``mode="train"``, :func:`forward_train`): each step is a forward, a
mean-squared-error loss against a fixed target, a backward and an SGD step
(``lr``). Megatron's conjugate operators carry the communication (Shoeybi et
al., "Megatron-LM", 2019, section 3, fig. 3): *f* before each column-parallel
input is the identity in forward and an all-reduce of the input's gradient in
backward; *g* after each row-parallel output is an all-reduce in forward and
the identity in backward. Each block has one of each, so a step issues
``4 × layers`` all-reduces of ``batch × seq × hidden`` elements (two in
forward, two in backward) and nothing else communicates. The check compares
the first step's loss and every parameter's gradient with a single-process
forward/backward of the same weights (the gradient sliced as the weights are).

Every rank builds the full model from the seed (identical weights on every
rank, no broadcast needed) and slices its shard. After the run every rank
recomputes the forward single-process with the full weights and compares; a
mismatch beyond the dtype's tolerance fails the job (a wrong TP makes every
measurement meaningless).

**Profilers** (``profiler``): ``"torch"`` (default) records each rank with
torch.profiler (``rank{r}.pt.trace.json.gz``); ``"nsys"`` runs each rank under
its own ``nsys profile`` session instead (``rank{r}.sqlite`` + ``.nsys-rep``,
see :mod:`tracekit.collectors.nsys` and :func:`_nsys_steps`). Only one of them runs:
both would use CUPTI.

Public API: :class:`TPConfig`, :func:`run_tp`; the model functions
(:func:`init_weights`, :func:`shard_weights`, :func:`forward`, ...) are
importable for tests.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tracekit.collectors import launch as _launch
from tracekit.errors import BadInputError, TracekitError

DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}
PROFILERS = ("torch", "nsys")
MODES = ("forward", "train")
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}
#: The TP-vs-single-process check, per dtype. float32: elementwise
#: |tp − ref| ≤ atol + rtol·|ref| (observed errors ~1e-6). Half precisions: the
#: relative RMS error ‖tp − ref‖₂ / ‖ref‖₂ ≤ rel_rms; elementwise bounds do not
#: work there because the all-reduce rounds each partial sum to bf16/fp16 and the
#: error grows with depth (bf16: ~0.6% at 2 layers, ~2% at 24; a structural TP
#: bug — wrong shard, missing all-reduce — gives tens of percent).
TOLERANCE: dict[str, dict[str, float]] = {
    "float32": {"atol": 1e-4, "rtol": 1e-4},
    "bfloat16": {"rel_rms": 4e-2},
    "float16": {"rel_rms": 1e-2},
}


class TPMismatchError(TracekitError):
    """The TP output differs from the single-process forward beyond tolerance (exit 1)."""


@dataclass
class TPConfig(_launch.RunOptions):
    """Options of the TP workload. ``steps=None`` means wait + warmup + active;
    ``ffn=None`` means 8/3 × hidden rounded up to a multiple of 64 (Llama-like)."""

    ranks: int = _launch.option(2, "Tensor-parallel ranks (processes), 1-8.")
    layers: int = _launch.option(4, "Transformer layers.")
    hidden: int = _launch.option(512, "Hidden size.")
    heads: int = _launch.option(8, "Attention heads (divisible by --ranks).")
    ffn: int | None = _launch.option(None, "MLP inner size (default: 8/3 x hidden, rounded up to 64).")
    seq: int = _launch.option(128, "Sequence length.")
    batch: int = _launch.option(4, "Batch size.")
    overlap_chunks: int = _launch.option(
        1, "Split the tokens into N chunks; chunk i's all-reduce runs (async) while chunk i+1 computes."
    )
    mode: str = _launch.option(
        "forward",
        "forward (inference, no_grad: 2 all-reduces per layer) or train (forward + backward + SGD step, "
        "Megatron's f/g: 4 all-reduces per layer).",
    )
    lr: float = _launch.option(0.01, "train mode: SGD learning rate.")
    profiler: str = _launch.option(
        "torch",
        "torch (torch.profiler, Kineto JSON per rank) or nsys (each rank under `nsys profile`, "
        "rank{r}.sqlite; needs nsys on PATH).",
    )
    # fault (from RunOptions), testing only: "corrupt_shard" perturbs the last rank's weights (the TP check
    # must then fail); "raise" makes the last rank raise before profiling

    def resolved(self) -> "TPConfig":
        """A validated copy with `steps`, `ffn` and `dtype` filled in / canonical.
        Raises BadInputError (one line) for an impossible configuration.
        Does not look at the backend (see :func:`tracekit.collectors.launch.resolve_backend`)."""
        c = dataclasses.replace(self)
        _launch.validate_ranks(c.ranks)
        for name in ("layers", "hidden", "heads", "seq", "batch"):
            v = getattr(c, name)
            if not isinstance(v, int) or v < 1:
                raise BadInputError(f"{name} must be a positive integer, got {v}")
        if c.heads % c.ranks:
            raise BadInputError(f"heads ({c.heads}) must be divisible by ranks ({c.ranks}): each rank holds heads/ranks heads")
        if c.hidden % c.heads:
            raise BadInputError(f"hidden ({c.hidden}) must be divisible by heads ({c.heads})")
        c.dtype = _DTYPE_ALIASES.get(c.dtype, c.dtype)
        if c.dtype not in DTYPES:
            raise BadInputError(f"unsupported dtype {self.dtype!r} (choose one of {', '.join(DTYPES)})")
        if c.ffn is None:
            c.ffn = -(-8 * c.hidden // 3 // 64) * 64
        if not isinstance(c.ffn, int) or c.ffn < 1:
            raise BadInputError(f"ffn must be a positive integer, got {c.ffn}")
        if c.ffn % c.ranks:
            raise BadInputError(f"ffn ({c.ffn}) must be divisible by ranks ({c.ranks})")
        n = c.overlap_chunks
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise BadInputError(f"overlap_chunks must be a positive integer, got {n}")
        if (c.batch * c.seq) % n:
            raise BadInputError(
                f"overlap_chunks ({n}) must divide the tokens (batch x seq = {c.batch * c.seq}) into equal chunks"
            )
        if c.mode not in MODES:
            raise BadInputError(f"unknown mode {c.mode!r} (choose one of {', '.join(MODES)})")
        if c.mode == "train" and n > 1:
            raise BadInputError("overlap_chunks > 1 is a forward-only option (mode 'forward')")
        if c.mode == "train" and not (isinstance(c.lr, (int, float)) and c.lr > 0):
            raise BadInputError(f"lr must be a positive number, got {c.lr}")
        c.steps = _launch.validate_schedule(c.wait, c.warmup, c.active, c.steps)
        if c.backend not in _launch.BACKENDS:
            raise BadInputError(f"unknown backend {c.backend!r} (choose one of {', '.join(_launch.BACKENDS)})")
        if c.profiler not in PROFILERS:
            raise BadInputError(f"unknown profiler {c.profiler!r} (choose one of {', '.join(PROFILERS)})")
        if c.fault not in (None, "corrupt_shard", "raise"):
            raise BadInputError(f"unknown fault {c.fault!r}")
        if c.timeout_s <= 0:
            raise BadInputError(f"timeout_s must be positive, got {c.timeout_s}")
        return c

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def dtype_bytes(self) -> int:
        return DTYPES[_DTYPE_ALIASES.get(self.dtype, self.dtype)]

    @property
    def all_reduces_per_layer(self) -> int:
        """All-reduce calls per layer per step: 2 × overlap_chunks (forward), 4 (train: f and g of both blocks)."""
        return 4 if self.mode == "train" else 2 * max(1, self.overlap_chunks)

    @property
    def all_reduce_bytes(self) -> int:
        """Bytes of each all-reduce (nccl-tests S): batch × seq × hidden × dtype bytes,
        divided by ``overlap_chunks`` (each chunk is all-reduced on its own)."""
        return self.block_bytes // max(1, self.overlap_chunks)

    @property
    def block_bytes(self) -> int:
        """Bytes a block (attention or MLP) all-reduces in all: batch × seq × hidden × dtype bytes."""
        return self.batch * self.seq * self.hidden * self.dtype_bytes


# --------------------------------------------------------------------------- the model


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
        _DTYPE_ALIASES.get(name, name)
    ]


def init_weights(cfg: TPConfig, device="cpu") -> dict[str, Any]:
    """The full (unsharded) model, built deterministically from ``cfg.seed``.

    Returns {"layers": [per-layer dict], "final_norm": (H,)}, each layer with
    attn_norm (H,), wq/wk/wv/wo (H, H), mlp_norm (H,), w_gate/w_up (F, H),
    w_down (H, F); linear weights ~ N(0, 1/fan_in), norms 1 + N(0, 0.1²).
    Drawn in float32 on the CPU (identical on every rank and machine), then cast.
    """
    import torch

    cfg = cfg if cfg.ffn is not None else cfg.resolved()
    H, F = cfg.hidden, cfg.ffn
    g = torch.Generator(device="cpu").manual_seed(cfg.seed)
    dt = torch_dtype(cfg.dtype)

    def lin(out_f: int, in_f: int):
        return (torch.randn(out_f, in_f, generator=g) / in_f**0.5).to(device=device, dtype=dt)

    def norm():
        return (1.0 + 0.1 * torch.randn(H, generator=g)).to(device=device, dtype=dt)

    layers = []
    for _ in range(cfg.layers):
        layers.append(
            {
                "attn_norm": norm(),
                "wq": lin(H, H),
                "wk": lin(H, H),
                "wv": lin(H, H),
                "wo": lin(H, H),
                "mlp_norm": norm(),
                "w_gate": lin(F, H),
                "w_up": lin(F, H),
                "w_down": lin(H, F),
            }
        )
    return {"layers": layers, "final_norm": norm()}


def make_input(cfg: TPConfig, device="cpu"):
    """The input activations (batch, seq, hidden), from ``cfg.seed`` (same on every rank)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(cfg.seed + 1_000_003)
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g)
    return x.to(device=device, dtype=torch_dtype(cfg.dtype))


def shard_weights(full: dict[str, Any], rank: int, world_size: int, heads: int) -> dict[str, Any]:
    """Rank `rank`'s shard of `full` for a TP group of `world_size`.

    Column-parallel (output rows split): wqkv = [wq; wk; wv] rows of the rank's
    heads → (3H/N, H); w_gate_up = [w_gate; w_up] rows of the rank's ffn slice
    → (2F/N, H). Row-parallel (input columns split): wo → (H, H/N),
    w_down → (H, F/N). Norms are replicated. ``world_size=1`` gives the full model.
    """
    import torch

    out_layers = []
    for layer in full["layers"]:
        H = layer["wq"].shape[0]
        F = layer["w_gate"].shape[0]
        hs, fs = H // world_size, F // world_size
        rows = slice(rank * hs, (rank + 1) * hs)
        frows = slice(rank * fs, (rank + 1) * fs)
        out_layers.append(
            {
                "attn_norm": layer["attn_norm"],
                "wqkv": torch.cat([layer["wq"][rows], layer["wk"][rows], layer["wv"][rows]]).contiguous(),
                "wo": layer["wo"][:, rows].contiguous(),
                "mlp_norm": layer["mlp_norm"],
                "w_gate_up": torch.cat([layer["w_gate"][frows], layer["w_up"][frows]]).contiguous(),
                "w_down": layer["w_down"][:, frows].contiguous(),
                "local_heads": heads // world_size,
            }
        )
    return {"layers": out_layers, "final_norm": full["final_norm"]}


def rms_norm(x, weight, eps: float = 1e-6):
    """RMSNorm, computed in float32 and cast back to x's dtype."""
    import torch

    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def attention_core(h, layer: dict[str, Any]):
    """Column-parallel QKV → causal attention over the shard's heads, before the
    output projection: (B, S, H) → (B, S, local_heads·head_dim)."""
    import torch.nn.functional as Fn

    B, S, _ = h.shape
    nh = layer["local_heads"]
    qkv = h @ layer["wqkv"].T  # (B, S, 3·nh·d)
    q, k, v = qkv.chunk(3, dim=-1)
    d = q.shape[-1] // nh
    q, k, v = (t.reshape(B, S, nh, d).transpose(1, 2) for t in (q, k, v))  # (B, nh, S, d)
    a = Fn.scaled_dot_product_attention(q, k, v, is_causal=True)
    return a.transpose(1, 2).reshape(B, S, nh * d)


def attention_partial(h, layer: dict[str, Any]):
    """Column-parallel QKV → causal attention over the shard's heads → row-parallel
    output projection. Returns this rank's partial sum (B, S, H), before all-reduce."""
    return attention_core(h, layer) @ layer["wo"].T


def mlp_partial(h, layer: dict[str, Any]):
    """Column-parallel gate/up → SwiGLU → row-parallel down. Returns this rank's
    partial sum (B, S, H), before all-reduce."""
    import torch.nn.functional as Fn

    g, u = (h @ layer["w_gate_up"].T).chunk(2, dim=-1)
    return (Fn.silu(g) * u) @ layer["w_down"].T


def forward(x, shard: dict[str, Any], all_reduce: Callable[[Any], Any] | None = None, eps: float = 1e-6):
    """The transformer forward on one rank's `shard`; `all_reduce(t)` sums `t` in
    place over the TP group (None: single process). Each layer's attention and
    MLP run inside ``record_function`` ranges ``layer{i}.attention`` / ``layer{i}.mlp``."""
    from torch.profiler import record_function

    for i, layer in enumerate(shard["layers"]):
        with record_function(f"layer{i}.attention"):
            part = attention_partial(rms_norm(x, layer["attn_norm"], eps), layer)
            if all_reduce is not None:
                all_reduce(part)
            x = x + part
        with record_function(f"layer{i}.mlp"):
            part = mlp_partial(rms_norm(x, layer["mlp_norm"], eps), layer)
            if all_reduce is not None:
                all_reduce(part)
            x = x + part
    return rms_norm(x, shard["final_norm"], eps)


def forward_chunked(x, shard: dict[str, Any], all_reduce_async: Callable[[Any], Any], chunks: int, eps: float = 1e-6):
    """The transformer forward with each block's all-reduce cut into `chunks` pieces
    of the token rows (module docstring, "Chunked overlap").

    `all_reduce_async(t)` starts summing `t` in place over the TP group and returns
    a handle with ``.wait()`` (``dist.all_reduce(t, async_op=True)``); chunk c's
    all-reduce is in flight while chunk c+1 computes. The batch × seq token rows
    must divide evenly into `chunks`. Same ``record_function`` ranges as
    :func:`forward`. Returns (B, S, H).
    """
    import torch
    from torch.profiler import record_function

    B, S, H = x.shape
    T = B * S
    if chunks < 1 or T % chunks:
        raise BadInputError(f"overlap_chunks ({chunks}) must divide the tokens ({T}) into equal chunks")
    n = T // chunks
    spans = [slice(c * n, (c + 1) * n) for c in range(chunks)]
    x = x.reshape(T, H)
    for i, layer in enumerate(shard["layers"]):
        with record_function(f"layer{i}.attention"):
            a = attention_core(rms_norm(x, layer["attn_norm"], eps).reshape(B, S, H), layer).reshape(T, -1)
            attn = []
            for rows in spans:
                part = a[rows] @ layer["wo"].T
                attn.append((rows, part, all_reduce_async(part)))
        with record_function(f"layer{i}.mlp"):
            mlp = []
            for rows, part, work in attn:
                work.wait()
                xc = x[rows] + part
                out = mlp_partial(rms_norm(xc, layer["mlp_norm"], eps), layer)
                mlp.append((xc, out, all_reduce_async(out)))
            done = []
            for xc, out, work in mlp:
                work.wait()
                done.append(xc + out)
            x = torch.cat(done)
    return rms_norm(x, shard["final_norm"], eps).reshape(B, S, H)


# --------------------------------------------------------------------------- training (Megatron's f and g)


def _tp_ops():
    """The autograd functions of Megatron's conjugate operators f and g (built on first use: torch is lazy)."""
    global _F_OP, _G_OP
    if _F_OP is None:
        import torch

        class CopyToTP(torch.autograd.Function):
            """f: identity forward, all-reduce of the gradient backward."""

            @staticmethod
            def forward(ctx, x, all_reduce):
                ctx.all_reduce = all_reduce
                return x.view_as(x)

            @staticmethod
            def backward(ctx, grad):
                grad = grad.contiguous().clone()
                ctx.all_reduce(grad)
                return grad, None

        class ReduceFromTP(torch.autograd.Function):
            """g: all-reduce forward, identity backward."""

            @staticmethod
            def forward(ctx, x, all_reduce):
                out = x.contiguous().clone()
                all_reduce(out)
                return out

            @staticmethod
            def backward(ctx, grad):
                return grad, None

        _F_OP, _G_OP = CopyToTP, ReduceFromTP
    return _F_OP, _G_OP


_F_OP = _G_OP = None


def copy_to_tp(x, all_reduce: Callable[[Any], Any] | None):
    """Megatron's f: ``x`` unchanged; in backward its gradient is summed in place by
    ``all_reduce`` over the TP group. ``all_reduce=None``: the identity (one process)."""
    return x if all_reduce is None else _tp_ops()[0].apply(x, all_reduce)


def reduce_from_tp(x, all_reduce: Callable[[Any], Any] | None):
    """Megatron's g: ``x`` summed over the TP group by ``all_reduce`` (on a copy); the
    gradient passes through unchanged. ``all_reduce=None``: the identity (one process)."""
    return x if all_reduce is None else _tp_ops()[1].apply(x, all_reduce)


def block_train(x, layer: dict[str, Any], all_reduce: Callable[[Any], Any] | None, eps: float = 1e-6, name: str = "layer"):
    """One transformer layer for training, on a rank's shard: the attention and MLP
    blocks each with f before the column-parallel input and g after the row-parallel
    output (four all-reduces with the backward). ``record_function`` ranges
    ``{name}.attention`` / ``{name}.mlp`` wrap the forward of each block."""
    from torch.profiler import record_function

    with record_function(f"{name}.attention"):
        h = copy_to_tp(rms_norm(x, layer["attn_norm"], eps), all_reduce)
        x = x + reduce_from_tp(attention_partial(h, layer), all_reduce)
    with record_function(f"{name}.mlp"):
        h = copy_to_tp(rms_norm(x, layer["mlp_norm"], eps), all_reduce)
        x = x + reduce_from_tp(mlp_partial(h, layer), all_reduce)
    return x


def forward_train(x, shard: dict[str, Any], all_reduce: Callable[[Any], Any] | None = None, eps: float = 1e-6):
    """The transformer forward with autograd through Megatron's f/g (module docstring,
    "Training"); `shard`'s tensors are the parameters (``requires_grad``). Returns (B, S, H)."""
    for i, layer in enumerate(shard["layers"]):
        x = block_train(x, layer, all_reduce, eps, f"layer{i}")
    return rms_norm(x, shard["final_norm"], eps)


#: the parameter tensors of a shard's layer, in order (local_heads is an int)
LAYER_PARAMS = ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gate_up", "w_down")


def shard_parameters(shard: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, tensor) of every parameter of `shard`, made leaves that require grad
    (in place in `shard`): ``layers.{i}.{param}`` in layer order, then ``final_norm``."""
    out = []
    for i, layer in enumerate(shard["layers"]):
        for k in LAYER_PARAMS:
            layer[k] = layer[k].detach().clone().requires_grad_(True)
            out.append((f"layers.{i}.{k}", layer[k]))
    if "final_norm" in shard:
        shard["final_norm"] = shard["final_norm"].detach().clone().requires_grad_(True)
        out.append(("final_norm", shard["final_norm"]))
    return out


def make_target(cfg: TPConfig, device="cpu"):
    """The training target (batch, seq, hidden) from ``cfg.seed`` (same on every rank)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(cfg.seed + 2_000_003)
    return torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g).to(device=device, dtype=torch_dtype(cfg.dtype))


def mse_loss(out, target):
    """The training loss: mean((out − target)²), computed in float32."""
    return (out.float() - target.float()).pow(2).mean()


def sharded_grads(full_grads: dict[str, Any], rank: int, world_size: int, heads: int) -> dict[str, Any]:
    """Rank `rank`'s slice of the single-process gradients, named as :func:`shard_parameters`.

    `full_grads` is {name: grad} of a one-rank shard (``wqkv`` = [wq; wk; wv], ``w_gate_up``
    = [w_gate; w_up]); they are split back into the full model's layout and sliced by
    :func:`shard_weights`, so a gradient is sharded exactly as its weight."""
    layers = []
    i = 0
    while f"layers.{i}.wqkv" in full_grads:
        g = {k: full_grads[f"layers.{i}.{k}"] for k in LAYER_PARAMS}
        wq, wk, wv = g["wqkv"].chunk(3)
        gate, up = g["w_gate_up"].chunk(2)
        layers.append({"attn_norm": g["attn_norm"], "wq": wq, "wk": wk, "wv": wv, "wo": g["wo"],
                       "mlp_norm": g["mlp_norm"], "w_gate": gate, "w_up": up, "w_down": g["w_down"]})
        i += 1
    full = {"layers": layers, "final_norm": full_grads.get("final_norm")}
    shard = shard_weights(full, rank, world_size, heads)
    out = {}
    for j, layer in enumerate(shard["layers"]):
        for k in LAYER_PARAMS:
            out[f"layers.{j}.{k}"] = layer[k]
    if full["final_norm"] is not None:
        out["final_norm"] = full["final_norm"]
    return out


def reference_grads(cfg: TPConfig, full: dict[str, Any], x, target) -> tuple[Any, dict[str, Any]]:
    """Single-process forward/backward with the full weights: (loss, {name: grad}) with
    one-rank shard names (see :func:`sharded_grads`)."""
    shard = shard_weights(full, 0, 1, cfg.heads)
    params = shard_parameters(shard)
    loss = mse_loss(forward_train(x, shard, None, cfg.eps), target)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in params}


#: The gradient check, per dtype: per tensor, ‖grad − ref‖₂ / ‖ref‖₂ ≤ rel_rms. Relative, not
#: elementwise: the MSE gradients are small (~1e-4), so an absolute bound would let a
#: missing backward all-reduce pass. float32 errors observed ~1e-6.
GRAD_TOLERANCE: dict[str, float] = {"float32": 1e-4, "bfloat16": 6e-2, "float16": 2e-2}


def compare_grads(grads: dict[str, Any], ref: dict[str, Any], dtype: str) -> dict[str, Any]:
    """Every gradient in `ref` against `grads` by relative RMS error (:data:`GRAD_TOLERANCE`).
    Returns {"passed", "max_rel_rms_err", "worst" (the tensor with the largest error),
    "criterion"}; a missing or non-finite gradient fails."""
    import torch

    tol = GRAD_TOLERANCE[_DTYPE_ALIASES.get(dtype, dtype)]
    worst, worst_err, passed = None, 0.0, True
    for name, r in ref.items():
        g = grads.get(name)
        if g is None or not bool(torch.isfinite(g.float()).all()):
            err = float("inf")
        else:
            d = (g.float() - r.float()).norm().item()
            n = r.float().norm().item()
            err = d / n if n > 0 else d
        if worst is None or err > worst_err:
            worst, worst_err = name, err
        passed = passed and err <= tol
    return {"passed": passed, "max_rel_rms_err": worst_err, "worst": worst,
            "criterion": f"per gradient, relative RMS error <= {tol:g}"}


def compare(out, ref, dtype: str) -> dict[str, Any]:
    """Check `out` against `ref` with :data:`TOLERANCE` for `dtype`. Returns
    {"passed", "max_abs_err", "rel_rms_err", "criterion"}; non-finite output fails."""
    import torch

    dtype = _DTYPE_ALIASES.get(dtype, dtype)
    tol = TOLERANCE[dtype]
    o, r = out.float().cpu(), ref.float().cpu()
    diff = o - r
    max_abs = diff.abs().max().item() if o.numel() else 0.0
    ref_norm = r.norm().item()
    rel_rms = diff.norm().item() / ref_norm if ref_norm > 0 else diff.norm().item()
    finite = bool(torch.isfinite(o).all())
    if "rel_rms" in tol:
        passed = finite and rel_rms <= tol["rel_rms"]
        criterion = f"relative RMS error <= {tol['rel_rms']:g}"
    else:
        passed = finite and torch.allclose(o, r, atol=tol["atol"], rtol=tol["rtol"])
        criterion = f"|tp - ref| <= {tol['atol']:g} + {tol['rtol']:g}*|ref| elementwise"
    return {"passed": bool(passed), "max_abs_err": max_abs, "rel_rms_err": rel_rms, "criterion": criterion}


# --------------------------------------------------------------------------- one rank


def _tp_rank(ctx: _launch.RankContext, cfg: TPConfig) -> dict[str, Any]:
    """What each rank process runs (see the module docstring)."""
    import torch
    import torch.distributed as dist

    device = ctx.device
    full = init_weights(cfg, device=device)
    shard = shard_weights(full, ctx.rank, ctx.world_size, cfg.heads)
    x = make_input(cfg, device=device)
    last = ctx.rank == ctx.world_size - 1
    if cfg.fault == "raise" and last:
        raise RuntimeError("injected fault (TPConfig.fault='raise')")
    if cfg.fault == "corrupt_shard" and last:
        shard["layers"][0]["w_down"].mul_(1.5)

    def all_reduce(t) -> None:
        dist.all_reduce(t)

    def all_reduce_async(t):
        return dist.all_reduce(t, async_op=True)

    train = cfg.mode == "train"
    first: dict[str, Any] = {}  # train: the first step's loss and gradients, for the check
    if train:
        params = shard_parameters(shard)
        target = make_target(cfg, device=device)
        opt = torch.optim.SGD([p for _, p in params], lr=cfg.lr)

    def step_forward():
        if train:
            opt.zero_grad(set_to_none=True)
            out = forward_train(x, shard, all_reduce, cfg.eps)
            loss = mse_loss(out, target)
            loss.backward()
            if not first:
                first["loss"] = loss.detach().clone()
                first["grads"] = {n: p.grad.detach().clone() for n, p in params}
            opt.step()
            return out.detach()
        if cfg.overlap_chunks > 1:
            return forward_chunked(x, shard, all_reduce_async, cfg.overlap_chunks, cfg.eps)
        return forward(x, shard, all_reduce, cfg.eps)

    # Everything that communicates for set-up happens here, before profiling starts.
    dist.barrier()
    if cfg.profiler == "nsys":
        # nsys (which wraps this process) records; torch.profiler must stay off
        step_s, out = _nsys_steps(ctx, cfg, step_forward)
        out_file = None
    else:
        schedule = _launch.ProfileSchedule(cfg.wait, cfg.warmup, cfg.active)
        out_file = ctx.trace_path()
        prof = _launch.make_profiler(schedule, out_file, use_cuda=ctx.is_cuda)
        step_s: list[float] = []
        out = None
        with _grad_mode(cfg), prof:
            for _step in ctx.profiled_steps(prof, cfg.steps, step_s):
                out = step_forward()
        ctx.check_trace(out_file)

    if train:
        if ctx.rank == 0:
            ctx.progress("checking TP gradients against the single-process backward")
        check = _train_check(cfg, full, x, target, first, ctx.rank, ctx.world_size)
    else:
        if ctx.rank == 0:
            ctx.progress("checking TP output against the single-process forward")
        with torch.no_grad():
            ref = forward(x, shard_weights(full, 0, 1, cfg.heads), None, cfg.eps)
        check = compare(out, ref, cfg.dtype)
        if not check["passed"]:
            raise TPMismatchError(
                f"TP output differs from the single-process forward: max abs error {check['max_abs_err']:.3g}, "
                f"relative RMS error {check['rel_rms_err']:.3g} (needs {check['criterion']} for {cfg.dtype})"
            )
    return {
        "rank": ctx.rank,
        **check,
        "step_s": step_s,
        "threads": torch.get_num_threads(),
        # under nsys the SQLite is written by nsys after this process exits (run_tp fills the size)
        "trace": out_file.name if out_file is not None else f"rank{ctx.rank}.sqlite",
        "trace_bytes": out_file.stat().st_size if out_file is not None else None,
    }


def _grad_mode(cfg: TPConfig):
    """torch.no_grad() for the forward-only mode; nothing for training."""
    import contextlib

    import torch

    return contextlib.nullcontext() if cfg.mode == "train" else torch.no_grad()


def _train_check(cfg: TPConfig, full, x, target, first: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """The first step's loss and gradients against the single-process backward of the same
    (initial) weights. Returns the result fields (max_abs_err: of the loss; rel_rms_err: the
    worst gradient's); raises TPMismatchError beyond :data:`GRAD_TOLERANCE`."""
    ref_loss, ref_grads = reference_grads(cfg, full, x, target)
    g = compare_grads(first["grads"], sharded_grads(ref_grads, rank, world, cfg.heads), cfg.dtype)
    loss_err = abs(first["loss"].item() - ref_loss.item())
    loss_rel = loss_err / abs(ref_loss.item()) if ref_loss.item() else loss_err
    if not g["passed"] or not loss_rel <= GRAD_TOLERANCE[cfg.dtype]:
        raise TPMismatchError(
            f"TP gradients differ from the single-process backward: worst {g['worst']} relative RMS error "
            f"{g['max_rel_rms_err']:.3g}, loss {first['loss'].item():.6g} vs {ref_loss.item():.6g} "
            f"(needs {g['criterion']} for {cfg.dtype})"
        )
    return {
        "max_abs_err": loss_err,
        "rel_rms_err": g["max_rel_rms_err"],
        "criterion": g["criterion"],
        "worst_grad": g["worst"],
        "loss": first["loss"].item(),
        "ref_loss": ref_loss.item(),
        "grads_checked": len(first["grads"]),
    }


def _nsys_steps(ctx: _launch.RankContext, cfg: TPConfig, step_forward: Callable[[], Any]) -> tuple[list[float], Any]:
    """Run the steps while ``nsys profile`` (the rank's parent) records; returns (step seconds, last output).

    torch.profiler is not started: nsys and Kineto would both use CUPTI. Instead
    every step is an NVTX range ``ProfilerStep#N`` (what the nsys reader takes as a
    step), and on a GPU the active steps run under ``torch.autograd.profiler.emit_nvtx``
    (one NVTX range per op, and the ``layer{i}.attention`` / ``layer{i}.mlp``
    record_function ranges). On a GPU, cudaProfilerStart/Stop bracket the active
    window (wait + warmup steps skipped, as torch.profiler's schedule does); run_tp
    starts nsys with ``--capture-range=cudaProfilerApi`` then, so only those steps
    are captured. On the CPU (gloo) nsys captures the whole process; NVTX needs a
    CUDA build of torch, and without one the steps run unmarked.

    Written and tested without a real nsys (none was available): on the CPU only.
    """
    import contextlib

    import torch

    device = ctx.device
    nvtx = torch.version.cuda is not None
    first_active = cfg.wait + cfg.warmup
    last_active = first_active + cfg.active - 1
    step_s: list[float] = []
    out = None
    with _grad_mode(cfg):
        for step in range(cfg.steps):
            active = first_active <= step <= last_active
            if ctx.is_cuda and step == first_active:
                torch.cuda.synchronize(device)
                torch.cuda.profiler.start()
            t0 = time.perf_counter()
            with contextlib.ExitStack() as marks:
                if nvtx:
                    marks.enter_context(torch.cuda.nvtx.range(f"ProfilerStep#{step}"))
                if ctx.is_cuda and active:
                    marks.enter_context(torch.autograd.profiler.emit_nvtx())
                out = step_forward()
                if ctx.is_cuda:
                    torch.cuda.synchronize(device)
            step_s.append(time.perf_counter() - t0)
            if ctx.is_cuda and step == last_active:
                torch.cuda.profiler.stop()
            if ctx.rank == 0:
                ctx.progress(f"step {step + 1}/{cfg.steps}")
    return step_s, out


# --------------------------------------------------------------------------- the job


def run_tp(config: TPConfig, on_progress: Callable[[str], None] | None = None) -> Path:
    """Run the TP workload on ``config.ranks`` processes with the profiler on.

    Returns the run folder (``<out>/tp-YYYYmmdd-HHMMSS-xxxx``, default out
    ./tracekit-runs) holding ``rank{r}.pt.trace.json.gz`` per rank and
    ``run_config.json``. Raises BadInputError for an impossible configuration,
    RankFailedError when a rank fails (including a TP mismatch: "rank 0 failed:
    TP output differs ... max abs error ...").

    With ``profiler="nsys"`` each rank runs under its own ``nsys profile``
    (:func:`tracekit.collectors.nsys.nsys_command`) and the folder holds ``rank{r}.sqlite``
    (+ ``rank{r}.nsys-rep``) instead; no nsys on PATH is a BadInputError raised
    before any folder or process is created. On a GPU the capture is limited to
    the active steps (``--capture-range=cudaProfilerApi``, see :func:`_nsys_steps`).
    """
    cfg = config.resolved()
    launch_kw: dict[str, Any] = {}
    if cfg.profiler == "nsys":
        from tracekit.collectors.nsys import find_nsys

        nsys = find_nsys()  # the clear error first: nothing created or started yet
    backend = _launch.resolve_backend(cfg.backend, cfg.ranks)
    info = _launch.host_info()
    run_dir = _launch.new_run_dir(cfg.out, "tp")
    if cfg.profiler == "nsys":
        from tracekit.collectors.nsys import nsys_command

        capture = "cudaProfilerApi" if backend == "nccl" else None
        base = run_dir.resolve()

        def nsys_prefix(r: int) -> list[str]:
            return nsys_command(nsys, base / f"rank{r}", capture_range=capture)

        launch_kw["rank_prefix"] = nsys_prefix
        info = {**info, "nsys": nsys, "nsys_command": nsys_command(nsys, "rank{r}", capture_range=capture)}
    results, wall, created = _launch.timed_launch(_tp_rank, cfg, backend, run_dir, on_progress, **launch_kw)
    if cfg.profiler == "nsys":
        for r in results:
            f = run_dir / r["trace"]
            if not f.is_file():
                raise TracekitError(
                    f"{f}: nsys wrote no SQLite export for rank {r['rank']} "
                    f"(its output is in {_launch.log_path(run_dir, r['rank'])})"
                )
            r["trace_bytes"] = f.stat().st_size
    write_run_config(run_dir, cfg, backend, info, results, wall, created)
    return run_dir


def build_run_config(
    run_id: str,
    cfg: TPConfig,
    backend: str,
    info: dict[str, Any],
    results: list[dict[str, Any]],
    wall_s: float,
    created: _dt.datetime,
) -> dict[str, Any]:
    """The run_config.json document (see the README of fixtures/tp_2rank)."""
    options = _launch.config_options(cfg, exclude=("out", "timeout_s", "fault", "profiler"))
    active_steps = _launch.active_steps(cfg.wait, cfg.warmup, cfg.active)
    per_rank_steps = [r["step_s"] for r in results]
    doc = {
        "workload": "tp",
        "run_id": run_id,
        "created_at": created.isoformat(timespec="seconds"),
        **options,
        "head_dim": cfg.head_dim,
        "world_size": cfg.ranks,
        "backend": backend,
        "dtype_bytes": cfg.dtype_bytes,
        **_launch.run_config_base(info, results, backend, cfg.wait, cfg.warmup, cfg.active),
        "expected": {
            # per call: with overlap_chunks N each block's all-reduce is N calls of 1/N the size
            # forward: 2 per layer (x chunks); train: 4 per layer (g twice in forward, f twice in backward)
            "all_reduce_per_step": cfg.all_reduces_per_layer * cfg.layers,
            "all_reduce_per_rank_active": cfg.all_reduces_per_layer * cfg.layers * cfg.active,
            "all_reduce_bytes": cfg.all_reduce_bytes,
            "all_reduce_elems": cfg.batch * cfg.seq * cfg.hidden // cfg.overlap_chunks,
            "all_reduce_async": cfg.overlap_chunks > 1,
            "block_all_reduce_bytes": cfg.block_bytes,
        },
        "tp_check": _train_check_doc(cfg, results) if cfg.mode == "train" else {
            "passed": True,
            "max_abs_err": max(r["max_abs_err"] for r in results),
            "rel_rms_err": max(r["rel_rms_err"] for r in results),
            "per_rank_max_abs_err": [r["max_abs_err"] for r in results],
            "criterion": results[0]["criterion"],
            **TOLERANCE[cfg.dtype],
            "reference": "single-process forward with the full weights, on every rank",
        },
        "timing": {
            "job_wall_s": round(wall_s, 3),
            "clock": "time.perf_counter around each forward step, per rank; warmup/active steps include profiler overhead",
            # median over all ranks and steps except the first (cold) step
            "step_wall_s": [[round(s, 6) for s in r] for r in per_rank_steps],
            **_launch.step_medians(per_rank_steps, active_steps),
        },
        "traces": [r["trace"] for r in results],
        "overlap_model": _launch.overlap_model("chunked", chunks=cfg.overlap_chunks) if cfg.overlap_chunks > 1
        else _launch.overlap_model("no_overlap"),
    }
    if cfg.profiler == "nsys":
        doc["profiler"] = _nsys_profiler_doc(cfg, backend, info, active_steps)
        doc["timing"]["clock"] = "time.perf_counter around each forward step, per rank; active steps include NVTX overhead"
    return doc


def _train_check_doc(cfg: TPConfig, results: list[dict[str, Any]]) -> dict[str, Any]:
    """The run config's ``tp_check`` for a training run: the first step's gradients and loss."""
    return {
        "passed": True,
        "max_abs_err": max(r["max_abs_err"] for r in results),  # of the loss
        "max_grad_rel_rms_err": max(r["rel_rms_err"] for r in results),
        "worst_grad": max(results, key=lambda r: r["rel_rms_err"])["worst_grad"],
        "grads_checked_per_rank": results[0]["grads_checked"],
        "loss": results[0]["loss"],
        "ref_loss": results[0]["ref_loss"],
        "criterion": results[0]["criterion"],
        "rel_rms": GRAD_TOLERANCE[cfg.dtype],
        "reference": "single-process forward/backward of the initial weights (first step, before the SGD step), "
        "every rank's gradients sliced as its weights",
    }


def _nsys_profiler_doc(cfg: TPConfig, backend: str, info: dict[str, Any], active_steps: list[int]) -> dict[str, Any]:
    """The run config's ``profiler`` entry for a run under nsys."""
    from tracekit.collectors.nsys import DEFAULT_TRACE

    on_gpu = backend == "nccl"
    return {
        "tool": "nsys",
        "nsys": info.get("nsys"),
        "command": info.get("nsys_command"),
        "trace": DEFAULT_TRACE,
        "export": "sqlite",
        "one_session_per_rank": True,
        "wait": cfg.wait,
        "warmup": cfg.warmup,
        "active": cfg.active,
        "capture": (
            "active steps only (cudaProfilerStart/Stop, --capture-range=cudaProfilerApi)"
            if on_gpu
            else "the whole rank process (gloo: set-up, every step and the TP check are in the capture)"
        ),
        "nvtx": "ProfilerStep#N per step" + ("; emit_nvtx (per-op ranges) in the active steps" if on_gpu else ""),
        "active_steps": active_steps,
    }


def write_run_config(run_dir: Path, cfg, backend, info, results, wall_s, created) -> Path:
    doc = build_run_config(run_dir.name, cfg, backend, info, results, wall_s, created)
    return _launch.write_json(run_dir / "run_config.json", doc)
