"""Run HTA's communication/computation overlap on a directory of rank traces; print JSON.

Usage (with the interpreter of the HTA virtual environment, see setup_hta.sh):

    .venv-hta/bin/python benchmarks/hta_overlap.py TRACE_DIR [--no-ns-rounding] [--include-last-step]

Prints one JSON object on stdout: ``{"<rank>": overlap_ratio, ...}`` where
overlap_ratio is HTA's ``comp_comm_overlap_pctg`` / 100 (HTA rounds the
percentage to 2 decimals, so the ratio is known to ±5e-5), ``null`` where
HTA returns NaN (a rank with no communication kernels).

This is the whole HTA side of the cross-check test and of the benchmark: one
process that loads the traces (``TraceAnalysis(trace_dir=...)``) and calls
``get_comm_comp_overlap(visualize=False)``. HTA's own log lines go to stderr.

Options map to HTA's documented switches:
  --no-ns-rounding     set HTA_DISABLE_NS_ROUNDING=1 (HTA otherwise rounds float
                       timestamps: start up, end down, to whole microseconds)
  --include-last-step  TraceAnalysis(include_last_profiler_step=True) (HTA
                       otherwise drops the GPU work launched in the last
                       profiler step)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys


def run_hta(argv: list[str] | None, description: str, method: str):
    """Parse ``TRACE_DIR [--no-ns-rounding] [--include-last-step]`` from ``argv``, load the traces
    with HTA (``TraceAnalysis``) and return ``getattr(ta, method)(visualize=False)``, a DataFrame.
    HTA logs to stdout through its logger config: stdout is kept for our JSON only."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("trace_dir")
    ap.add_argument("--no-ns-rounding", action="store_true")
    ap.add_argument("--include-last-step", action="store_true")
    args = ap.parse_args(argv)
    if args.no_ns_rounding:
        os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"  # read by HTA at parse time
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        from hta.trace_analysis import TraceAnalysis

        ta = TraceAnalysis(trace_dir=os.path.abspath(args.trace_dir), include_last_profiler_step=args.include_last_step)
        return getattr(ta, method)(visualize=False)
    finally:
        sys.stdout = real_stdout


def main(argv: list[str] | None = None) -> int:
    df = run_hta(argv, __doc__.splitlines()[0], "get_comm_comp_overlap")
    out = {}
    for rank, pct in zip(df["rank"].tolist(), df["comp_comm_overlap_pctg"].tolist()):
        pct = float(pct)
        out[str(int(rank))] = None if math.isnan(pct) else round(pct / 100.0, 6)
    json.dump(out, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
