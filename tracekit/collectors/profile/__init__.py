"""Profiling a live job with no change to its code (``tracekit profile -- CMD ...``).

- ``tracekit.collectors.profile.agent`` (in tracekit, because ``tracekit.profile`` uses it too): what runs *inside* every Python process of the
  job. Loaded by the injected ``sitecustomize``, it wraps
  ``torch.distributed.init_process_group`` (via an import hook, so torch is not
  imported early), starts ``torch.profiler`` once the process group exists (the
  rank is then known), advances the schedule on every optimizer step (PyTorch's
  global step post-hook) or on every ``tracekit.step()``, and writes the rank's
  Kineto trace after the active steps, at exit, or on SIGTERM. Standard library
  and torch only: the job's Python need not have tracekit installed.
- ``collectors/profile/sitecustomize.py``: the injected file. The runner copies it
  alone into a private folder put first on the job's ``PYTHONPATH``; it loads the
  agent by path, then chains to any other ``sitecustomize`` the environment had.
- ``tracekit.collectors.profile.runner``: the parent side. Runs the command in its own
  process group, forwards Ctrl-C, reaps every process the job left behind,
  gathers the per-rank traces and the agents' status files, and ingests them as
  one run (workload ``external``).
"""
