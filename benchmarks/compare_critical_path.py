"""The critical path of two checkouts on the same stores: its CPU seconds and whether its rows agree.

    python benchmarks/compare_critical_path.py --old OLD_CHECKOUT [--new NEW_CHECKOUT] INPUT... [--work DIR] [--repeat N]

INPUT: a trace file or folder (ingested once, by NEW_CHECKOUT, into a fresh store under DIR; a
folder that ingests as several runs is ingested as it is: every run is compared) or an existing
store folder (one holding ``runs/`` and ``versions/``). For each store and each checkout, a child process
with PYTHONPATH set to that checkout opens the store (``tracekit.analyses.connect``), creates the
pipeline modules before ``critical_path`` (untimed), then ``critical_path`` alone, timed in CPU
seconds (``time.process_time``: DuckDB's threads included) and wall seconds, with the peak RSS
(``ru_maxrss``, MiB) after it (with ``--repeat N``: N runs per side, interleaved, the one with
the least CPU s kept); and writes ``critical_path`` and ``critical_path_summary``, every
column in key order, as Parquet. The two sides' tables must be equal row for row.

Prints one line per store: path rows, CPU / wall seconds old → new, peak RSS old → new, and
``same`` or ``DIFFERENT`` (then the first differing row); an input whose ingest fails is named and
skipped. Exits 1 when any store differs.
OLD_CHECKOUT can be an exported tree (``git archive REV | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

_KEYS = {"critical_path": "run_id, rank, step, pos", "critical_path_summary": "run_id, step, rank"}


def _child(store: str, out: str) -> None:
    """In the checkout on PYTHONPATH: build the critical path of `store`, write its tables to
    `out` (a folder) and its costs to out/cost.json."""
    import resource
    import time

    import tracekit.analyses as an
    from tracekit.store import Store

    con = an.connect(Store(store))
    con.analyses.ensure([r for r in an.BY_NAME["critical_path"].reads if r in an.DEFINED_BY])
    c0, w0 = time.process_time(), time.perf_counter()
    con.analyses.ensure("critical_path")
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for table, key in _KEYS.items():
        con.execute(f"COPY (SELECT * FROM {table} ORDER BY {key} NULLS FIRST) TO '{out}/{table}.parquet' (FORMAT parquet)")
    rows = con.execute("SELECT count(*) FROM critical_path").fetchone()[0]
    Path(out, "cost.json").write_text(json.dumps({"cpu_s": cpu, "wall_s": wall, "rss_mib": rss, "rows": rows}))


def _run(checkout: Path, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    subprocess.run([sys.executable, *args], env=env, check=True, cwd=checkout)


def _diff(a: Path, b: Path) -> str | None:
    """None when the tables of the two output folders are equal (columns, types and rows; a column
    declared NOT NULL on one side and nullable on the other is the same column), else the first
    difference."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def nullable(t):
        return t.cast(pa.schema([f.with_nullable(True) for f in t.schema]))

    for table in _KEYS:
        x, y = (nullable(pq.read_table(d / f"{table}.parquet")) for d in (a, b))
        if x.schema != y.schema:
            return f"{table}: schema {x.schema} != {y.schema}"
        if x.num_rows != y.num_rows:
            return f"{table}: {x.num_rows} rows != {y.num_rows}"
        if not x.equals(y):
            xs, ys = x.to_pylist(), y.to_pylist()
            i = next(i for i in range(len(xs)) if xs[i] != ys[i])
            return f"{table} row {i}: {xs[i]} != {ys[i]}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="*")
    ap.add_argument("--old", type=Path)
    ap.add_argument("--new", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--work", type=Path, default=Path("/tmp/compare_critical_path"))
    ap.add_argument("--repeat", type=int, default=1, help="runs per side, interleaved; the least CPU s is kept")
    ap.add_argument("--child", nargs=2, metavar=("STORE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    if args.old is None:
        ap.error("--old is required")
    me = str(Path(__file__).resolve())
    bad = 0
    for k, src in enumerate(args.inputs):
        src = Path(src).resolve()
        if (src / "versions").is_dir() and (src / "runs").is_dir():  # a store
            store = src
        else:
            store = args.work / f"store{k}"
            if not (store / "versions").is_dir():
                try:
                    _run(args.new, ["-m", "tracekit", "ingest", str(src), "--store", str(store)])
                except subprocess.CalledProcessError:
                    print(f"{src}: skipped (the ingest failed: its message is above)", flush=True)
                    continue
        costs: dict[str, dict] = {}
        for _ in range(args.repeat):
            for side, checkout in (("old", args.old), ("new", args.new)):
                out = args.work / f"out{k}-{side}"
                out.mkdir(parents=True, exist_ok=True)
                _run(checkout, [me, "--child", str(store), str(out)])
                cost = json.loads((out / "cost.json").read_text())
                if side not in costs or cost["cpu_s"] < costs[side]["cpu_s"]:
                    costs[side] = cost
        diff = _diff(args.work / f"out{k}-old", args.work / f"out{k}-new")
        o, n = costs["old"], costs["new"]
        print(f"{src}: {n['rows']:,} path rows; CPU s {o['cpu_s']:.2f} -> {n['cpu_s']:.2f}; wall s "
              f"{o['wall_s']:.2f} -> {n['wall_s']:.2f}; peak RSS MiB {o['rss_mib']:.0f} -> {n['rss_mib']:.0f}; "
              + ("same" if diff is None else f"DIFFERENT: {diff}"), flush=True)
        bad += diff is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
