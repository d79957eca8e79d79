"""`tracekit predict`: the α–β calculator (placeholder, filled by the model work)."""

import typer

app = typer.Typer(help="The α–β calculator: collective times per algorithm, hierarchical, overlap models.", no_args_is_help=True)
