"""Run HTA's temporal breakdown on a directory of rank traces; print JSON.

Usage (with the interpreter of the HTA virtual environment, see setup_hta.sh):

    .venv-hta/bin/python benchmarks/hta_breakdown.py TRACE_DIR [--no-ns-rounding] [--include-last-step]

Prints one JSON object on stdout: ``{"<rank>": {"idle_us": ..., "compute_us": ...,
"non_compute_us": ..., "kernel_us": ...}, ...}``, HTA's ``get_temporal_breakdown(visualize=False)``
columns ``idle_time(us)``, ``compute_time(us)``, ``non_compute_time(us)``, ``kernel_time(us)``
(HTA 0.5: kernel time = end of the rank's last GPU op − start of its first; idle = kernel time −
|∪ GPU ops|; compute = |∪ computation kernels|; non-compute = the rest). HTA's own log lines go to
stderr. The options are those of ``hta_overlap.py`` (HTA_DISABLE_NS_ROUNDING=1;
``include_last_profiler_step=True``).
"""

from __future__ import annotations

import json
import sys

from hta_overlap import run_hta  # beside this file: the argument parsing and HTA loading they share


def main(argv: list[str] | None = None) -> int:
    df = run_hta(argv, __doc__.splitlines()[0], "get_temporal_breakdown")
    out = {}
    for row in df.to_dict("records"):
        out[str(int(row["rank"]))] = {
            "idle_us": float(row["idle_time(us)"]), "compute_us": float(row["compute_time(us)"]),
            "non_compute_us": float(row["non_compute_time(us)"]), "kernel_us": float(row["kernel_time(us)"]),
        }
    json.dump(out, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
