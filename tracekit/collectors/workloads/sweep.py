"""The calibration sweep: each collective over a range of sizes, for the α–β fit.

On every rank, for each op in ``ops`` and each size S in
``min_bytes, min_bytes·factor, ... ≤ max_bytes`` (S is nccl-tests' S, see
below), the sweep runs ``warmup_iters`` unprofiled-in-effect calls, then
``iters`` measured calls. The α–β fit (``analyses/fit.py``, table
``alpha_beta_fit``) turns the measured (size, sync time) pairs of the ingested
run into this machine's α, β and n½ per (op, group size).

What each op moves (S = the configured size, float32 elements, N ranks):

    all_reduce      all_reduce(x)                      x: S bytes
    all_gather      all_gather_single(out, x)          x: S/N bytes, out: S bytes
                    (all_gather_into_tensor on torch < 2.13; same c10d op, _allgather_base_)
    reduce_scatter  reduce_scatter_single(out, x)      x: S bytes, out: S/N bytes
                    (reduce_scatter_tensor on older torch; c10d::_reduce_scatter_base_)
    all_to_all      all_to_all_single(out, x)          x, out: S bytes (even splits)
    send_recv       even rank r sends S bytes to r+1, which receives them (blocking
                    send/recv); with an odd world size the last rank sits out

Sizes are rounded down to a multiple of ``4·N`` bytes (whole float32 elements,
equal per-rank chunks; at least one element per rank) and deduplicated; the
run config records the sizes actually used.

The profiler (record_shapes, one cycle, ``torch.profiler.schedule(wait=0,
warmup=1, active=blocks)``): profiler step 0 holds *all* the warm-up calls of
every (op, size) block and is the profiler's own warm-up step, so it is traced
and discarded — no warm-up call is in the exported trace. Each measured
(op, size) block is then one profiler step (``ProfilerStep#1`` ...
``ProfilerStep#<blocks>``, in the order of ``blocks`` in run_config.json):
a ``dist.barrier()`` that lines the ranks up, then ``iters`` calls inside a
``record_function("sweep.<op>.<S>B")`` range. So a rank's trace holds
``iters`` calls per (op, size) it takes part in, plus one barrier per block.

Per-block wall times (``time.perf_counter`` after the barrier, per rank, with
``torch.cuda.synchronize`` on GPU) go into run_config ``timing`` as a
cross-check of the trace-derived times.

Public API: :class:`SweepConfig`, :func:`run_sweep`, :func:`sweep_sizes`,
:func:`parse_size`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tracekit.collectors import launch as _launch
from tracekit.errors import BadInputError, TracekitError

#: canonical op names of the sweep, in the order they run
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
_OP_ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
    "reducescatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all_single": "all_to_all",
    "sendrecv": "send_recv",
    "send": "send_recv",
    "recv": "send_recv",
    "p2p": "send_recv",
}
DTYPE_BYTES = 4  # float32
MAX_BYTES_LIMIT = 1 << 30  # per buffer; more is a typo, not a calibration


def parse_size(text: str | int) -> int:
    """Whole bytes from ``1024``, ``1K``/``1KiB`` (binary, K = 1024: the sweep's power-of-two sizes),
    ``16M``, ``1G``; ``1KB``, ``16MB`` are decimal: :func:`tracekit.model.units.parse_size`, the one
    size reading of every command-line option. Raises BadInputError for anything else, or a
    fraction of a byte."""
    from tracekit.model.units import parse_size as _parse_size

    return _parse_size(text)


def parse_ops(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"all_reduce,send_recv"`` (or a list) → canonical op names, in :data:`OPS` order.
    Raises BadInputError for an unknown op or an empty list."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = set()
    for item in items:
        key = str(item).strip().lower().replace("-", "_")
        if not key:
            continue
        op = key if key in OPS else _OP_ALIASES.get(key.replace("_", "")) or _OP_ALIASES.get(key)
        if op is None:
            raise BadInputError(f"unknown op {item.strip()!r} (choose from {', '.join(OPS)})")
        out.add(op)
    if not out:
        raise BadInputError(f"no ops given (choose from {', '.join(OPS)})")
    return tuple(op for op in OPS if op in out)


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int, ranks: int) -> list[int]:
    """The sizes S of the sweep: min·factor^i ≤ max, each rounded down to a multiple
    of 4·ranks bytes (at least 4·ranks), duplicates dropped, ascending."""
    unit = DTYPE_BYTES * ranks
    sizes: list[int] = []
    s = min_bytes
    while s <= max_bytes:
        v = max(unit, s // unit * unit)
        if not sizes or v != sizes[-1]:
            sizes.append(v)
        s *= factor
    return sizes


@dataclass
class SweepConfig:
    """Options of the sweep (sizes in bytes, nccl-tests' S)."""

    ranks: int = _launch.option(2, "Ranks (processes), 2-8.")
    backend: str = _launch.option("auto", "auto (nccl with CUDA, else gloo), gloo or nccl.")
    # ops, min_bytes and max_bytes are text on the command line ("all_reduce,send_recv", "64M")
    ops: tuple[str, ...] = _launch.option(
        OPS, f"Comma-separated ops: {', '.join(OPS)}.", cli_type=str, cli_default=",".join(OPS)
    )
    min_bytes: int = _launch.option(
        1 << 10, "Smallest size S (bytes; K/M/G or KiB/MiB/GiB binary, KB/MB/GB decimal).", cli_type=str, cli_default="1K"
    )
    max_bytes: int = _launch.option(
        64 << 20, "Largest size S (bytes; K/M/G or KiB/MiB/GiB binary, KB/MB/GB decimal).", cli_type=str, cli_default="64M"
    )
    factor: int = _launch.option(4, "Each size is the previous one times this (integer >= 2).")
    iters: int = _launch.option(5, "Measured calls per (op, size).")
    warmup_iters: int = _launch.option(2, "Warm-up calls per (op, size), not in the trace.")
    out: str | None = None
    timeout_s: float = 300.0
    #: filled in by :meth:`resolved`
    sizes: list[int] = field(default_factory=list)

    def resolved(self) -> "SweepConfig":
        """A validated copy with canonical ops and the sizes filled in.
        Raises BadInputError (one line) for an impossible configuration."""
        c = dataclasses.replace(self)
        _launch.validate_ranks(c.ranks)
        if c.ranks < 2:
            raise BadInputError(f"a sweep needs at least 2 ranks (collectives on 1 rank move nothing), got {c.ranks}")
        c.ops = parse_ops(c.ops)
        c.min_bytes, c.max_bytes = parse_size(c.min_bytes), parse_size(c.max_bytes)
        if c.min_bytes < 1:
            raise BadInputError(f"min-bytes must be at least 1, got {c.min_bytes}")
        if c.max_bytes < c.min_bytes:
            raise BadInputError(f"max-bytes ({c.max_bytes}) is smaller than min-bytes ({c.min_bytes})")
        if c.max_bytes > MAX_BYTES_LIMIT:
            raise BadInputError(f"max-bytes ({c.max_bytes}) is over the limit of {MAX_BYTES_LIMIT} (1 GiB)")
        if not isinstance(c.factor, int) or isinstance(c.factor, bool) or c.factor < 2:
            raise BadInputError(f"factor must be an integer >= 2, got {c.factor}")
        if not isinstance(c.iters, int) or c.iters < 1:
            raise BadInputError(f"iters must be at least 1, got {c.iters}")
        if not isinstance(c.warmup_iters, int) or c.warmup_iters < 0:
            raise BadInputError(f"warmup-iters must be >= 0, got {c.warmup_iters}")
        _launch.validate_run_options(c.backend, c.timeout_s)
        c.sizes = sweep_sizes(c.min_bytes, c.max_bytes, c.factor, c.ranks)
        return c

    @property
    def blocks(self) -> list[tuple[str, int]]:
        """(op, size) in the order they run; block i is profiler step i + 1."""
        return [(op, s) for op in self.ops for s in self.sizes]


def p2p_peer(rank: int, world_size: int) -> tuple[str, int] | None:
    """send_recv role of `rank`: ("send", r+1) for even ranks with a partner,
    ("recv", r−1) for odd ranks, None for the last rank of an odd world."""
    if rank % 2 == 0:
        return ("send", rank + 1) if rank + 1 < world_size else None
    return ("recv", rank - 1)


def expected_calls(cfg: SweepConfig, rank: int, world_size: int) -> dict[str, int]:
    """Calls of each traced op on `rank` (canonical collectives-table names:
    send and recv separate, plus the per-block barriers)."""
    n = len(cfg.sizes) * cfg.iters
    out: dict[str, int] = {}
    for op in cfg.ops:
        if op == "send_recv":
            role = p2p_peer(rank, world_size)
            if role is not None:
                out[role[0]] = n
        else:
            out[op] = n
    out["barrier"] = len(cfg.blocks)
    return out


# --------------------------------------------------------------------------- one rank


def _op_callables(ctx: _launch.RankContext, op: str, size: int):
    """A no-argument function issuing one call of `op` with S = `size` bytes, or None
    when this rank does not take part (send_recv on the odd one out)."""
    import torch
    import torch.distributed as dist

    n = ctx.world_size
    elems = size // DTYPE_BYTES
    dev = ctx.device
    fill = float(ctx.rank + 1)
    if op == "all_reduce":
        x = torch.full((elems,), fill, device=dev)
        return lambda: dist.all_reduce(x)
    if op == "all_gather":
        x = torch.full((elems // n,), fill, device=dev)
        out = torch.empty(elems, device=dev)
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: fn(out, x)
    if op == "reduce_scatter":
        x = torch.full((elems,), fill, device=dev)
        out = torch.empty(elems // n, device=dev)
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: fn(out, x)
    if op == "all_to_all":
        x = torch.full((elems,), fill, device=dev)
        out = torch.empty(elems, device=dev)
        return lambda: dist.all_to_all_single(out, x)
    if op == "send_recv":
        role = p2p_peer(ctx.rank, n)
        if role is None:
            return None
        x = torch.full((elems,), fill, device=dev)
        kind, peer = role
        if kind == "send":
            return lambda: dist.send(x, peer)
        return lambda: dist.recv(x, peer)
    raise BadInputError(f"unknown op {op!r}")


def _check_result(ctx: _launch.RankContext, op: str, size: int) -> None:
    """One unprofiled call of `op` whose result is checked (a sweep that moves the
    wrong bytes measures nothing). Raises TracekitError on a mismatch."""
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    elems = size // DTYPE_BYTES
    chunk = elems // n
    dev = ctx.device
    total = n * (n + 1) / 2
    if op == "all_reduce":
        x = torch.full((elems,), float(r + 1), device=dev)
        dist.all_reduce(x)
        ok = bool((x == total).all())
    elif op == "all_gather":
        x = torch.full((chunk,), float(r + 1), device=dev)
        out = torch.empty(elems, device=dev)
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, x)
        want = torch.arange(1, n + 1, device=dev, dtype=out.dtype).repeat_interleave(chunk)
        ok = bool((out == want).all())
    elif op == "reduce_scatter":
        x = torch.arange(elems, device=dev, dtype=torch.float32) + r
        out = torch.empty(chunk, device=dev)
        (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, x)
        want = n * (torch.arange(r * chunk, (r + 1) * chunk, device=dev, dtype=torch.float32)) + n * (n - 1) / 2
        ok = bool(torch.allclose(out, want))
    elif op == "all_to_all":
        x = torch.full((elems,), float(r + 1), device=dev) + torch.arange(n, device=dev).repeat_interleave(chunk) * 100
        out = torch.empty(elems, device=dev)
        dist.all_to_all_single(out, x)
        # chunk j of out came from rank j's chunk r: (j + 1) + 100·r
        want = (torch.arange(1, n + 1, device=dev, dtype=torch.float32) + 100 * r).repeat_interleave(chunk)
        ok = bool((out == want).all())
    else:
        role = p2p_peer(r, n)
        if role is None:
            return
        kind, peer = role
        x = torch.full((elems,), float(r + 1), device=dev)
        if kind == "send":
            dist.send(x, peer)
            ok = True
        else:
            x.zero_()
            dist.recv(x, peer)
            ok = bool((x == float(peer + 1)).all())
    if not ok:
        raise TracekitError(f"{op} of {size} bytes returned wrong values on rank {r}")


def _sweep_rank(ctx: _launch.RankContext, cfg: SweepConfig) -> dict[str, Any]:
    """What each rank process runs (see the module docstring)."""
    import warnings

    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")

    def sync() -> None:
        if ctx.is_cuda:
            torch.cuda.synchronize(ctx.device)

    # correctness first, unprofiled, on the smallest size of each op
    for op in cfg.ops:
        _check_result(ctx, op, cfg.sizes[0])
    dist.barrier()

    blocks = cfg.blocks
    calls = [(op, size, _op_callables(ctx, op, size)) for op, size in blocks]
    schedule = _launch.ProfileSchedule(wait=0, warmup=1, active=len(blocks))
    out_file = ctx.trace_path()
    prof = _launch.make_profiler(schedule, out_file, use_cuda=ctx.is_cuda)
    block_s: list[float | None] = []
    with prof:
        # profiler step 0 (its warm-up step: traced, then discarded) = every warm-up call
        if ctx.rank == 0:
            ctx.progress("warm-up")
        for op, size, fn in calls:
            if fn is not None:
                for _ in range(cfg.warmup_iters):
                    fn()
        sync()
        dist.barrier()
        prof.step()
        for i, (op, size, fn) in enumerate(calls):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            if fn is not None:
                with record_function(f"sweep.{op}.{size}B"):
                    for _ in range(cfg.iters):
                        fn()
                sync()
                block_s.append((time.perf_counter() - t0) / cfg.iters)
            else:
                block_s.append(None)
            prof.step()
            if ctx.rank == 0:
                ctx.progress(f"{op} {size:,} B ({i + 1}/{len(calls)})")
    if not out_file.exists():
        raise TracekitError(f"{out_file}: the profiler exported no trace")
    return {
        "rank": ctx.rank,
        "block_s": block_s,
        "threads": torch.get_num_threads(),
        "trace": out_file.name,
        "trace_bytes": out_file.stat().st_size,
        "all_gather_api": "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor",
        "reduce_scatter_api": "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor",
    }


# --------------------------------------------------------------------------- the job


def run_sweep(config: SweepConfig, on_progress: Callable[[str], None] | None = None) -> Path:
    """Run the sweep on ``config.ranks`` processes with the profiler on.

    Returns the run folder (``<out>/sweep-YYYYmmdd-HHMMSS-xxxx``, default out
    ./tracekit-runs) holding ``rank{r}.pt.trace.json.gz`` per rank and
    ``run_config.json``. Raises BadInputError for an impossible configuration,
    RankFailedError when a rank fails.
    """
    cfg = config.resolved()
    backend = _launch.resolve_backend(cfg.backend, cfg.ranks)
    info = _launch.host_info()
    run_dir = _launch.new_run_dir(cfg.out, "sweep")
    results, wall, created = _launch.timed_launch(_sweep_rank, cfg, backend, run_dir, on_progress)
    doc = build_run_config(run_dir.name, cfg, backend, info, results, wall, created)
    _launch.write_json(run_dir / "run_config.json", doc)
    return run_dir


def build_run_config(
    run_id: str,
    cfg: SweepConfig,
    backend: str,
    info: dict[str, Any],
    results: list[dict[str, Any]],
    wall_s: float,
    created: _dt.datetime,
) -> dict[str, Any]:
    """The run_config.json document of a sweep run."""
    blocks = cfg.blocks
    base = _launch.run_config_base(info, results, backend, 0, 1, len(blocks))
    base["profiler"]["note"] = (
        "step 0 (all warm-up calls) is the profiler's warm-up step and is not in the trace; "
        "step i >= 1 is blocks[i-1]: a barrier, then iters calls inside record_function sweep.<op>.<S>B"
    )
    per_block = []
    for i, (op, size) in enumerate(blocks):
        times = [r["block_s"][i] for r in results if r["block_s"][i] is not None]
        per_block.append(
            {
                "op": op,
                "size_bytes": size,
                "profiler_step": i + 1,
                "mean_call_s": [None if r["block_s"][i] is None else round(r["block_s"][i], 9) for r in results],
                "median_over_ranks_s": round(statistics.median(times), 9) if times else None,
            }
        )
    return {
        "workload": "sweep",
        "run_id": run_id,
        "created_at": created.isoformat(timespec="seconds"),
        "ranks": cfg.ranks,
        "world_size": cfg.ranks,
        "backend": backend,
        "ops": list(cfg.ops),
        "sizes": list(cfg.sizes),
        "min_bytes": cfg.min_bytes,
        "max_bytes": cfg.max_bytes,
        "factor": cfg.factor,
        "iters": cfg.iters,
        "warmup_iters": cfg.warmup_iters,
        "dtype": "float32",
        "dtype_bytes": DTYPE_BYTES,
        "size_meaning": "nccl-tests S: all_reduce buffer, all_gather output, reduce_scatter input, "
        "all_to_all send buffer, send/recv message",
        "apis": {
            "all_reduce": "all_reduce",
            "all_gather": results[0]["all_gather_api"] if results else None,
            "reduce_scatter": results[0]["reduce_scatter_api"] if results else None,
            "all_to_all": "all_to_all_single",
            "send_recv": "send/recv (blocking), even rank r -> r+1",
        },
        "blocks": [[op, size] for op, size in blocks],
        **base,
        "expected": {
            "calls_per_rank": [expected_calls(cfg, r, cfg.ranks) for r in range(cfg.ranks)],
            "calls_per_op_per_rank": len(cfg.sizes) * cfg.iters,
        },
        "timing": {
            "job_wall_s": round(wall_s, 3),
            "clock": "time.perf_counter per block after its barrier, divided by iters, per rank (profiler on)",
            "blocks": per_block,
        },
        "traces": [r["trace"] for r in results],
        "overlap_model": _launch.overlap_model("no_overlap"),
    }
