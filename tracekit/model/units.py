"""Reading and writing the units of the α–β model: bytes, bandwidths, times.

Conventions (../shared/reference/alpha-beta.md, "Units"):

- bytes use decimal prefixes, 1 KB = 1e3 B, 1 MB = 1e6 B, 1 GB = 1e9 B (what
  nccl-tests reports); KiB/MiB/GiB/TiB (powers of 1024) are accepted when
  written as such, and a bare ``K``/``M``/``G`` is refused rather than guessed by
  :func:`parse_bytes`; the command line's :func:`parse_size` reads it as binary, the
  nccl-tests flags' convention, and says so in every option's help;
- a bandwidth is bytes per second, per direction: ``400Gb/s`` (bits) is
  5e10 B/s, and a figure marked ``bidirectional`` is halved;
- times are seconds (float).

Every parser raises :class:`tracekit.errors.BadInputError` with a one-line
message saying what was expected.
"""

from __future__ import annotations

import math
import re

from tracekit.errors import BadInputError

__all__ = [
    "parse_bytes",
    "parse_size",
    "parse_bandwidth",
    "parse_time",
    "format_bytes",
    "format_time",
    "format_bandwidth",
]

# A decimal number: 12, 1.5, .5, 1e9, 1.342e+3 (sign handled separately).
_NUMBER = r"(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"

_DECIMAL = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_BINARY = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40, "pi": 2.0**50}

_BYTES_EXPECTED = (
    "expected a non-negative number with an optional unit B, KB, MB, GB, TB "
    "(powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 100MB"
)
_BANDWIDTH_EXPECTED = (
    "expected a positive rate such as 360GB/s, 400Gb/s, 400Gbps or 25GiB/s "
    "(per direction; add 'bidirectional' to halve a two-way figure), or a plain number of B/s"
)
_TIME_EXPECTED = "expected a non-negative time such as 2us, 2µs, 1ms, 10ns, 1.5s, or a plain number of seconds"


def _split_number(text: str) -> tuple[float, str] | None:
    """Split ``'  1.5 GB '`` into ``(1.5, 'GB')``; None when no number leads."""
    m = re.fullmatch(r"\s*(?P<sign>[+-]?)\s*" + _NUMBER + r"\s*(?P<unit>.*?)\s*", text)
    if m is None:
        return None
    value = float(m.group("num"))
    if m.group("sign") == "-":
        value = -value
    return value, m.group("unit")


def _prefix_factor(prefix: str) -> float | None:
    """Multiplier of a size prefix: '' → 1, 'k'/'K' → 1e3, 'Ki' → 1024, ...; None if unknown."""
    p = prefix.lower()
    if p in _DECIMAL:
        return _DECIMAL[p]
    if p in _BINARY:
        return _BINARY[p]
    return None


def parse_bytes(text: str | int | float) -> float:
    """A byte count from text such as ``100MB``, ``256KB``, ``1GiB``, ``1.342GB``, ``4096``.

    Decimal prefixes (KB = 1e3, MB = 1e6, GB = 1e9, TB = 1e12) and binary ones
    (KiB = 2**10, MiB = 2**20, GiB = 2**30, TiB = 2**40); ``B``/``byte``/``bytes``
    or no unit mean bytes. A lowercase ``b`` means bits and is refused, as is a
    bare ``K``/``M``/``G`` (ambiguous between 1000 and 1024).
    Numbers (int/float) are taken as bytes.

    Returns bytes (float). Raises BadInputError on unreadable, negative or
    non-finite values.
    """
    if isinstance(text, bool):
        raise BadInputError(f"cannot read {text!r} as a byte size: {_BYTES_EXPECTED}")
    if isinstance(text, (int, float)):
        value = float(text)
        if value < 0:
            raise BadInputError(f"bad byte size {text!r}: a size cannot be negative")
        if not math.isfinite(value):
            raise BadInputError(f"bad byte size {text!r}: {_BYTES_EXPECTED}")
        return value
    split = _split_number(str(text))
    if split is None:
        raise BadInputError(f"cannot read {text!r} as a byte size: {_BYTES_EXPECTED}")
    value, unit = split
    m = re.fullmatch(r"(?P<prefix>[kKmMgGtTpP]i?)?(?P<b>B|bytes?|b|bits?)?", unit)
    if m is None or (m.group("prefix") and not m.group("b")):
        hint = " (say KB for 1e3 or KiB for 1024)" if m is not None else ""
        raise BadInputError(f"cannot read {text!r} as a byte size{hint}: {_BYTES_EXPECTED}")
    if m.group("b") in ("b", "bit", "bits"):
        raise BadInputError(f"{text!r} is in bits, not bytes: {_BYTES_EXPECTED}")
    factor = _prefix_factor(m.group("prefix") or "")
    assert factor is not None
    value *= factor
    if value < 0:
        raise BadInputError(f"bad byte size {text!r}: a size cannot be negative")
    if not math.isfinite(value):
        raise BadInputError(f"bad byte size {text!r}: {_BYTES_EXPECTED}")
    return value


_BIDIRECTIONAL = re.compile(r"\(?\s*(bi-?directional|bidir|both\s+directions)\s*\)?\s*$", re.I)
_PER_DIRECTION = re.compile(
    r"\(?\s*(uni-?directional|per[\s-]direction|each\s+way|one\s+way)\s*\)?\s*$", re.I
)


def parse_bandwidth(text: str | int | float) -> float:
    """A per-direction bandwidth in bytes/s from text such as ``400Gb/s`` or ``900GB/s bidirectional``.

    Bits (``b``, ``bit``) are divided by 8: ``400Gb/s`` = ``400Gbps`` =
    ``400Gbit/s`` = 5e10 B/s. Bytes (``B``): ``360GB/s`` = 3.6e11 B/s,
    ``25GiB/s`` = 25·2**30 B/s. A trailing ``bidirectional`` (also ``bidir``,
    ``(bidirectional)``) marks a two-way sum and halves it: ``900GB/s
    bidirectional`` = 4.5e11 B/s. ``per direction``/``unidirectional`` is
    accepted and changes nothing. A plain number is B/s.

    Returns bytes/second (float, > 0). Raises BadInputError on unreadable,
    zero, negative or non-finite values.
    """
    if isinstance(text, bool):
        raise BadInputError(f"cannot read {text!r} as a bandwidth: {_BANDWIDTH_EXPECTED}")
    if isinstance(text, (int, float)):
        value = float(text)
        if not math.isfinite(value) or value <= 0:
            raise BadInputError(f"bad bandwidth {text!r}: {_BANDWIDTH_EXPECTED}")
        return value
    raw = str(text)
    body = raw.strip()
    halve = False
    marker = _BIDIRECTIONAL.search(body)
    if marker is not None and marker.start() > 0:
        halve = True
        body = body[: marker.start()].strip().rstrip(",")
    else:
        marker = _PER_DIRECTION.search(body)
        if marker is not None and marker.start() > 0:
            body = body[: marker.start()].strip().rstrip(",")
    split = _split_number(body)
    if split is None:
        raise BadInputError(f"cannot read {raw!r} as a bandwidth: {_BANDWIDTH_EXPECTED}")
    value, unit = split
    if unit:
        m = re.fullmatch(r"(?P<prefix>[kKmMgGtTpP]i?)?(?P<b>B|bytes?|b|bits?)(?:/s|/sec|ps)", unit)
        if m is None:
            raise BadInputError(f"cannot read {raw!r} as a bandwidth: {_BANDWIDTH_EXPECTED}")
        factor = _prefix_factor(m.group("prefix") or "")
        assert factor is not None
        value *= factor
        if m.group("b") in ("b", "bit", "bits"):
            value /= 8.0
    if halve:
        value /= 2.0
    if not math.isfinite(value) or value <= 0:
        raise BadInputError(f"bad bandwidth {raw!r}: {_BANDWIDTH_EXPECTED}")
    return value


_TIME_UNITS = {
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,  # micro sign U+00B5
    "μs": 1e-6,  # Greek mu U+03BC
    "ns": 1e-9,
}


def parse_time(text: str | int | float) -> float:
    """A duration in seconds from text such as ``2us``, ``2µs``, ``1ms``, ``10ns``, ``1s``.

    Units: s, ms, us / µs / μs, ns; a plain number is seconds.
    Returns seconds (float, >= 0). Raises BadInputError on unreadable,
    negative or non-finite values.
    """
    if isinstance(text, bool):
        raise BadInputError(f"cannot read {text!r} as a time: {_TIME_EXPECTED}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        split = _split_number(str(text))
        if split is None or split[1] not in _TIME_UNITS:
            raise BadInputError(f"cannot read {text!r} as a time: {_TIME_EXPECTED}")
        value = split[0] * _TIME_UNITS[split[1]]
    if value < 0:
        raise BadInputError(f"bad time {text!r}: a duration cannot be negative")
    if not math.isfinite(value):
        raise BadInputError(f"bad time {text!r}: {_TIME_EXPECTED}")
    return value


def format_bytes(n: float) -> str:
    """``1e8`` → ``'100 MB'``, ``720000`` → ``'720 KB'`` (decimal prefixes, 4 significant digits)."""
    n = float(n)
    for unit, factor in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= factor:
            return f"{n / factor:.4g} {unit}"
    return f"{n:.4g} B"


def format_time(seconds: float) -> str:
    """``1.2e-5`` → ``'12 µs'``, ``0.0012`` → ``'1.2 ms'`` (4 significant digits)."""
    s = float(seconds)
    if s == 0:
        return "0 s"
    for unit, factor in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(s) >= factor:
            return f"{s / factor:.4g} {unit}"
    return f"{s / 1e-9:.4g} ns"


def format_bandwidth(bps: float) -> str:
    """``3.6e11`` → ``'360 GB/s'`` (bytes per second, decimal prefixes)."""
    return format_bytes(bps) + "/s"


def parse_size(text: str | int | float, *, whole: bool = True) -> int | float:
    """The size of a command-line option (``--bytes``, ``--min-bytes``, ``--max-bytes``): one
    reading everywhere in the CLI.

    ============================  =====================  ==============================
    written                       means                  why
    ============================  =====================  ==============================
    ``4096``, ``1e9``, ``4096B``  bytes                  plain numbers are bytes
    ``1KB``, ``1MB``, ``1GB``     1e3, 1e6, 1e9 B        decimal: alpha-beta.md "Units",
                                                         what nccl-tests *reports*
    ``1KiB``, ``1MiB``, ``1GiB``  2**10, 2**20, 2**30 B  binary, written as such
    ``1K``, ``1M``, ``1G``        2**10, 2**20, 2**30 B  binary: nccl-tests' own ``-b``/
                                                         ``-e`` size flags (``-e 1G``)
    ============================  =====================  ==============================

    So the letter alone never silently means a power of 1000: ``1G`` is 1 GiB as in nccl-tests'
    flags, ``1GB`` is 1e9 B as in its output; outputs print decimal units (``1.07 GB``).
    :func:`parse_bytes` (the model's own API) stays strict and refuses the bare letter.
    ``whole``: the result must be a whole number of bytes and is returned as ``int``.
    Raises BadInputError (one line) for anything else, bits (``1Gb``), negatives, a fraction
    of a byte when ``whole``.
    """
    if isinstance(text, bool):
        raise BadInputError(f"cannot read {text!r} as a byte size: {_SIZE_EXPECTED}")
    value: float
    if isinstance(text, (int, float)):
        value = parse_bytes(text)
    else:
        m = re.fullmatch(r"\s*" + _NUMBER + r"\s*(?P<p>[kKmMgG])\s*", str(text))
        if m is not None:
            value = float(m.group("num")) * _BINARY[m.group("p").lower() + "i"]
        else:
            value = parse_bytes(text)
    if not whole:
        return value
    if value != int(value):
        raise BadInputError(f"bad size {text!r}: not a whole number of bytes ({value:g})")
    return int(value)


_SIZE_EXPECTED = (
    "expected bytes (4096, 1e9), KB/MB/GB (powers of 1000) or K/M/G = KiB/MiB/GiB (powers of 1024), "
    "e.g. 100MB, 1G, 1GiB"
)
