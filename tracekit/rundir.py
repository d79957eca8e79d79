"""Run folders: where a collector or ``tracekit.profile`` writes one run's traces and run_config.json.

A run folder is ``<out>/<workload>-YYYYmmdd-HHMMSS-xxxx`` (default out: ./tracekit-runs); its name
becomes the run id in the store.
"""

from __future__ import annotations

import datetime as _dt
import os
import secrets
from pathlib import Path

from tracekit.errors import BadInputError, TracekitError


def new_run_id(workload: str, now: _dt.datetime | None = None) -> str:
    """``<workload>-YYYYmmdd-HHMMSS-xxxx`` (local time, 4 random hex digits)."""
    now = now or _dt.datetime.now()
    return f"{workload}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def new_run_dir(out: str | os.PathLike | None, workload: str) -> Path:
    """Create and return a fresh run folder ``<out>/<run_id>`` (default out: ./tracekit-runs)."""
    base = Path(out) if out is not None else Path("tracekit-runs")
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInputError(f"{base}: cannot create the output folder ({exc.strerror or exc})") from None
    for _ in range(100):
        d = base / new_run_id(workload)
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
        except OSError as exc:
            raise BadInputError(f"{d}: cannot create the run folder ({exc.strerror or exc})") from None
    raise TracekitError(f"{base}: could not find a free run folder name")
