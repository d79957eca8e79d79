"""`tracekit collect pp` and `tracekit collect disagg-kv`: run the pipeline-parallel
or the disaggregated prefill/decode workload, then ingest it and print the report.

Registered on the ``collect`` sub-app (imported by ``tracekit.cli.collect``).
Thin: the work is in ``collectors.workloads.pp`` / ``collectors.workloads.disagg_kv``,
``tracekit.ingest.ingest_paths`` and ``tracekit.report``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from tracekit.cli.collect import (
    ACTIVE_OPT, BACKEND_OPT, DTYPE_OPT, INGEST_OPT, OUT_OPT, SEED_OPT, STORE_OPT, WAIT_OPT, WARMUP_OPT,
    app, ingest_and_report, run_workload,
)


@app.command("pp")
def pp(
    ranks: int = typer.Option(2, "--ranks", help="Ranks (processes), one pipeline stage each, 1-8."),
    stages: Optional[int] = typer.Option(None, "--stages", help="Pipeline stages (must equal --ranks; default: --ranks)."),
    layers: int = typer.Option(4, "--layers", help="Transformer layers (divisible by --stages)."),
    hidden: int = typer.Option(256, "--hidden", help="Hidden size."),
    heads: int = typer.Option(4, "--heads", help="Attention heads (divide --hidden)."),
    ffn: Optional[int] = typer.Option(None, "--ffn", help="MLP inner size (default: 8/3 x hidden, rounded up to 64; 0: no MLP)."),
    vocab: int = typer.Option(512, "--vocab", help="Vocabulary size."),
    seq: int = typer.Option(64, "--seq", help="Sequence length (train) or prompt length (decode)."),
    batch: int = typer.Option(8, "--batch", help="Batch size (divisible by --microbatches)."),
    microbatches: int = typer.Option(4, "--microbatches", help="Micro-batches per step."),
    schedule: str = typer.Option("gpipe", "--schedule", help="gpipe or 1f1b (train only)."),
    mode: str = typer.Option("train", "--mode", help="train (forward + backward) or decode (prefill + greedy decode)."),
    tokens: int = typer.Option(8, "--tokens", help="Decode steps per generation (decode mode)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Steps (default: wait + warmup + active)."),
    dtype: str = DTYPE_OPT,
    backend: str = BACKEND_OPT,
    wait: int = WAIT_OPT,
    warmup: int = WARMUP_OPT,
    active: int = ACTIVE_OPT,
    seed: int = SEED_OPT,
    out: Path = OUT_OPT,
    store: Optional[str] = STORE_OPT,
    ingest: bool = INGEST_OPT,
) -> None:
    """Pipeline-parallel transformer: activations (and gradients) sent stage to stage with isend/irecv."""
    from collectors.workloads.pp import PPConfig, run_pp

    cfg = PPConfig(
        ranks=ranks, stages=stages, layers=layers, hidden=hidden, heads=heads, ffn=ffn, vocab=vocab, seq=seq,
        batch=batch, microbatches=microbatches, schedule=schedule, mode=mode, tokens=tokens, steps=steps,
        dtype=dtype, backend=backend, seed=seed, wait=wait, warmup=warmup, active=active, out=str(out),
    ).resolved()  # bad options fail here, before anything starts
    title = (
        f"pp {cfg.mode}: {cfg.stages} stages, {cfg.layers} layers, hidden {cfg.hidden}, "
        f"{cfg.microbatches} micro-batches of {cfg.micro_batch}"
        + (f", {cfg.schedule}" if cfg.mode == "train" else f", {cfg.tokens} tokens")
        + f", {cfg.dtype}"
    )
    run_dir, config_dict = run_workload(lambda progress: run_pp(cfg, on_progress=progress), f"pp on {cfg.ranks} ranks")
    check = config_dict["pp_check"]
    print(
        f"{title}: {run_dir} (check passed, max relative error {check['max_rel_rms_err']:.3g}; "
        f"job {config_dict['timing']['job_wall_s']:.1f} s)",
        file=sys.stderr,
    )
    if ingest:
        ingest_and_report(run_dir, "pp", config_dict, store)


@app.command("disagg-kv")
def disagg_kv(
    ranks: int = typer.Option(2, "--ranks", help="Ranks, an even number: the first half prefill, the second half decode."),
    layers: int = typer.Option(8, "--layers", help="Transformer layers (one KV message each)."),
    hidden: int = typer.Option(512, "--hidden", help="Hidden size."),
    heads: int = typer.Option(8, "--heads", help="Query heads."),
    kv_heads: int = typer.Option(2, "--kv-heads", help="Key/value heads (divide --heads)."),
    head_dim: int = typer.Option(64, "--head-dim", help="Head dimension."),
    ffn: Optional[int] = typer.Option(None, "--ffn", help="MLP inner size (default: 8/3 x hidden, rounded up to 64; 0: attention only)."),
    vocab: int = typer.Option(512, "--vocab", help="Vocabulary size."),
    prompt_len: int = typer.Option(256, "--prompt-len", help="Prompt tokens per sequence."),
    batch: int = typer.Option(2, "--batch", help="Sequences per request."),
    decode_tokens: int = typer.Option(8, "--decode-tokens", help="Tokens the decode rank generates per request."),
    mode: str = typer.Option("layerwise", "--mode", help="layerwise (send each layer's KV as it is computed) or bulk (after the prefill)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Requests (steps) (default: wait + warmup + active)."),
    dtype: str = DTYPE_OPT,
    backend: str = BACKEND_OPT,
    wait: int = WAIT_OPT,
    warmup: int = WARMUP_OPT,
    active: int = ACTIVE_OPT,
    seed: int = typer.Option(0, "--seed", help="Seed of the weights and prompts."),
    out: Path = OUT_OPT,
    store: Optional[str] = STORE_OPT,
    ingest: bool = INGEST_OPT,
) -> None:
    """Disaggregated prefill/decode: prefill ranks ship each layer's KV cache to decode ranks (bulk or layer-wise)."""
    from collectors.workloads.disagg_kv import KVConfig, run_disagg_kv

    cfg = KVConfig(
        ranks=ranks, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim, ffn=ffn,
        vocab=vocab, prompt_len=prompt_len, batch=batch, decode_tokens=decode_tokens, mode=mode, steps=steps,
        dtype=dtype, backend=backend, seed=seed, wait=wait, warmup=warmup, active=active, out=str(out),
    ).resolved()
    title = (
        f"disagg-kv {cfg.mode}: {len(cfg.pairs)} prefill/decode pair(s), {cfg.layers} layers, "
        f"{cfg.kv_bytes_per_layer:,} KV bytes per layer, {cfg.dtype}"
    )
    run_dir, config_dict = run_workload(
        lambda progress: run_disagg_kv(cfg, on_progress=progress), f"disagg-kv on {cfg.ranks} ranks"
    )
    print(
        f"{title}: {run_dir} (decode check passed; job {config_dict['timing']['job_wall_s']:.1f} s)",
        file=sys.stderr,
    )
    if ingest:
        ingest_and_report(run_dir, "disagg_kv", config_dict, store)
