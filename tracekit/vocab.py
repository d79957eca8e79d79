"""Names written into traces by tracekit's collectors and read back by its ingest.

The ground layer: no imports, so the profile agent can load it inside a user's job and the ingest
can read it without importing any collector.

- :data:`LABEL_PREFIX`: a ``torch.profiler.record_function`` range named ``LABEL_PREFIX + name``
  around a ``torch.distributed`` call names that call's process group (written by
  ``tracekit.collectors.pg_labels``, read by ``tracekit.ingest.pg_attribution``, rule 0).
"""

LABEL_PREFIX = "tracekit.process_group:"
