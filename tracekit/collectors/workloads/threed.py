"""The 3-D workload: a transformer trained with tensor (TP), pipeline (PP) and data (DP)
parallelism at once, T·P·D ranks (``tracekit collect 3d --tp T --pp P --dp D``).

**Layout** (Megatron-LM's default order, tensor fastest, then data, then pipeline):
global rank = t + T·(d + D·p) for TP index t, DP index d and pipeline stage p. Every rank
creates every group, in the same order, each with its description
(``torch.distributed.new_group(ranks, group_desc=...)``, so the trace's ``Process Group
Name/Desc/Ranks`` identify them):

- ``tp``: the T ranks of one (stage, replica): t + T·(d + D·p) for t in 0..T−1;
- ``dp``: the D ranks of one (stage, TP index): the replicas of the same shard;
- ``pp``: the P ranks of one (replica, TP index): the stages, joined by send/recv.

**The model**: ``layers`` pre-norm blocks (causal attention, SwiGLU MLP) and a final
RMSNorm, as :mod:`tracekit.collectors.workloads.tp` trains them (Megatron's f/g: four
all-reduces on the ``tp`` group per layer per micro-batch, two in forward and two in
backward); stage p holds layers [p·L/P, (p+1)·L/P), the last stage the final norm and
the loss, mean((out − target)²) / microbatches. Stage 0's input and the last stage's
targets are drawn from the seed per (replica, micro-batch), (micro_batch, seq, hidden).

**PP**: each replica's batch is ``microbatches`` micro-batches run with the 1F1B schedule
(:func:`tracekit.collectors.workloads.pp.stage_program`); activations go forward and their
gradients back with isend/irecv on the ``pp`` group, each TP rank to the TP rank of the same
index on the next stage. Per step and rank: M activation sends on every stage but the last,
M gradient sends on every stage but the first, and as many recvs.

**DP** (``dp_mode``): the gradients of a rank's parameters are cut into buckets as DDP does
(Li et al., "PyTorch Distributed", VLDB 2020): parameters in reverse order of the forward,
a bucket closed once it holds ≥ ``bucket_kb`` KiB (:func:`make_buckets`). Gradients
accumulate over the micro-batches; during the last micro-batch's backward a bucket is
launched (``async_op=True``) as soon as its last gradient is accumulated
(``register_post_accumulate_grad_hook``), so it overlaps the backward of the layers before
it; the step waits for all buckets before the optimizer.

- ``ddp``: one all-reduce per bucket on the ``dp`` group (sum, then ÷ D); every rank then
  takes the same SGD step;
- ``fsdp`` (ZeRO-2 style sharded gradients and optimizer): one reduce-scatter per bucket
  (the flat bucket padded to a multiple of D), each rank updating its 1/D of the bucket's
  parameters, then one all-gather per bucket of the updated shards.

So a step issues, per rank, buckets DP collectives (ddp) or 2 × buckets (fsdp).

**Check**: after the run every rank recomputes the first step single-process: the full
model, every replica's micro-batches, the summed loss ÷ (D·M), backward; the rank's
DP-reduced gradients of that step (ddp: every parameter; fsdp: its shard of every bucket)
must match the reference's, sliced as the rank's weights are, and the last stage's loss its
replica's share of the reference loss. A mismatch fails the job.

Public API: :class:`ThreeDConfig`, :func:`run_3d`, :func:`layout`, :func:`make_buckets`,
:func:`expected_counts`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tracekit.collectors import launch as _launch
from tracekit.collectors.workloads import tp as _tp
from tracekit.errors import BadInputError, TracekitError

DP_MODES = ("ddp", "fsdp")


class ThreeDMismatchError(TracekitError):
    """The 3-D run's gradients or loss differ from the single-process reference (exit 1)."""


@dataclass
class ThreeDConfig(_launch.RunOptions):
    """Options of the 3-D workload; ``ranks`` is tp × pp × dp. ``ffn=None``: 8/3 × hidden
    rounded up to 64 (as tp)."""

    tp: int = _launch.option(2, "Tensor-parallel size (ranks per TP group).")
    pp: int = _launch.option(2, "Pipeline stages.")
    dp: int = _launch.option(2, "Data-parallel replicas.")
    dp_mode: str = _launch.option(
        "ddp", "ddp (bucketed all-reduce overlapped with backward) or fsdp (reduce-scatter + all-gather per bucket)."
    )
    layers: int = _launch.option(4, "Transformer layers in all (divisible by --pp).")
    hidden: int = _launch.option(64, "Hidden size.")
    heads: int = _launch.option(4, "Attention heads (divisible by --tp).")
    ffn: int | None = _launch.option(None, "MLP inner size (default: 8/3 x hidden, rounded up to 64).")
    seq: int = _launch.option(16, "Sequence length.")
    micro_batch: int = _launch.option(2, "Sequences per micro-batch.")
    microbatches: int = _launch.option(4, "Micro-batches per step and replica (1F1B schedule).")
    bucket_kb: int = _launch.option(128, "DP gradient bucket size, KiB (a bucket closes once it holds at least this).")
    lr: float = _launch.option(0.01, "SGD learning rate.")
    wait: int = _launch.option(1, "Profiler schedule: steps skipped.")
    warmup: int = _launch.option(1, "Profiler schedule: warm-up steps (traced, discarded).")
    active: int = _launch.option(2, "Profiler schedule: recorded steps.")

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def layers_per_stage(self) -> int:
        return self.layers // self.pp

    @property
    def dtype_bytes(self) -> int:
        return _tp.DTYPES[self.dtype]

    @property
    def activation_bytes(self) -> int:
        """Bytes of one PP message (an activation or its gradient): micro_batch × seq × hidden × dtype."""
        return self.micro_batch * self.seq * self.hidden * self.dtype_bytes

    def tp_config(self) -> "_tp.TPConfig":
        """The TP workload's config of the same model (weights, shapes): the whole model, one micro-batch."""
        return _tp.TPConfig(
            ranks=self.tp, layers=self.layers, hidden=self.hidden, heads=self.heads, ffn=self.ffn, seq=self.seq,
            batch=self.micro_batch, dtype=self.dtype, seed=self.seed, mode="train", lr=self.lr,
        ).resolved()

    def resolved(self) -> "ThreeDConfig":
        """A validated copy (steps, ffn, dtype filled in). Raises BadInputError, one line."""
        c = dataclasses.replace(self)
        for name in ("tp", "pp", "dp", "layers", "hidden", "heads", "seq", "micro_batch", "microbatches", "bucket_kb"):
            v = getattr(c, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise BadInputError(f"{name} must be a positive integer, got {v}")
        _launch.validate_ranks(c.ranks)
        if c.layers % c.pp:
            raise BadInputError(f"layers ({c.layers}) must be divisible by pp ({c.pp}): each stage holds layers/pp layers")
        if c.dp_mode not in DP_MODES:
            raise BadInputError(f"unknown dp_mode {c.dp_mode!r} (choose one of {', '.join(DP_MODES)})")
        if not (isinstance(c.lr, (int, float)) and c.lr > 0):
            raise BadInputError(f"lr must be a positive number, got {c.lr}")
        c.dtype = _tp._DTYPE_ALIASES.get(c.dtype, c.dtype)
        if c.dtype not in _tp.DTYPES:
            raise BadInputError(f"unsupported dtype {self.dtype!r} (choose one of {', '.join(_tp.DTYPES)})")
        c.ffn = c.tp_config().ffn  # the TP config checks heads/hidden/ffn against tp
        c.steps = _launch.validate_schedule(c.wait, c.warmup, c.active, c.steps)
        _launch.validate_run_options(c.backend, c.timeout_s, c.fault, (None, "raise"))
        return c


# --------------------------------------------------------------------------- layout and buckets


def coords(rank: int, tp: int, pp: int, dp: int) -> tuple[int, int, int]:
    """(tp index, pp stage, dp index) of global `rank` (rank = t + T·(d + D·p))."""
    return rank % tp, rank // (tp * dp), (rank // tp) % dp


def layout(tp: int, pp: int, dp: int) -> dict[str, list[list[int]]]:
    """Every group of each dimension as lists of global ranks, in creation order:
    {"tp": [...], "dp": [...], "pp": [...]} (module docstring, "Layout")."""
    def rank(t, p, d):
        return t + tp * (d + dp * p)

    return {
        "tp": [[rank(t, p, d) for t in range(tp)] for p in range(pp) for d in range(dp)],
        "dp": [[rank(t, p, d) for d in range(dp)] for p in range(pp) for t in range(tp)],
        "pp": [[rank(t, p, d) for p in range(pp)] for d in range(dp) for t in range(tp)],
    }


def make_buckets(sizes: list[int], cap_bytes: int) -> list[list[int]]:
    """DDP's bucketing: parameter indices in reverse order (the order backward makes their
    gradients), a bucket closed once its bytes reach `cap_bytes`; `sizes` are bytes per
    parameter in forward order. Returns the buckets (lists of indices), first launched first."""
    buckets, cur, cur_bytes = [], [], 0
    for i in reversed(range(len(sizes))):
        cur.append(i)
        cur_bytes += sizes[i]
        if cur_bytes >= cap_bytes:
            buckets.append(cur)
            cur, cur_bytes = [], 0
    if cur:
        buckets.append(cur)
    return buckets


def stage_param_shapes(cfg: ThreeDConfig, stage: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of a TP rank's parameters on `stage`, in forward order (layers numbered globally)."""
    H, F, T = cfg.hidden, cfg.ffn, cfg.tp
    out = []
    for j in range(stage * cfg.layers_per_stage, (stage + 1) * cfg.layers_per_stage):
        for k, shape in (("attn_norm", (H,)), ("wqkv", (3 * H // T, H)), ("wo", (H, H // T)), ("mlp_norm", (H,)),
                         ("w_gate_up", (2 * F // T, H)), ("w_down", (H, F // T))):
            out.append((f"layers.{j}.{k}", shape))
    if stage == cfg.pp - 1:
        out.append(("final_norm", (H,)))
    return out


def stage_buckets(cfg: ThreeDConfig, stage: int) -> list[list[int]]:
    """The DP buckets of a rank on `stage` (indices into :func:`stage_param_shapes`)."""
    import math

    sizes = [math.prod(s) * cfg.dtype_bytes for _, s in stage_param_shapes(cfg, stage)]
    return make_buckets(sizes, cfg.bucket_kb * 1024)


def expected_counts(cfg: ThreeDConfig, rank: int) -> dict[str, int]:
    """What `rank` issues per step: TP all-reduces (4 × layers of its stage × microbatches),
    PP sends and recvs, DP buckets and DP collectives (ddp: buckets all-reduces; fsdp: buckets
    reduce-scatters + buckets all-gathers)."""
    _, p, _ = coords(rank, cfg.tp, cfg.pp, cfg.dp)
    M = cfg.microbatches
    sends = (M if p < cfg.pp - 1 else 0) + (M if p > 0 else 0)
    nb = len(stage_buckets(cfg, p))
    return {
        "tp_all_reduce": 4 * cfg.layers_per_stage * M if cfg.tp > 1 else 0,
        "pp_send": sends if cfg.pp > 1 else 0,
        "pp_recv": sends if cfg.pp > 1 else 0,
        "dp_buckets": nb,
        "dp_all_reduce": nb if cfg.dp > 1 and cfg.dp_mode == "ddp" else 0,
        "dp_reduce_scatter": nb if cfg.dp > 1 and cfg.dp_mode == "fsdp" else 0,
        "dp_all_gather": nb if cfg.dp > 1 and cfg.dp_mode == "fsdp" else 0,
    }


def make_data(cfg: ThreeDConfig):
    """(inputs, targets), each (dp, microbatches, micro_batch, seq, hidden), from the seed."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(cfg.seed + 3_000_017)
    shape = (cfg.dp, cfg.microbatches, cfg.micro_batch, cfg.seq, cfg.hidden)
    dt = _tp.torch_dtype(cfg.dtype)
    return torch.randn(shape, generator=g).to(dt), torch.randn(shape, generator=g).to(dt)


# --------------------------------------------------------------------------- DP: buckets on the backward


class DPBuckets:
    """A rank's gradient buckets on the ``dp`` group (module docstring, "DP").

    ``arm()`` before the last micro-batch's backward: from then on, each bucket is launched
    asynchronously as soon as every gradient in it has been accumulated. ``finish()`` waits for
    all, averages, and applies the SGD step (ddp: to every parameter; fsdp: to this rank's shard
    of each bucket, then all-gathers the shards). ``reduced``: the first step's DP-reduced
    gradients, for the check (ddp: {name: grad}; fsdp: {bucket: flat shard}).
    """

    def __init__(self, params: list[tuple[str, Any]], buckets: list[list[int]], group, dp: int, dp_index: int,
                 mode: str, lr: float):
        self.params, self.buckets, self.group = params, buckets, group
        self.dp, self.dp_index, self.mode, self.lr = dp, dp_index, mode, lr
        self.bucket_of = {i: b for b, idx in enumerate(buckets) for i in idx}
        self.armed = False
        self.pending: list[int] = []
        self.works: dict[int, tuple] = {}
        self.reduced: dict | None = None
        for i, (_, p) in enumerate(params):
            p.register_post_accumulate_grad_hook(self._hook(i))

    def _hook(self, i: int):
        def hook(p) -> None:
            if not self.armed:
                return
            b = self.bucket_of[i]
            self.pending[b] -= 1
            if self.pending[b] == 0:
                self._launch(b)

        return hook

    def arm(self) -> None:
        self.armed = True
        self.pending = [len(idx) for idx in self.buckets]
        self.works = {}

    def _flat(self, b: int, grads: bool):
        import torch

        ts = [(self.params[i][1].grad if grads else self.params[i][1].detach()).reshape(-1) for i in self.buckets[b]]
        flat = torch.cat(ts)
        pad = (-flat.numel()) % self.dp if self.mode == "fsdp" else 0
        return torch.nn.functional.pad(flat, (0, pad)) if pad else flat

    def _launch(self, b: int) -> None:
        import torch
        import torch.distributed as dist
        from torch.profiler import record_function

        with record_function(f"dp.bucket{b}.{'all_reduce' if self.mode == 'ddp' else 'reduce_scatter'}"):
            flat = self._flat(b, grads=True)
            if self.dp == 1:
                self.works[b] = (None, flat, flat)
            elif self.mode == "ddp":
                self.works[b] = (dist.all_reduce(flat, group=self.group, async_op=True), flat, flat)
            else:
                out = torch.empty(flat.numel() // self.dp, dtype=flat.dtype)
                self.works[b] = (dist.reduce_scatter_tensor(out, flat, group=self.group, async_op=True), flat, out)

    def finish(self) -> None:
        """Wait for every bucket, average, take the SGD step (module docstring)."""
        import torch
        import torch.distributed as dist
        from torch.profiler import record_function

        self.armed = False
        if len(self.works) != len(self.buckets):
            raise TracekitError(f"only {len(self.works)} of {len(self.buckets)} gradient buckets were launched")
        first = self.reduced is None
        if first:
            self.reduced = {}
        with record_function("dp.finish"), torch.no_grad():
            for b, idx in enumerate(self.buckets):
                work, _flat, out = self.works[b]
                if work is not None:
                    work.wait()
                out.div_(self.dp)
                if self.mode == "ddp":
                    off = 0
                    for i in idx:
                        name, p = self.params[i]
                        n = p.numel()
                        p.grad.copy_(out[off : off + n].view_as(p))
                        off += n
                        if first:
                            self.reduced[name] = p.grad.clone()
                        p.add_(p.grad, alpha=-self.lr)
                else:
                    if first:
                        self.reduced[b] = out.clone()
                    flat_p = self._flat(b, grads=False)
                    n = out.numel()
                    shard = flat_p[self.dp_index * n : (self.dp_index + 1) * n] - self.lr * out
                    full = torch.empty_like(flat_p)
                    if self.dp > 1:
                        dist.all_gather_into_tensor(full, shard.contiguous(), group=self.group)
                    else:
                        full.copy_(shard)
                    off = 0
                    for i in idx:
                        _, p = self.params[i]
                        p.copy_(full[off : off + p.numel()].view_as(p))
                        off += p.numel()
            for _, p in self.params:
                p.grad = None


# --------------------------------------------------------------------------- PP: the exchange


class _Exchange:
    """The pp.run_program exchange on the ``pp`` group: recvs posted, sends handed to a
    :class:`tracekit.collectors.workloads.pp.WorkWaiter`, recvs waited for."""

    def __init__(self, cfg: ThreeDConfig, stage_rank: Callable[[int], int], group):
        from tracekit.collectors.workloads.pp import WorkWaiter

        self.cfg, self.stage_rank, self.group = cfg, stage_rank, group
        self.waiter = WorkWaiter("pp-send-waiter")

    def __call__(self, sends: list, recvs: list) -> dict:
        import torch
        import torch.distributed as dist
        from torch.profiler import record_function

        M = self.cfg.microbatches
        got: dict = {}
        with record_function("pp.p2p"):
            works = []
            shape = (self.cfg.micro_batch, self.cfg.seq, self.cfg.hidden)
            for msg in recvs:
                buf = torch.empty(shape, dtype=_tp.torch_dtype(self.cfg.dtype))
                got[msg] = buf
                works.append(dist.irecv(buf, src=self.stage_rank(msg.src), group=self.group, tag=msg.tag(M)))
            for msg, t in sends:
                t = t.contiguous()
                self.waiter.put(dist.isend(t, dst=self.stage_rank(msg.dst), group=self.group, tag=msg.tag(M)), t)
            for w in works:
                w.wait()
        return got


# --------------------------------------------------------------------------- one rank


def _new_groups(cfg: ThreeDConfig, rank: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Create every group (all ranks, same order); return this rank's {dim: group} and
    [{"pg_name", "desc", "ranks"}] of the groups it belongs to."""
    import torch.distributed as dist

    mine, named = {}, []
    for dim, groups in layout(cfg.tp, cfg.pp, cfg.dp).items():
        for ranks in groups:
            g = dist.new_group(ranks, group_desc=dim)
            if rank in ranks:
                mine[dim] = g
                named.append({"pg_name": g.group_name, "desc": dim, "ranks": ranks})
    return mine, named


def _rank_3d(ctx: _launch.RankContext, cfg: ThreeDConfig) -> dict[str, Any]:
    """What each rank process runs (module docstring)."""
    import torch
    import torch.distributed as dist

    from tracekit.collectors.workloads.pp import run_program, stage_program

    T, P, D, M = cfg.tp, cfg.pp, cfg.dp, cfg.microbatches
    t_idx, stage, d_idx = coords(ctx.rank, T, P, D)
    groups, named = _new_groups(cfg, ctx.rank)
    if cfg.fault == "raise" and ctx.rank == ctx.world_size - 1:
        raise RuntimeError("injected fault (ThreeDConfig.fault='raise')")
    tcfg = cfg.tp_config()
    full = _tp.init_weights(tcfg)
    shard = _tp.shard_weights(full, t_idx, T, cfg.heads)
    lo, hi = stage * cfg.layers_per_stage, (stage + 1) * cfg.layers_per_stage
    last = stage == P - 1
    mine = {"layers": shard["layers"][lo:hi]}
    if last:
        mine["final_norm"] = shard["final_norm"]
    params = []  # (global name, tensor) in forward order, as stage_param_shapes
    for n, p in _tp.shard_parameters(mine):
        if n.startswith("layers."):
            _, j, k = n.split(".", 2)
            n = f"layers.{lo + int(j)}.{k}"
        params.append((n, p))
    buckets = stage_buckets(cfg, stage)
    dp_state = DPBuckets(params, buckets, groups.get("dp"), D, d_idx, cfg.dp_mode, cfg.lr)
    inputs, targets = make_data(cfg)
    tp_group = groups["tp"]

    def all_reduce(t) -> None:
        dist.all_reduce(t, group=tp_group)

    tp_ar = all_reduce if T > 1 else None
    saved: dict[int, tuple] = {}
    losses: dict[int, float] = {}

    def compute(act, inp):
        from torch.profiler import record_function

        with record_function(f"stage{stage}.{act.op}.mb{act.mb}"):
            m = act.mb
            if act.op == "forward":
                x_in = None if stage == 0 else inp.requires_grad_(True)
                x = inputs[d_idx, m] if stage == 0 else x_in
                for j, layer in enumerate(mine["layers"]):
                    x = _tp.block_train(x, layer, tp_ar, cfg.eps, f"layer{lo + j}")
                if last:
                    loss = _tp.mse_loss(_tp.rms_norm(x, mine["final_norm"], cfg.eps), targets[d_idx, m]) / M
                    saved[m] = (x_in, loss)
                    losses[m] = loss.item()
                    return None
                saved[m] = (x_in, x)
                return x.detach()
            x_in, y = saved.pop(m)
            if m == M - 1:
                dp_state.arm()  # the last micro-batch's backward launches the buckets
            if last:
                torch.autograd.backward(y)
            else:
                torch.autograd.backward(y, grad_tensors=inp)
            return x_in.grad if x_in is not None else None

    program = stage_program("1f1b", "train", P, stage, M)
    exchange = _Exchange(cfg, lambda s: t_idx + T * (d_idx + D * s), groups["pp"])
    first_losses: dict[int, float] = {}
    dist.barrier()
    schedule = _launch.ProfileSchedule(cfg.wait, cfg.warmup, cfg.active)
    out_file = ctx.trace_path()
    prof = _launch.make_profiler(schedule, out_file, use_cuda=ctx.is_cuda)
    step_s: list[float] = []
    try:
        with prof:
            for step in ctx.profiled_steps(prof, cfg.steps, step_s):
                run_program(program, compute, exchange)
                exchange.waiter.drain()
                dp_state.finish()
                if step == 0:
                    first_losses = dict(losses)
    finally:
        exchange.waiter.close()
    ctx.check_trace(out_file)
    if ctx.rank == 0:
        ctx.progress("checking gradients against the single-process reference")
    check = _check(cfg, full, inputs, targets, dp_state, params, buckets, t_idx, d_idx, first_losses if last else None)
    return {
        "rank": ctx.rank,
        "coords": {"tp": t_idx, "pp": stage, "dp": d_idx},
        "process_groups": named,
        **check,
        "step_s": step_s,
        "threads": torch.get_num_threads(),
        "trace": out_file.name,
        "trace_bytes": out_file.stat().st_size,
    }


def reference_step(cfg: ThreeDConfig, full: dict[str, Any], inputs, targets) -> tuple[list[list[float]], dict[str, Any]]:
    """The first step single-process: every replica's micro-batches through the full model,
    loss_dm = mse / M, Σ loss / D backward. Returns ([replica][micro-batch] loss_dm, {name: grad})
    (one-rank shard names, see tp.sharded_grads)."""
    tcfg = cfg.tp_config()
    shard = _tp.shard_weights(full, 0, 1, cfg.heads)
    params = _tp.shard_parameters(shard)
    losses = []
    for d in range(cfg.dp):
        row = []
        for m in range(cfg.microbatches):
            loss = _tp.mse_loss(_tp.forward_train(inputs[d, m], shard, None, tcfg.eps), targets[d, m]) / cfg.microbatches
            (loss / cfg.dp).backward()
            row.append(loss.item())
        losses.append(row)
    return losses, {n: p.grad for n, p in params}


def _check(cfg, full, inputs, targets, dp_state: DPBuckets, params, buckets, t_idx, d_idx, first_losses) -> dict[str, Any]:
    """The rank's first-step DP-reduced gradients (and the last stage's losses) against
    :func:`reference_step`; raises ThreeDMismatchError beyond tp.GRAD_TOLERANCE."""
    import torch

    ref_losses, ref = reference_step(cfg, full, inputs, targets)
    ref = _tp.sharded_grads(ref, t_idx, cfg.tp, cfg.heads)
    if cfg.dp_mode == "ddp":
        got, want = dp_state.reduced, {n: ref[n] for n, _ in params}
    else:
        got, want = {}, {}
        for b, idx in enumerate(buckets):
            flat = torch.cat([ref[params[i][0]].reshape(-1) for i in idx])
            flat = torch.nn.functional.pad(flat, (0, (-flat.numel()) % cfg.dp))
            n = flat.numel() // cfg.dp
            got[f"bucket{b}"], want[f"bucket{b}"] = dp_state.reduced[b], flat[d_idx * n : (d_idx + 1) * n]
    g = _tp.compare_grads(got, want, cfg.dtype)
    loss_err = 0.0
    if first_losses is not None:
        loss_err = max(abs(first_losses[m] - ref_losses[d_idx][m]) / abs(ref_losses[d_idx][m]) for m in first_losses)
    tol = _tp.GRAD_TOLERANCE[cfg.dtype]
    if not g["passed"] or loss_err > tol:
        raise ThreeDMismatchError(
            f"3-D gradients differ from the single-process reference: worst {g['worst']} relative RMS error "
            f"{g['max_rel_rms_err']:.3g}, loss relative error {loss_err:.3g} (needs {g['criterion']} for {cfg.dtype})"
        )
    return {"grad_rel_rms_err": g["max_rel_rms_err"], "worst_grad": g["worst"], "grads_checked": len(want),
            "loss_rel_err": loss_err, "criterion": g["criterion"],
            "loss": sum(first_losses.values()) if first_losses else None}


# --------------------------------------------------------------------------- the job


def run_3d(config: ThreeDConfig, on_progress: Callable[[str], None] | None = None) -> Path:
    """Run the 3-D workload on tp × pp × dp processes with the profiler on.

    Returns the run folder (``<out>/3d-YYYYmmdd-HHMMSS-xxxx``) with one
    ``rank{r}.pt.trace.json.gz`` per rank and ``run_config.json``. Raises BadInputError for an
    impossible configuration, RankFailedError when a rank fails (a mismatch included)."""
    cfg = config.resolved()
    backend = _launch.resolve_backend(cfg.backend, cfg.ranks)
    info = _launch.host_info()
    run_dir = _launch.new_run_dir(cfg.out, "3d")
    created = _dt.datetime.now(_dt.timezone.utc).astimezone()
    t0 = time.perf_counter()
    results = _launch.launch(_rank_3d, cfg.ranks, backend, run_dir, cfg, timeout_s=cfg.timeout_s, on_progress=on_progress)
    wall = time.perf_counter() - t0
    doc = build_run_config(run_dir.name, cfg, backend, info, results, wall, created)
    _launch.write_json(run_dir / "run_config.json", doc)
    return run_dir


def build_run_config(run_id, cfg: ThreeDConfig, backend, info, results, wall_s, created) -> dict[str, Any]:
    """The run_config.json document: options, layout, the named process groups, what each rank
    issues per step (``expected``), the check, timings."""
    groups: dict[str, dict[str, Any]] = {}
    for r in results:
        for g in r["process_groups"]:
            groups[g["pg_name"]] = g
    active = _launch.active_steps(cfg.wait, cfg.warmup, cfg.active)
    per_rank_steps = [r["step_s"] for r in results]
    return {
        "workload": "3d",
        "run_id": run_id,
        "created_at": created.isoformat(timespec="seconds"),
        **_launch.config_options(cfg),
        "world_size": cfg.ranks,
        "backend": backend,
        "dtype_bytes": cfg.dtype_bytes,
        "layers_per_stage": cfg.layers_per_stage,
        "schedule": "1f1b",
        # the layout the analyses infer dimensions from (analyses/process_groups.sql)
        "parallel_layout": {"order": "tp-dp-pp", "tp": cfg.tp, "dp": cfg.dp, "pp": cfg.pp,
                            "rank": "t + tp*(d + dp*p)"},
        "process_groups": sorted(groups.values(), key=lambda g: (g["desc"], g["ranks"])),
        **_launch.run_config_base(info, results, backend, cfg.wait, cfg.warmup, cfg.active),
        "expected": {
            "per_rank_per_step": [expected_counts(cfg, r) for r in range(cfg.ranks)],
            "tp_all_reduce_bytes": cfg.activation_bytes,
            "pp_message_bytes": cfg.activation_bytes,
            "dp_bucket_bytes": [[sum(_numel(s) for i, (_, s) in enumerate(stage_param_shapes(cfg, p)) if i in b)
                                 * cfg.dtype_bytes for b in stage_buckets(cfg, p)] for p in range(cfg.pp)],
        },
        "check": {
            "passed": True,
            "max_grad_rel_rms_err": max(r["grad_rel_rms_err"] for r in results),
            "max_loss_rel_err": max(r["loss_rel_err"] for r in results),
            "worst_grad": max(results, key=lambda r: r["grad_rel_rms_err"])["worst_grad"],
            "criterion": results[0]["criterion"],
            "reference": "single-process forward/backward of the first step, every replica's micro-batches, "
            "the rank's DP-reduced gradients sliced as its weights (fsdp: its shard of each bucket)",
        },
        "timing": {
            "job_wall_s": round(wall_s, 3),
            "clock": "time.perf_counter around each step (1F1B program, DP finish, SGD), per rank",
            "step_wall_s": [[round(s, 6) for s in r] for r in per_rank_steps],
            **_launch.step_medians(per_rank_steps, active),
        },
        "traces": [r["trace"] for r in results],
        "overlap_model": _launch.overlap_model("pipeline", stages=cfg.pp, microbatches=cfg.microbatches),
        # per dimension, the model analyses/measured_vs_model.py applies to that dimension's calls
        "overlap_models": {
            "tp": _launch.overlap_model("no_overlap"),
            "pp": _launch.overlap_model("pipeline", stages=cfg.pp, microbatches=cfg.microbatches),
            "dp": _launch.overlap_model("bucket_overlap",
                                        buckets=[expected_counts(cfg, r)["dp_buckets"] for r in range(cfg.ranks)]),
        },
    }


def _numel(shape) -> int:
    import math

    return math.prod(shape)
