"""Progress display for long steps: a rich progress bar on a terminal, nothing when piped.

Library code takes an optional ``progress`` callable and calls it as
``progress("phase text", total=N)`` to start a phase of N units,
``progress(advance=1)`` when a unit is done, and ``progress("text")`` for a
phase without units. :func:`terminal_progress` builds such a callable.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator


@contextlib.contextmanager
def terminal_progress(stream=None) -> Iterator[Callable | None]:
    """Yield a progress callable drawing on ``stream`` (stderr) if it is a terminal, else None."""
    stream = stream or sys.stderr
    if not stream.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(file=stream), transient=True,
    ) as bar:
        state = {"task": None}

        def progress(text: str | None = None, *, total: int | None = None, advance: int = 0) -> None:
            if text is not None:
                if state["task"] is not None:
                    bar.update(state["task"], completed=bar.tasks[state["task"]].total or 0)
                state["task"] = bar.add_task(text, total=total)
            elif state["task"] is not None and advance:
                bar.advance(state["task"], advance)

        yield progress
