"""Named baselines: a name (``main``, ``last-good``) that points at a run of the store, so a CI
pipeline compares each new run with ``baseline:NAME`` instead of a run id it would have to remember.

Layout: ``<store>/baselines/<NAME>.json`` holds ``{"name", "run_id", "version", "set_at"}``
(``version`` the run's version directory when the baseline was set, ``set_at`` UTC ISO 8601).
Each baseline is its own file, written to a temporary file beside it and renamed over it
(:func:`tracekit.store.atomic_output`), so readers see the old target or the new one and two
pipelines setting different names never lose each other's write.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from typing import Any

from tracekit.errors import StoreError
from tracekit.store import Store, atomic_output

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
"""A baseline name: letters, digits, ``.``, ``_``, ``-`` (first a letter or digit), at most 100."""

PREFIX = "baseline:"
"""``diff baseline:NAME NEW`` names a run by its baseline."""


def _dir(store: Store):
    return store.path / "baselines"


def _check_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise StoreError(f"baseline name {name!r}: use letters, digits, '.', '_' or '-' (at most 100 characters)")
    return name


def _version(store: Store, run_id: str) -> str | None:
    link = store.run_dir(run_id)
    return os.path.basename(os.readlink(link)) if link.is_symlink() else None


def set_baseline(store: Store, name: str, run_id: str) -> dict[str, Any]:
    """Point baseline ``name`` at run ``run_id`` (replacing its previous target); returns the record.
    Raises StoreError when the name is malformed or the run is not in the store."""
    _check_name(name)
    if not store.has_run(run_id):
        raise store.missing_run(run_id)
    rec = dict(name=name, run_id=run_id, version=_version(store, run_id),
               set_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    _dir(store).mkdir(parents=True, exist_ok=True)
    with atomic_output(_dir(store) / f"{name}.json") as tmp:
        tmp.write_text(json.dumps(rec, indent=2) + "\n", encoding="utf-8")
    return rec


def list_baselines(store: Store) -> list[dict[str, Any]]:
    """Every baseline, sorted by name, each with ``present`` (its run is still in the store) and
    ``replaced`` (the run was re-ingested since: its current version differs from the one recorded)."""
    d = _dir(store)
    out = []
    if not d.is_dir():
        return out
    for f in sorted(d.glob("*.json")):
        try:
            rec = json.loads(f.read_text(encoding="utf-8"))
            rid = rec["run_id"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"{f}: not a baseline record ({exc})") from None
        present = store.has_run(rid)
        rec["present"] = present
        rec["replaced"] = bool(present and rec.get("version") and _version(store, rid) not in (None, rec["version"]))
        out.append(rec)
    return out


def resolve_run(store: Store, ref: str) -> tuple[str, str | None]:
    """``baseline:NAME`` → (its run id, a warning or None); any other text is a run id, returned as
    it is. Raises StoreError when the baseline does not exist or its run has left the store."""
    if not ref.startswith(PREFIX):
        return ref, None
    name = _check_name(ref[len(PREFIX):])
    f = _dir(store) / f"{name}.json"
    if not f.is_file():
        known = ", ".join(b["name"] for b in list_baselines(store)) or "none"
        raise StoreError(f"no baseline {name!r} in {store.path} (baselines: {known}; "
                         f"set one with `tracekit baseline set {name} RUN`)")
    rec = next(b for b in list_baselines(store) if b["name"] == name)
    if not rec["present"]:
        raise StoreError(f"baseline {name!r} points at run {rec['run_id']!r}, which is no longer in {store.path}")
    warn = None
    if rec["replaced"]:
        warn = (f"baseline {name!r}: run {rec['run_id']} was re-ingested after the baseline was set "
                f"({rec['set_at']}); comparing with its current version")
    return rec["run_id"], warn
