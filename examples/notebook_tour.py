"""A tour of tracekit's Python API, cell by cell (run it as a script, or paste the cells into a notebook).

    python examples/notebook_tour.py [STORE]     # default: a fresh temporary store

It ingests the repository's recorded 2-rank TP fixture (fixtures/tp_2rank) and asks the
questions a performance engineer asks first. tests/cli/test_api.py runs it.
"""

import sys
import tempfile
from pathlib import Path

import tracekit

REPO = Path(__file__).resolve().parents[1]

# %% Open a store (nothing is read yet) and ingest one run: one trace file per rank
tk = tracekit.open(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="tracekit-tour-"))
run = tk.ingest(REPO / "fixtures" / "tp_2rank")
print(tk.runs()[["run_id", "workload", "backend", "world_size", "ranks", "events"]].to_string(index=False))

# %% What did each collective cost? Bandwidth per instance (GB/s, GB = 1e9)
bw = run.bandwidth()
print(bw.groupby("op")[["size_bytes", "sync_time_ns", "busbw_GBps"]].median())

# %% Who waited for whom: per-rank wait, and the straggler of each instance
waits = run.waits()
print(waits.groupby("rank")["wait_ns"].sum().rename("total_wait_ns"))
print(run.instances()["straggler"].value_counts().rename("times_last"))

# %% How much communication was hidden behind compute, per rank and per profiler step
print(run.overlap(by="rank")[["rank", "comm_ns", "overlap_ns", "exposed_comm_ns", "overlap_ratio"]])
print(run.overlap(by="step").head())

# %% What the α–β model says: the fit, the verdict per instance, measured vs predicted
print(run.fit()[["op", "group_size", "alpha_s", "beta_GBps", "status"]])
print(run.verdicts()["verdict"].value_counts())
print(run.measured_vs_model()[["rank", "exposed_ns", "predicted_exposed_ns", "model"]])

# %% Anything else is SQL over the same views (a DuckDB relation)
print(run.sql("SELECT op, count(*) AS n, median(busbw_gbps) AS busbw_GBps "
              "FROM collective_bandwidth GROUP BY op").df())

# %% The report as data, as HTML, and the merged timeline for ui.perfetto.dev
rep = run.report()
print(sorted(rep))
out = Path(tk.store.path)
print(run.html(out / "report.html"))
print(run.export_perfetto(out / "merged.json").to_dict())
run.close()
