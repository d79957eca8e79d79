"""The one exception hierarchy of tracekit, caught once at the CLI boundary.

Every error carries a one-line message a user can act on, naming the file and
what is wrong, e.g. ``rank-3.json.gz: truncated gzip stream (file incomplete?)``.
"""

from __future__ import annotations

import os


class TracekitError(Exception):
    """Base class. The CLI prints ``tracekit: <message>`` and exits with ``exit_code``."""

    exit_code = 1

    def __init__(self, message: str):
        # Keep messages to one line whatever the cause text holds.
        super().__init__(" ".join(str(message).split()))


class BadInputError(TracekitError):
    """Bad input or usage: a file that is not what it should be, a bad value (exit 2)."""

    exit_code = 2


class FileError(BadInputError):
    """A problem with one input file; the message starts with the file's path."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):  # survive pickling across worker processes
        return (type(self), (self.path, self.problem))


class StoreError(BadInputError):
    """The store is missing, unreadable, or written by a newer tracekit."""
