"""estimate_offsets_from_files (DuckDB over the staged collectives, one pair's samples in Python at a
time) gives what estimate_offsets gives from every row in memory, to the ns, on random runs: an
independent computation of the same definition (tracekit/ingest/clocks.py's module docstring)."""

from __future__ import annotations

import random

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tracekit.ingest.clocks import estimate_offsets, estimate_offsets_from_files

T0 = 1_733_000_000_000_000_000  # epoch ns: ends far above 2**53


def _run(seed: int, n_ranks: int):
    """Random collectives rows of ``n_ranks`` ranks on ``n_ranks // 3 + 1`` hosts (a clock each):
    groups of 2..n ranks, instances where some member is missing, repeated (pg_name, seq) rows on a
    rank (the later wins), NULL pg_name, op, seq or ts_ns; sample counts odd and even."""
    rng = random.Random(seed)
    clock = {r: rng.randrange(-10**7, 10**7) for r in range(n_ranks)}
    hosts = {r: f"h{r // 3}" for r in range(n_ranks)}
    rows = []
    groups = [sorted(rng.sample(range(n_ranks), rng.randint(2, n_ranks))) for _ in range(rng.randint(1, 4))]
    if seed % 3 == 0:  # a rank in no group shared with rank 0's component: not aligned
        groups = [[r for r in g if r != n_ranks - 1] or [0, 1] for g in groups]
    for gi, g in enumerate(groups):
        pg = None if gi == 3 else str(gi)
        for seq in range(rng.randint(1, 9)):
            end = T0 + rng.randrange(10**9)
            for r in g:
                if rng.random() < 0.1:
                    continue
                dur = rng.randrange(1, 10**6)
                e = end + rng.randrange(-500, 500)
                row = dict(rank=r, pg_name=pg, seq=seq, op="all_reduce", ts_ns=e - clock[r] - dur, dur_ns=dur)
                if rng.random() < 0.05:
                    row[rng.choice(["op", "seq", "ts_ns"])] = None
                rows.append(row)
                if rng.random() < 0.05:  # the same instance again on this rank: the later row counts
                    rows.append(dict(row, ts_ns=row["ts_ns"] + rng.randrange(1, 1000) if row["ts_ns"] else None))
    rows.sort(key=lambda r: r["rank"])  # a rank's rows in its file's order, files in rank order
    return rows, hosts


def _files(tmp_path, rows, n_ranks) -> dict:
    schema = pa.schema([("rank", pa.int64()), ("pg_name", pa.string()), ("seq", pa.int64()), ("op", pa.string()),
                        ("ts_ns", pa.int64()), ("dur_ns", pa.int64())])
    out = {}
    for r in range(n_ranks):
        f = tmp_path / f"rank={r}.parquet"
        pq.write_table(pa.Table.from_pylist([x for x in rows if x["rank"] == r], schema=schema), f,
                       row_group_size=3)  # several row groups: the row order must survive them
        out[r] = f
    return out


@pytest.mark.parametrize("seed", range(24))
@pytest.mark.parametrize("mode", ["collectives", "host"])
def test_same_offsets_as_from_rows(tmp_path, seed, mode):
    n = 3 + seed % 6
    rows, hosts = _run(seed, n)
    ranks = list(range(n)) if seed % 4 else list(range(1, n))  # the reference need not be rank 0
    want = estimate_offsets(rows, ranks, hosts, mode)
    got = estimate_offsets_from_files(_files(tmp_path, rows, n), ranks, hosts, mode, duckdb.connect())
    assert got == want


def test_hand_computed_three_ranks(tmp_path):
    """Rank 1's clock is 1,000 ns behind rank 0's, rank 2's 250 ns ahead of rank 1's; rank 2 never
    meets rank 0 (only through rank 1). Ends (local clocks): instance A: r0 5,000, r1 4,000 (diff
    1,000); B: r0 9,000, r1 7,990 (1,010); C: r1 3,000, r2 3,250 (−250): offset of r1 = median(1,000,
    1,010) = 1,005; of r2 = 1,005 − 250 = 755. Uncertainties: MAD 5 → 1.2533·1.4826·5/√2 = 6.57 → 7;
    one sample: MAD 0 → the 1 ns floor; r2's sums the chain: 8."""
    rows = [dict(rank=0, pg_name="a", seq=0, op="x", ts_ns=4000, dur_ns=1000),
            dict(rank=0, pg_name="a", seq=1, op="x", ts_ns=8000, dur_ns=1000),
            dict(rank=1, pg_name="a", seq=0, op="x", ts_ns=3000, dur_ns=1000),
            dict(rank=1, pg_name="a", seq=1, op="x", ts_ns=6990, dur_ns=1000),
            dict(rank=1, pg_name="b", seq=0, op="x", ts_ns=2000, dur_ns=1000),
            dict(rank=2, pg_name="b", seq=0, op="x", ts_ns=3000, dur_ns=250)]
    got = estimate_offsets_from_files(_files(tmp_path, rows, 3), [0, 1, 2], {}, "collectives", duckdb.connect())
    assert got == {0: (0, 0, None), 1: (1005, 7, None), 2: (755, 8, None)}
