"""What one ingest put in the store, in a few lines: ``tracekit ingest`` prints it under ``run X in
STORE`` so a user learns at once that only 1 of 8 ranks was recorded, not when analyzing.

:func:`ingest_summary` reads the committed run's own Parquet files (run, ranks, collectives; no
DuckDB) and returns plain data; :func:`summary_lines` words it.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

SOURCE_WORDS = {"nccl_tests": "a benchmark log"}
"""Sources whose run is not one file per rank: their ranks are never "missing"."""


def _ranges(nums: list[int], spell_out: int = 16) -> str:
    """``[1, 2, 3, 5]`` → ``'1, 2, 3, 5'``; past ``spell_out`` numbers, runs collapse: ``'1–7, 9'``."""
    nums = sorted(nums)
    if len(nums) <= spell_out:
        return ", ".join(map(str, nums))
    out, start, prev = [], nums[0], nums[0]
    for n in nums[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(str(start) if start == prev else f"{start}–{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(out)


def ingest_summary(store, run_id: str) -> dict[str, Any]:
    """The run ``run_id`` of ``store`` (a tracekit.store.Store) as ``{'run_id', 'source',
    'world_size' (int or None), 'expected_from' ('world_size' | 'process groups' | None),
    'ranks_found' [int], 'ranks_missing' [int] (None when the expected count is unknown or the run is
    a benchmark log, whose one file stands for every rank), 'hosts' (distinct non-null hosts of
    the ranks, and for a benchmark log the hosts its "Using devices" lines name),
    'process_groups' (distinct pg_name of its collectives), 'collectives_per_op' {op: calls, summed
    over the recorded ranks; op None → 'unknown'}, 'events', 'events_quarantined', 'warnings'
    (count, all ranks)}``.

    Expected ranks are ``0 .. world_size − 1`` (runs.world_size); where the trace names no world
    size, the union of its process groups' member ranks (collectives.pg_ranks). Raises StoreError
    when the run is not in the store."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tracekit.errors import StoreError

    d = store.run_dir(run_id)
    if not (d / "run.parquet").exists():
        raise StoreError(f"run {run_id!r} is not in {store.path}")
    run = pq.ParquetFile(d / "run.parquet").read(columns=["source", "world_size", "config"]).to_pylist()[0]
    ranks = pq.ParquetFile(d / "ranks.parquet").read(
        columns=["rank", "host", "events", "events_quarantined", "warnings"]).to_pylist()
    per_op: Counter = Counter()
    groups: set = set()
    members: set = set()
    cf = d / "collectives.parquet"
    if cf.exists():
        cols = pq.ParquetFile(cf).read(columns=["op", "pg_name", "pg_ranks"])
        for op, n in zip(*(lambda vc: (vc.field(0).to_pylist(), vc.field(1).to_pylist()))(
                cols.column("op").value_counts())):
            per_op[op or "unknown"] += n
        groups = {g for g in cols.column("pg_name").unique().to_pylist() if g is not None}
        pr = cols.column("pg_ranks")
        if pa.types.is_list(pr.type) or pa.types.is_large_list(pr.type):
            members = {int(r) for r in pc.unique(pc.list_flatten(pr)).to_pylist() if r is not None}
        else:  # JSON text
            for text in pr.unique().to_pylist():
                members |= _members(text)
    found = sorted({r["rank"] for r in ranks if r["rank"] is not None})
    ws = run.get("world_size")
    expected, expected_from = None, None
    if ws:
        expected, expected_from = set(range(int(ws))), "world_size"
    elif members:
        expected, expected_from = members | set(found), "process groups"
    benchmark = run.get("source") == "nccl_tests"
    missing = None if expected is None or benchmark else sorted(expected - set(found))
    return dict(
        run_id=run_id, source=run.get("source"), world_size=None if ws is None else int(ws),
        expected_from=expected_from, ranks_found=found, ranks_missing=missing,
        hosts=len({r["host"] for r in ranks if r["host"]} | _log_hosts(run.get("config"))), process_groups=len(groups),
        collectives_per_op=dict(sorted(per_op.items(), key=lambda kv: (-kv[1], kv[0]))),
        events=sum(r["events"] or 0 for r in ranks),
        events_quarantined=sum(r["events_quarantined"] or 0 for r in ranks),
        warnings=sum(len(r["warnings"] or []) for r in ranks),
    )


def _log_hosts(config) -> set[str]:
    """The hosts a benchmark log names (runs.config ``groups[i].hosts``: nccl-tests' "Using devices"
    lines, tracekit.ingest.nccl_tests_run); empty for a trace's config or an unreadable one."""
    import json

    try:
        groups = json.loads(config).get("groups") if config else None
    except (ValueError, AttributeError):
        return set()
    if not isinstance(groups, list):
        return set()
    return {h for g in groups if isinstance(g, dict) and isinstance(g.get("hosts"), list)
            for h in g["hosts"] if isinstance(h, str) and h}


def _members(pg_ranks) -> set[int]:
    """collectives.pg_ranks (a list of ints, or its JSON text ``'[0, 1]'``) → the set of ranks."""
    if pg_ranks is None:
        return set()
    if isinstance(pg_ranks, str):
        try:
            pg_ranks = json.loads(pg_ranks)
        except ValueError:
            return set()
    try:
        return {int(r) for r in pg_ranks}
    except (TypeError, ValueError):
        return set()


def summary_lines(s: dict[str, Any], analyze_cmd: str) -> list[str]:
    """:func:`ingest_summary`'s data as the lines ``tracekit ingest`` prints, ending with the command
    that analyzes the run (``analyze_cmd``)."""
    found = s["ranks_found"]
    if s["source"] in SOURCE_WORDS:
        ranks = (f"ranks: {SOURCE_WORDS[s['source']]} of {s['process_groups']} benchmark run(s), the largest on "
                 f"{s['world_size'] or 'an unknown number of'} ranks (each row measures all its ranks together; "
                 "no per-rank timeline)")
    elif s["ranks_missing"] is None:
        ranks = (f"ranks: {len(found)} found ({_ranges(found)}); expected: unknown "
                 "(the trace names no world size or process group members)")
    else:
        n_exp = len(found) + len(s["ranks_missing"])
        via = "" if s["expected_from"] == "world_size" else f" (from its {s['expected_from']})"
        ranks = f"ranks: {len(found)} of {n_exp} found{via} ({_ranges(found)})"
        if s["ranks_missing"]:
            ranks += f"; missing {len(s['ranks_missing'])}: {_ranges(s['ranks_missing'])}"
    ops = ", ".join(f"{op} {n:,}" for op, n in s["collectives_per_op"].items()) or "none"
    what = "sizes measured per op" if s["source"] in SOURCE_WORDS else "calls per op over the recorded ranks"
    return [
        ranks,
        f"hosts: {s['hosts'] or 'not recorded'}; process groups: {s['process_groups']}; events: {s['events']:,}",
        f"collectives ({what}): {ops}",
        f"quarantined events: {s['events_quarantined']:,}; warnings: {s['warnings']}"
        + (" (on stderr)" if s["warnings"] else ""),
        f"next: {analyze_cmd}",
    ]
