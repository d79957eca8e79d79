"""The CLI's option conventions, applied once to every command instead of typed at each option.

- a boolean option is a ``--flag/--no-flag`` pair (``--replace/--no-replace``);
- every option that takes a value shows a typed metavar in ``--help``: the one its declaration
  names, else one from its name (``--run`` RUN, ``--store`` DIR, ``--link`` PRESET, ``--bytes``
  SIZE, ``--ranks`` INT: numbers some commands read as text show their type), else from its type
  (INT, FLOAT, PATH, TEXT); a flag shows none. typer alone prints ``<bool>``/``<str>``;
- a comma-separated default (``--ops``) is shown with spaces, so ``--help`` wraps it instead of
  cutting it.

:func:`apply` walks the typer app's commands (and its sub-apps') and rewrites their
``typer.Option`` declarations before typer builds the click commands, i.e. before the first
``app(...)`` call. ``tests/cli/test_cli_help.py`` snapshots every command's ``--help``.
"""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

BY_NAME = {
    "--run": "RUN", "--run-id": "RUN", "--store": "DIR", "--out": "DIR", "--link": "PRESET",
    "--link-in": "PRESET", "--link-out": "PRESET", "--bytes": "SIZE", "--min-bytes": "SIZE",
    "--max-bytes": "SIZE", "--comm-pattern": "REGEX", "--html": "FILE", "--perfetto": "FILE",
    "--output": "FILE", "--alpha": "TIME", "--beta": "RATE", "--compute": "TIME", "--comm": "TIME",
    "--alpha-chunk": "TIME", "--workload": "NAME", "--ops": "OPS", "--dtype": "DTYPE",
    # numbers the commands read as text (to name the option in their errors): their type, not TEXT
    "--ranks": "INT", "--nodes": "INT", "--gpus-per-node": "INT", "--nics-per-node": "INT", "--nics": "INT",
    "--layers": "INT", "--stages": "INT", "--microbatches": "INT", "--tokens": "INT", "--max-chunks": "INT",
    "--chunks": "N|best", "--efficiency": "FLOAT", "--stage-time": "TIME", "--transfer": "TIME",
    "--layer-compute": "TIME", "--machine": "MACHINE", "--algo": "ALGO", "--backend": "BACKEND",
    "--align": "MODE", "--op": "OP",
}
"""Metavars by option name: what the value is, where a type (TEXT) would say less."""

BY_TYPE = {int: "INT", float: "FLOAT", str: "TEXT", Path: "PATH"}
_TYPE_WORDS = {"STR": "TEXT", "STR...": "TEXT..."}


def _bare(annotation):
    """``Optional[X]``/``List[X]`` → X."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, list, tuple) and len(args) == 1:
        return _bare(args[0])
    return annotation


def _fix_option(info, annotation) -> None:
    decls = list(info.param_decls or ())
    typ = _bare(annotation)
    if typ is bool:
        if decls and not any("/" in d for d in decls) and decls[0].startswith("--"):
            decls[0] = f"{decls[0]}/--no-{decls[0][2:]}"
            info.param_decls = tuple(decls)
        if info.metavar is None:
            info.metavar = ""  # a flag takes no value: show none
        return
    if info.metavar is None:
        long = next((d.split("/")[0] for d in decls if d.startswith("--")), None)
        info.metavar = BY_NAME.get(long) or BY_TYPE.get(typ) or "TEXT"
    default = info.default
    if isinstance(default, str) and "," in default and " " not in default and info.show_default is True:
        info.show_default = default.replace(",", ", ")  # a list wraps in --help instead of being cut at "…"


def _fix_command(callback) -> None:
    import typer.models

    for p in inspect.signature(callback).parameters.values():
        if isinstance(p.default, typer.models.ArgumentInfo) and p.default.metavar is None:
            p.default.metavar = p.name.upper()  # usage line: QUERY, not {query}
        if isinstance(p.default, typer.models.OptionInfo):
            hint = p.annotation
            if isinstance(hint, str):  # from __future__ import annotations
                hint = typing.get_type_hints(callback).get(p.name, str)
            _fix_option(p.default, hint)


def _typed_display(orig):
    """typer's ``display_type_rich`` without ``<bool>``/``<str>``: nothing for a flag (``--help``
    included), the metavar where one is set, else the type's name in capitals (PATH...)."""

    def display(self, ctx):
        if getattr(self, "is_flag", False):
            return ""
        from typer.core import TyperArgument

        if self.metavar is not None and not isinstance(self, TyperArgument):  # an argument's is its name
            return self.metavar
        shown = orig(self, ctx)
        if isinstance(shown, str) and shown.startswith("<") and ">" in shown:
            inner = shown[1:shown.index(">")]
            if inner.startswith("list[") and inner.endswith("]"):
                inner = inner[5:-1] + "..."
            shown = _TYPE_WORDS.get(inner.upper(), inner.upper()) + shown[shown.index(">") + 1:]
        return shown

    display._tracekit = True
    return display


def _patch_typer_display() -> None:
    """Route typer's type column through :func:`_typed_display` (typer >= 0.29 prints ``<bool>``
    and ``<str>`` where older ones printed nothing or TEXT); a typer without the hook is left alone."""
    try:
        from typer import core
    except ImportError:  # pragma: no cover
        return
    for cls in (getattr(core, "TyperOption", None), getattr(core, "TyperArgument", None)):
        fn = getattr(cls, "display_type_rich", None)
        if fn is not None and not getattr(fn, "_tracekit", False):
            cls.display_type_rich = _typed_display(fn)


def apply(app) -> None:
    """Apply the conventions (module docstring) to every command of ``app`` and its sub-apps."""
    _patch_typer_display()
    for cmd in app.registered_commands:
        if cmd.callback is not None:
            _fix_command(cmd.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            apply(group.typer_instance)


TORCH_HINT = (
    "install the collectors' extra and a torch build: pip install 'tracekit[collect]' "
    "(then torch itself: on a GPU machine the CUDA build from pytorch.org, elsewhere the CPU wheel: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu)"
)


def require_torch(command: str) -> None:
    """Raise BadInputError (exit 2, one line) when torch is not importable: ``tracekit collect`` and
    ``tracekit profile`` run real torch jobs; the analyzer (ingest, analyze, sql, ...) needs none."""
    import importlib.util

    from tracekit.errors import BadInputError

    if importlib.util.find_spec("torch") is None:
        raise BadInputError(f"{command} needs torch, which is not installed: {TORCH_HINT}")


PROFILER_NOISE_PCT = 3.0
"""Below this magnitude a measured profiler overhead (step time with the profiler against without)
is reported as "within noise": it is the threshold this team chose for step-time differences of a
few recorded steps on shared CPU machines, where a negative overhead (the profiled steps faster)
shows the spread is at least that large. A choice, not a measurement of every machine."""


def overhead_text(pct: float) -> str:
    """``profiler overhead +12.3% per recorded step``, or ``within noise`` below :data:`PROFILER_NOISE_PCT`."""
    if abs(pct) < PROFILER_NOISE_PCT:
        return f"profiler overhead within noise ({pct:+.1f}%, |x| < {PROFILER_NOISE_PCT:g}%)"
    return f"profiler overhead {pct:+.1f}% per recorded step"
