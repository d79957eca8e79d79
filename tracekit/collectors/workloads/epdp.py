"""EP × DP: the MoE layers of :mod:`tracekit.collectors.workloads.ep`, trained, with the experts
sharded over an expert-parallel group inside each of D data-parallel replicas
(``tracekit collect ep --dp D``; ranks = EP · D, default 2 × D).

**Layout** (ep fastest): global rank = e + EP·d for EP index e and replica d. Every rank creates
every group, in the same order, each with its description (``new_group(ranks, group_desc=...)``):

- ``ep``: the EP ranks of replica d, {e + EP·d}: they hold all E experts between them (rank e
  the experts [e·E/EP, (e+1)·E/EP)) and exchange tokens with all-to-alls;
- ``dp``: the D ranks of EP index e, {e + EP·d}: the replicas of the same experts.

**A step** (one per profiler step), on every rank's own tokens (``ep.make_input`` with the
global rank) and targets: the forward of ep.py (attention, router, per layer a split-count
all-to-all of E int64 counts, the dispatch and the combine all-to-alls on the ``ep`` group, with
the router's uneven splits), loss = mean((out − target)²), backward. The data all-to-alls are
``torch.distributed.nn.functional.all_to_all_single``, whose backward is the reverse all-to-all:
each layer's combine, and each layer's dispatch but layer 0's (whose input depends on no trained
weight), send gradients back. Per rank and step on its ``ep`` group: 3·L all-to-alls forward and
2·L − 1 backward.

**Trained**: the experts only (the attention, router and norms are frozen, so the replicated
weights need no gradient exchange). An expert's gradient sums every token of the EP group routed
to it; the D replicas of an expert average theirs as DDP does (threed.DPBuckets: buckets of the
expert weights in reverse forward order, closed at ≥ ``bucket_kb`` KiB, each launched
``async_op=True`` on the ``dp`` group as soon as its gradients are accumulated, so it overlaps the
rest of the backward; SGD after all). Per rank and step: one all-reduce per bucket.

**Check**: after the run each rank recomputes the first step single-process: every rank's
tokens through the full model (all experts, ``ep.reference_forward``), Σ over replicas d and EP
ranks e of the loss ÷ D, backward; its DP-reduced expert gradients must match the reference's
for its experts (tp.GRAD_TOLERANCE), else the job fails.

Public API: :func:`layout`, :func:`expected_counts`, :func:`run_epdp` (``tracekit collect ep`` calls it when
``dp`` > 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from tracekit.collectors import launch as _launch
from tracekit.collectors.workloads import ep as _ep
from tracekit.collectors.workloads import tp as _tp
from tracekit.collectors.workloads.threed import DPBuckets, make_buckets


def layout(ep: int, dp: int) -> dict[str, list[list[int]]]:
    """{"ep": groups, "dp": groups} of global ranks, rank = e + ep·d (module docstring)."""
    return {"ep": [[e + ep * d for e in range(ep)] for d in range(dp)],
            "dp": [[e + ep * d for d in range(dp)] for e in range(ep)]}


def expert_params(cfg: "_ep.EPConfig") -> list[tuple[str, tuple[int, int]]]:
    """(name, shape) of one rank's trained weights in forward order: per layer, per local expert
    j (global cfg.experts_per_rank·e + j, named by local index here), w_gate_up then w_down."""
    H, F = cfg.hidden, cfg.ffn
    return [(f"layers.{i}.experts.{j}.{w}", shape) for i in range(cfg.layers) for j in range(cfg.experts_per_rank)
            for w, shape in (("w_gate_up", (2 * F, H)), ("w_down", (H, F)))]


def buckets(cfg: "_ep.EPConfig") -> list[list[int]]:
    """DDP's buckets of :func:`expert_params` (threed.make_buckets, ``bucket_kb`` KiB)."""
    sizes = [s[0] * s[1] * cfg.dtype_bytes for _, s in expert_params(cfg)]
    return make_buckets(sizes, cfg.bucket_kb * 1024)


def expected_counts(cfg: "_ep.EPConfig") -> dict[str, Any]:
    """Per rank and step: the all-to-alls on its ep group and the all-reduces on its dp group."""
    L = cfg.layers
    shapes = expert_params(cfg)
    bks = buckets(cfg)
    return {"ep_all_to_all_forward": 3 * L, "ep_all_to_all_backward": 2 * L - 1,
            "ep_all_to_all": 5 * L - 1, "ep_split_exchange": L, "split_exchange_bytes": cfg.experts * _ep.COUNT_BYTES,
            "dp_buckets": len(bks), "dp_all_reduce": len(bks),
            "dp_bucket_bytes": [sum(shapes[i][1][0] * shapes[i][1][1] for i in b) * cfg.dtype_bytes for b in bks]}


def make_target(cfg: "_ep.EPConfig", rank: int, step: int, device="cpu"):
    """Rank `rank`'s regression target at step `step` (batch, seq, hidden), from ``cfg.seed``."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(cfg.seed + 2_000_029 + 7919 * rank + 104_729 * step)
    return torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g).to(device=device, dtype=_tp.torch_dtype(cfg.dtype))


def forward(x, shard: dict[str, Any], cfg: "_ep.EPConfig", ep: int, group, routing: list):
    """The layers on x (batch, seq, H) with the rank's `shard`, all-to-alls on `group` (ep ranks),
    differentiable; appends each layer's top-k expert ids (T, k) to `routing`. Returns the output."""
    import torch
    import torch.distributed as dist
    from torch.distributed.nn.functional import all_to_all_single
    from torch.profiler import record_function

    E, k, H = cfg.experts, cfg.top_k, cfg.hidden
    El = E // ep
    for i, layer in enumerate(shard["layers"]):
        if cfg.attention:
            with record_function(f"layer{i}.attention"):
                x = x + _tp.attention_partial(_tp.rms_norm(x, layer["attn_norm"], cfg.eps), layer)
        with record_function(f"layer{i}.router"):
            shape = x.shape
            h = _tp.rms_norm(x, layer["mlp_norm"], cfg.eps).reshape(-1, H)
            idx, gates, _ = _ep.route(h, layer, k)
            order = torch.argsort(idx.reshape(-1), stable=True)  # assignments by expert, so by owner rank
            tok = torch.div(order, k, rounding_mode="floor")
            gate_sorted = gates.reshape(-1)[order].to(x.dtype).unsqueeze(1)
            counts = torch.bincount(idx.reshape(-1), minlength=E)
        routing.append(idx)
        with record_function(f"layer{i}.dispatch"):
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=group)
            per_src = recv_counts.view(ep, El)
            in_splits, out_splits = counts.view(ep, El).sum(1).tolist(), per_src.sum(1).tolist()
            recv = all_to_all_single(h.new_empty(sum(out_splits), H), h[tok], out_splits, in_splits, group=group)
        with record_function(f"layer{i}.experts"):
            # received rows: by source rank, then by local expert; every local expert runs (maybe
            # on no rows) so that each of its weights gets a gradient every step
            row_expert = torch.repeat_interleave(torch.arange(El, device=recv.device).repeat(ep), per_src.reshape(-1))
            by_expert = torch.argsort(row_expert, stable=True)
            rows = recv[by_expert]
            sizes = per_src.sum(0).tolist()
            outs = [_ep.expert_mlp(part, layer["experts"][j]) for j, part in enumerate(torch.split(rows, sizes))]
            done = torch.zeros_like(recv).index_copy(0, by_expert, torch.cat(outs))
        with record_function(f"layer{i}.combine"):
            back = all_to_all_single(h.new_empty(h.shape[0] * k, H), done, in_splits, out_splits, group=group)
        with record_function(f"layer{i}.unpermute"):
            x = x + torch.zeros_like(h).index_add(0, tok, back * gate_sorted).reshape(shape)
    return _tp.rms_norm(x, shard["final_norm"], cfg.eps)


def _trained(shard: dict[str, Any]) -> list[tuple[str, Any]]:
    """The shard's expert weights as (name, leaf tensor requiring grad), in :func:`expert_params` order."""
    out = []
    for i, layer in enumerate(shard["layers"]):
        for j, ex in enumerate(layer["experts"]):
            for w in ("w_gate_up", "w_down"):
                ex[w] = ex[w].detach().requires_grad_(True)
                out.append((f"layers.{i}.experts.{j}.{w}", ex[w]))
    return out


def reference_grads(cfg: "_ep.EPConfig", e_idx: int) -> dict[str, Any]:
    """The first step single-process (module docstring, "Check"): the gradients of EP index
    e_idx's experts, named as :func:`expert_params`."""
    full = _ep.init_weights(cfg)
    ep = cfg.ranks // cfg.dp
    mine = _trained(_ep.shard_weights(full, e_idx, ep))
    for layer in full["layers"]:  # the other experts must be differentiable too: their tokens flow on
        for ex in layer["experts"]:
            for w in ("w_gate_up", "w_down"):
                if not ex[w].requires_grad:
                    ex[w] = ex[w].detach().requires_grad_(True)
    total = 0.0
    for r in range(cfg.ranks):
        out, _ = _ep.reference_forward(_ep.make_input(cfg, r, 0), full, cfg)
        total = total + _tp.mse_loss(out, make_target(cfg, r, 0))
    (total / cfg.dp).backward()
    return {n: p.grad for n, p in mine}


def _rank(ctx: _launch.RankContext, cfg: "_ep.EPConfig") -> dict[str, Any]:
    """What each rank process runs (module docstring)."""
    import torch
    import torch.distributed as dist

    ep, D = cfg.ranks // cfg.dp, cfg.dp
    e_idx, d_idx = ctx.rank % ep, ctx.rank // ep
    mine, named = {}, []
    for dim, groups in layout(ep, D).items():
        for ranks in groups:
            g = dist.new_group(ranks, group_desc=dim)
            if ctx.rank in ranks:
                mine[dim] = g
                named.append({"pg_name": g.group_name, "desc": dim, "ranks": ranks})
    if cfg.fault == "raise" and ctx.rank == ctx.world_size - 1:
        raise RuntimeError("injected fault (EPConfig.fault='raise')")
    shard = _ep.shard_weights(_ep.init_weights(cfg, device=ctx.device), e_idx, ep)
    params = _trained(shard)
    if cfg.fault == "corrupt_expert" and ctx.rank == ctx.world_size - 1:
        with torch.no_grad():
            params[0][1].mul_(1.5)
    dp_state = DPBuckets(params, buckets(cfg), mine["dp"], D, d_idx, "ddp", cfg.lr)
    dist.barrier()
    schedule = _launch.ProfileSchedule(cfg.wait, cfg.warmup, cfg.active)
    out_file = ctx.trace_path()
    prof = _launch.make_profiler(schedule, out_file, use_cuda=ctx.is_cuda)
    step_s: list[float] = []
    losses = []
    with prof:
        for step in ctx.profiled_steps(prof, cfg.steps, step_s):
            out = forward(_ep.make_input(cfg, ctx.rank, step, device=ctx.device), shard, cfg, ep, mine["ep"], [])
            loss = _tp.mse_loss(out, make_target(cfg, ctx.rank, step, device=ctx.device))
            dp_state.arm()
            loss.backward()
            dp_state.finish()
            losses.append(loss.item())
    ctx.check_trace(out_file)
    if ctx.rank == 0:
        ctx.progress("checking expert gradients against the single-process reference")
    got = {n: v.cpu() for n, v in dp_state.reduced.items()}  # the reference runs on the CPU
    g = _tp.compare_grads(got, reference_grads(cfg, e_idx), cfg.dtype)
    if not g["passed"]:
        raise _ep.EPMismatchError(
            f"EP x DP expert gradients differ from the single-process reference: worst {g['worst']} relative RMS "
            f"error {g['max_rel_rms_err']:.3g} (needs {g['criterion']} for {cfg.dtype})")
    return {"rank": ctx.rank, "coords": {"ep": e_idx, "dp": d_idx}, "process_groups": named,
            "grad_rel_rms_err": g["max_rel_rms_err"], "worst_grad": g["worst"], "criterion": g["criterion"],
            "losses": losses, "step_s": step_s, "threads": torch.get_num_threads(), "trace": out_file.name}


def run_epdp(cfg: "_ep.EPConfig", on_progress: Callable[[str], None] | None = None) -> Path:
    """Run EP × DP (``cfg`` resolved, dp > 1) with the profiler on; returns the run folder
    (``<out>/ep-...``) with a trace per rank and run_config.json. Raises RankFailedError when a
    rank fails (a gradient mismatch included)."""
    backend = _launch.resolve_backend(cfg.backend, cfg.ranks)
    info = _launch.host_info()
    run_dir = _launch.new_run_dir(cfg.out, "ep")
    results, wall, created = _launch.timed_launch(_rank, cfg, backend, run_dir, on_progress)
    ep, active = cfg.ranks // cfg.dp, _launch.active_steps(cfg.wait, cfg.warmup, cfg.active)
    groups = {g["pg_name"]: g for r in results for g in r["process_groups"]}
    exp = expected_counts(cfg)
    per_rank_steps = [r["step_s"] for r in results]
    doc = {
        "workload": "ep", "run_id": run_dir.name, "created_at": created.isoformat(timespec="seconds"),
        **_launch.config_options(cfg), "world_size": cfg.ranks, "backend": backend, "dtype_bytes": cfg.dtype_bytes,
        "experts_per_rank": cfg.experts_per_rank, "trained": "experts only (attention, router, norms frozen)",
        # the layout the analyses infer dimensions from (analyses/process_groups.sql)
        "parallel_layout": {"order": "ep-dp", "ep": ep, "dp": cfg.dp, "rank": "e + ep*d"},
        "process_groups": sorted(groups.values(), key=lambda g: (g["desc"], g["ranks"])),
        **_launch.run_config_base(info, results, backend, cfg.wait, cfg.warmup, cfg.active),
        "expected": {"per_rank_per_step": exp},
        "check": {"passed": True, "max_grad_rel_rms_err": max(r["grad_rel_rms_err"] for r in results),
                  "worst_grad": max(results, key=lambda r: r["grad_rel_rms_err"])["worst_grad"],
                  "criterion": results[0]["criterion"],
                  "reference": "single-process forward/backward of the first step, every rank's tokens, all experts, "
                               "Σ loss ÷ dp; the rank's DP-reduced expert gradients"},
        "timing": {"job_wall_s": round(wall, 3), "clock": "time.perf_counter around each step, per rank",
                   "step_wall_s": [[round(s, 6) for s in r] for r in per_rank_steps],
                   **_launch.step_medians(per_rank_steps, active)},
        "traces": [r["trace"] for r in results],
        "overlap_model": _launch.overlap_model("no_overlap"),
        # per dimension, the model analyses/measured_vs_model.py applies to that dimension's calls
        "overlap_models": {"ep": _launch.overlap_model("no_overlap"),
                           "dp": _launch.overlap_model("bucket_overlap", buckets=exp["dp_buckets"])},
    }
    _launch.write_json(run_dir / "run_config.json", doc, indent=1)
    return run_dir
