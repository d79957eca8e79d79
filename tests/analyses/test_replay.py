"""analyses/replay.py and ``tracekit whatif`` on stores.

1. The unchanged graph's replay gives every rank's measured step within 2 % on every step of every
   collected multi-rank fixture and of the shared 8-rank DLRM set (skipped without ../shared); on
   DLRM also with every GPU op's delay dropped (the graph's edges alone, launch latency and
   unrecorded waits removed), an independent check that the edges explain the step.
2. A hand-made 2-rank Kineto trace (tests/analyses/test_critical_path.py's) through the CLI, with
   the edited step times worked out by hand.
3. One rank of two: the edited time is a range with the reason, never a bare number.
4. ``--link nvlink5`` on DLRM: the change is explained (collectives changed, by how much, how much
   was hidden) and the numbers agree with each other.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES
from tracekit import analyses
from tracekit.analyses import replay as rpl
from tracekit.cli import main
from tracekit.ingest import ingest_paths
from tracekit.model import whatif as wf
from tracekit.store import Store

from test_critical_path import make_two_rank

SHARED = FIXTURES.parent.parent / "shared" / "traces"
WORKLOADS = ("tp_2rank", "tp_chunks_2rank", "ep_2rank", "pp_2rank", "pp_decode_2rank", "kv_bulk_2rank",
             "kv_layerwise_2rank", "sweep_2rank", "3d_2x2x2")


def _store(src, tmp_path, run_id="r"):
    store = Store(tmp_path / "s")
    ingest_paths([src], store, run_id=run_id)
    return store


@pytest.mark.parametrize("src", [FIXTURES / w for w in WORKLOADS] + [SHARED / "param_dlrm_8rank_v100"],
                         ids=lambda p: p.name)
def test_unchanged_replay_within_2_percent(src, tmp_path):
    if not src.exists():
        pytest.skip(f"{src} absent (../shared/traces is not checked out here)")
    con = analyses.connect(_store(src, tmp_path))
    rows = con.execute("SELECT rank, step, measured_ns, replayed_ns, error FROM replay_steps").fetchall()
    ranks, steps = con.execute("SELECT count(*), (SELECT count(DISTINCT step) FROM events WHERE step IS NOT NULL) "
                               "FROM ranks").fetchone()
    con.close()
    assert len(rows) >= ranks * max(steps, 1) - ranks  # every rank of every step (a rank may miss one)
    for rank, step, measured, replayed, err in rows:
        assert measured > 0
        assert abs(err) <= rpl.MAX_REPLAY_ERROR, (rank, step, measured, replayed)


def test_dlrm_edges_alone_explain_the_step(tmp_path):
    src = SHARED / "param_dlrm_8rank_v100"
    if not src.exists():
        pytest.skip(f"{src} absent (../shared/traces is not checked out here)")
    con = analyses.connect(_store(src, tmp_path))
    n = 0
    for g in rpl.graphs(con, "r"):
        g0 = g.copy()
        g0.delay = np.where(g.gpu, 0, g.delay)  # no launch latency, no unrecorded wait on the GPU
        meas, rep = rpl.measured_ns(g), wf.replay(g0).step_ns()
        assert len(meas) == 8
        for r in meas:
            assert rep[r] <= meas[r]  # dropping delays never lengthens a step
            assert abs(rep[r] - meas[r]) / meas[r] <= 0.02, (r, meas[r], rep[r])
            n += 1
    con.close()
    assert n == 8


def _cli_json(args, capsys):
    assert main(args + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_whatif_cli_by_hand(tmp_path, capsys):
    # make_two_rank (µs): rank 0 launches at 1, gemm A [2, 12), all-reduce [12, 40) (rank 1 arrives
    # at 22: 18 after it), a sync call [4, 40.5), a launch [41, 41.5), gemm B [45, 55) (3.5 after its
    # launch); rank 1 launches at 1, gemm C [2, 22), all-reduce [22, 38). compute ×0.5: A [2, 7),
    # C [2, 12); rank 1's all-reduce [12, 28); rank 0's ends 12 + 18 = 30; the sync returns 30.5;
    # the launch [31, 31.5); B [35, 40). Rank 0: 40 − 1 = 39 µs (measured 54), rank 1: 28 − 1 = 27 (37)
    make_two_rank(tmp_path / "tr")
    ingest_paths([tmp_path / "tr"], Store(tmp_path / "s"), run_id="tr")
    ans = _cli_json(["whatif", "--store", str(tmp_path / "s"), "--scale", "compute=0.5"], capsys)
    assert ans["edits"] == ["scale compute=0.5"] and ans["model"] is None
    (st,) = ans["steps"]
    assert st["limits"] == []
    got = {r["rank"]: (r["measured_ns"], r["replayed_ns"], r["edited_ns"]) for r in st["ranks"]}
    assert got == {0: (54_000, 54_000, 39_000), 1: (37_000, 37_000, 27_000)}
    slow = st["ranks"][0]
    assert slow["path_change"]["compute_ns"] == -5_000  # gemm B: 10 → 5 µs
    assert sum(slow["path_edited"].values()) == 39_000
    # no edit named: refused in one line, exit 2
    assert main(["whatif", "--store", str(tmp_path / "s")]) == 2
    assert "name an edit" in capsys.readouterr().err
    assert main(["whatif", "--store", str(tmp_path / "s"), "--link", "nvlink99"]) == 2


def test_one_rank_of_two_gives_a_range(tmp_path, capsys):
    make_two_rank(tmp_path / "tr")
    (tmp_path / "r0").mkdir()
    shutil.copy(tmp_path / "tr" / "rank0.json", tmp_path / "r0" / "rank0.json")
    ingest_paths([tmp_path / "r0"], Store(tmp_path / "s"), run_id="r0")
    ans = _cli_json(["whatif", "--store", str(tmp_path / "s"), "--scale", "compute=0.5"], capsys)
    (st,) = ans["steps"]
    assert any("only 1 of 2 ranks" in why for why in st["limits"])
    (r,) = st["ranks"]
    assert r["edited_ns"] is None and r["change_ns"] is None
    lo, hi = r["edited_range_ns"]
    # by hand (µs after the window's start at 1): gemm A halves to [2, 7), the all-reduce keeps its 28 µs
    # tail (no last arrival recorded), B ends at 45: edited 44. The untraced rank may hold all of that
    # tail: freed, the all-reduce ends at 7, the sync at 7.5 (+0.5 its own), B's launch [8, 8.5) after
    # 0.5 of host code, B after its 3.5 µs idle [12, 17): 16. High end: the unchanged replay, 54.
    assert (lo, hi) == (16_000, 54_000) and hi == r["replayed_ns"]
    assert main(["whatif", "--store", str(tmp_path / "s"), "--scale", "compute=0.5"]) == 0
    assert "limit: only 1 of 2 ranks" in capsys.readouterr().out


def test_dlrm_nvlink5_explains_the_change(tmp_path, capsys):
    src = SHARED / "param_dlrm_8rank_v100"
    if not src.exists():
        pytest.skip(f"{src} absent (../shared/traces is not checked out here)")
    _store(src, tmp_path, "dlrm")
    ans = _cli_json(["whatif", "--store", str(tmp_path / "s"), "--link", "nvlink5"], capsys)
    assert "nvlink5" in ans["model"] and ans["edits"] == ["transfers on nvlink5"]
    (st,) = ans["steps"]
    assert st["limits"] == [] and len(st["ranks"]) == 8
    ch = st["collectives_changed"]
    assert {c["op"] for c in ch} == {"all_reduce", "all_to_all"}
    for c in ch:
        assert c["group_size"] == 8 and c["change_ns"] == c["after_ns"] - c["before_ns"] != 0
    ex = st["explain"]
    slow = next(r for r in st["ranks"] if r["rank"] == st["slowest_rank"])
    assert ex["step_change_ns"] == slow["edited_ns"] - slow["replayed_ns"]
    assert ex["transfer_change_ns"] == sum(c["change_ns"] for c in ch)
    assert ex["hidden_ns"] == ex["transfer_change_ns"] - ex["step_change_ns"]
    # the big all-reduces get faster on NVLink 5 (1.5 MB: 85 µs measured on V100)
    big = max(ch, key=lambda c: c["size_bytes"])
    assert big["op"] == "all_reduce" and big["after_ns"] < big["before_ns"]
    assert main(["whatif", "--store", str(tmp_path / "s"), "--link", "nvlink5"]) == 0
    text = capsys.readouterr().out
    assert "was hidden" in text and "all_reduce" in text and "where faster" in text


def test_api_whatif_is_the_cli_answer(tmp_path, capsys):
    import tracekit

    make_two_rank(tmp_path / "tr")
    ingest_paths([tmp_path / "tr"], Store(tmp_path / "s"), run_id="tr")
    with tracekit.open(tmp_path / "s").run("tr") as run:
        ans = run.whatif(no_stragglers=True)
    # no stragglers (points of the program matched by name and occurrence; delays only): rank 0's
    # second launch's 1.5 µs of host code before it is cut to rank 1's 0.5, off the critical path
    # (the all-reduce it launches waits for gemm A); nothing else differs at a shared point, so
    # rank 0's step stays 54 µs and rank 1's 37
    assert ans == _cli_json(["whatif", "--store", str(tmp_path / "s"), "--no-stragglers"], capsys)
    got = {r["rank"]: r["edited_ns"] for r in ans["steps"][0]["ranks"]}
    assert got == {0: 54_000, 1: 37_000}
    assert "1000 ns of per-rank delay" in ans["steps"][0]["notes"][0]


def test_gpu_ops_without_their_launch_give_a_range(tmp_path):
    # hta_pyper_a100_r0of16: rank 0 of 16, and some launches outside the capture (traces/README.md)
    src = SHARED / "hta_pyper_a100_r0of16"
    if not src.exists():
        pytest.skip(f"{src} absent (../shared/traces is not checked out here)")
    con = analyses.connect(_store(src, tmp_path))
    from tracekit.report.whatif import whatif_answer

    ans = whatif_answer(con, "r", scale="compute=0.5")
    con.close()
    first = ans["steps"][0]
    assert any("have no launch call in the trace" in why for why in first["limits"])
    assert any("only 1 of 16 ranks" in why for why in first["limits"])
    for st in ans["steps"]:
        (r,) = st["ranks"]
        assert r["edited_ns"] is None
        lo, hi = r["edited_range_ns"]
        assert lo < hi and hi == r["replayed_ns"]  # compute halved: never slower than as measured


def test_whatif_html_renders_in_chromium(tmp_path, capsys):
    from tests.report.test_html_report import _run_chromium

    make_two_rank(tmp_path / "tr")
    ingest_paths([tmp_path / "tr"], Store(tmp_path / "s"), run_id="tr")
    page = tmp_path / "w.html"
    assert main(["whatif", "--store", str(tmp_path / "s"), "--scale", "compute=0.5", "--html", str(page)]) == 0
    capsys.readouterr()
    text = page.read_text()
    assert "scale compute=0.5" in text and text.count("<script") >= 2
    shot = os.environ.get("TRACEKIT_SHOT")  # a path: also a screenshot there, to look at
    dom, log = _run_chromium(page, tmp_path, Path(shot) if shot else None, height=900)
    assert 'class="main-svg"' in dom and "Uncaught" not in log


def test_nesting_by_hand():
    # one thread: A [0, 10) holds B [1, 4) (which holds C [2, 3)) and D [5, 10); E [10, 12) follows A;
    # Z [0, 0) is zero-length at A's start (A's thread predecessor, not its child); G [0, 5) is on a
    # GPU stream (never nested)
    from types import SimpleNamespace

    s = np.array([0, 1, 2, 5, 10, 0, 0], np.int64)
    e = np.array([10, 4, 3, 10, 12, 0, 5], np.int64)
    w = SimpleNamespace(s=s, e=e, gpu=np.array([0, 0, 0, 0, 0, 0, 1], bool))
    par, chi = rpl._nesting(w, np.array([0, 0, 0, 0, 0, 0, 1], np.int64))
    assert sorted(zip(par.tolist(), chi.tolist())) == [(0, 1), (0, 3), (1, 2)]


def test_device_sync_waits_for_every_stream_by_hand():
    # rank 0: cudaDeviceSynchronize [10, 50); stream 1: ops ending 20 and 40, stream 2: ending 45 and
    # 60 (after the call: not waited for) and 5 (before it started); rank 1's op ending 30 is another
    # rank's. The call waits for the op ending 40 (stream 1) and the one ending 45 (stream 2)
    from types import SimpleNamespace

    s = np.array([10, 15, 30, 0, 40, 55, 20], np.int64)
    e = np.array([50, 20, 40, 5, 45, 60, 30], np.int64)
    w = SimpleNamespace(s=s, e=e, gpu=np.array([0, 1, 1, 1, 1, 1, 1], bool),
                        rank=np.array([0, 0, 0, 0, 0, 0, 1], np.int64))
    track = np.array([0, 1, 1, 2, 2, 2, 3], np.int64)
    name = np.array(["cudaDeviceSynchronize", "k", "k", "k", "k", "k", "k"], object)
    calls, ops = rpl._device_syncs(w, track, name)
    assert calls.tolist() == [0, 0] and sorted(ops.tolist()) == [2, 4]


def test_an_edit_that_matches_nothing_is_refused(tmp_path, capsys):
    make_two_rank(tmp_path / "tr")
    ingest_paths([tmp_path / "tr"], Store(tmp_path / "s"), run_id="tr")
    assert main(["whatif", "--store", str(tmp_path / "s"), "--scale", "gemn=0.5"]) == 2
    err = capsys.readouterr().err
    assert "matched nothing" in err and "gemn" in err and len(err.strip().splitlines()) == 1
    assert main(["whatif", "--store", str(tmp_path / "s"), "--move-off", "broadcast"]) == 2


@pytest.mark.parametrize("argv, words", [
    (["--scale", "compute=1e12"], "FACTOR a number from 0 to 1e+06"),  # int64 overflow in the replay before
    (["--scale", "compute=inf"], "FACTOR a number from 0 to 1e+06"),  # 'infinitely slower' replayed faster
    (["--link", "nvlink5", "--algo", "bogus"], "--algo 'bogus': not an algorithm of the model"),
    (["--link", "nvlink5", "--ops", "zzz"], "the edit matched nothing in any step (transfers from the model on "
                                            "nvlink5 for zzz)"),
    (["--delay", "5:10@all_reduce"], "--delay: rank 5 is not in the run (its ranks: 0, 1)"),
    (["--delay", "0:99999999999999@send"], "more than the largest delay, 1e+09 ms"),
    (["--step", "999", "--no-stragglers"], "no step 999 (its steps: 2, 3)"),
    (["--no-stragglers", "--html", "/nonexistent-tk/dir/x.html"], "cannot write the HTML page"),
    # a gloo run's collectives are CPU spans: the edits of GPU streams find them and say so
    (["--move-off", "all_reduce"], "the edit changed nothing in any step (move 'all_reduce' off the compute "
                                   "stream): its matching collective spans are CPU spans, on no GPU stream"),
    (["--chunk", "all_reduce=4", "--link", "nvlink4"], "its matching collective spans are CPU spans, on no "
                                                       "GPU stream: nothing to pipeline"),
])
def test_whatif_bad_edits_are_one_line_errors(tmp_path, capsys, argv, words):
    _store(FIXTURES / "tp_2rank", tmp_path, run_id="tp")
    capsys.readouterr()
    assert main(["whatif", "--store", str(tmp_path / "s"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "internal error" not in err
