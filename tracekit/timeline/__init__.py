"""Pure numpy over exact int64 ns spans: interval unions and overlap (``intervals``), the GPU
time breakdown's sweep (``gpu``). No DuckDB, no store: the ingest and the analyses both call it."""
