"""Running a command under Nsight Systems (``nsys profile``) with a SQLite export.

Used by ``tracekit collect tp --profiler nsys`` (each rank under its own nsys
session, ``rank{r}.sqlite``) and ``tracekit profile --nsys -- CMD`` (one nsys
session around the whole job, ``job.sqlite``). The exported SQLite is what
:mod:`tracekit.ingest.nsys` reads.

The command line follows the documented ``nsys profile`` switches:
``--trace=cuda,nvtx,osrt`` (what to trace), ``--export=sqlite`` (after the
capture, also export the report as ``<out_base>.sqlite`` next to
``<out_base>.nsys-rep``), ``--force-overwrite=true`` and ``-o <out_base>``
(nsys adds the extensions itself), then the application and its arguments.

No real ``nsys`` was available where this was written (no GPU, Nsight Systems
not installable): the command line and the file names it produces were taken
from the documentation and checked only against a fake ``nsys`` in the tests
(tests/collectors/test_nsys_profiler.py), never against Nsight Systems itself.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tracekit.errors import BadInputError

#: what ``--trace`` selects by default: CUDA API + kernels/memcpy, NVTX ranges, OS runtime calls
DEFAULT_TRACE = "cuda,nvtx,osrt"

NOT_FOUND = "nsys (Nsight Systems) is not on PATH: install it or add it to PATH, or use the torch profiler"


def find_nsys() -> str:
    """The path of the ``nsys`` executable found on PATH.

    Raises BadInputError (exit 2, one line) when there is none, so that callers
    can check before creating a run folder or starting any process.
    """
    path = shutil.which("nsys")
    if not path:
        raise BadInputError(NOT_FOUND)
    return path


def nsys_command(
    nsys: str,
    out_base: str | os.PathLike,
    trace: str = DEFAULT_TRACE,
    *,
    capture_range: str | None = None,
) -> list[str]:
    """The ``nsys profile`` prefix that runs an application and exports SQLite.

    Append the application's argv to the returned list. `out_base` is the report
    path without extension: nsys writes ``<out_base>.nsys-rep`` and, because of
    ``--export=sqlite``, ``<out_base>.sqlite``. An existing report of that name
    is overwritten. `capture_range` (e.g. ``"cudaProfilerApi"``) limits the
    capture to what the application brackets with cudaProfilerStart/Stop; by
    default the whole run of the application (and its children) is captured.
    """
    cmd = [
        str(nsys),
        "profile",
        f"--trace={trace}",
        "--export=sqlite",
        "--force-overwrite=true",
    ]
    if capture_range:
        cmd.append(f"--capture-range={capture_range}")
    cmd += ["-o", str(Path(out_base))]
    return cmd


def sqlite_path(out_base: str | os.PathLike) -> Path:
    """Where ``--export=sqlite`` puts the export for report base name `out_base`."""
    p = Path(out_base)
    return p.with_name(p.name + ".sqlite")
