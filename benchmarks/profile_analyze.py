"""Where `tracekit analyze --json` spends its time: each pipeline module's build and each report
statement, wall and CPU seconds (this process), in build order.

    python benchmarks/profile_analyze.py STORE [--run RUN_ID] [--top N] [--no-critical-path]

Runs ``build_report`` on one ``report_connection`` (as the CLI does) with ``create_module`` and the
connection's ``execute``/``sql`` wrapped by ``time.perf_counter``/``time.process_time``. A
statement's time includes the modules it built on the way (shown separately, so the statement's own
time is its total minus theirs). Prints the total, then the N costliest items.
"""

from __future__ import annotations

import argparse
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("store")
    ap.add_argument("--run", default=None)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--no-critical-path", action="store_true", help="leave the critical path out (analyze's flag)")
    args = ap.parse_args(argv)

    import tracekit.analyses as an
    from tracekit.report.data import build_report, report_connection

    items: list[tuple[str, float, float]] = []
    stack: list[list[float]] = []  # per open item: wall and CPU of the modules built inside it

    def timed(label, call):
        stack.append([0.0, 0.0])
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            return call()
        finally:
            w, c = time.perf_counter() - w0, time.process_time() - c0
            inner = stack.pop()
            items.append((label, w - inner[0], c - inner[1]))
            if stack:
                stack[-1][0] += w
                stack[-1][1] += c

    create = an.create_module
    an.create_module = lambda con, name: timed(f"build {name}", lambda: create(con, name))
    w0, c0 = time.perf_counter(), time.process_time()
    rid, con = report_connection(args.store, args.run)
    ex, sq = con.execute, con.sql
    con.execute = lambda q, *a, **k: timed("query " + " ".join(str(q).split())[:70], lambda: ex(q, *a, **k))
    con.sql = lambda q, *a, **k: timed("query " + " ".join(str(q).split())[:70], lambda: sq(q, *a, **k))
    try:
        build_report(args.store, rid, con=con, critical_path=False if args.no_critical_path else None)
    finally:
        con.close()
    w, c = time.perf_counter() - w0, time.process_time() - c0
    print(f"analyze (build_report) of run {rid}: {w:.2f} s wall, {c:.2f} CPU s")
    for label, iw, ic in sorted(items, key=lambda t: -t[1])[: args.top]:
        print(f"  {iw:7.2f} s wall {ic:7.2f} CPU s  {label}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
