"""Do two checkouts of tracekit build the same stores and reports?

    python benchmarks/compare_checkouts.py OLD_DIR NEW_DIR [--workdir DIR] [--only SUBSTRING ...]
        [--allow-new TABLE.parquet ...] [--ignore COLUMN ...]

Each checkout ingests, with its own code (``python -m tracekit`` run by the checkout's
``.venv/bin/python`` when it has one, else this interpreter, with PYTHONPATH and cwd set to the
checkout), every input of the list below into a store of its own, then ``tracekit analyze
--json`` prints the run's report. Per input the two are compared:

* every table of the run (``run.parquet``, ``ranks.parquet``, ``events/*.parquet``,
  ``collectives.parquet`` and whatever else the store holds), row for row and order-insensitive
  (DuckDB ``EXCEPT ALL`` both ways), without ``created_at`` and ``source_path``; a table named in
  ``--allow-new`` may exist in NEW's store only (one NEW adds, e.g. ``span_overlap.parquet``);
* the ``analyze --json`` documents, without the keys ``created_at``, ``source_path`` and ``store``;
* ``--ignore``: more columns (and JSON keys) left out of both, e.g. ``schema_version`` when NEW
  bumps the store's schema version;
* for an input that one checkout refuses, the exit code and the error line.

Inputs: ``fixtures/*_2rank``, ``fixtures/handmade/*``, ``fixtures/defects/*`` (files and
folders), every folder of ``../shared/traces`` as one run (and, when a folder is refused as one
run, each of its entries as its own), and a ×4 replica of ``hta_ddp_v100_r1of2`` written by
``benchmarks/bench_ingest.py --write-replica`` (NEW_DIR's). Prints one line per input
(``identical`` / ``DIFFERENT`` with what differs) and exits 1 when any input differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

IGNORED_COLUMNS = ("created_at", "source_path")
IGNORED_KEYS = {"created_at", "source_path", "store"}
EXTRA_IGNORED: set = set()  # --ignore: columns and keys left out of both comparisons too


def _python(checkout: Path) -> str:
    venv = checkout / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _tracekit(checkout: Path, args: list[str], timeout: int = 1800) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(checkout), TRACEKIT_STORE="")
    return subprocess.run([_python(checkout), "-m", "tracekit", *args], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=timeout)


def inputs(repo: Path, traces: Path, work: Path) -> list[tuple[str, list[Path]]]:
    """(name, paths) of every input to ingest."""
    out: list[tuple[str, list[Path]]] = []
    fx = repo / "fixtures"
    out += [(p.name, [p]) for p in sorted(fx.glob("*_2rank"))]
    out += [(f"handmade/{p.name}", [p]) for p in sorted((fx / "handmade").iterdir()) if p.suffix != ".md"]
    out += [(f"defects/{p.name}", [p]) for p in sorted((fx / "defects").iterdir()) if p.suffix not in (".py", ".md")]
    if traces.is_dir():
        for d in sorted(p for p in traces.iterdir() if p.is_dir()):
            out.append((f"traces/{d.name}", [d]))
        base = traces / "hta_ddp_v100_r1of2" / "df_index_resolver.json.gz"
        if base.exists():
            rep = work / "x4" / "rank0.json.gz"
            if not rep.exists():
                rep.parent.mkdir(parents=True, exist_ok=True)
                subprocess.run([sys.executable, str(repo / "benchmarks" / "bench_ingest.py"), "--write-replica", "4",
                                str(rep), "--base", str(base)], check=True, capture_output=True)
            out.append(("x4 replica of hta_ddp_v100_r1of2", [rep]))
    return out


def _norm(doc):
    if isinstance(doc, dict):
        return {k: _norm(v) for k, v in doc.items() if k not in IGNORED_KEYS and k not in EXTRA_IGNORED}
    if isinstance(doc, list):
        return [_norm(v) for v in doc]
    return doc


def _tables(store: Path) -> dict[str, list[str]]:
    """Table name (path under the run, rank files grouped) → its Parquet files."""
    out: dict[str, list[str]] = {}
    for f in sorted(store.glob("runs/*/**/*.parquet")):
        rel = f.relative_to(next(store.glob("runs/*")))
        key = str(rel.parent / "*.parquet") if rel.parent.name else rel.name
        out.setdefault(key, []).append(str(f))
    return out


def compare_stores(a: Path, b: Path, allow_new: tuple = ()) -> list[str]:
    """What differs between the runs of stores ``a`` and ``b`` (empty when nothing does); a table
    named in ``allow_new`` (e.g. ``span_overlap.parquet``) may be in ``b`` only."""
    import duckdb

    con = duckdb.connect()
    ta, tb = _tables(a), _tables(b)
    diffs = [f"{k}: only in old" for k in sorted(ta.keys() - tb.keys())]
    diffs += [f"{k}: only in new" for k in sorted(tb.keys() - ta.keys()) if k not in allow_new]
    for k in sorted(ta.keys() & tb.keys()):
        if len(ta[k]) != len(tb[k]):
            diffs.append(f"{k}: {len(ta[k])} files against {len(tb[k])}")
            continue
        cols = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet({ta[k]})").fetchall()]
        cols_b = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet({tb[k]})").fetchall()]
        if cols != cols_b:
            diffs.append(f"{k}: columns differ ({sorted(set(cols) ^ set(cols_b))})")
            continue
        keep = ", ".join(f'"{c}"' for c in cols if c not in IGNORED_COLUMNS and c not in EXTRA_IGNORED)
        qa, qb = f"SELECT {keep} FROM read_parquet({ta[k]})", f"SELECT {keep} FROM read_parquet({tb[k]})"
        only_a = con.execute(f"SELECT count(*) FROM ({qa} EXCEPT ALL {qb})").fetchone()[0]
        only_b = con.execute(f"SELECT count(*) FROM ({qb} EXCEPT ALL {qa})").fetchone()[0]
        if only_a or only_b:
            n = con.execute(f"SELECT count(*) FROM ({qa})").fetchone()[0]
            bad = [c for c in cols if c not in IGNORED_COLUMNS and c not in EXTRA_IGNORED and con.execute(
                f'SELECT count(*) FROM (SELECT "{c}" FROM read_parquet({ta[k]}) EXCEPT ALL '
                f'SELECT "{c}" FROM read_parquet({tb[k]}))').fetchone()[0]]
            diffs.append(f"{k}: {only_a} of {n} rows only in old, {only_b} only in new (columns {bad})")
    return diffs


def compare_one(name: str, paths: list[Path], old: Path, new: Path, work: Path,
                allow_new: tuple = ()) -> tuple[str, list[str]]:
    """('identical' | 'identical (both refuse)' | 'DIFFERENT', what differs) for one input."""
    got = {}
    for label, checkout in (("old", old), ("new", new)):
        store = work / "stores" / label / name.replace("/", "_").replace(" ", "_")
        shutil.rmtree(store, ignore_errors=True)
        ing = _tracekit(checkout, ["ingest", *map(str, paths), "--store", str(store), "--run-id", "cmp"])
        rep = None
        if ing.returncode == 0:
            an = _tracekit(checkout, ["analyze", "--store", str(store), "--run", "cmp", "--json"])
            rep = (an.returncode, _norm(json.loads(an.stdout)) if an.returncode == 0 else an.stderr.strip())
        got[label] = (ing.returncode, ing.stderr.strip().splitlines()[-1:] if ing.returncode else None, store, rep)
    (rc_a, err_a, st_a, rep_a), (rc_b, err_b, st_b, rep_b) = got["old"], got["new"]
    if rc_a or rc_b:
        if (rc_a, err_a) == (rc_b, err_b):
            return "identical (both refuse)", []
        return "DIFFERENT", [f"ingest: old rc {rc_a} {err_a}, new rc {rc_b} {err_b}"]
    diffs = compare_stores(st_a, st_b, allow_new)
    if rep_a != rep_b:
        diffs.append(_json_diff(rep_a, rep_b))
    return ("identical" if not diffs else "DIFFERENT"), diffs


def _json_diff(a, b, path: str = "analyze") -> str:
    """The first place two JSON documents differ."""
    if type(a) is not type(b):
        return f"{path}: {str(a)[:80]} against {str(b)[:80]}"
    if isinstance(a, dict):
        for k in sorted(a.keys() | b.keys()):
            if a.get(k) != b.get(k):
                return _json_diff(a.get(k), b.get(k), f"{path}.{k}")
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: {len(a)} items against {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _json_diff(x, y, f"{path}[{i}]")
    return f"{path}: {str(a)[:80]} against {str(b)[:80]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--workdir", type=Path, default=None, help="keep stores and the replica here")
    ap.add_argument("--traces", type=Path, default=None, help="the shared traces (default: NEW/../shared/traces)")
    ap.add_argument("--only", nargs="*", default=None, help="only inputs whose name holds one of these")
    ap.add_argument("--allow-new", nargs="*", default=(), help="tables NEW may add (e.g. span_overlap.parquet)")
    ap.add_argument("--ignore", nargs="*", default=(), help="columns and JSON keys compared by neither (schema_version)")
    args = ap.parse_args(argv)
    EXTRA_IGNORED.update(args.ignore)
    old, new = args.old.resolve(), args.new.resolve()
    traces = args.traces or new.parent / "shared" / "traces"
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tracekit-compare-"))
    todo = inputs(new, traces, work)
    if args.only:
        todo = [t for t in todo if any(s in t[0] for s in args.only)]
    width = max(len(n) for n, _ in todo)
    n_diff = 0
    for name, paths in todo:
        verdict, diffs = compare_one(name, paths, old, new, work, tuple(args.allow_new))
        if verdict == "identical (both refuse)" and name.startswith("traces/"):
            sub = [p for p in sorted(paths[0].iterdir()) if not p.name.startswith(".") and p.suffix != ".md"]
            print(f"{name:<{width}}  {verdict}; its entries one by one:", flush=True)
            for p in sub:
                v, d = compare_one(f"{name}/{p.name}", [p], old, new, work, tuple(args.allow_new))
                n_diff += v == "DIFFERENT"
                print(f"  {p.name:<{width - 2}}  {v}" + "".join(f"\n      {x}" for x in d), flush=True)
            continue
        n_diff += verdict == "DIFFERENT"
        print(f"{name:<{width}}  {verdict}" + "".join(f"\n      {x}" for x in diffs), flush=True)
    print(f"\n{len(todo)} inputs, {n_diff} different (stores and reports in {work})")
    if args.workdir is None:
        shutil.rmtree(work / "stores", ignore_errors=True)
    return 1 if n_diff else 0


if __name__ == "__main__":
    sys.exit(main())
