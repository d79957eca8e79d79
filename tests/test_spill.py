"""The ingest's bounded-memory building blocks (tracekit.spill) against plain numpy.

ExternalSort must give np.lexsort's order whether its rows stay in memory or go to many runs
on disk; PositionStore must give back, position by position, the last value put, whether its
puts stay pending or go to bucket files; both must leave no file behind.
"""

from __future__ import annotations

import numpy as np
import pytest

from tracekit import spill
from tracekit.spill import ExternalSort, PositionStore, SortedColumns

_DTYPES = [np.int32, np.int64, np.int8, np.int64, np.float64]


def _rows(rng, n):
    """Keys with many ties in the leading columns (and negatives); the row number makes them distinct."""
    return [
        rng.integers(-2, 3, n).astype(np.int32),
        rng.integers(-50, 50, n) * 10**12,
        rng.integers(0, 2, n).astype(np.int8),
        np.arange(n, dtype=np.int64),
        rng.random(n),
    ]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [200, 3_000, 40_000, 10**9])
def test_external_sort_gives_lexsort_order(seed, budget, tmp_path, monkeypatch):
    monkeypatch.setattr(spill, "MIN_BLOCK_ROWS", 7)  # merges in many small steps
    monkeypatch.setattr(spill, "MERGE_FAN_IN", 3)  # and in passes when there are more than 3 runs
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 6000))
    cols = _rows(rng, n)
    perm = rng.permutation(n)  # rows added in random order, in random-sized parts
    s = ExternalSort(_DTYPES, 4, budget, tmp_path)
    at = 0
    while at < n:
        k = int(rng.integers(1, 700))
        s.add(*(c[perm[at:at + k]] for c in cols))
        at += k
    got = [np.concatenate(x) for x in zip(*s.batches(rows=int(rng.integers(1, 2000))))]
    want = np.lexsort(cols[:4][::-1])
    for g, c in zip(got, cols):
        assert g.dtype == c.dtype
        np.testing.assert_array_equal(g, c[want])
    assert s.rows == n
    # 29 B a row: below the budget nothing spills; 200 B make every part of 7 rows or more a run
    if n * 29 < budget:
        assert s.n_runs == 0
    if budget == 200 and n >= 1400:
        assert s.n_runs >= 2
    assert not list(tmp_path.iterdir())  # runs removed once read


def test_external_sort_of_nothing_and_of_one_key(tmp_path):
    s = ExternalSort([np.int64], 1, 100, tmp_path)
    assert list(s.batches()) == []
    s = ExternalSort([np.int64, np.int64], 1, 16, tmp_path)  # 16 B a row: every part is a run
    for part in ([5, 3], [9], [1, 7, 2]):
        s.add(np.array(part), np.array(part) * 10)
    got = [np.concatenate(x) for x in zip(*s.batches())]
    assert got[0].tolist() == [1, 2, 3, 5, 7, 9] and got[1].tolist() == [10, 20, 30, 50, 70, 90]
    assert s.n_runs == 3


def test_external_sort_close_removes_unread_runs(tmp_path):
    with ExternalSort([np.int64], 1, 8, tmp_path) as s:
        s.add(np.arange(10))
        s.add(np.arange(10))
        assert len(list(tmp_path.iterdir())) == 2
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [100, 5_000, 10**9])
def test_position_store_gives_back_the_last_value_put(seed, budget, tmp_path):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 20_000))
    val = np.zeros(n, dtype=np.int64)
    flag = np.zeros(n, dtype=bool)
    st = PositionStore([np.int64, np.bool_], budget, tmp_path)
    for _ in range(int(rng.integers(1, 40))):  # random subsets, many positions put more than once
        pos = rng.choice(n, int(rng.integers(0, n + 1)), replace=False)
        v = rng.integers(-10**15, 10**15, len(pos))
        f = rng.random(len(pos)) < 0.5
        st.put(pos, v, f)
        val[pos], flag[pos] = v, f
    got, at = [], 0
    while at < n:
        k = min(int(rng.integers(0, 3000)), n - at)
        got.append(st.take(k))
        at += k
    g = [np.concatenate(x) for x in zip(*got)]
    np.testing.assert_array_equal(g[0], val)
    np.testing.assert_array_equal(g[1], flag)
    if budget == 10**9:
        assert st.n_flushes == 0
    st.close()
    assert not list(tmp_path.iterdir())


def test_position_store_buckets_and_a_put_behind_the_reader(tmp_path):
    st = PositionStore([np.int64], 16, tmp_path, bucket_rows=4)  # 16 B: every put is flushed
    st.put(np.array([9, 0, 5]), np.array([90, 1, 50]))
    st.put(np.array([5]), np.array([55]))  # replaces 50
    assert st.n_flushes == 2
    assert st.take(3)[0].tolist() == [1, 0, 0]
    st.put(np.array([3]), np.array([33]))  # not taken yet, in the bucket loaded (0..3)
    assert st.take(4)[0].tolist() == [33, 0, 55, 0]
    with pytest.raises(ValueError, match="already taken"):
        st.put(np.array([6]), np.array([1]))
    st.put(np.array([8, 7]), np.array([80, 70]))  # 7 is in the bucket being taken (4..7)
    assert st.take(3)[0].tolist() == [70, 80, 90]
    assert st.take(2)[0].tolist() == [0, 0]  # past every put: zeros
    st.close()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("seed", range(3))
def test_sorted_columns_look_up_like_a_dict(seed, tmp_path):
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(-10**12, 10**12, 5000))
    a = rng.integers(-99, 99, len(keys))
    b = rng.random(len(keys))
    a_ok = rng.random(len(keys)) < 0.8
    want = {}
    sc = SortedColumns([np.int64, np.float64], tmp_path, cache_blocks=1)
    at = 0
    while at < len(keys):  # blocks of random sizes
        k = int(rng.integers(1, 400))
        sl = slice(at, at + k)
        sc.append(keys[sl], a[sl], b[sl], valid=[a_ok[sl], None])
        for key, x, ok, y in zip(keys[sl].tolist(), a[sl].tolist(), a_ok[sl].tolist(), b[sl].tolist()):
            want[key] = (x if ok else None, y)
        at += k
    assert len(sc) == len(keys) and sc.to_dict() == want
    probe = np.concatenate([rng.choice(keys, 3000), rng.integers(-10**12, 10**12, 3000)])
    for q in (probe, np.sort(probe)):  # any order; ascending reads each block once
        found, (x, y), (x_ok, y_ok) = sc.lookup(q)
        assert y_ok is None  # column b has no nulls
        for key, f, xv, xo, yv in zip(q.tolist(), found.tolist(), x.tolist(), x_ok.tolist(), y.tolist()):
            if key in want:
                assert f and (xv if xo else None, yv) == want[key]
            else:
                assert not f and not xo and xv == 0 and yv == 0
    assert sc.get(int(keys[7])) == want[int(keys[7])] and sc.get(int(keys[0]) - 1) is None
    with pytest.raises(ValueError, match="increase"):
        sc.append(keys[-1:], a[:1], b[:1])
    sc.close()
    assert not list(tmp_path.iterdir())
