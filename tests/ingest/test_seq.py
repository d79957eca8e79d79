"""The collectives' seq where the trace gives none (tracekit.ingest.seq.number_seq): each call's
position in its process group in call order, against a plain Python sort of the same rows."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.ingest.seq import number_seq
from tracekit.store import COLLECTIVES_SCHEMA


def _table(rows: list[dict]) -> pa.Table:
    cols = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in COLLECTIVES_SCHEMA}
    return pa.table(cols, schema=COLLECTIVES_SCHEMA)


def _by_hand(rows: list[dict], need: list[bool]) -> list:
    """Per row: its new seq (numbered rows), else its own."""
    def key(i):
        r = rows[i]
        return tuple((r[c] is None, r[c] or 0) for c in ("issue_ts_ns", "ts_ns", "event_id")) + (i,)

    out = [r["seq"] for r in rows]
    count: dict = {}
    for i in sorted((i for i in range(len(rows)) if need[i]), key=key):
        g = rows[i]["pg_name"]
        out[i] = count.get(g, 0)
        count[g] = out[i] + 1
    return out


_maybe = lambda s: st.one_of(st.none(), s)  # noqa: E731
_row = st.fixed_dictionaries({
    "pg_name": _maybe(st.sampled_from(["0", "1", "tp"])), "issue_ts_ns": _maybe(st.integers(0, 5)),
    "ts_ns": _maybe(st.integers(0, 5)), "event_id": st.integers(0, 50), "seq": _maybe(st.integers(0, 9))})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_row, st.booleans()), max_size=30))
def test_numbered_in_call_order_per_group(data):
    rows, need = [r for r, _ in data], [n for _, n in data]
    got = number_seq(_table(rows), pa.array(need, pa.bool_()).to_numpy(zero_copy_only=False)).column("seq")
    assert got.to_pylist() == _by_hand(rows, need)


def test_nanosecond_times_are_compared_exactly():
    """Times near 1.7e18 ns (an epoch clock) one ns apart, in a table whose issue times have a NULL:
    as float64 (a pandas column with a NULL) they would be equal; the later call gets the later seq."""
    t0 = 1_700_000_000_000_000_001
    rows = [dict(pg_name="0", issue_ts_ns=t0 + 1, ts_ns=t0 + 1, event_id=1, seq=None),
            dict(pg_name="0", issue_ts_ns=t0, ts_ns=t0 + 9, event_id=2, seq=None),
            dict(pg_name="0", issue_ts_ns=None, ts_ns=t0, event_id=3, seq=None)]
    got = number_seq(_table(rows), pa.array([True] * 3).to_numpy(zero_copy_only=False)).column("seq")
    assert got.to_pylist() == [1, 0, 2]
    assert float(t0) == float(t0 + 1)  # why it matters
