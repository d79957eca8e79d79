"""The collectives' ``seq``: each call's number in its process group, in the CPU's call order.

Used by the rank's collectives table (tracekit.ingest.assemble) and by the process groups decided
across ranks (tracekit.ingest.pg_attribution), which number the calls they put in a group.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.store import COLLECTIVES_SCHEMA


def number_seq(table: pa.Table, need: np.ndarray) -> pa.Table:
    """``table`` with the rows of the bool mask ``need`` numbered 0, 1... per pg_name in call order
    (issue_ts_ns, ts_ns, event_id, row order; a NULL after every value): their ``seq``; other rows
    keep theirs. A NULL pg_name is a group of its own."""
    seq = table.column("seq")
    rows = np.flatnonzero(need)
    keys = []
    for c in ("event_id", "ts_ns", "issue_ts_ns"):  # np.lexsort: the last key is the first
        col = table.column(c)
        vals = pc.fill_null(col, 0).to_numpy()[rows]
        nulls = col.is_null().to_numpy(zero_copy_only=False)[rows]
        keys += [vals, nulls]
    order = rows[np.lexsort(keys)]  # stable: row order on ties
    group = pc.dictionary_encode(table.column("pg_name")).combine_chunks()
    g = pc.fill_null(group.indices, len(group.dictionary)).to_numpy(zero_copy_only=False)[order]
    by_group = np.argsort(g, kind="stable")
    gs = g[by_group]
    first = np.r_[0, np.flatnonzero(gs[1:] != gs[:-1]) + 1] if len(gs) else np.zeros(0, np.int64)
    count = np.arange(len(gs)) - np.repeat(first, np.diff(np.r_[first, len(gs)]))
    number = np.empty(len(gs), np.int64)
    number[by_group] = count
    vals = pc.fill_null(seq, 0).to_numpy().copy()
    vals[order] = number  # the call's position in its group, in call order
    valid = seq.is_valid().to_numpy(zero_copy_only=False) | need
    i = COLLECTIVES_SCHEMA.get_field_index("seq")
    return table.set_column(i, COLLECTIVES_SCHEMA.field(i), pa.array(vals, pa.int64(), mask=~valid)).combine_chunks()
