"""Two checkouts of tracekit, back to back, on the same trace: ingest, then ``analyze --json``.

    python benchmarks/bench_checkouts.py OLD_DIR NEW_DIR TRACE [--repeat N] [--workdir DIR] [--out FILE]

Each checkout runs with its own ``.venv/bin/python -m tracekit`` (cwd and PYTHONPATH set to it,
as ``compare_checkouts.py`` does), into a fresh store per run under ``--workdir``; repeats are
interleaved (old, new, old, new, ...). Per run and step: wall seconds, CPU seconds (user + system,
the process and its children) and peak memory (MiB), measured by ``bench_ingest.measure`` (the
larger of ``wait4``'s ru_maxrss and the process tree's summed RSS sampled every 50 ms), with the
1-minute load average at the end of each step. Prints one line per measurement and a Markdown
table of the fastest run of each; ``--out`` writes every measurement as JSON. Stores are removed
after each run; the trace is left where it is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import measure  # noqa: E402


def _cmd(checkout: Path, args: list[str]) -> tuple[list[str], dict]:
    py = checkout / ".venv" / "bin" / "python"
    env = dict(os.environ, PYTHONPATH=str(checkout), TRACEKIT_STORE="")
    return [str(py if py.exists() else sys.executable), "-m", "tracekit", *args], env


def run_once(checkout: Path, trace: Path, work: Path) -> dict:
    """Ingest ``trace`` with ``checkout`` into a fresh store, then analyze --json; both measured."""
    store = work / f"store-{checkout.name}"
    shutil.rmtree(store, ignore_errors=True)
    out = {}
    cwd = os.getcwd()
    os.chdir(checkout)
    try:
        for step, args in (("ingest", ["ingest", str(trace), "--store", str(store)]),
                           ("analyze", ["analyze", "--store", str(store), "--json"])):
            cmd, env = _cmd(checkout, args)
            out[step] = measure(cmd, stdout=str(work / f"{checkout.name}.{step}.out"), env=env)
            if out[step]["rc"]:
                raise SystemExit(f"{checkout}: {step} failed: {out[step]['stderr_tail']}")
    finally:
        os.chdir(cwd)
        shutil.rmtree(store, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="tk-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for i in range(a.repeat):
        for side, co in (("old", a.old), ("new", a.new)):
            r = run_once(co.resolve(), a.trace.resolve(), work)
            runs[side].append(r)
            for step, m in r.items():
                print(f"{side} {co} #{i + 1} {step}: {m['wall_s']} s wall, {m['cpu_s']} s CPU, "
                      f"{m['peak_mib']} MiB, load {m['loadavg_1m']}", flush=True)
    if a.out:
        a.out.write_text(json.dumps(runs, indent=1))
    print("\n| step | old wall s / CPU s / peak MiB | new wall s / CPU s / peak MiB |\n|---|---|---|")
    for step in ("ingest", "analyze"):
        cells = []
        for side in ("old", "new"):
            ms = [r[step] for r in runs[side]]
            cells.append(" / ".join(", ".join(str(m[k]) for m in ms) for k in ("wall_s", "cpu_s", "peak_mib")))
        print(f"| {step} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
