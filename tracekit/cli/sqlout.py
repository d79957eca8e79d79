"""``tracekit sql --format table|csv|json|parquet [--output FILE]``: the result of a query, formatted.

A layer after the query: the statement itself stays read-only (whatever confines it), and this
module only turns its result — an Arrow table — into text or a file. Only ``--output`` writes,
from Python (pyarrow's CSV and Parquet writers, the json module), never a DuckDB ``COPY``.

- ``table``: a rich table on the terminal (NULL shown as ``NULL``); with ``--output``, the same
  table as plain text.
- ``csv``: RFC 4180 with a header row (pyarrow.csv); NULL is an empty field, a list or struct
  its JSON text.
- ``json``: a list of objects, one per row; NULL, NaN and ±inf are ``null`` (JSON has no NaN);
  timestamps and other non-JSON values as strings.
- ``parquet``: the Arrow table as is (types kept); needs ``--output`` (binary).

A file is written to a temporary name beside ``FILE`` and renamed, so a failed write leaves no
half file. Errors: BadInputError for an unknown format, ``parquet`` without ``--output``, or an
output folder that does not exist.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

from tracekit.errors import BadInputError

FORMATS = ("table", "csv", "json", "parquet")


def check(fmt: str, output: Path | None) -> None:
    """Validate ``--format``/``--output`` before the query runs (one-line BadInputError)."""
    if fmt not in FORMATS:
        raise BadInputError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "parquet" and output is None:
        raise BadInputError("--format parquet writes a binary file: give --output FILE")
    if output is not None:
        if output.is_dir():
            raise BadInputError(f"{output}: is a directory; give the output file's name")
        if not output.parent.is_dir():
            raise BadInputError(f"{output}: its folder {output.parent} does not exist")


def _json_rows(table) -> str:
    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v

    rows = [{k: clean(v) for k, v in r.items()} for r in table.to_pylist()]
    return json.dumps(rows, indent=2, default=str, allow_nan=False)


def _table_text(table, width: int | None, plain: bool) -> str:
    from rich.table import Table

    from tracekit.report.textfmt import literal_console

    t = Table(box=None if plain else Table().box)
    for c in table.column_names:
        t.add_column(c, overflow="fold")
    for r in table.to_pylist():
        t.add_row(*["NULL" if v is None else str(v) for v in r.values()])
    buf = io.StringIO()
    literal_console(file=buf, width=width or 200, no_color=True, force_terminal=False).print(t)
    return buf.getvalue()


def _flat(table):
    """CSV has no lists or structs: such a column becomes its JSON text (``[0, 1]``)."""
    import pyarrow as pa

    for i, f in enumerate(table.schema):
        if pa.types.is_nested(f.type):
            text = pa.array([None if v is None else json.dumps(v, default=str) for v in table.column(i).to_pylist()],
                            pa.string())
            table = table.set_column(i, f.name, text)
    return table


def render(table, fmt: str, width: int | None = None) -> str:
    """``table`` (pyarrow.Table) as text in ``fmt`` (table, csv or json)."""
    if fmt == "json":
        return _json_rows(table) + "\n"
    if fmt == "csv":
        import pyarrow.csv as pacsv

        sink = io.BytesIO()
        pacsv.write_csv(_flat(table), sink)
        return sink.getvalue().decode("utf-8")
    return _table_text(table, width, plain=False)


def write(table, fmt: str, output: Path) -> Path:
    """Write ``table`` to ``output`` in ``fmt``, atomically (:func:`tracekit.store.atomic_output`); returns the path."""
    from tracekit.store import atomic_output

    with atomic_output(output) as tmp:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, tmp)
        else:
            text = render(table, fmt) if fmt != "table" else _table_text(table, 200, plain=True)
            with open(tmp, "w", encoding="utf-8", newline="") as fh:
                fh.write(text)
    return output




STREAMED = ("csv", "parquet")
"""Formats written batch by batch with ``--output`` (:func:`streamed`): no row is held in memory."""


@contextlib.contextmanager
def streamed(fmt: str, output: Path):
    """Yield ``(sink, rows)`` for :func:`tracekit.sqlshell.fetch_bounded`: ``sink(schema)`` opens a
    writer of ``fmt`` (csv: pyarrow's CSVWriter, lists and structs as JSON text as in
    :func:`render`; parquet: pyarrow's ParquetWriter) on a temporary file beside ``output``, which
    is renamed to ``output`` when the block ends without error (:func:`tracekit.store.atomic_output`);
    ``rows()`` is the number of rows written. Opening the sink again (a query retried with more
    memory) starts the file over."""
    from tracekit.store import atomic_output

    written = [0]

    with atomic_output(output) as tmp:
        def sink(schema):
            written[0] = 0
            return _BatchSink(fmt, tmp, schema, written)

        yield sink, lambda: written[0]


class _BatchSink:
    """One streamed output file: ``write_batch`` per record batch, ``close`` at the end."""

    def __init__(self, fmt, path, schema, written):
        import pyarrow as pa

        self.fmt, self.written = fmt, written
        if fmt == "parquet":
            import pyarrow.parquet as pq

            self.w = pq.ParquetWriter(path, schema)
        else:
            import pyarrow.csv as pacsv

            flat = _flat(pa.Table.from_batches([], schema=schema)).schema
            self.w = pacsv.CSVWriter(str(path), flat)

    def write_batch(self, batch) -> None:
        import pyarrow as pa

        if self.fmt == "parquet":
            self.w.write_batch(batch)
        else:
            self.w.write_table(_flat(pa.Table.from_batches([batch])))
        self.written[0] += batch.num_rows

    def close(self) -> None:
        self.w.close()
