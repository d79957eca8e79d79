"""Running real things with the profiler on.

- ``collectors.launch``: spawn N ranks (one process each, process group over a
  free local port), the torch.profiler schedule, per-rank trace export, the run
  folder, failure gathering. Reused by every workload.
- ``collectors.workloads``: the built-in real workloads (``tp`` now).
"""
