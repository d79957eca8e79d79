"""The search for the CPU comm ops that enclose a kernel's launch call
(tracekit.ingest.attribute._enclosing_ops: two external sorts and a sweep per thread),
against a brute-force scan of every op, in memory and spilled to many runs."""

from __future__ import annotations

import random

import numpy as np
import pytest

import tracekit.ingest.attribute as attribute
from tracekit import spill
from tracekit.spill import SortedColumns


class _Meta:
    """What _enclosing_ops reads of a MetaRows: frames of row dicts in file order."""

    def __init__(self, rows, frame):
        self.rows, self.frame = rows, frame

    def frames(self):
        for i in range(0, len(self.rows), self.frame):
            yield i, self.rows[i:i + self.frame]


def _brute(rows, thread, ts, end, window):
    """Rows of the ops of ``thread`` with start <= ts and end >= end among the last ``window``
    ops that start at or before ts (by start, the longer first, then file order), innermost
    (latest in that order) first."""
    ops = sorted(((r["ts_ns"], -r["dur_ns"], i) for i, r in enumerate(rows)
                  if not r["gpu"] and (r["device"], r["track"]) == thread), key=lambda o: o)
    before = [o for o in ops if o[0] <= ts][-window:]
    return [i for s, nd, i in reversed(before) if s - nd >= end]


def _launches(rows, scratch):
    """(event_id, pid, tid, start, end) tuples, by event_id → the SortedColumns the link pass gives."""
    scratch.mkdir(exist_ok=True)
    out = SortedColumns([np.int64] * 4, scratch)
    if rows:
        out.append(np.array([x[0] for x in rows], dtype=np.int64),
                   *(np.array([x[k] for x in rows], dtype=np.int64) for k in range(1, 5)))
    return out


def _case(seed, scratch):
    rng = random.Random(seed)
    rows, launches = [], []
    threads = [(1, 10), (1, 11), (2, 10)]
    n_ops = rng.choice([30, 90, 200])  # beyond the 64-op window too
    for _ in range(n_ops):  # nested and overlapping ops with many equal starts and durations
        d, t = rng.choice(threads[:2])  # thread (2, 10) runs no comm op
        rows.append(dict(gpu=False, device=d, track=t, ts_ns=rng.randint(0, 400),
                         dur_ns=rng.choice([0, 1, 5, 5, 10, 30, 120]), event_id=len(rows)))
    for _ in range(150):
        eid = 10_000 + len(rows)
        rows.append(dict(gpu=True, device=0, track=7, ts_ns=0, dur_ns=0, event_id=eid))
        if rng.random() < 0.9:  # the others were launched outside the capture
            t = rng.randint(-2, 430)
            pid, tid = rng.choice(threads)
            launches.append((eid, pid, tid, t, t + rng.choice([0, 0, 1, 3, 8])))
    rng.shuffle(rows)  # ops and kernels interleaved, ops in no order
    launches.sort()
    return rows, _launches(launches, scratch), {x[0]: x[1:] for x in launches}


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("budget", ["default", "tiny"])
def test_enclosing_ops_match_brute_force(seed, budget, tmp_path, monkeypatch):
    if budget == "tiny":  # every frame's rows a run of their own, merged 4 rows at a time (a thread's
        # rows span many batches); calls matched 3 at a time
        monkeypatch.setattr(spill, "STATE_BUDGET", 64)
        monkeypatch.setattr(spill, "MIN_BLOCK_ROWS", 4)
        monkeypatch.setattr(attribute, "_SWEEP_CALLS", 3)
    rows, keyed, launch = _case(seed, tmp_path / "keyed")
    meta = _Meta(rows, frame=17)
    got = {}
    with attribute._enclosing_ops(meta, keyed, tmp_path) as enclosing:
        for i, r in enumerate(rows):
            if r["gpu"]:
                got[i] = enclosing(i)
    n_found = 0
    for i, r in enumerate(rows):
        if not r["gpu"]:
            continue
        la = launch.get(r["event_id"])
        want = [] if la is None else _brute(rows, (la[0], la[1]), la[2], la[3], attribute.ENCLOSING_WINDOW)
        assert got[i] == want, (i, la)
        n_found += bool(want)
    assert n_found > 20  # the case is not empty
    keyed.close()
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_enclosing_ops_innermost_first_and_the_window(tmp_path, monkeypatch):
    # ops (start, dur) on one thread: A (0, 100), B (10, 50), C (10, 80), D (20, 5); a launch at
    # [30, 31] is inside A, B and C (not D: it ends at 25): innermost first is B (start 10, the
    # shorter of the two), then C, then A.
    ops = [(0, 100), (10, 50), (10, 80), (20, 5)]
    rows = [dict(gpu=False, device=1, track=1, ts_ns=s, dur_ns=d, event_id=i) for i, (s, d) in enumerate(ops)]
    rows.append(dict(gpu=True, device=0, track=0, ts_ns=0, dur_ns=0, event_id=99))
    keyed = _launches([(99, 1, 1, 30, 31)], tmp_path / "keyed")
    with attribute._enclosing_ops(_Meta(rows, 2), keyed, tmp_path) as enclosing:
        assert enclosing(4) == [1, 2, 0]
    # by start, the longer first, the last two ops are B and D: only they are looked at
    monkeypatch.setattr(attribute, "ENCLOSING_WINDOW", 2)
    with attribute._enclosing_ops(_Meta(rows, 2), keyed, tmp_path) as enclosing:
        assert enclosing(4) == [1]
