"""Cross-check: tracekit's per-rank overlap ratio against HTA's ``get_comm_comp_overlap``.

HTA (HolisticTraceAnalysis 0.5.0) runs in its own virtual environment
(``.venv-hta``, made by ``bash benchmarks/setup_hta.sh``), in a subprocess
(``benchmarks/hta_overlap.py``), on temporary directories of symlinks to the
shared traces. The tests skip with a reason when that environment or
``../shared/traces`` is absent.

Both tools define overlap_ratio = |comm ∩ compute| / |comm| over unions of
intervals. What each counts differs, and this module pins every difference
down rather than widening the tolerance:

1. HTA's definition is recomputed here, independently, from the raw JSON
   (:func:`hta_definition`): comm = GPU events whose name starts with "nccl"
   and has "Kernel" after it; compute = the other GPU events (any event with a
   ``stream`` arg) except memory copies/sets and names containing "Sync"; with
   two optional steps HTA applies by default:
     (a) *ns rounding*: when timestamps are floats, each event's start is
         rounded up and its end down to whole µs (HTA's
         ``HTA_DISABLE_NS_ROUNDING=1`` turns this off);
     (b) *launch filter*: when the traces name more than one ProfilerStep,
         HTA keeps only GPU events whose correlation id matches a CPU event
         that starts before the last ProfilerStep starts (with
         ``include_last_profiler_step=True``: at or before its end); GPU work
         of the last step, and GPU work whose launch is not in the trace,
         is dropped.
   ``test_independent_recompute_reproduces_hta`` shows the recomputation
   equals HTA's output (to the 0.005 percentage points HTA rounds to) on every
   rank, with HTA's defaults and with both switches set.
2. ``test_tracekit_is_hta_definition_without_rounding_or_launch_filter``: with
   (a) and (b) off, the same recomputation equals tracekit to 1e-6 on every
   rank. So on these traces the remaining differences of definition (HTA counts
   any event with a ``stream`` arg as GPU work, e.g. the one ``cpu_op`` in
   tracelens_b200 that carries one; tracekit counts kernels only, and decides
   comm by metadata or a ``nccl`` substring) change nothing, and (a) and (b)
   are the whole story. HTA 0.5.0 does not count sync events as compute (names
   containing "Sync" are excluded), and none of these traces has any.
3. ``test_tracekit_agrees_with_hta_where_definitions_match``: where (a) and (b)
   are inactive on a trace (integer timestamps, or rounding switched off; at
   most one ProfilerStep, or no GPU event dropped by the filter), tracekit and
   HTA's own output agree to 0.5 percentage points.
4. ``test_documented_differences``: where they are active and matter, the
   difference is asserted as it is:
     - hta_nccl_parser_a100_r0of2 (float timestamps, 3 steps): HTA's default
       is 14.31 % against tracekit's 15.61 %: rounding costs 0.47 points and
       dropping the last step 0.83; with both switches HTA gives 15.61 %.
     - hta_pyper_a100_r0of16 (integer timestamps, 5 steps): 872 GPU events
       (memsets, memcpys and kernels) have no launch in the trace, so HTA's
       filter drops them even with include_last_profiler_step; HTA gives 1.37 %
       (default) and 1.47 % (last step included) against tracekit's 1.359 %.
       The default lands within 0.5 points of tracekit only because the two
       effects partly cancel.
   On hta_ddp_v100_r1of2 (5 steps) and hta_ws1_record_param_comms_v100
   (float timestamps, 5 steps, no NCCL kernels) the steps are active but
   cannot change the answer (0 stays 0, no comm stays null).
"""

from __future__ import annotations

from tracekit import analyses
import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, shared_trace
from tracekit.ingest import expand_paths, ingest_paths
from tracekit.store import Store

HTA_PY = REPO / ".venv-hta" / "bin" / "python"
HELPER = REPO / "benchmarks" / "hta_overlap.py"

TRACE_SETS = [
    "param_dlrm_8rank_v100",
    "hta_nccl_parser_a100_r0of2",
    "tracelens_b200_r0of8",
    "hta_pyper_a100_r0of16",
    "hta_ddp_v100_r1of2",
    "hta_ws1_record_param_comms_v100",
]
PP = 0.005  # 0.5 percentage points, as a ratio
HTA_ROUNDING = 0.5e-4 + 1e-9  # HTA reports the percentage with two decimals

DEFAULT = dict(rounding=True, last_step=False)  # HTA's defaults
SWITCHED = dict(rounding=False, last_step=True)  # --no-ns-rounding --include-last-step


# -- an independent computation of HTA's definition -----------------------------


def _load(path: Path) -> dict:
    op = gzip.open if path.name.endswith(".gz") else open
    with op(path, "rt") as fh:
        return json.load(fh)


def _union(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _covered(a, b) -> float:
    """|a ∩ b| for two sorted lists of disjoint intervals."""
    i = j = 0
    tot = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            tot += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tot


def _is_hta_comm(name: str) -> bool:
    return name.startswith("nccl") and "Kernel" in name[4:]


def _is_hta_compute(name: str) -> bool:
    if _is_hta_comm(name) or "Memcpy" in name or name.startswith(("Memset", "dma")) or "Sync" in name:
        return False
    return True


def _rows(events: list[dict], rounding: bool):
    """(start, end, stream, correlation, name) of the complete events HTA keeps, in µs."""
    xs = [e for e in events if e.get("ph") == "X" and e.get("dur") is not None and e.get("cat") not in (None, "Trace")]
    floats = any(isinstance(e.get("ts"), float) for e in xs)
    rows = []
    for e in xs:
        a = e.get("args") if isinstance(e.get("args"), dict) else {}
        s, end = e["ts"], e["ts"] + e["dur"]
        if rounding and floats:
            s, end = math.ceil(s), math.floor(end)
        try:
            stream = int(a.get("stream", -1))
        except (TypeError, ValueError):
            stream = -1
        corr = a.get("correlation", -1)
        rows.append((s, end, stream, corr if isinstance(corr, int) else -1, str(e.get("name"))))
    return rows, floats


def hta_definition(events: list[dict], *, rounding: bool, last_step: bool | None, n_step_names: int) -> dict:
    """HTA's overlap ratio recomputed from raw events; ``last_step=None`` turns the launch filter off.

    Returns ratio (None without comm), and how many GPU events the launch filter dropped.
    """
    rows, floats = _rows(events, rounding)
    on_gpu = [r for r in rows if r[2] >= 0 and r[3] >= 0]
    dropped = 0
    if last_step is not None and n_step_names > 1:
        steps = [r for r in rows if not (r[2] >= 0 and r[3] >= 0) and r[4].startswith("ProfilerStep")]
        last_start = max(r[0] for r in steps)
        last_end = max(r[1] for r in steps)
        keep_cpu = (lambda r: r[0] <= last_end) if last_step else (lambda r: r[0] < last_start)
        launched = {r[3] for r in rows if not (r[2] >= 0 and r[3] >= 0) and keep_cpu(r)}
        gpu = [r for r in on_gpu if r[3] in launched]
        dropped = len(on_gpu) - len(gpu)
    else:
        gpu = [r for r in rows if r[2] != -1]
    comm = _union([(r[0], r[1]) for r in gpu if _is_hta_comm(r[4])])
    comp = _union([(r[0], r[1]) for r in gpu if _is_hta_compute(r[4])])
    c = sum(e - s for s, e in comm)
    return dict(ratio=_covered(comm, comp) / c if c else None, dropped=dropped, floats=floats)


# -- running both tools --------------------------------------------------------


def _hta_cmd(trace_dir: Path, switched: bool) -> list[str]:
    flags = ["--no-ns-rounding", "--include-last-step"] if switched else []
    return [str(HTA_PY), str(HELPER), str(trace_dir), *flags]


def _finish(proc: subprocess.Popen, what: str) -> dict[int, float | None]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"HTA failed on {what}:\n{err[-3000:]}"
    return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}


@pytest.fixture(scope="module")
def hta_python():
    if not HTA_PY.exists():
        pytest.skip(f"HTA environment {HTA_PY.parent.parent} is absent (make it with: bash benchmarks/setup_hta.sh)")
    probe = subprocess.run([str(HTA_PY), "-c", "import hta.trace_analysis"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"HTA environment {HTA_PY.parent.parent} is incomplete (re-run bash benchmarks/setup_hta.sh)")
    return HTA_PY


@pytest.fixture(scope="module", params=TRACE_SETS)
def case(request, hta_python, tmp_path_factory):
    name = request.param
    src = shared_trace(name)
    files = expand_paths([src])
    links = tmp_path_factory.mktemp(f"hta-{name}")
    for f in files:
        (links / f.name).symlink_to(f)  # HTA wants a directory of rank files; never copy the shared traces
    # both HTA runs go in the background while tracekit and the recomputation run here
    procs = {
        sw: subprocess.Popen(_hta_cmd(links, sw), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for sw in (False, True)
    }
    try:
        store = Store(tmp_path_factory.mktemp(f"store-{name}"))
        rid = ingest_paths([src], store)
        con = analyses.connect(store)
        tk = dict(con.execute("SELECT rank, overlap_ratio FROM overlap_by_rank WHERE run_id = ?", [rid]).fetchall())
        con.close()
        docs = {}
        for f in files:
            doc = _load(f)
            di = doc.get("distributedInfo") or {}
            docs[int(di.get("rank", 0))] = doc["traceEvents"]
        step_names = {
            e.get("name") for evs in docs.values() for e in evs if str(e.get("name", "")).startswith("ProfilerStep")
        }
        n = len(step_names)
        indep = {
            rank: {
                "default": hta_definition(evs, n_step_names=n, **DEFAULT),
                "switched": hta_definition(evs, n_step_names=n, **SWITCHED),
                "rounded_last_step_kept": hta_definition(evs, rounding=True, last_step=True, n_step_names=n),
                "neither": hta_definition(evs, rounding=False, last_step=None, n_step_names=n),
            }
            for rank, evs in docs.items()
        }
        hta = {"default": _finish(procs[False], name), "switched": _finish(procs[True], name + " (switched)")}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    print(
        f"\n{name}: "
        + "; ".join(
            f"rank {r}: tracekit {_pct(tk[r])}, HTA {_pct(hta['default'][r])} "
            f"(switched {_pct(hta['switched'][r])}), filter dropped {indep[r]['default']['dropped']}"
            for r in sorted(tk)
        ),
        file=sys.stderr,
    )
    return dict(name=name, tk=tk, hta=hta, indep=indep, n_step_names=len(step_names))


def _pct(x):
    return "null" if x is None else f"{100 * x:.3f}%"


def _close(a, b, tol) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= tol


# -- the checks -----------------------------------------------------------------


def test_every_rank_is_seen_by_both(case):
    assert set(case["tk"]) == set(case["hta"]["default"]) == set(case["hta"]["switched"]) == set(case["indep"])


def test_independent_recompute_reproduces_hta(case):
    for rank, by in case["indep"].items():
        for cfg in ("default", "switched"):
            got, want = by[cfg]["ratio"], case["hta"][cfg][rank]
            assert _close(got, want, HTA_ROUNDING), f"{case['name']} rank {rank} {cfg}: recomputed {got}, HTA {want}"


def test_tracekit_is_hta_definition_without_rounding_or_launch_filter(case):
    for rank, by in case["indep"].items():
        assert _close(case["tk"][rank], by["neither"]["ratio"], 1e-6), (
            f"{case['name']} rank {rank}: tracekit {case['tk'][rank]}, HTA definition without (a), (b): "
            f"{by['neither']['ratio']}"
        )


def test_tracekit_agrees_with_hta_where_definitions_match(case):
    """(a) off when timestamps are integers or rounding is switched off; (b) off when it drops nothing."""
    compared = 0
    for rank, by in case["indep"].items():
        filter_inactive = case["n_step_names"] <= 1
        if filter_inactive or by["switched"]["dropped"] == 0:
            # with both switches, rounding is off and the filter drops nothing: the definitions match
            assert _close(case["tk"][rank], case["hta"]["switched"][rank], PP), (case["name"], rank)
            compared += 1
        if filter_inactive and not by["default"]["floats"]:
            # HTA's defaults are already our definition here
            assert _close(case["tk"][rank], case["hta"]["default"][rank], PP), (case["name"], rank)
            compared += 1
    if case["name"] == "hta_pyper_a100_r0of16":
        assert compared == 0  # see test_documented_differences
    else:
        assert compared > 0


def test_documented_differences(case):
    name, tk, hta, indep = case["name"], case["tk"], case["hta"], case["indep"]
    if name == "hta_nccl_parser_a100_r0of2":
        by = indep[0]
        assert by["default"]["floats"] and case["n_step_names"] == 3
        assert abs(tk[0] - hta["default"][0]) > PP  # a real difference with HTA's defaults ...
        assert _close(tk[0], hta["switched"][0], PP)  # ... that HTA's two switches remove
        rounding = by["switched"]["ratio"] - by["rounded_last_step_kept"]["ratio"]
        last_step = by["rounded_last_step_kept"]["ratio"] - by["default"]["ratio"]
        assert rounding == pytest.approx(0.0047, abs=0.0002)
        assert last_step == pytest.approx(0.0083, abs=0.0002)
        assert tk[0] - hta["default"][0] == pytest.approx(rounding + last_step, abs=HTA_ROUNDING + 1e-6)
    elif name == "hta_pyper_a100_r0of16":
        by = indep[0]
        assert not by["default"]["floats"]  # no rounding involved
        assert by["switched"]["dropped"] == 872  # GPU events whose launch is not in the trace
        assert abs(tk[0] - hta["switched"][0]) > 0.001  # HTA still differs with the last step included ...
        # ... by exactly what the dropped events change (HTA's two decimals aside)
        assert tk[0] - hta["switched"][0] == pytest.approx(
            by["neither"]["ratio"] - by["switched"]["ratio"], abs=HTA_ROUNDING + 1e-6
        )
    elif name == "hta_ddp_v100_r1of2":
        assert case["n_step_names"] == 5 and tk[1] == hta["default"][1] == hta["switched"][1] == 0.0
    elif name == "hta_ws1_record_param_comms_v100":
        assert indep[0]["default"]["floats"] and case["n_step_names"] == 5
        assert tk[0] is None and hta["default"][0] is None and hta["switched"][0] is None
    elif name == "tracelens_b200_r0of8":
        assert indep[0]["default"]["floats"] and case["n_step_names"] == 0
        assert tk[0] == hta["default"][0] == hta["switched"][0] == 0.0
    else:
        assert name == "param_dlrm_8rank_v100" and case["n_step_names"] == 1
        assert not any(by["default"]["floats"] for by in indep.values())
