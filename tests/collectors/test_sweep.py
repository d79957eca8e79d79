"""The calibration sweep: sizes and options, the recorded fixture's traces
(exact call counts and sizes per op and rank, no warm-up call inside the
trace), the fixture through ingest and the α–β fit, and (slow) a real run of
`tracekit collect sweep`.
"""

from __future__ import annotations

from tracekit import analyses
import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tracekit.errors import BadInputError

pytest.importorskip("torch")

from tracekit.collectors.workloads import sweep  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "sweep_2rank"

#: Kineto cpu_op name (torch 2.13, gloo) → the sweep op it belongs to
C10D_OPS = {
    "c10d::allreduce_": "all_reduce",
    "c10d::_allgather_base_": "all_gather",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::alltoall_base_": "all_to_all",
    "c10d::send": "send",
    "c10d::recv_": "recv",
}


def _config() -> dict:
    return json.loads((FIXTURE / "run_config.json").read_text())


def _trace(rank: int) -> dict:
    with gzip.open(FIXTURE / f"rank{rank}.pt.trace.json.gz", "rt") as f:
        return json.load(f)


def _first_tensor_elems(dims) -> int:
    """Elements of a c10d op's first tensor argument (a Tensor or a TensorList of one)."""
    d = dims[0]
    if d and isinstance(d[0], list):
        d = d[0]
    n = 1
    for x in d:
        n *= x
    return n


# --------------------------------------------------------------------------- options


def test_parse_size():
    assert sweep.parse_size("1024") == 1024
    assert sweep.parse_size("1K") == sweep.parse_size("1KiB") == 1024
    assert sweep.parse_size("1KB") == 1000 and sweep.parse_size("16MB") == 16_000_000  # decimal, as in the model
    assert sweep.parse_size("16M") == 16 << 20
    assert sweep.parse_size("1G") == 1 << 30
    assert sweep.parse_size(4096) == 4096
    for bad in ("", "1T", "-4", "1.5"):
        with pytest.raises(BadInputError):
            sweep.parse_size(bad)


def test_parse_ops_canonical_order_and_aliases():
    assert sweep.parse_ops("send_recv,all_reduce") == ("all_reduce", "send_recv")
    assert sweep.parse_ops("all_gather_into_tensor, reduce_scatter_tensor,all_to_all_single,p2p") == (
        "all_gather", "reduce_scatter", "all_to_all", "send_recv",
    )
    assert sweep.parse_ops("allreduce") == ("all_reduce",)
    with pytest.raises(BadInputError, match="unknown op 'broadcast'"):
        sweep.parse_ops("all_reduce,broadcast")
    with pytest.raises(BadInputError, match="no ops"):
        sweep.parse_ops(" , ")


def test_sizes_are_whole_equal_chunks():
    assert sweep.sweep_sizes(1024, 64 << 20, 4, 2) == [1024 * 4**i for i in range(9)]
    assert sweep.sweep_sizes(1024, 16 << 20, 2, 2)[-1] == 16 << 20
    # 3 ranks: multiples of 12 bytes (float32, equal per-rank chunks)
    s3 = sweep.sweep_sizes(1000, 100_000, 10, 3)
    assert s3 == [996, 9996, 99996] and all(s % 12 == 0 for s in s3)
    # tiny sizes round up to one element per rank and are not repeated
    assert sweep.sweep_sizes(1, 16, 2, 2) == [8, 16]


def test_defaults():
    c = sweep.SweepConfig().resolved()
    assert c.ops == sweep.OPS
    assert (c.sizes[0], c.sizes[-1], len(c.sizes)) == (1024, 64 << 20, 9)
    assert (c.iters, c.warmup_iters, c.factor) == (5, 2, 4)
    assert len(c.blocks) == 5 * 9


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(ranks=1), "at least 2 ranks"),
        (dict(ranks=9), "ranks must be between 1 and 8"),
        (dict(min_bytes=2048, max_bytes=1024), "smaller than min-bytes"),
        (dict(max_bytes="2G"), "over the limit"),
        (dict(factor=1), "factor must be an integer >= 2"),
        (dict(iters=0), "iters must be at least 1"),
        (dict(warmup_iters=-1), "warmup-iters must be >= 0"),
        (dict(ops="all_reduce,gossip"), "unknown op 'gossip'"),
        (dict(backend="mpi"), "unknown backend"),
    ],
)
def test_bad_configs_raise_bad_input(kw, words):
    with pytest.raises(BadInputError) as ei:
        sweep.SweepConfig(**kw).resolved()
    assert words in str(ei.value) and "\n" not in str(ei.value)


def test_cli_bad_option_exits_2(capsys, tmp_path):
    from tracekit.cli import main

    assert main(["collect", "sweep", "--ops", "all_reduce,gossip", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().startswith("tracekit: unknown op 'gossip'")
    assert list(tmp_path.iterdir()) == []  # refused before anything started


def test_p2p_roles():
    assert [sweep.p2p_peer(r, 4) for r in range(4)] == [("send", 1), ("recv", 0), ("send", 3), ("recv", 2)]
    assert sweep.p2p_peer(2, 3) is None


# --------------------------------------------------------------------------- the recorded fixture


def test_fixture_config():
    cfg = _config()
    assert cfg["workload"] == "sweep" and cfg["world_size"] == 2 and cfg["backend"] == "gloo"
    assert cfg["ops"] == list(sweep.OPS)
    assert cfg["sizes"] == [1024 * 4**i for i in range(6)]
    assert (cfg["iters"], cfg["warmup_iters"]) == (3, 1)
    assert len(cfg["blocks"]) == len(cfg["ops"]) * len(cfg["sizes"])
    for f in FIXTURE.glob("*.gz"):
        assert f.stat().st_size < 1 << 20


@pytest.mark.parametrize("rank", [0, 1])
def test_fixture_trace_calls_and_sizes_per_op(rank):
    """Per rank and op: exactly sizes × iters calls (the warm-up calls are not in the
    trace), iters at each configured size, sizes read from the ops' Input Dims."""
    cfg = _config()
    n = cfg["world_size"]
    sizes, iters = cfg["sizes"], cfg["iters"]
    seen: dict[str, Counter] = defaultdict(Counter)
    steps = set()
    for e in _trace(rank)["traceEvents"]:
        name = e.get("name", "")
        if name.startswith("ProfilerStep#"):
            steps.add(int(name.split("#")[1]))
        op = C10D_OPS.get(name)
        if op is None or e.get("ph") != "X":
            continue
        dims = e["args"]["Input Dims"]
        if op == "all_gather":  # (output S/4, input S/4N)
            out_e, in_e = dims[0][0], dims[1][0]
            assert out_e == n * in_e
            size = out_e * 4
        elif op == "reduce_scatter":  # (output S/4N, input S/4)
            out_e, in_e = dims[0][0], dims[1][0]
            assert in_e == n * out_e
            size = in_e * 4
        else:
            size = _first_tensor_elems(dims) * 4
        seen[op][size] += 1
    expected = cfg["expected"]["calls_per_rank"][rank]
    assert expected == sweep.expected_calls(sweep.SweepConfig(**{
        k: cfg[k] for k in ("ranks", "ops", "min_bytes", "max_bytes", "factor", "iters", "warmup_iters")
    }).resolved(), rank, n)
    want_ops = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send" if rank == 0 else "recv"}
    assert set(seen) == want_ops
    for op in want_ops:
        assert dict(seen[op]) == {s: iters for s in sizes}, op
        assert sum(seen[op].values()) == expected[op] == len(sizes) * iters
    assert steps == set(range(1, len(cfg["blocks"]) + 1))  # step 0 (all warm-ups) was discarded


def test_fixture_ingest_counts_and_fit(tmp_path):
    from tracekit.ingest import ingest_paths
    from tracekit.store import Store

    st = Store(tmp_path / "store")
    rid = ingest_paths([str(FIXTURE)], store=st)
    con = analyses.connect(st)
    run = con.execute("SELECT workload, world_size, backend FROM runs WHERE run_id = ?", [rid]).fetchone()
    assert run == ("sweep", 2, "gloo")
    cfg = _config()
    per = cfg["expected"]["calls_per_op_per_rank"]
    rows = con.execute(
        "SELECT rank, op, count(*), count(DISTINCT size_bytes), min(size_bytes), max(size_bytes) "
        "FROM collectives WHERE run_id = ? AND op IN ('all_gather', 'all_to_all', 'send', 'recv', 'barrier') "
        "GROUP BY ALL ORDER BY ALL",
        [rid],
    ).fetchall()
    got = {(r[0], r[1]): r[2:] for r in rows}
    lo, hi = cfg["sizes"][0], cfg["sizes"][-1]
    for rank in (0, 1):
        for op in ("all_gather", "all_to_all", "send" if rank == 0 else "recv"):
            assert got[(rank, op)] == (per, len(cfg["sizes"]), lo, hi), (rank, op)
        assert got[(rank, "barrier")][0] == len(cfg["blocks"])
    complete = con.execute(
        "SELECT op, count(*) FROM collective_instances WHERE run_id = ? AND complete AND NOT disagree "
        "AND op IN ('all_gather', 'all_to_all') GROUP BY op ORDER BY op",
        [rid],
    ).fetchall()
    assert complete == [("all_gather", per), ("all_to_all", per)]
    fit = {
        r[0]: r[1:]
        for r in con.execute(
            "SELECT op, status, alpha_s, beta_Bps, n_half_bytes FROM alpha_beta_fit WHERE run_id = ?", [rid]
        ).fetchall()
    }
    for op in ("all_reduce", "all_gather", "all_to_all"):
        status, alpha, beta, n_half = fit[op]
        assert alpha > 0 and beta > 0 and n_half > 0, (op, fit[op])
    # gloo on a loaded 2-core host: all_reduce's per-size medians sit on a line (ok); all_gather's and
    # all_to_all's stray by 23 % and 31 % (poor, judged by issue 15's 15 % bound)
    assert {op: fit[op][0] for op in ("all_reduce", "all_gather", "all_to_all")} == {
        "all_reduce": "ok", "all_gather": "poor", "all_to_all": "poor"}


def test_fixture_reduce_scatter_ingested_as_reduce_scatter(tmp_path):
    """gloo runs reduce-scatter as an all-reduce of the input (its worker span is named
    gloo:all_reduce); ingest must still call it reduce_scatter, from the c10d op that issued it."""
    from tracekit.ingest import ingest_paths
    from tracekit.store import Store

    st = Store(tmp_path / "store")
    rid = ingest_paths([str(FIXTURE)], store=st)
    cfg = _config()
    n = analyses.connect(st).execute(
        "SELECT rank, op, count(*) FROM collectives WHERE run_id = ? AND op IN ('all_reduce', 'reduce_scatter') "
        "GROUP BY ALL ORDER BY ALL",
        [rid],
    ).fetchall()
    per = cfg["expected"]["calls_per_op_per_rank"]
    assert n == [(0, "all_reduce", per), (0, "reduce_scatter", per), (1, "all_reduce", per), (1, "reduce_scatter", per)]


# --------------------------------------------------------------------------- a real run


@pytest.mark.slow
def test_collect_sweep_end_to_end(tmp_path, capsys):
    """`tracekit collect sweep` on 2 gloo ranks: run folder, trace counts, ingest, fit rows."""
    from tracekit.cli import main
    from tracekit.store import Store

    store = tmp_path / "store"
    rc = main([
        "collect", "sweep", "--ranks", "2", "--backend", "gloo", "--ops", "all_reduce,all_to_all,send_recv",
        "--min-bytes", "1K", "--max-bytes", "64K", "--factor", "4", "--iters", "2", "--warmup-iters", "1",
        "--out", str(tmp_path / "runs"), "--store", str(store),
    ])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "α–β fit" in out.out
    (run_dir,) = (tmp_path / "runs").iterdir()
    cfg = json.loads((run_dir / "run_config.json").read_text())
    assert cfg["sizes"] == [1024, 4096, 16384, 65536] and cfg["ops"] == ["all_reduce", "all_to_all", "send_recv"]
    con = analyses.connect(Store(store))
    counts = dict(
        ((r, op), n)
        for r, op, n in con.execute(
            "SELECT rank, op, count(*) FROM collectives WHERE op <> 'barrier' GROUP BY ALL"
        ).fetchall()
    )
    assert counts == {(0, "all_reduce"): 8, (1, "all_reduce"): 8, (0, "all_to_all"): 8, (1, "all_to_all"): 8,
                      (0, "send"): 8, (1, "recv"): 8}
    # every swept collective gets a fit row (its status may say the slope is not
    # resolvable at these small sizes on a busy machine: that is the fit's call)
    fit = dict(con.execute("SELECT op, n_samples + n_warmup FROM alpha_beta_fit").fetchall())
    assert fit["all_reduce"] == 8 and fit["all_to_all"] == 8


def test_fixture_send_recv_pairs_matched(tmp_path):
    """Each send on rank 0 pairs with its recv on rank 1 into one complete instance, peers set."""
    from tracekit.ingest import ingest_paths
    from tracekit.store import Store

    st = Store(tmp_path / "store")
    rid = ingest_paths([str(FIXTURE)], store=st)
    cfg = _config()
    rows = analyses.connect(st).execute(
        "SELECT size_bytes, count(*) FROM collective_instances WHERE run_id = ? AND op IN ('send', 'recv') "
        "AND complete AND NOT disagree GROUP BY ALL ORDER BY ALL",
        [rid],
    ).fetchall()
    assert rows == [(s, cfg["iters"]) for s in cfg["sizes"]]
    peers = analyses.connect(st).execute(
        "SELECT rank, op, peer, count(*) FROM collectives WHERE run_id = ? AND op IN ('send', 'recv') GROUP BY ALL",
        [rid],
    ).fetchall()
    n = cfg["expected"]["calls_per_op_per_rank"]
    assert sorted(peers) == [(0, "send", 1, n), (1, "recv", 0, n)]
