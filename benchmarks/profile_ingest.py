"""Where `tracekit ingest` spends its time and memory, by tracekit source line.

    python benchmarks/profile_ingest.py TRACE [TRACE ...] [--top 25] [--interval-ms 1]

Runs :func:`tracekit.ingest.ingest_paths` on the files (into a temporary store)
in this process, with:

* a sampling thread that, every interval, notes the innermost frame of the main
  thread that lies in tracekit's own code (file:line and function) and the
  process's RSS, so time and the peak of memory are charged to tracekit lines;
  a long call into C that holds the GIL (a JSON decode) is charged to the line
  that made it only approximately (the sample lands when it returns), so read
  the function totals of ``pyinstrument`` beside it for those;
* every DuckDB query timed exactly (``duckdb.connect`` is wrapped), charged to
  the tracekit line that ran it, with the first words of its SQL.

Single process: use ``jobs=1`` semantics (what a one-file ingest does anyway).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def _ours(filename: str) -> bool:
    return filename.startswith(str(REPO / "tracekit")) or filename.startswith(str(REPO / "analyses"))


def _where(frame) -> tuple[str, int, str] | None:
    f = frame
    while f is not None:
        if _ours(f.f_code.co_filename):
            return (os.path.relpath(f.f_code.co_filename, REPO), f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


def _stack_funcs(frame) -> list[str]:
    out = []
    f = frame
    while f is not None:
        if _ours(f.f_code.co_filename):
            out.append(f"{os.path.relpath(f.f_code.co_filename, REPO)}:{f.f_code.co_name}")
        f = f.f_back
    return out


class Sampler(threading.Thread):
    def __init__(self, target_ident: int, interval: float):
        super().__init__(daemon=True)
        self.target = target_ident
        self.interval = interval
        self.lines: collections.Counter = collections.Counter()
        self.funcs: collections.Counter = collections.Counter()
        self.peak = (0, None)
        self.stop = threading.Event()

    def run(self):
        last = time.perf_counter()
        while not self.stop.is_set():
            time.sleep(self.interval)
            now = time.perf_counter()
            dt, last = now - last, now
            frame = sys._current_frames().get(self.target)
            if frame is None:
                continue
            w = _where(frame)
            self.lines[w] += dt
            for fn in set(_stack_funcs(frame)):
                self.funcs[fn] += dt
            rss = _rss()
            if rss > self.peak[0]:
                self.peak = (rss, w)


class _TimedCon:
    """A DuckDB connection whose execute/executemany calls are timed per calling line."""

    def __init__(self, con, sink):
        self._con = con
        self._sink = sink

    def _timed(self, name, sql, *a, **kw):
        caller = _where(sys._getframe(2))
        t = time.perf_counter()
        try:
            return getattr(self._con, name)(sql, *a, **kw)
        finally:
            head = " ".join(str(sql).split())[:70]
            self._sink[(caller, head)] += time.perf_counter() - t

    def execute(self, sql, *a, **kw):
        return self._timed("execute", sql, *a, **kw)

    def executemany(self, sql, *a, **kw):
        return self._timed("executemany", sql, *a, **kw)

    def sql(self, sql, *a, **kw):
        return self._timed("sql", sql, *a, **kw)

    def __getattr__(self, name):
        return getattr(self._con, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._con.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--interval-ms", type=float, default=1.0)
    ap.add_argument("--dump", type=Path, default=None, help="write every line's seconds as JSON here")
    args = ap.parse_args(argv)

    import duckdb

    queries: collections.Counter = collections.Counter()
    real_connect = duckdb.connect
    duckdb.connect = lambda *a, **kw: _TimedCon(real_connect(*a, **kw), queries)

    from tracekit.ingest import ingest_paths
    from tracekit.store import Store

    sys.setswitchinterval(args.interval_ms / 1000.0)
    sampler = Sampler(threading.get_ident(), args.interval_ms / 1000.0)
    rss0 = _rss()
    with tempfile.TemporaryDirectory(prefix="tracekit-prof-") as tmp:
        sampler.start()
        t0 = time.perf_counter()
        ingest_paths(list(args.paths), Store(Path(tmp) / "store"), jobs=1)
        wall = time.perf_counter() - t0
        sampler.stop.set()
        sampler.join()
    duckdb.connect = real_connect

    peak, at = sampler.peak
    print(f"ingest wall {wall:.2f} s; RSS at start {rss0 / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB at {at}")
    print(f"\ntop {args.top} functions (inclusive seconds, tracekit frames only)")
    for fn, s in sampler.funcs.most_common(args.top):
        print(f"  {s:7.2f}  {fn}")
    print(f"\ntop {args.top} lines (seconds charged to the innermost tracekit line)")
    for w, s in sampler.lines.most_common(args.top):
        where = "(outside tracekit code)" if w is None else f"{w[0]}:{w[1]} {w[2]}"
        print(f"  {s:7.2f}  {where}")
    if args.dump:
        import json

        rows = [dict(file=w[0], line=w[1], func=w[2], s=round(v, 4)) for w, v in sampler.lines.items() if w]
        args.dump.write_text(json.dumps(dict(wall_s=wall, lines=rows, funcs=dict(sampler.funcs)), indent=1))
    print("\nDuckDB queries (exact seconds, by calling line)")
    for (w, head), s in queries.most_common(args.top):
        where = "?" if w is None else f"{w[0]}:{w[1]} {w[2]}"
        print(f"  {s:7.2f}  {where}  {head}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
