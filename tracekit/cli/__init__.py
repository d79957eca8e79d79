"""The ``tracekit`` command line (typer + rich).

Thin on purpose: each command parses its arguments and calls a library
function that tests can call too. Errors of the ``TracekitError`` family are
caught once, here, and printed as one line (exit 2 for bad input, 1 otherwise).
Heavy imports (torch, DuckDB) happen inside the commands that need them.
"""

from __future__ import annotations

import os
import sys

# Before anything imports pyarrow: its C++ default pool is read from the environment
# once. The system allocator gives freed memory back where mimalloc (the default)
# keeps it per thread.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

import typer  # noqa: E402

from tracekit.errors import TracekitError  # noqa: E402

app = typer.Typer(
    name="tracekit",
    help="Trace-driven profiler and communication/compute overlap analyzer for distributed LLM jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

from tracekit.cli import baseline, commands, conventions, export_diff, predict, profile, whatif  # noqa: E402

COMMANDS = (
    ("profile", profile.profile, profile.COMMAND_OPTIONS),
    ("ingest", commands.ingest, {}),
    ("analyze", commands.analyze, {}),
    ("runs", commands.runs, {}),
    ("sql", commands.sql, {}),
    ("export", export_diff.export, {}),
    ("diff", export_diff.diff, {}),
    ("whatif", whatif.whatif, {}),
)
"""Every top-level command: (name, function, typer's ``app.command`` options), in ``--help`` order."""

GROUPS = (
    ("collect", commands.collect_group()),  # the workloads (tracekit/cli/collect.py), loaded on first lookup
    ("predict", predict.app),
    ("baseline", baseline.baseline_app),
)
"""Every command group: (name, typer sub-app)."""

for _name, _fn, _opts in COMMANDS:
    app.command(_name, **_opts)(_fn)
for _name, _group in GROUPS:
    app.add_typer(_group, name=_name)

conventions.apply(app)  # --flag/--no-flag, typed metavars (tracekit/cli/conventions.py)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (0 ok, 2 bad input/usage, 1 internal, 3 partial ingest:
    some nccl-tests logs left out, see `tracekit ingest --strict`)."""
    try:
        rv = app(args=argv, prog_name="tracekit", standalone_mode=False)
        if isinstance(rv, int) and rv != 0:  # typer turns Ctrl-C into a return value of 130
            if rv == 130:
                print("tracekit: interrupted", file=sys.stderr)
            return rv
    except TracekitError as exc:
        from tracekit.report.textfmt import literal

        print(literal(f"tracekit: {exc}"), file=sys.stderr)  # one line: a newline in a name is written \\n
        return exc.exit_code
    except typer.Exit as exc:  # typer/click normal exits
        return exc.exit_code
    except SystemExit as exc:
        return int(exc.code or 0)
    except KeyboardInterrupt:
        print("tracekit: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # click usage errors and the like
        code = _usage_error(exc)
        if code is not None:
            return code
        if os.environ.get("TRACEKIT_DEBUG"):
            raise
        where = ""
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            where = f" at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(
            f"tracekit: internal error: {type(exc).__name__}: {first}{where} (set TRACEKIT_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1
    return 0


def _click_kinds():
    """Usage-error and abort classes of whichever click typer uses (its vendored copy in typer >= 0.29)."""
    kinds: list = []
    aborts: list = [typer.Abort]
    try:
        import click

        kinds.append(click.ClickException)
        aborts.append(click.exceptions.Abort)
    except ImportError:  # typer >= 0.29 no longer installs click
        pass
    try:
        from typer._click import exceptions as tce

        kinds.append(tce.ClickException)
    except ImportError:  # pragma: no cover - older typer
        pass
    return tuple(kinds), tuple(aborts)


def _usage_error(exc: Exception) -> int | None:
    """Print a click/typer usage error as one line and return its exit code; None if not one."""
    kinds, aborts = _click_kinds()
    if isinstance(exc, aborts):
        print("tracekit: aborted", file=sys.stderr)
        return 1
    if not isinstance(exc, kinds):
        return None
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        print(ctx.get_help())
        return 2
    text = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    msg = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    usage = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
    print(f"tracekit: {msg}{usage}", file=sys.stderr)
    return int(getattr(exc, "exit_code", 2) or 2)


PANDAS_FREE = frozenset({"ingest", "analyze", "runs", "sql", "export", "diff", "whatif", "baseline"})
"""The commands that build Arrow arrays but never hand pandas objects to pyarrow
(:func:`pyarrow_without_pandas`)."""


def pyarrow_without_pandas() -> None:
    """Spare the process pandas' import where nothing asks for it. pyarrow imports pandas the first
    time it builds an array from Python or numpy objects, only to ask whether they are pandas
    objects, and its answer is kept for the process; asked here once with pandas hidden, it answers
    no without importing it. pandas itself still imports wherever it is asked for by name
    (``Table.to_pandas``, DuckDB's ``.df()``), and works."""
    import importlib.abc

    class _Hidden(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "pandas" or name.startswith("pandas."):
                raise ImportError("pandas hidden while pyarrow asks for it")
            return None

    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    hidden = _Hidden()
    sys.meta_path.insert(0, hidden)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(hidden)


def entry() -> None:  # pragma: no cover - thin wrapper for console scripts
    if len(sys.argv) > 1 and sys.argv[1] in PANDAS_FREE:
        pyarrow_without_pandas()
    sys.exit(main())
