"""`tracekit collect WORKLOAD`: run a built-in real workload with the profiler on, then ingest it (placeholder)."""

import typer

app = typer.Typer(help="Run a built-in real workload (tp, ...) on N ranks with the profiler on, then ingest it.", no_args_is_help=True)
