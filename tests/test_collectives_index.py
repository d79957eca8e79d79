"""The per-thread index of CPU comm ops that finds the ops enclosing a kernel's launch call
(tracekit.ingest.collectives._OpIndex), against a brute-force scan of every op."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from tracekit.ingest.collectives import _OpIndex


def _brute(ops, ts, end):
    """Rows of the ops with start <= ts and end >= end, innermost first: the latest start first,
    on equal starts the shorter first, on equal both the later in the file first."""
    hits = [(s, d, i) for i, (s, d) in enumerate(ops) if s <= ts and s + d >= end]
    return [i for s, d, i in sorted(hits, key=lambda h: (-h[0], h[1], -h[2]))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("file_order", ["sorted", "shorter_first", "shuffled"])
def test_enclosing_ops_match_brute_force(seed, file_order):
    rng = random.Random(seed)
    ops = []
    for _ in range(40):  # nested and overlapping ops with many equal starts and durations
        s = rng.randint(0, 60)
        ops.append((s, rng.choice([0, 1, 5, 5, 10, 30])))
    if file_order == "sorted":  # as traces list them: by start, the longer first (no sort needed)
        ops.sort(key=lambda o: (o[0], -o[1]))
    elif file_order == "shorter_first":  # by start but the shorter first: the index must sort
        ops.sort()
    else:
        rng.shuffle(ops)
    meta = SimpleNamespace(ts_ns=np.array([o[0] for o in ops], dtype=np.int64),
                           dur_ns=np.array([o[1] for o in ops], dtype=np.int64))
    idx = _OpIndex(meta, np.arange(len(ops)))
    for _ in range(200):
        t = rng.randint(-2, 95)
        e = t + rng.choice([0, 0, 1, 3, 8])
        assert idx.enclosing(t, e) == _brute(ops, t, e), (t, e)
