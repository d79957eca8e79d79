"""The search for the CPU comm ops that enclose a kernel's launch call
(tracekit.ingest.attribute.enclosing_ops: one sort and a window per call), against a
brute-force scan of every op."""

from __future__ import annotations

import random

import numpy as np
import pytest

import pyarrow as pa

import tracekit.ingest.attribute as attribute
from tracekit.ingest.linkpass import ById
from tracekit.ingest.staging import MetaRows, _meta_batch


def _meta(rows) -> MetaRows:
    return MetaRows(pa.Table.from_batches([_meta_batch([dict(r, name="op") for r in rows])]))


def _brute(rows, thread, ts, end, window):
    """Rows of the ops of ``thread`` with start <= ts and end >= end among the last ``window``
    ops that start at or before ts (by start, the longer first, then file order), innermost
    (latest in that order) first."""
    ops = sorted(((r["ts_ns"], -r["dur_ns"], i) for i, r in enumerate(rows)
                  if not r["gpu"] and (r["device"], r["track"]) == thread), key=lambda o: o)
    before = [o for o in ops if o[0] <= ts][-window:]
    return [i for s, nd, i in reversed(before) if s - nd >= end]


def _launches(rows):
    """(event_id, pid, tid, start, end) tuples, by event_id → the ById the link pass gives."""
    return ById(np.array([x[0] for x in rows], dtype=np.int64),
                [np.array([x[k] for x in rows], dtype=np.int64) for k in range(1, 5)], [None] * 4)


def _case(seed):
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
    return rows, _launches(launches), {x[0]: x[1:] for x in launches}


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("at_once", [4096, 3])
def test_enclosing_ops_match_brute_force(seed, at_once, monkeypatch):
    monkeypatch.setattr(attribute, "_CALLS_AT_ONCE", at_once)  # calls matched 3 at a time
    rows, keyed, launch = _case(seed)
    got = attribute.enclosing_ops(_meta(rows), keyed)
    n_found = 0
    for i, r in enumerate(rows):
        if not r["gpu"]:
            assert i not in got
            continue
        la = launch.get(r["event_id"])
        want = [] if la is None else _brute(rows, (la[0], la[1]), la[2], la[3], attribute.ENCLOSING_WINDOW)
        assert got.get(i, []) == want, (i, la)
        n_found += bool(want)
    assert n_found > 20  # the case is not empty


def test_enclosing_ops_innermost_first_and_the_window(monkeypatch):
    # ops (start, dur) on one thread: A (0, 100), B (10, 50), C (10, 80), D (20, 5); a launch at
    # [30, 31] is inside A, B and C (not D: it ends at 25): innermost first is B (start 10, the
    # shorter of the two), then C, then A.
    ops = [(0, 100), (10, 50), (10, 80), (20, 5)]
    rows = [dict(gpu=False, device=1, track=1, ts_ns=s, dur_ns=d, event_id=i) for i, (s, d) in enumerate(ops)]
    rows.append(dict(gpu=True, device=0, track=0, ts_ns=0, dur_ns=0, event_id=99))
    keyed = _launches([(99, 1, 1, 30, 31)])
    assert attribute.enclosing_ops(_meta(rows), keyed) == {4: [1, 2, 0]}
    # by start, the longer first, the last two ops are B and D: only they are looked at
    monkeypatch.setattr(attribute, "ENCLOSING_WINDOW", 2)
    assert attribute.enclosing_ops(_meta(rows), keyed) == {4: [1]}


def test_a_launch_call_without_pid_is_on_the_thread_without_device():
    # an op on thread (None, 10) (its device unknown) encloses the launch whose pid is missing and
    # tid is 10, not the one on (1, 10); an op on (0, 10) encloses neither
    rows = [dict(gpu=False, device=None, track=10, ts_ns=0, dur_ns=100, event_id=0),
            dict(gpu=False, device=0, track=10, ts_ns=0, dur_ns=100, event_id=1),
            dict(gpu=True, device=0, track=0, ts_ns=0, dur_ns=0, event_id=98),
            dict(gpu=True, device=0, track=0, ts_ns=0, dur_ns=0, event_id=99)]
    keyed = ById(np.array([98, 99]), [np.array([0, 1]), np.array([10, 10]), np.array([5, 5]), np.array([6, 6])],
                 [np.array([False, True]), None, None, None])
    assert attribute.enclosing_ops(_meta(rows), keyed) == {2: [0]}
