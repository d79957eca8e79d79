"""The expert-parallel (EP) workload: MoE transformer layers on N ranks.

Every rank holds its own tokens (``batch × seq`` per rank; the inputs differ by
rank and by step) and ``experts / N`` of the experts of every layer: rank r owns
experts ``[r·E/N, (r+1)·E/N)``. Each layer, per micro-batch of a rank's tokens:

    x = x + attention(RMSNorm(x))          replicated weights, the rank's own tokens
    h = RMSNorm(x)                          (omitted with attention=False)
    logits = h @ Wr.T + b                   float32 router, b = the skew bias (below)
    idx, g = top-k(logits), softmax over the k chosen logits
    sort the (token, slot) assignments by expert (so by owner rank)
    all_to_all_single(counts per expert)    exchange split counts (E int64 per rank)
    all_to_all_single(rows, uneven splits)  dispatch: each assignment's h row → its expert's rank
    y_rows = expert_e(rows)                 SwiGLU experts, grouped by local expert
    all_to_all_single(back, reversed splits) combine: results back to the token's rank
    x = x + Σ_k g_k · y_k                   gate-weighted sum per token

and a final RMSNorm. So each MoE layer issues, per micro-batch, one
split-exchange all-to-all (``E`` int64 counts, even splits of ``E/N``) and two
data all-to-alls (dispatch and combine, ``rows × hidden`` elements with the
real, uneven splits the router produced). The forward runs under
``torch.no_grad()``; nothing else communicates inside the profiled steps.

**Two-batch overlap** (``two_batch_overlap=True``): the batch is cut into two
halves along the batch dimension; each half is a generator that yields right
after it launches an all-to-all with ``async_op=True`` and waits for it when
resumed. Alternating the two halves gives, per layer::

    A: attention, router, counts, dispatch ─┐ (in flight)
    B: attention, router, counts, dispatch  │ ─┐
    A: wait, experts, combine ─┐            ┘  │
    B: wait, experts, combine  │ ─┐            ┘
    A: wait, unpermute, next layer's attention … ┘ …

so one half's all-to-all runs while the other half computes.

**Skew** (``skew=F``): a bias ``b`` is added to expert 0's router logit. The
router rows are unit vectors and ``h`` has RMS ≈ 1, so each token's logits are
(close to) independent N(0, 1) over the experts. Expert 0 is then chosen for a
fraction ``p(b) = P(z0 + b > k-th largest of z1..z(E−1))`` of the tokens and
every other expert for ``(k − p)/(E − 1)``; asking ``p·(E−1)/(k − p) = F``
gives ``p = F·k/(E − 1 + F)``, and ``b`` is the ``p``-quantile of
``t − z0`` (``t`` the k-th largest of the other E−1), estimated once from a
fixed-seed sample of 200,000 Gaussian draws (:func:`skew_bias`). F = 1 gives
b = 0. F must be below ``(E − 1)/(k − 1)`` (expert 0 in every token's top-k)
when k > 1. The ratio actually measured is in run_config.json.

**Check**: every rank recomputes, single-process, the same layers on its own
tokens with all the experts (a dense loop over experts, no communication) and
the routing the EP run chose; the chosen experts must be a top-k of the
reference's own router logits (within a small tolerance for near-ties) and the
outputs must agree within the dtype's tolerance (as for TP), else the job fails.

Public API: :class:`EPConfig`, :func:`run_ep`; the model pieces
(:func:`init_weights`, :func:`make_input`, :func:`route`, :func:`ep_forward`,
:func:`reference_forward`, :func:`skew_bias`, ...) are importable for tests.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from tracekit.collectors import launch as _launch
from tracekit.collectors.workloads.tp import _DTYPE_ALIASES, DTYPES, TOLERANCE, attention_partial, compare, rms_norm, torch_dtype
from tracekit.errors import BadInputError, TracekitError

#: How far (in logit units) the EP run's chosen experts may fall below the
#: reference's own k-th largest logit: rounding differences upstream of the
#: router can swap near-tied experts. A wrong dispatch is caught by the output
#: comparison, which uses the EP run's routing.
ROUTING_TOL: dict[str, float] = {"float32": 1e-3, "bfloat16": 0.1, "float16": 2e-2}
#: Samples of the Monte-Carlo estimate of the skew bias.
SKEW_SAMPLES = 200_000
COUNT_BYTES = 8  # the split counts are int64


class EPMismatchError(TracekitError):
    """The EP output differs from the single-process reference beyond tolerance (exit 1)."""


@dataclass
class EPConfig(_launch.RunOptions):
    """Options of the EP workload. ``steps=None`` means wait + warmup + active;
    ``ffn=None`` means 2 × hidden (each expert's SwiGLU inner size)."""

    ranks: int | None = _launch.option(None, "Ranks (processes), 1-8: ep x dp (default: 2 x dp).")
    layers: int = _launch.option(4, "MoE transformer layers.")
    hidden: int = _launch.option(512, "Hidden size.")
    heads: int = _launch.option(8, "Attention heads (replicated attention; hidden divisible by heads).")
    ffn: int | None = _launch.option(None, "Each expert's MLP inner size (default: 2 x hidden).")
    experts: int = _launch.option(8, "Experts per layer (>= ranks, divisible by ranks).")
    top_k: int = _launch.option(2, "Experts per token (<= experts).")
    seq: int = _launch.option(128, "Sequence length (tokens per rank = batch x seq).")
    batch: int = _launch.option(4, "Sequences per rank.")
    skew: float = _launch.option(1.0, "Make expert 0 about F times as hot as each other expert (>= 1).")
    two_batch_overlap: bool = _launch.option(
        False, "Split each batch in two halves; one half's all-to-all runs (async) while the other computes."
    )
    attention: bool = _launch.option(True, "Include the replicated attention block.")
    dp: int = _launch.option(1, "Data-parallel replicas: > 1 trains the experts, sharded over ranks/dp EP ranks "
                                "inside each replica (collectors/workloads/epdp.py).")
    bucket_kb: int = _launch.option(256, "With --dp > 1: DDP gradient bucket size, KiB.")
    lr: float = 0.05  # with dp > 1: the SGD learning rate of the experts
    # fault (from RunOptions), testing only: "corrupt_expert" perturbs one expert's weights on the last
    # rank (the check must then fail); "raise" makes the last rank raise

    def resolved(self) -> "EPConfig":
        """A validated copy with `steps`, `ffn` and `dtype` filled in / canonical.
        Raises BadInputError (one line) for an impossible configuration.
        Does not look at the backend (see :func:`tracekit.collectors.launch.resolve_backend`)."""
        c = dataclasses.replace(self)
        if isinstance(c.dp, bool) or not isinstance(c.dp, int) or c.dp < 1:
            raise BadInputError(f"dp must be a positive integer, got {c.dp}")
        if c.ranks is None:
            c.ranks = 2 * c.dp
        _launch.validate_ranks(c.ranks)
        if c.ranks % c.dp:
            raise BadInputError(f"ranks ({c.ranks}) must be divisible by dp ({c.dp}): each replica is ranks/dp EP ranks")
        for name in ("layers", "hidden", "heads", "experts", "top_k", "seq", "batch", "bucket_kb"):
            v = getattr(c, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise BadInputError(f"{name} must be a positive integer, got {v}")
        ep, what = c.ranks // c.dp, "ranks" if c.dp == 1 else "the EP group size"
        if c.experts < ep:
            raise BadInputError(f"experts ({c.experts}) must be at least {what} ({ep}): every rank holds experts")
        if c.experts % ep:
            raise BadInputError(
                f"experts ({c.experts}) must be divisible by {what} ({ep}): each rank holds experts/{what} experts"
            )
        if c.dp > 1 and c.two_batch_overlap:
            raise BadInputError("two-batch overlap is a forward-only (dp 1) option; --dp > 1 trains")
        if c.top_k > c.experts:
            raise BadInputError(f"top_k ({c.top_k}) must not exceed experts ({c.experts})")
        if c.attention and c.hidden % c.heads:
            raise BadInputError(f"hidden ({c.hidden}) must be divisible by heads ({c.heads})")
        c.dtype = _DTYPE_ALIASES.get(c.dtype, c.dtype)
        if c.dtype not in DTYPES:
            raise BadInputError(f"unsupported dtype {self.dtype!r} (choose one of {', '.join(DTYPES)})")
        if c.ffn is None:
            c.ffn = 2 * c.hidden
        if isinstance(c.ffn, bool) or not isinstance(c.ffn, int) or c.ffn < 1:
            raise BadInputError(f"ffn must be a positive integer, got {c.ffn}")
        try:
            c.skew = float(c.skew)
        except (TypeError, ValueError):
            raise BadInputError(f"skew must be a number >= 1, got {self.skew!r}") from None
        if not math.isfinite(c.skew) or c.skew < 1:
            raise BadInputError(f"skew must be a finite number >= 1 (expert 0 F times hotter), got {self.skew!r}")
        if c.skew > 1:
            limit = skew_limit(c.experts, c.top_k)
            if c.skew >= limit:
                raise BadInputError(
                    f"skew {c.skew:g} is unreachable with {c.experts} experts and top-k {c.top_k}: "
                    f"expert 0 can be at most {limit:g}x as hot as the others (it is then in every token's top-k)"
                )
        if c.two_batch_overlap and c.batch < 2:
            raise BadInputError(f"two-batch overlap splits the batch in two halves: batch must be >= 2, got {c.batch}")
        c.steps = _launch.validate_schedule(c.wait, c.warmup, c.active, c.steps)
        _launch.validate_run_options(c.backend, c.timeout_s, c.fault, (None, "corrupt_expert", "raise"))
        return c

    @property
    def dtype_bytes(self) -> int:
        return DTYPES[_DTYPE_ALIASES.get(self.dtype, self.dtype)]

    @property
    def experts_per_rank(self) -> int:
        return self.experts // (self.ranks // self.dp)

    @property
    def tokens_per_rank(self) -> int:
        return self.batch * self.seq

    @property
    def microbatches(self) -> int:
        return 2 if self.two_batch_overlap else 1

    def microbatch_sizes(self) -> list[int]:
        """Batch rows of each micro-batch (two halves, the first the larger, with two-batch overlap)."""
        if not self.two_batch_overlap:
            return [self.batch]
        first = (self.batch + 1) // 2
        return [first, self.batch - first]

    @property
    def row_bytes(self) -> int:
        """Bytes of one dispatched row (one token's hidden vector)."""
        return self.hidden * self.dtype_bytes


# --------------------------------------------------------------------------- skew


def skew_limit(experts: int, top_k: int) -> float:
    """The largest reachable skew ratio: (E − 1)/(k − 1) for k > 1 (expert 0 in
    every top-k), unbounded (inf) for k = 1 < E, and 1 when k = E."""
    if top_k >= experts:
        return 1.0
    if top_k == 1:
        return math.inf
    return (experts - 1) / (top_k - 1)


@functools.lru_cache(maxsize=32)
def skew_bias(experts: int, top_k: int, skew: float, samples: int = SKEW_SAMPLES, seed: int = 0) -> float:
    """The bias on expert 0's logit that makes it ≈`skew`× as often chosen as any other expert.

    Model: a token's logits are i.i.d. N(0, 1) over the experts. With bias b,
    expert 0 is in the top-k with probability p(b) = P(z0 + b > t), t the k-th
    largest of the other E − 1 logits; every other expert with (k − p)/(E − 1).
    The target ratio F needs p = F·k/(E − 1 + F), so b is the p-quantile of
    t − z0, estimated from `samples` fixed-seed draws. Returns 0.0 for F = 1.
    Raises BadInputError when F is unreachable (see :func:`skew_limit`).
    """
    import torch

    if skew == 1:
        return 0.0
    if not skew > 1 or skew >= skew_limit(experts, top_k):
        raise BadInputError(f"skew {skew:g} is unreachable with {experts} experts and top-k {top_k}")
    g = torch.Generator(device="cpu").manual_seed(seed)
    z = torch.randn(samples, experts, generator=g, dtype=torch.float64)
    kth_other = z[:, 1:].topk(top_k, dim=1).values[:, -1]
    d = (kth_other - z[:, 0]).sort().values
    p = skew * top_k / (experts - 1 + skew)
    return float(d[min(samples - 1, max(0, int(round(p * samples))))])


# --------------------------------------------------------------------------- the model


def init_weights(cfg: EPConfig, device="cpu") -> dict[str, Any]:
    """The full model (every expert), built deterministically from ``cfg.seed``.

    Returns {"layers": [per-layer dict], "final_norm": (H,), "router_bias": float}.
    Each layer: attn_norm (H,), wqkv (3H, H), wo (H, H), local_heads (all heads:
    attention is replicated), mlp_norm (H,), w_router (E, H) float32 with unit
    rows, router_bias (E,) float32 (the skew bias on expert 0, zeros otherwise),
    experts: E dicts of w_gate_up (2F, H) and w_down (H, F). Linear weights
    ~ N(0, 1/fan_in), norms 1 + N(0, 0.1²); drawn in float32 on the CPU, then cast.
    """
    import torch

    cfg = cfg if cfg.ffn is not None else cfg.resolved()
    H, F, E = cfg.hidden, cfg.ffn, cfg.experts
    g = torch.Generator(device="cpu").manual_seed(cfg.seed)
    dt = torch_dtype(cfg.dtype)
    b = skew_bias(E, cfg.top_k, cfg.skew)

    def lin(out_f: int, in_f: int):
        return (torch.randn(out_f, in_f, generator=g) / in_f**0.5).to(device=device, dtype=dt)

    def norm():
        return (1.0 + 0.1 * torch.randn(H, generator=g)).to(device=device, dtype=dt)

    layers = []
    for _ in range(cfg.layers):
        layer: dict[str, Any] = {"attn_norm": norm(), "local_heads": cfg.heads}
        layer["wqkv"] = torch.cat([lin(H, H), lin(H, H), lin(H, H)]).contiguous()
        layer["wo"] = lin(H, H)
        layer["mlp_norm"] = norm()
        wr = torch.randn(E, H, generator=g)
        layer["w_router"] = (wr / wr.norm(dim=1, keepdim=True)).to(device=device, dtype=torch.float32)
        bias = torch.zeros(E, dtype=torch.float32)
        bias[0] = b
        layer["router_bias"] = bias.to(device)
        layer["experts"] = [
            {"w_gate_up": torch.cat([lin(F, H), lin(F, H)]).contiguous(), "w_down": lin(H, F)} for _ in range(E)
        ]
        layers.append(layer)
    return {"layers": layers, "final_norm": norm(), "router_bias": b}


def make_input(cfg: EPConfig, rank: int, step: int, device="cpu"):
    """Rank `rank`'s input activations at step `step` (batch, seq, hidden), from ``cfg.seed``."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(cfg.seed + 1_000_003 + 7919 * rank + 104_729 * step)
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g)
    return x.to(device=device, dtype=torch_dtype(cfg.dtype))


def route(h2d, layer: dict[str, Any], top_k: int):
    """Router on h2d (T, H): float32 logits (T, E) = h·Wrᵀ + bias, the top-k experts
    idx (T, k) int64 and their gates (T, k) float32 (softmax over the k chosen logits)."""
    import torch

    logits = h2d.float() @ layer["w_router"].T + layer["router_bias"]
    top, idx = logits.topk(top_k, dim=-1)
    return idx, torch.softmax(top, dim=-1), logits


def expert_mlp(x, expert: dict[str, Any]):
    """One expert's SwiGLU MLP on rows x (M, H) → (M, H)."""
    import torch.nn.functional as Fn

    g, u = (x @ expert["w_gate_up"].T).chunk(2, dim=-1)
    return (Fn.silu(g) * u) @ expert["w_down"].T


#: An all-to-all: a2a(output, input, output_split_sizes, input_split_sizes, async_op)
#: → a Work with .wait() when async_op, else None (splits None: even).
AllToAll = Callable[..., Any]


def dist_all_to_all(out, inp, out_splits=None, in_splits=None, async_op: bool = False):
    """:data:`AllToAll` over the default process group (torch.distributed.all_to_all_single)."""
    import torch.distributed as dist

    return dist.all_to_all_single(
        out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits, async_op=async_op
    )


def local_all_to_all(out, inp, out_splits=None, in_splits=None, async_op: bool = False):
    """:data:`AllToAll` of a 1-rank group (a copy), for in-process tests."""
    out.copy_(inp)

    class _Done:
        def wait(self):
            return True

    return _Done() if async_op else None


def _microbatch_forward(
    x, shard: dict[str, Any], cfg: EPConfig, rank: int, world: int, a2a: AllToAll, log: list, mb: int, overlap: bool
) -> Iterator[None]:
    """The layers on one micro-batch x (b, s, H); a generator that, when `overlap`,
    yields right after launching each data all-to-all (async) and waits for it when
    resumed. The final output is left in ``log`` as ("out", mb, tensor); each layer's
    routing and splits as ("route", mb, layer, dict)."""
    import torch
    from torch.profiler import record_function

    E, k, H = cfg.experts, cfg.top_k, cfg.hidden
    El = E // world
    for i, layer in enumerate(shard["layers"]):
        if cfg.attention:
            with record_function(f"layer{i}.attention"):
                x = x + attention_partial(rms_norm(x, layer["attn_norm"], cfg.eps), layer)
        with record_function(f"layer{i}.router"):
            shape = x.shape
            h = rms_norm(x, layer["mlp_norm"], cfg.eps).reshape(-1, H)
            T = h.shape[0]
            idx, gates, _ = route(h, layer, k)
            flat_e = idx.reshape(-1)
            order = torch.argsort(flat_e, stable=True)  # assignments grouped by expert, so by owner rank
            tok = torch.div(order, k, rounding_mode="floor")  # the token of each sorted assignment
            gate_sorted = gates.reshape(-1)[order].to(x.dtype).unsqueeze(1)
            counts = torch.bincount(flat_e, minlength=E)
        with record_function(f"layer{i}.dispatch"):
            recv_counts = torch.empty_like(counts)
            a2a(recv_counts, counts)  # the split exchange: E/world counts to each rank
            per_src = recv_counts.view(world, El)
            in_splits = counts.view(world, El).sum(1).tolist()
            out_splits = per_src.sum(1).tolist()
            send = h[tok]
            recv = h.new_empty(sum(out_splits), H)
            work = a2a(recv, send, out_splits, in_splits, async_op=overlap)
        log.append(("route", mb, i, {"idx": idx, "in_splits": in_splits, "out_splits": out_splits,
                                     "expert_counts": counts.tolist()}))
        if overlap:
            yield
            with record_function(f"layer{i}.dispatch.wait"):
                work.wait()
        with record_function(f"layer{i}.experts"):
            # received rows: by source rank, then by local expert within each source
            local_ids = torch.arange(El, device=recv.device).repeat(world)
            row_expert = torch.repeat_interleave(local_ids, per_src.reshape(-1))
            by_expert = torch.argsort(row_expert, stable=True)
            rows = recv[by_expert]
            done = torch.empty_like(recv)
            start = 0
            for j, n in enumerate(per_src.sum(0).tolist()):
                if n:
                    done[by_expert[start:start + n]] = expert_mlp(rows[start:start + n], layer["experts"][j])
                start += n
        with record_function(f"layer{i}.combine"):
            back = h.new_empty(T * k, H)
            work = a2a(back, done, in_splits, out_splits, async_op=overlap)
        if overlap:
            yield
            with record_function(f"layer{i}.combine.wait"):
                work.wait()
        with record_function(f"layer{i}.unpermute"):
            y = torch.zeros_like(h)
            y.index_add_(0, tok, back * gate_sorted)
            x = x + y.reshape(shape)
    log.append(("out", mb, rms_norm(x, shard["final_norm"], cfg.eps)))


def ep_forward(x, shard: dict[str, Any], cfg: EPConfig, rank: int, world: int, a2a: AllToAll = local_all_to_all):
    """The EP forward of rank `rank`'s tokens x (batch, seq, H) with `shard` (see
    :func:`shard_weights`). With ``cfg.two_batch_overlap`` the two halves of the
    batch alternate (module docstring). Returns (output (batch, seq, H),
    routing: per layer {"idx": (T, k) in token order, "in_splits"/"out_splits":
    per micro-batch lists of `world` row counts, "expert_counts": per micro-batch
    lists of E assignment counts})."""
    import torch

    sizes = cfg.microbatch_sizes()
    parts = list(torch.split(x, sizes, dim=0)) if len(sizes) > 1 else [x]
    log: list = []
    gens = [_microbatch_forward(p, shard, cfg, rank, world, a2a, log, m, len(parts) > 1) for m, p in enumerate(parts)]
    live = list(gens)
    while live:  # round-robin: each resume runs one half until its next async launch
        for gen in list(live):
            try:
                next(gen)
            except StopIteration:
                live.remove(gen)
    outs = {m: t for kind, m, t in (e for e in log if e[0] == "out")}
    out = torch.cat([outs[m] for m in range(len(parts))], dim=0)
    routing = []
    for i in range(cfg.layers):
        recs = {m: r for kind, m, li, r in (e for e in log if e[0] == "route") if li == i}
        ordered = [recs[m] for m in range(len(parts))]
        routing.append(
            {
                "idx": torch.cat([r["idx"] for r in ordered], dim=0),
                "in_splits": [r["in_splits"] for r in ordered],
                "out_splits": [r["out_splits"] for r in ordered],
                "expert_counts": [r["expert_counts"] for r in ordered],
            }
        )
    return out, routing


def shard_weights(full: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """Rank `rank`'s shard: everything replicated except the experts, of which it
    keeps its own E/world (local expert j = global expert rank·E/world + j)."""
    layers = []
    for layer in full["layers"]:
        E = len(layer["experts"])
        El = E // world
        mine = dict(layer)
        mine["experts"] = layer["experts"][rank * El:(rank + 1) * El]
        layers.append(mine)
    return {"layers": layers, "final_norm": full["final_norm"]}


def reference_forward(x, full: dict[str, Any], cfg: EPConfig, routing: list | None = None):
    """The same layers single-process, all experts local: each expert e is applied
    to the tokens routed to it (a dense loop over experts, no sort, no exchange).

    `routing` (per layer, e.g. from :func:`ep_forward`) supplies the chosen
    experts; the reference checks that they are a top-k of its own logits within
    :data:`ROUTING_TOL` (raises EPMismatchError otherwise) and recomputes the
    gates itself. None: its own top-k. Returns (output, tokens whose top-k set
    differs from the reference's own, as a count).
    """
    import torch

    k, H = cfg.top_k, cfg.hidden
    tol = ROUTING_TOL[_DTYPE_ALIASES.get(cfg.dtype, cfg.dtype)]
    swapped = 0
    for i, layer in enumerate(full["layers"]):
        if cfg.attention:
            x = x + attention_partial(rms_norm(x, layer["attn_norm"], cfg.eps), layer)
        h = rms_norm(x, layer["mlp_norm"], cfg.eps).reshape(-1, H)
        logits = h.float() @ layer["w_router"].T + layer["router_bias"]
        own = logits.topk(k, dim=-1).indices
        if routing is None:
            idx = own
        else:
            idx = routing[i]["idx"].to(own.device)
            if idx.shape != own.shape:
                raise EPMismatchError(f"layer {i}: EP routed {tuple(idx.shape)} assignments, expected {tuple(own.shape)}")
            chosen = logits.gather(1, idx)
            others = logits.scatter(1, idx, float("-inf"))
            worst_gap = (others.max(1).values - chosen.min(1).values).max().item()
            if worst_gap > tol:
                raise EPMismatchError(
                    f"EP routing at layer {i} is not a top-{k} of the single-process reference's router logits "
                    f"(an unchosen logit exceeds a chosen one by {worst_gap:.3g} > {tol:g}): the activations "
                    f"entering that layer differ from the reference"
                )
            swapped += int((idx.sort(1).values != own.sort(1).values).any(1).sum().item())
        gates = torch.softmax(logits.gather(1, idx), dim=-1).to(x.dtype)
        y = torch.zeros_like(h)
        for e, expert in enumerate(layer["experts"]):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if tok.numel():
                y.index_add_(0, tok, expert_mlp(h[tok], expert) * gates[tok, slot].unsqueeze(1))
        x = x + y.reshape(x.shape)
    return rms_norm(x, full["final_norm"], cfg.eps), swapped


# --------------------------------------------------------------------------- one rank


def _ep_rank(ctx: _launch.RankContext, cfg: EPConfig) -> dict[str, Any]:
    """What each rank process runs (see the module docstring)."""
    import torch
    import torch.distributed as dist

    device = ctx.device
    full = init_weights(cfg, device=device)
    shard = shard_weights(full, ctx.rank, ctx.world_size)
    inputs = [make_input(cfg, ctx.rank, s, device=device) for s in range(cfg.steps)]
    last = ctx.rank == ctx.world_size - 1
    if cfg.fault == "raise" and last:
        raise RuntimeError("injected fault (EPConfig.fault='raise')")
    if cfg.fault == "corrupt_expert" and last:
        # perturb an expert this rank owns, without touching `full` (the reference)
        shard["layers"][0]["experts"] = list(shard["layers"][0]["experts"])
        e0 = shard["layers"][0]["experts"][0]
        shard["layers"][0]["experts"][0] = {**e0, "w_down": e0["w_down"] * 1.5}

    dist.barrier()  # set-up communication happens before profiling starts
    schedule = _launch.ProfileSchedule(cfg.wait, cfg.warmup, cfg.active)
    out_file = ctx.trace_path()
    prof = _launch.make_profiler(schedule, out_file, use_cuda=ctx.is_cuda)
    step_s: list[float] = []
    outputs, routings = [], []
    with torch.no_grad(), prof:
        for step in ctx.profiled_steps(prof, cfg.steps, step_s):
            out, routing = ep_forward(inputs[step], shard, cfg, ctx.rank, ctx.world_size, dist_all_to_all)
            outputs.append(out)
            routings.append(routing)
    ctx.check_trace(out_file)

    if ctx.rank == 0:
        ctx.progress("checking EP output against the single-process reference")
    worst = {"max_abs_err": 0.0, "rel_rms_err": 0.0}
    swapped = 0
    with torch.no_grad():
        for step in range(cfg.steps):
            ref, sw = reference_forward(inputs[step], full, cfg, routings[step])
            swapped += sw
            check = compare(outputs[step], ref, cfg.dtype)
            if not check["passed"]:
                raise EPMismatchError(
                    f"EP output differs from the single-process reference at step {step}: max abs error "
                    f"{check['max_abs_err']:.3g}, relative RMS error {check['rel_rms_err']:.3g} "
                    f"(needs {check['criterion']} for {cfg.dtype})"
                )
            worst["max_abs_err"] = max(worst["max_abs_err"], check["max_abs_err"])
            worst["rel_rms_err"] = max(worst["rel_rms_err"], check["rel_rms_err"])
    splits = [
        [
            {"in_splits": r["in_splits"], "out_splits": r["out_splits"], "expert_counts": r["expert_counts"]}
            for r in routing
        ]
        for routing in routings
    ]
    return {
        "rank": ctx.rank,
        **worst,
        "criterion": check["criterion"],
        "near_tie_swaps": swapped,
        "splits": splits,  # [step][layer] -> per micro-batch lists
        "step_s": step_s,
        "threads": torch.get_num_threads(),
        "trace": out_file.name,
        "trace_bytes": out_file.stat().st_size,
    }


# --------------------------------------------------------------------------- the job


def run_ep(config: EPConfig, on_progress: Callable[[str], None] | None = None) -> Path:
    """Run the EP workload on ``config.ranks`` processes with the profiler on.

    Returns the run folder (``<out>/ep-YYYYmmdd-HHMMSS-xxxx``, default out
    ./tracekit-runs) holding ``rank{r}.pt.trace.json.gz`` per rank and
    ``run_config.json``. Raises BadInputError for an impossible configuration,
    RankFailedError when a rank fails (including an EP mismatch). A config
    with ``dp > 1`` is EP x DP: run it with ``epdp.run_epdp`` (BadInputError here).
    """
    cfg = config.resolved()
    if cfg.dp > 1:
        raise BadInputError(f"dp = {cfg.dp}: EP x DP runs through tracekit.collectors.workloads.epdp.run_epdp")
    backend = _launch.resolve_backend(cfg.backend, cfg.ranks)
    info = _launch.host_info()
    run_dir = _launch.new_run_dir(cfg.out, "ep")
    results, wall, created = _launch.timed_launch(_ep_rank, cfg, backend, run_dir, on_progress)
    doc = build_run_config(run_dir.name, cfg, backend, info, results, wall, created)
    _launch.write_json(run_dir / "run_config.json", doc, indent=1)
    return run_dir


def expected_counts(cfg: EPConfig) -> dict[str, Any]:
    """What the trace must hold for `cfg` (per rank), and the sizes a model needs."""
    m, L, k = cfg.microbatches, cfg.layers, cfg.top_k
    rows = [b * cfg.seq * k for b in cfg.microbatch_sizes()]
    return {
        "microbatches": m,
        "microbatch_tokens": [b * cfg.seq for b in cfg.microbatch_sizes()],
        "all_to_all_per_layer_per_microbatch": 3,
        "data_all_to_all_per_layer_per_microbatch": 2,
        "split_exchange_all_to_all_per_layer_per_microbatch": 1,
        "all_to_all_per_step": 3 * L * m,
        "all_to_all_per_rank_active": 3 * L * m * cfg.active,
        "data_all_to_all_per_rank_active": 2 * L * m * cfg.active,
        "split_exchange_per_rank_active": L * m * cfg.active,
        # split exchange: E int64 counts in and out, even splits of E/ranks
        "split_exchange_elems": cfg.experts,
        "split_exchange_bytes": cfg.experts * COUNT_BYTES,
        "split_exchange_dtype": "int64",
        # dispatch: each rank sends all its (token, slot) assignments, its own share included
        "dispatch_rows_per_microbatch": rows,
        "dispatch_bytes_per_microbatch": [r * cfg.row_bytes for r in rows],
        "row_bytes": cfg.row_bytes,
        # what leaves the rank under uniform routing: rows × (1 − 1/ranks)
        "uniform_wire_bytes_per_microbatch": [r * cfg.row_bytes * (cfg.ranks - 1) // cfg.ranks for r in rows],
        # combine: the reverse of dispatch (input = rows received, output = rows sent)
        "combine_splits": "dispatch splits reversed (input_split_sizes = dispatch output_split_sizes)",
    }


def build_run_config(
    run_id: str,
    cfg: EPConfig,
    backend: str,
    info: dict[str, Any],
    results: list[dict[str, Any]],
    wall_s: float,
    created: _dt.datetime,
) -> dict[str, Any]:
    """The run_config.json document (see fixtures/ep_2rank/NOTE.md)."""
    options = _launch.config_options(cfg)
    active_steps = _launch.active_steps(cfg.wait, cfg.warmup, cfg.active)
    R, E, El = cfg.ranks, cfg.experts, cfg.experts_per_rank
    per_step = []  # one entry per (step, layer, micro-batch), every rank's splits
    expert_tokens = [[0] * E for _ in range(cfg.layers)]  # over the active steps, all ranks
    rank_rows_in = [[0] * R for _ in range(cfg.layers)]  # rows each rank's experts received, active steps
    for step in range(cfg.steps):
        for layer in range(cfg.layers):
            for mb in range(cfg.microbatches):
                ins = [res["splits"][step][layer]["in_splits"][mb] for res in results]
                outs = [res["splits"][step][layer]["out_splits"][mb] for res in results]
                per_step.append({"step": step, "active": step in active_steps, "layer": layer, "microbatch": mb,
                                 "in_splits": ins, "out_splits": outs})
                if step in active_steps:
                    for res in results:
                        for e, n in enumerate(res["splits"][step][layer]["expert_counts"][mb]):
                            expert_tokens[layer][e] += n
                    for r in range(R):
                        rank_rows_in[layer][r] += sum(outs[r])
    totals = [sum(col) for col in zip(*expert_tokens)]
    others = totals[1:]
    skew_measured = (totals[0] / (sum(others) / len(others))) if others and sum(others) else None
    per_rank_steps = [r["step_s"] for r in results]
    return {
        "workload": "ep",
        "run_id": run_id,
        "created_at": created.isoformat(timespec="seconds"),
        **options,
        "world_size": R,
        "backend": backend,
        "dtype_bytes": cfg.dtype_bytes,
        "experts_per_rank": El,
        "tokens_per_rank": cfg.tokens_per_rank,
        "microbatches": cfg.microbatches,
        "microbatch_batch_rows": cfg.microbatch_sizes(),
        "router_bias": skew_bias(E, cfg.top_k, cfg.skew),
        **_launch.run_config_base(info, results, backend, cfg.wait, cfg.warmup, cfg.active),
        "expected": expected_counts(cfg),
        "measured": {
            "note": "splits are row counts (one row = one (token, slot) assignment = hidden × dtype_bytes bytes); "
            "in_splits[r][d] = rows rank r's dispatch sends to rank d; out_splits[r][s] = rows rank r receives "
            "from rank s; the combine uses them reversed",
            "splits": per_step,
            "expert_tokens_active": expert_tokens,
            "expert_tokens_active_total": totals,
            "rows_received_per_rank_active": rank_rows_in,
            "skew_measured": round(skew_measured, 4) if skew_measured is not None else None,
        },
        "ep_check": {
            "passed": True,
            "max_abs_err": max(r["max_abs_err"] for r in results),
            "rel_rms_err": max(r["rel_rms_err"] for r in results),
            "per_rank_max_abs_err": [r["max_abs_err"] for r in results],
            "criterion": results[0]["criterion"],
            **TOLERANCE[cfg.dtype],
            "routing_tolerance": ROUTING_TOL[cfg.dtype],
            "near_tie_swaps": sum(r["near_tie_swaps"] for r in results),
            "reference": "single-process forward of each rank's tokens with all experts and the EP run's routing, every step",
        },
        "timing": {
            "job_wall_s": round(wall_s, 3),
            "clock": "time.perf_counter around each forward step, per rank; warmup/active steps include profiler overhead",
            "step_wall_s": [[round(s, 6) for s in r] for r in per_rank_steps],
            **_launch.step_medians(per_rank_steps, active_steps),
        },
        "traces": [r["trace"] for r in results],
        "overlap_model": _launch.overlap_model("two_batch", layers=cfg.layers) if cfg.two_batch_overlap
        else _launch.overlap_model("no_overlap"),
    }
