"""The replay's validation table (benchmarks/README.md, "Replay (what-if)"): per input, every step
of its graph replayed unchanged against the measured step (analyses/replay.py, replay_steps), and
replayed with every GPU op's delay dropped (the edges alone: no launch latency, no unrecorded
wait), the largest |error| over ranks and steps of each; and the wall time of the graphs'
build and replay. Inputs: the collected workload fixtures and the multi-rank sets of
../shared/traces (single ranks of bigger jobs listed with their limit).

    python benchmarks/replay_errors.py [PATH ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT = [REPO / "fixtures" / w for w in ("tp_2rank", "tp_chunks_2rank", "ep_2rank", "pp_2rank", "pp_decode_2rank",
                                           "kv_bulk_2rank", "kv_layerwise_2rank", "sweep_2rank", "3d_2x2x2")] + [
    REPO.parent / "shared" / "traces" / t for t in ("param_dlrm_8rank_v100", "hta_ddp_v100_r1of2",
                                                    "hta_nccl_parser_a100_r0of2", "hta_pyper_a100_r0of16")]


def main(paths: list[str]) -> int:
    from tracekit import analyses
    from tracekit.analyses import replay as rpl
    from tracekit.ingest import ingest_paths
    from tracekit.model import whatif as wf
    from tracekit.store import Store

    print("| input | ranks / world | steps | nodes | edges | max \\|error\\| replayed | max \\|error\\| GPU delays dropped | replay s |")
    print("|---|---|---|---|---|---|---|---|")
    for src in map(Path, paths or DEFAULT):
        if not src.exists():
            print(f"| {src.name} | absent | | | | | | |")
            continue
        with tempfile.TemporaryDirectory() as d:
            store = Store(Path(d) / "s")
            ingest_paths([src], store, run_id="r")
            con = analyses.connect(store)
            world, ranks = con.execute("SELECT max(world_size), (SELECT count(*) FROM ranks) FROM runs").fetchone()
            t = time.perf_counter()
            err = err0 = 0.0
            steps = nodes = edges = 0
            for g in rpl.graphs(con, "r"):
                meas, rep = rpl.measured_ns(g), wf.replay(g).step_ns()
                g0 = g.copy()
                g0.delay = np.where(g.gpu, 0, g.delay)
                rep0 = wf.replay(g0).step_ns()
                err = max([err] + [abs(rep[r] - meas[r]) / meas[r] for r in meas if meas[r]])
                err0 = max([err0] + [abs(rep0[r] - meas[r]) / meas[r] for r in meas if meas[r]])
                steps, nodes, edges = steps + 1, nodes + g.n, edges + len(g.src)
            dt = time.perf_counter() - t
            con.close()
        print(f"| {src.name} | {ranks} / {world} | {steps} | {nodes:,} | {edges:,} | {err:.2%} | {err0:.2%} | {dt:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
