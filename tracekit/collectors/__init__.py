"""Running real things with the profiler on.

- ``tracekit.collectors.launch``: spawn N ranks (one process each, process group over a
  free local port), the torch.profiler schedule, per-rank trace export, the run
  folder, failure gathering. Reused by every workload.
- ``tracekit.collectors.workloads``: the built-in real workloads (``tp`` now).
"""
