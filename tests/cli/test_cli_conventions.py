"""CLI conventions: the repeat-ingest message, full run ids in `tracekit runs`, `sql --format
--output` round trips, collect/profile without torch."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from tests.conftest import FIXTURES
from tracekit.cli import main
from tracekit.store import Store

TP = FIXTURES / "tp_2rank"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("conv") / "store"
    assert main(["ingest", "--store", str(d), str(TP)]) == 0
    return d


def test_repeat_ingest_says_already_ingested(store, capsys):
    rid = Store(store).run_ids()[0]
    capsys.readouterr()
    assert main(["ingest", "--store", str(store), str(TP)]) == 0
    err = capsys.readouterr().err
    assert f"already ingested as {rid} (use --replace" in err
    assert Store(store).run_ids() == [rid]  # nothing new
    assert main(["ingest", "--store", str(store), str(TP), "--replace"]) == 0
    assert "already ingested" not in capsys.readouterr().err


def test_runs_shows_full_long_ids(tmp_path, capsys, monkeypatch):
    long_id = "perlmutter-cloverleaf-cuda-nccl-allreduce-sweep-2rank-with-a-long-name"
    d = tmp_path / "s"
    assert main(["ingest", "--store", str(d), str(TP), "--run-id", long_id]) == 0
    monkeypatch.setenv("COLUMNS", "80")
    capsys.readouterr()
    assert main(["runs", "--store", str(d)]) == 0
    out = capsys.readouterr().out
    assert long_id in out and "…" not in out


def _sql(store, query, *args):
    return main(["sql", "--store", str(store), query, *args])


Q = "SELECT rank, seq, size_bytes, dur_ns, pg_ranks FROM collectives ORDER BY rank, seq"


def test_sql_csv_output_round_trip(store, tmp_path, capsys):
    from tracekit import analyses

    con = analyses.connect(Store(store))
    want = con.execute(Q).fetchall()
    con.close()
    out = tmp_path / "c.csv"
    assert _sql(store, Q, "--format", "csv", "--output", str(out)) == 0
    assert capsys.readouterr().out == ""  # only the file is written
    rows = list(csv.DictReader(out.open(newline="")))
    assert len(rows) == len(want) == 16
    got = [(int(r["rank"]), int(r["seq"]), int(r["size_bytes"]), int(r["dur_ns"]), json.loads(r["pg_ranks"]))
           for r in rows]
    assert got == [tuple(w) for w in want]


def test_sql_parquet_and_json(store, tmp_path, capsys):
    from tracekit import analyses

    con = analyses.connect(Store(store))
    want = con.execute("SELECT pg_name, seq, busbw_gbps FROM collective_bandwidth ORDER BY seq").fetchall()
    con.close()
    out = tmp_path / "b.parquet"
    assert _sql(store, "SELECT pg_name, seq, busbw_gbps FROM collective_bandwidth ORDER BY seq",
                "--format", "parquet", "--output", str(out)) == 0
    t = pq.read_table(out)
    assert [tuple(r.values()) for r in t.to_pylist()] == want  # exact doubles, types kept
    capsys.readouterr()
    assert _sql(store, "SELECT pg_name, seq, busbw_gbps FROM collective_bandwidth ORDER BY seq", "--format", "json") == 0
    assert [tuple(r.values()) for r in json.loads(capsys.readouterr().out)] == want


def test_sql_format_errors_and_read_only(store, tmp_path, capsys):
    assert _sql(store, "SELECT 1", "--format", "parquet") == 2
    assert "--output" in capsys.readouterr().err
    assert _sql(store, "SELECT 1", "--format", "xml") == 2
    assert _sql(store, "SELECT 1", "--format", "csv", "--output", str(tmp_path / "no" / "x.csv")) == 2
    assert "does not exist" in capsys.readouterr().err
    target = tmp_path / "copy.csv"
    assert _sql(store, f"COPY runs TO '{target}'", "--format", "csv", "--output", str(tmp_path / "o.csv")) == 2
    assert not target.exists() and not (tmp_path / "o.csv").exists()


def test_piped_sql_table_takes_columns(store, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    capsys.readouterr()
    assert _sql(store, "SELECT * FROM runs") == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) == 100 and len(lines) > 3  # the runs row's 20-odd columns folded into 100


def test_sql_run_restricts_every_view(tmp_path, capsys):
    """--run: the tables and the analysis views hold that run's rows only (tp_2rank: 8 all-reduces
    per rank, 2 ranks → 16 collectives rows, 8 instances; the handmade pair: 6 rows, 3 instances)."""
    d = tmp_path / "s"
    assert main(["ingest", "--store", str(d), str(TP), "--run-id", "tp"]) == 0
    assert main(["ingest", "--store", str(d), str(FIXTURES / "handmade" / "two_rank"), "--run-id", "hand"]) == 0
    capsys.readouterr()
    q = ("SELECT (SELECT count(*) FROM collectives), (SELECT count(*) FROM collective_instances), "
         "(SELECT string_agg(DISTINCT run_id, ',') FROM collective_instances)")
    assert _sql(d, q, "--format", "csv", "--run", "tp") == 0
    assert capsys.readouterr().out.splitlines()[1:] == ['16,8,"tp"']
    assert _sql(d, "SELECT count(DISTINCT run_id) FROM collectives", "--format", "csv", "--run", "tp", "--run", "hand") == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["2"]
    assert _sql(d, "SELECT 1", "--run", "nope") == 2
    assert capsys.readouterr().err.strip() == f"tracekit: run 'nope' is not in {d} (runs: hand, tp)"


@pytest.mark.parametrize("argv", [["collect", "tp"], ["collect", "sweep"], ["profile", "--", "python", "x.py"]])
def test_collect_and_profile_without_torch_exit_2(argv):
    code = ("import sys; sys.modules['torch'] = None\n"  # torch absent, as in a core-only install
            "from tracekit.cli import main; sys.exit(main(%r))" % argv)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs torch" in lines[0] and "tracekit[collect]" in lines[0]
    assert "download.pytorch.org/whl/cpu" in lines[0]


def test_overhead_wording():
    from tracekit.cli.conventions import overhead_text

    assert overhead_text(-1.8).startswith("profiler overhead within noise")
    assert overhead_text(2.9).startswith("profiler overhead within noise")
    assert overhead_text(12.34) == "profiler overhead +12.3% per recorded step"
