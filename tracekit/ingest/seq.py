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
    (issue_ts_ns, ts_ns, event_id, row order): their ``seq``; other rows keep theirs."""
    seq = table.column("seq")
    df = table.select(["pg_name", "issue_ts_ns", "ts_ns", "event_id"]).to_pandas()[need]
    df = df.sort_values(["issue_ts_ns", "ts_ns", "event_id"], kind="stable")
    number = df.groupby("pg_name", sort=False, dropna=False).cumcount()
    vals = pc.fill_null(seq, 0).to_numpy().copy()
    vals[df.index.to_numpy()] = number.to_numpy()  # the index: positions in ``table``
    valid = seq.is_valid().to_numpy(zero_copy_only=False) | need
    i = COLLECTIVES_SCHEMA.get_field_index("seq")
    return table.set_column(i, COLLECTIVES_SCHEMA.field(i), pa.array(vals, pa.int64(), mask=~valid)).combine_chunks()
