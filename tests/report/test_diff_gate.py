"""`tracekit diff BASE NEW --fail-on RULE` (the CI gate) and named baselines (`tracekit baseline`).

The slower run is the hand-made 2-rank trace (fixtures/handmade/two_rank) with every NCCL kernel
twice as long, starts unchanged. By hand, from the events (µs):

base: rank 0 all-reduce [1000, 1050], GEMM [1030, 1100], all-gather [2000, 2010] → comm 60,
      overlap 20, exposed 40; rank 1 all-reduce [1020, 1060], all-gather [2004, 2016] → exposed 52.
      Exposed comm 92 µs. All-reduce sync time = mean end − last start = 1055 − 1020 = 35 µs,
      all-gather 2013 − 2004 = 9 µs.
slow: rank 0 all-reduce [1000, 1100] (70 under the GEMM), all-gather [2000, 2020] → exposed 50;
      rank 1 [1020, 1100], [2004, 2028] → exposed 104. Exposed comm 154 µs: +62 µs = +67.4 %.
      Sync times 80 µs and 20 µs: busbw (bytes / sync time) changes by 35/80 − 1 = −56.25 % and
      9/20 − 1 = −55 %.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, REPO
from tracekit.cli import main
from tracekit.errors import BadInputError, StoreError
from tracekit.ingest import ingest_paths
from tracekit.report.diff import diff_runs, evaluate_gate, parse_fail_on
from tracekit.store import Store
from tracekit.store.baselines import list_baselines, resolve_run, set_baseline

TWO_RANK = FIXTURES / "handmade" / "two_rank"


def _copy(dst, scale_nccl: float):
    """The two-rank trace with every NCCL kernel's duration times ``scale_nccl`` (re-serialised,
    so even a scale of 1 gives files of another sha256: another run)."""
    dst.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        d = json.loads((TWO_RANK / f"rank{r}.json").read_text())
        for e in d["traceEvents"]:
            if e["name"].startswith("nccl"):
                e["dur"] *= scale_nccl
        (dst / f"rank{r}.json").write_text(json.dumps(d))
    return dst


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate-traces")
    return dict(slow=_copy(root / "slow", 2.0), same=_copy(root / "same", 1.0))


@pytest.fixture(scope="module")
def store(tmp_path_factory, traces):
    st = Store(tmp_path_factory.mktemp("gate-store"))
    ingest_paths([TWO_RANK], st, run_id="base")
    ingest_paths([traces["slow"]], st, run_id="slow")
    ingest_paths([traces["same"]], st, run_id="same")
    ingest_paths([FIXTURES / "nccl_tests" / "two_runs.md"], st, run_id="log")
    return st


def test_parse_rules():
    r = parse_fail_on("exposed_comm>+5%")
    assert (r["metric"], r["op"], r["relative"], r["threshold"]) == ("exposed_comm", ">", True, 0.05)
    assert parse_fail_on("busbw<-10%")["threshold"] == pytest.approx(-0.10)
    assert parse_fail_on("comm > +2ms")["threshold"] == pytest.approx(2e6)  # ns
    assert parse_fail_on("busbw<-5GB/s")["threshold"] == pytest.approx(-5.0)  # GB/s
    assert parse_fail_on("overlap_ratio<-10pp") == dict(expr="overlap_ratio<-10pp", metric="overlap_ratio", op="<",
                                                        relative=False, threshold=pytest.approx(-0.10), unit="pp")
    for bad, why in (("exposed_comm>+5", "needs a unit"), ("latency>5%", "unknown metric"),
                     ("busbw=-10%", "not METRIC>CHANGE"), ("busbw<-10pp", "overlap_ratio only"),
                     ("comm>+5GB/s", None), ("", "not METRIC")):
        with pytest.raises(BadInputError) as e:
            parse_fail_on(bad)
        assert "\n" not in str(e.value) and (why is None or why in str(e.value))


def test_gate_values_by_hand(store):
    d = diff_runs(store, "base", "slow")
    g = evaluate_gate(d, [parse_fail_on("exposed_comm>+5%"), parse_fail_on("busbw<-10%"),
                          parse_fail_on("exposed_comm>+70%"), parse_fail_on("comm>+1ms")])
    assert not g["passed"]
    assert [(r["checked"], r["failed"]) for r in g["rules"]] == [(1, 1), (2, 2), (1, 0), (1, 0)]
    exp = next(f for f in g["failures"] if f["metric"] == "exposed_comm")
    assert (exp["a"], exp["b"]) == (92_000, 154_000)
    assert exp["change"] == pytest.approx(62 / 92)
    bw = {f["op"]: f["change"] for f in g["failures"] if f["metric"] == "busbw"}
    assert bw == {"all_reduce": pytest.approx(35 / 80 - 1), "all_gather": pytest.approx(9 / 20 - 1)}


def test_gate_exit_codes(store, capsys):
    rules = ["--fail-on", "exposed_comm>+5%", "--fail-on", "busbw<-10%"]
    assert main(["diff", "base", "slow", "--store", str(store.path), *rules]) == 1
    out = capsys.readouterr().out
    assert "gate: FAILED (3 regressions)" in out
    assert re.search(r"exposed_comm>\+5%.*\(run total\).*\+67\.4%", out)
    assert re.search(r"busbw<-10%.*all_reduce.*4 MiB–8 MiB.*-56\.2%", out)
    # an identical run (the same events in other files) passes: every change is 0
    assert main(["diff", "base", "same", "--store", str(store.path), *rules]) == 0
    assert "gate: passed" in capsys.readouterr().out
    assert main(["diff", "base", "slow", "--store", str(store.path), "--fail-on", "exposed_comm>5"]) == 2
    assert "needs a unit" in capsys.readouterr().err


def test_gate_json(store, capsys):
    assert main(["diff", "base", "slow", "--store", str(store.path), "--json", "--fail-on", "sync_time>+100%"]) == 1
    g = json.loads(capsys.readouterr().out)["gate"]
    # sync time 35 → 80 µs (+128.6 %) and 9 → 20 µs (+122.2 %): both break +100 %
    assert g["passed"] is False and {(f["op"], f["a"], f["b"]) for f in g["failures"]} == {
        ("all_reduce", 35000.0, 80000.0), ("all_gather", 9000.0, 20000.0)}


def test_rule_without_data_is_not_judged(store):
    g = evaluate_gate(diff_runs(store, "log", "log"), [parse_fail_on("exposed_comm>+5%"), parse_fail_on("busbw<-10%")])
    assert g["passed"] and g["rules"][0]["checked"] == 0 and "no timeline" in g["rules"][0]["not_judged"]
    assert g["rules"][1]["checked"] > 0 and g["rules"][1]["not_judged"] is None


def test_baselines(store, capsys):
    rec = set_baseline(store, "good", "base")
    assert rec["run_id"] == "base" and (store.path / "baselines" / "good.json").is_file()
    assert resolve_run(store, "baseline:good") == ("base", None)
    assert resolve_run(store, "slow") == ("slow", None)
    set_baseline(store, "good", "same")  # re-pointing replaces
    assert [(b["name"], b["run_id"], b["present"]) for b in list_baselines(store)] == [("good", "same", True)]
    with pytest.raises(StoreError, match="no baseline 'nope'"):
        resolve_run(store, "baseline:nope")
    with pytest.raises(StoreError, match="not in"):
        set_baseline(store, "x", "no-such-run")
    with pytest.raises(StoreError, match="baseline name"):
        set_baseline(store, "../evil", "base")
    assert main(["baseline", "set", "good", "base", "--store", str(store.path)]) == 0
    assert main(["baseline", "list", "--store", str(store.path)]) == 0
    assert "good\tbase\t" in capsys.readouterr().out
    assert main(["diff", "baseline:good", "slow", "--store", str(store.path), "--fail-on", "busbw<-10%"]) == 1
    assert main(["diff", "baseline:missing", "slow", "--store", str(store.path)]) == 2


def _readme_ci_example() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## CI gate", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


@pytest.mark.parametrize("new,rc", [("slow", 1), ("same", 0)])
def test_readme_ci_example(tmp_path, traces, new, rc):
    """The README's two-line CI example, run by a shell as written (`tracekit` = this checkout)."""
    lines = _readme_ci_example()
    assert len(lines) == 2
    work = tmp_path / "ci"
    work.mkdir()
    (work / "traces").symlink_to(traces[new])
    st = tmp_path / "store"
    ingest_paths([TWO_RANK], Store(st), run_id="good-run")
    env = dict(os.environ, TRACEKIT_STORE=str(st), CI_COMMIT=f"commit-{new}", GOOD_RUN="good-run",
               PYTHONPATH=str(REPO))
    script = f"tracekit() {{ {shlex.quote(sys.executable)} -m tracekit \"$@\"; }}\n" + "\n".join(lines) + "\n"
    proc = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == rc, proc.stderr
    gate = json.loads((work / "gate.json").read_text())["gate"]
    assert gate["passed"] is (rc == 0)
    if rc:
        assert {f["expr"] for f in gate["failures"]} == {"exposed_comm>+5%", "busbw<-10%"}


def test_baseline_of_a_replaced_run_warns(tmp_path, traces, capsys):
    st = Store(tmp_path / "s")
    ingest_paths([TWO_RANK], st, run_id="r")
    set_baseline(st, "good", "r")
    ingest_paths([traces["slow"]], st, run_id="r", replace=True)  # the same id, other data: a new version
    (rec,) = list_baselines(st)
    assert rec["present"] and rec["replaced"]
    rid, warn = resolve_run(st, "baseline:good")
    assert rid == "r" and "re-ingested after the baseline was set" in warn
    assert main(["baseline", "list", "--store", str(st.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["replaced"] is True
