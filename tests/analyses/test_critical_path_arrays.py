"""The critical path's array walk (timeline/critical_path.py, ``walks``) against the one-node-at-a-
time walk (``walk``), which it must reproduce exactly.

1. Hand-made windows (a few nodes, their predecessors written here): a path that only follows the
   usual choice (computed as arrays), one where the usual predecessor is ready after the cursor and
   one whose usual predecessors loop (both walked by ``walk``), each with the path worked out by
   hand.
2. Every window of real stores (fixtures with several ranks, steps and collectives; a shared
   trace when ../shared is present): ``walks`` and ``walk`` give the same nodes, ready times and
   edge kinds for every rank.
3. The stored rows do not depend on whether the array walk or ``walk`` built them.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import FIXTURES
from tracekit import analyses
from tracekit.analyses import replay
from tracekit.ingest import ingest_paths
from tracekit.timeline import critical_path as cp
from tracekit.store import Store

T, END, SYNC = cp._THREAD, cp._END, cp._EDGE_SYNC
SHARED = FIXTURES.parent.parent / "shared" / "traces"


def _window(e, usual, other=None, starts=(3,)):
    """A _Window of len(e) nodes with the given ends (start = end − 1): ``usual`` per node
    (predecessor, ready, kind), ``other`` per node a second candidate (or None), the paths'
    starts."""
    n = len(e)
    w = object.__new__(cp._Window)
    w.e = np.array(e, np.int64)
    w.s = w.e - 1
    w.pred = np.full((cp._Window.RULES, n), -1, np.int64)
    w.ready = np.zeros((cp._Window.RULES, n), np.int64)
    w.kind = np.zeros((cp._Window.RULES, n), np.int8)
    for col, rows in ((0, usual), (1, other or [None] * n)):
        for i, c in enumerate(rows):
            if c is not None:
                w.pred[col, i], w.ready[col, i], w.kind[col, i] = c
    w.usual = tuple(np.array([u[c] if u else (-1, 0, END)[c] for u in usual], t)
                    for c, t in enumerate((np.int64, np.int64, np.int8)))
    w._best = None
    w.starts = np.array(starts, np.int64)
    return w


def _both(w, monkeypatch):
    """(walks' result as lists, how many paths it handed to walk); asserts walk gives the same."""
    calls = []
    real = cp.walk
    monkeypatch.setattr(cp, "walk", lambda *a: calls.append(a[1]) or real(*a))
    nodes, readies, kinds, lengths = cp.walks(w)
    monkeypatch.setattr(cp, "walk", real)
    ref = [real(w, int(i), int(w.e[i])) for i in w.starts]
    assert lengths.tolist() == [len(r[0]) for r in ref]
    for got, c in ((nodes, 0), (readies, 1), (kinds, 2)):
        assert got.tolist() == [x for r in ref for x in r[c]]
    return (nodes.tolist(), readies.tolist(), kinds.tolist(), lengths.tolist()), len(calls)


def test_a_chain_of_usual_choices_is_taken_as_arrays(monkeypatch):
    # 3 ← 2 ← 1 ← 0 by thread edges, each ready at its predecessor's end; node 3 ends at 40
    w = _window([10, 20, 30, 40], [None, (0, 10, T), (1, 20, T), (2, 30, T)])
    got, fallbacks = _both(w, monkeypatch)
    assert got == ([3, 2, 1, 0], [30, 20, 10, 10], [T, T, T, END], [4])
    assert fallbacks == 0


def test_a_usual_predecessor_ready_after_the_cursor_is_walked(monkeypatch):
    # node 2's usual predecessor (1, a sync edge ready at 35) is ready after the cursor the walk
    # enters it with (30, node 3's edge): the walk takes node 2's other candidate (0, ready 10)
    w = _window([10, 20, 36, 40], [None, (0, 10, T), (1, 35, SYNC), (2, 30, T)],
                [None, None, (0, 10, T), None])
    got, fallbacks = _both(w, monkeypatch)
    assert got == ([3, 2, 0], [30, 10, 10], [T, T, END], [3])
    assert fallbacks == 1


def test_usual_predecessors_that_loop_are_walked(monkeypatch):
    # 1 and 2 are each other's usual predecessor (ready 20, zero-length nodes); from 1 the walk
    # finds 2 on the path already and takes 1's other candidate, 0 (ready 5). Two ranks' paths:
    # node 4's (a plain chain 4 ← 0, as arrays alone it would be) walked with it in one window.
    w = _window([5, 20, 20, 25, 30], [None, (2, 20, T), (1, 20, T), (2, 20, T), (0, 5, T)],
                [None, (0, 5, T), None, None, None], starts=(3, 4))
    got, fallbacks = _both(w, monkeypatch)
    assert got == ([3, 2, 1, 0, 4, 0], [20, 20, 5, 5, 5, 5], [T, T, T, END, T, END], [4, 2])
    assert fallbacks == 1


def test_no_start_gives_no_path(monkeypatch):
    w = _window([10], [None], starts=())
    assert _both(w, monkeypatch)[0] == ([], [], [], [])


def _stores():
    yield FIXTURES / "3d_2x2x2"
    yield FIXTURES / "pp_2rank"
    yield FIXTURES / "handmade" / "two_rank"
    for name in ("param_dlrm_8rank_v100", "hta_pyper_a100_r0of16"):
        yield SHARED / name


@pytest.mark.parametrize("src", list(_stores()), ids=lambda p: p.name)
def test_every_window_of_real_stores_walks_the_same(src, tmp_path, monkeypatch):
    if not src.exists():
        pytest.skip(f"{src} absent (../shared/traces is not checked out here)")
    store = Store(tmp_path / "s")
    ingest_paths([src], store, run_id="r")
    con = analyses.connect(store)
    con.analyses.ensure([r for r in analyses.BY_NAME["critical_path"].reads if r in analyses.DEFINED_BY])
    con.execute(analyses.critical_path._ARRIVALS, ["r"])
    con.execute(replay._EVENTS, ["r"])
    kinds = [k for (k,) in con.execute("SELECT DISTINCT track_kind FROM _cp_events WHERE node AND "
                                       "track_kind IS NOT NULL ORDER BY 1").fetchall()]
    paths = 0
    for _, rows in replay._windows(con, kinds):
        w = replay._window(rows)[0]
        paths += _both(w, monkeypatch)[0][3].__len__()
    assert paths > 0
    # the paths (stored at ingest for a run of one rank, walked by the analysis for several): the
    # array walk's, then walk's alone
    tables = ("critical_path", "critical_path_summary")
    arrays = [con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in tables]
    con.close()
    monkeypatch.setattr(cp, "walks", lambda w: _by_walk(w))
    store = Store(tmp_path / "by_walk")
    ingest_paths([src], store, run_id="r")
    con = analyses.connect(store)
    assert [con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in tables] == arrays
    con.close()


def _by_walk(w):
    ref = [cp.walk(w, int(i), int(w.e[i])) for i in w.starts]
    return (*(np.array([x for r in ref for x in r[c]], np.int64) for c in range(3)),
            np.array([len(r[0]) for r in ref], np.int64))
