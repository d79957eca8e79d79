"""The ``run_config.json`` beside a run's rank files: read, and checked against its schema.

A tracekit collector writes ``run_config.json`` next to the traces it collects; the ingest reads
it when present (its ``workload`` names the run) and stores it whole in ``runs.config`` (JSON
text), where the report reads the overlap model's keys. A file written by somebody else is input
like any other, so it is checked before anything is stored (:func:`read_run_config`):

* the document is a JSON object, at most :data:`MAX_DEPTH` levels deep, of at most
  :data:`MAX_BYTES` bytes; every number in it is finite and every integer fits in 64 bits
  (JSON allows more; the store and the report's arithmetic do not); every string is valid
  Unicode (no lone surrogate escape, which UTF-8 cannot hold);
* the keys tracekit reads have the types of :data:`SCHEMA` (other keys are kept as they are).

A file that breaks a rule raises FileError naming the file and the key (``tracekit ingest``
exits 2 and nothing is stored).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tracekit.errors import FileError

MAX_DEPTH = 32
MAX_BYTES = 16 << 20
INT64 = 2**63 - 1

_STR, _BOOL, _DICT, _LIST, _COUNT = "a string", "true or false", "an object", "a list", "an integer >= 1"

SCHEMA: dict[str, str] = {
    "workload": _STR,  # the run's workload label (runs.workload)
    "backend": _STR,  # used when the traces do not say
    "torch_version": _STR,
    "device_name": _STR,
    "mode": _STR,  # disagg_kv: bulk | layerwise; pp: train | decode
    "overlap_model": _DICT,  # {"kind": str, "params": {...}}
    "overlap_chunks": _COUNT,
    "layers": _COUNT,
    "stages": _COUNT,
    "ranks": _COUNT,
    "microbatches": _COUNT,
    "two_batch_overlap": _BOOL,
    "partial": _BOOL,
    "timing": _DICT,
    "expected": _DICT,
    "profiler": _DICT,
    "notes": _LIST,
}
"""The keys tracekit reads from a run config and the type each must have when present (null is
allowed for any of them: the key is then as good as absent)."""


def _type_ok(v, want: str) -> bool:
    if v is None:
        return True
    if want == _STR:
        return isinstance(v, str)
    if want == _BOOL:
        return isinstance(v, bool)
    if want == _DICT:
        return isinstance(v, dict)
    if want == _LIST:
        return isinstance(v, list)
    if want == _COUNT:
        return type(v) is int and 1 <= v <= INT64
    return True


def _kind(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def check_run_config(cfg, path: Path) -> dict:
    """``cfg`` (a decoded run config) if it follows the rules of the module docstring; FileError
    naming ``path`` and the first key that does not."""
    if not isinstance(cfg, dict):
        raise FileError(path, f"a run config must be a JSON object, not {_kind(cfg)}")
    stack = [(cfg, "", 1)]
    while stack:  # depth, numbers and strings everywhere, without recursion
        v, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise FileError(path, f"key {where or '(top)'!r} nests deeper than {MAX_DEPTH} levels")
        if isinstance(v, dict):
            for k, x in v.items():
                _check_text(k, f"{where}.{k}" if where else k, path)
                stack.append((x, f"{where}.{k}" if where else str(k), depth + 1))
        elif isinstance(v, list):
            stack.extend((x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v))
        elif isinstance(v, str):
            _check_text(v, where, path)
        elif type(v) is int and not -INT64 - 1 <= v <= INT64:
            raise FileError(path, f"key {where!r}: the integer {str(v)[:24]}... does not fit in 64 bits")
        elif type(v) is float and not math.isfinite(v):
            raise FileError(path, f"key {where!r}: {v} is not a finite number")
    for key, want in SCHEMA.items():
        if key in cfg and not _type_ok(cfg[key], want):
            raise FileError(path, f"key {key!r} must be {want}, not {_kind(cfg[key])} (run config schema: "
                                  "tracekit/ingest/run_config.py)")
    m = cfg.get("overlap_model")
    if isinstance(m, dict) and ("kind" in m and not isinstance(m["kind"], str)
                                or "params" in m and not isinstance(m["params"], (dict, type(None)))):
        raise FileError(path, "key 'overlap_model' must be {\"kind\": a string, \"params\": an object}")
    return cfg


def _check_text(s, where: str, path: Path) -> None:
    try:
        str(s).encode("utf-8")
    except UnicodeEncodeError:
        raise FileError(path, f"key {where!r}: a string with a lone UTF-16 surrogate (not valid Unicode)") from None


def read_run_config(path: Path) -> dict:
    """The run config at ``path``, checked (:func:`check_run_config`). FileError when it cannot be
    read, is larger than :data:`MAX_BYTES`, is not JSON (NaN and Infinity included), or breaks
    the schema."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise FileError(path, f"larger than {MAX_BYTES >> 20} MiB: not a run config")
        text = path.read_bytes()
    except OSError as exc:
        raise FileError(path, f"cannot read it ({exc.strerror or exc})") from None

    def no_constant(name):
        raise ValueError(f"{name} is not a JSON number")

    try:
        cfg = json.loads(text, parse_constant=no_constant)
    except RecursionError:
        raise FileError(path, f"nests deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise FileError(path, f"not valid JSON ({' '.join(str(exc).split())[:160]})") from None
    return check_run_config(cfg, path)
