"""Registration of the top-level commands on the typer app."""

from __future__ import annotations

from tracekit.cli import app
from tracekit.cli import collect as _collect
from tracekit.cli import predict as _predict

app.add_typer(_collect.app, name="collect")
app.add_typer(_predict.app, name="predict")
