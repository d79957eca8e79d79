"""Arrow arrays and tables from numpy and Python lists, without ``pa.array``.

Every ``pa.array`` call (numpy input included) and ``pa.Table.from_pylist`` make
pyarrow import pandas, ~0.15 s of each ingest. These builders assemble the
arrays from buffers instead (``pa.Array.from_buffers``), for the few types the
store uses. Same values and types as ``pa.array`` would give (tested against it
in tests/test_arrow_build.py).
"""

from __future__ import annotations

import datetime as _dt

import numpy as np
import pyarrow as pa


def _validity(mask_valid: np.ndarray | None):
    """A validity bitmap buffer from a bool array (True = valid), or None when all are valid."""
    if mask_valid is None or mask_valid.all():
        return None, 0
    bits = np.packbits(mask_valid.astype(bool), bitorder="little")
    return pa.py_buffer(bits.tobytes()), int(len(mask_valid) - mask_valid.sum())


def from_numpy(values: np.ndarray, type_: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """A fixed-width (int, float, timestamp) array over ``values`` (converted to ``type_``'s width)."""
    if pa.types.is_boolean(type_):
        return bool_array(values, valid)
    np_type = {8: np.int64, 4: np.int32}[type_.bit_width // 8] if not pa.types.is_floating(type_) else np.float64
    data = np.ascontiguousarray(values, dtype=np_type)
    vb, nulls = _validity(valid)
    return pa.Array.from_buffers(type_, len(data), [vb, pa.py_buffer(data)], null_count=nulls)


def bool_array(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    bits = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
    vb, nulls = _validity(valid)
    return pa.Array.from_buffers(pa.bool_(), len(values), [vb, pa.py_buffer(bits.tobytes())], null_count=nulls)


def string_array(values: list) -> pa.Array:
    """``str``/None items → a ``pa.string()`` array."""
    enc = [b"" if v is None else str(v).encode("utf-8", "surrogatepass") for v in values]
    offsets = np.zeros(len(enc) + 1, dtype=np.int32)
    if enc:
        np.cumsum(np.fromiter(map(len, enc), dtype=np.int64, count=len(enc)), out=offsets[1:], dtype=np.int32)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    vb, nulls = _validity(valid)
    return pa.Array.from_buffers(
        pa.string(), len(values), [vb, pa.py_buffer(offsets), pa.py_buffer(b"".join(enc))], null_count=nulls
    )


def _list_array(values: list, type_: pa.ListType) -> pa.Array:
    lens = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:], dtype=np.int32)
    flat = [x for v in values if v is not None for x in v]
    child = column(flat, type_.value_type)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    vb, nulls = _validity(valid)
    return pa.Array.from_buffers(type_, len(values), [vb, pa.py_buffer(offsets)], null_count=nulls, children=[child])


def column(values: list, type_: pa.DataType) -> pa.Array:
    """Python values (None = null) → an array of ``type_``: ints, floats, bools, strings,
    tz-aware or naive ``datetime`` as timestamps, and lists of those.

    Raises TypeError for a type not listed here.
    """
    n = len(values)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    if pa.types.is_string(type_):
        return string_array(values)
    if pa.types.is_list(type_):
        return _list_array(values, type_)
    if pa.types.is_boolean(type_):
        return bool_array(np.fromiter((bool(v) for v in values), dtype=bool, count=n), valid)
    if pa.types.is_integer(type_):
        return from_numpy(np.fromiter((0 if v is None else int(v) for v in values), dtype=np.int64, count=n),
                          type_, valid)
    if pa.types.is_floating(type_):
        return from_numpy(np.fromiter((np.nan if v is None else float(v) for v in values), dtype=np.float64,
                                      count=n), type_, valid)
    if pa.types.is_timestamp(type_) and type_.unit == "us":
        return from_numpy(np.fromiter((0 if v is None else _epoch_us(v) for v in values), dtype=np.int64, count=n),
                          type_, valid)
    raise TypeError(f"no builder for Arrow type {type_}")


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def _epoch_us(v: _dt.datetime) -> int:
    if v.tzinfo is None:
        v = v.replace(tzinfo=_dt.timezone.utc)
    d = v - _EPOCH
    return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds


def _bits(buf, offset: int, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")[offset : offset + n].astype(bool)


def to_numpy(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """(values, validity or None when there are no nulls) of an int32/int64/bool array.

    ``Array.to_numpy`` imports pandas; this reads the buffers. Null slots hold 0 / False.
    Raises TypeError for other types.
    """
    n, off = len(arr), arr.offset
    bufs = arr.buffers()
    valid = _bits(bufs[0], off, n) if arr.null_count and bufs[0] is not None else None
    t = arr.type
    if pa.types.is_boolean(t):
        vals = _bits(bufs[1], off, n) if n else np.zeros(0, dtype=bool)
    elif pa.types.is_int64(t) or pa.types.is_int32(t):
        dt = np.int64 if pa.types.is_int64(t) else np.int32
        vals = np.frombuffer(bufs[1], dtype=dt, count=n, offset=off * np.dtype(dt).itemsize) if n else np.zeros(0, dt)
    else:
        raise TypeError(f"to_numpy: no reader for Arrow type {t}")
    if valid is not None:
        vals = np.where(valid, vals, 0).astype(vals.dtype)
    return vals, valid


def all_valid(valid: np.ndarray | None, n: int) -> np.ndarray:
    """A validity mask from :func:`to_numpy`'s (None means every one of the ``n`` rows is valid)."""
    return np.ones(n, dtype=bool) if valid is None else valid


def not_null(col) -> np.ndarray:
    """Per row of an Array or ChunkedArray: it holds a value."""
    arr = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return _bits(arr.buffers()[0], arr.offset, len(arr))


def table_from_rows(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """``pa.Table.from_pylist(rows, schema=schema)`` without pandas (a missing key is null)."""
    cols = [column([r.get(f.name) for r in rows], f.type) for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)
