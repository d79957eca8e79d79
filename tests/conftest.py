"""Shared test helpers: where the repo's fixtures and the shared real traces live."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

# The reports size their tables to $COLUMNS when piped (tracekit.report.textfmt.output_console), and
# pytest-xdist's workers set COLUMNS=80: the tests assert the output of an unset $COLUMNS (a test
# about the width sets its own with monkeypatch).
for _name in ("COLUMNS", "LINES"):  # a plugin may have set them with putenv, which os.environ does not see
    os.environ.pop(_name, None)
    os.unsetenv(_name)
# A suite started in the background by a non-interactive shell has SIGINT ignored, and the processes
# the tests start inherit that: the Ctrl-C tests (a job, a Ray driver) need the terminal's default.
signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
SHARED = REPO.parent / "shared"
TRACES = SHARED / "traces"


CHROMIUM_PAGES_AT_ONCE = 4
"""How many headless Chromium processes a browser test runs at once (a page's drawing waits on
Chromium's virtual time as much as on the cores)."""


def shared_trace(rel: str) -> Path:
    """Path of a file or folder under ../shared/traces, or skip the test with the reason."""
    p = TRACES / rel
    if not p.exists():
        pytest.skip(f"../shared/traces/{rel} is not available (a fresh clone has no ../shared)")
    return p


def store_snapshot(path: Path) -> dict[str, bytes]:
    """Every file under a store directory with its bytes, to prove a failed ingest changed nothing."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


RAY_FILES = frozenset({"tests/ingest/test_ray_engine.py", "tests/ingest/test_ray_staged_tables.py",
                       "tests/ingest/test_bounded_procs.py"})
"""Test files that start or join Ray clusters (``--address auto`` finds the latest one started on
this machine) or count a command's processes: in the ``jobs`` group, one test at a time."""

NOT_JOBS_FILES = frozenset({"tests/cli/test_core_install.py"})
"""``slow`` test files that start no job (a pip install into a fresh venv): grouped by file like the
fast tests, so they run beside the ``jobs`` group."""


def _alone(item) -> bool:
    """Whether ``item`` runs alone (marked ``serial``: it asserts a wall-time bound or a timing result)."""
    return item.get_closest_marker("serial") is not None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Group and order the tests for pytest-xdist's workers (``--dist loadgroup``, pyproject's addopts;
    each group runs on one worker, the groups in this order):

    1. ``jobs``: the ``slow`` tests (real multi-process jobs) and :data:`RAY_FILES`, one at a time, so
       that two jobs never share the cores and two Ray clusters never meet; first, as the longest group;
    2. every other test grouped by its file, so a module-scoped store is built once;
    3. ``serial``: the tests marked ``serial``, last; each runs alone (:class:`_Alone`).

    In one process (``-n 0``, or ``-p no:xdist``) the tests keep their order. A worker's options say
    ``loadgroup`` (the controller's ``-n`` and ``--dist`` are not passed on to it)."""
    if not config.getoption("loadgroup", False):
        return
    jobs, rest, alone = [], [], []
    for item in items:
        path = item.nodeid.split("::")[0]
        if _alone(item):
            item.add_marker(pytest.mark.xdist_group("serial"))
            alone.append(item)
        elif (item.get_closest_marker("slow") and path not in NOT_JOBS_FILES) or path in RAY_FILES:
            item.add_marker(pytest.mark.xdist_group("jobs"))
            jobs.append(item)
        else:
            item.add_marker(pytest.mark.xdist_group(path))
            rest.append(item)
    items[:] = jobs + rest + alone


def pytest_xdist_node_collection_finished(node, ids):
    """Stop a run whose groups were lost: pytest-xdist's loadgroup passes each test's group to the
    scheduler as a suffix of its node id (``...::test@group``), and pytest 9.2 no longer keeps that
    suffix (pytest-dev/pytest-xdist#1386), so that every test would run as a group of its own, the
    multi-process jobs beside each other and each module's store built on both workers."""
    if node.config.getoption("dist", None) == "loadgroup":
        lost = [i for i in ids if "@" not in i.rsplit("]", 1)[-1]]
        if lost:
            pytest.exit(f"pytest-xdist lost the test groups of {len(lost)} tests (e.g. {lost[0]}; "
                        "pytest-dev/pytest-xdist#1386): install the versions pyproject.toml's test extra names",
                        returncode=4)


class _Alone:
    """A readers-writer lock shared by the workers of one run (two files locked with ``flock``): every test
    holds the room shared while it runs, a ``serial`` test holds it alone, so that no other test runs on
    any worker meanwhile. A test waiting to run alone first takes the gate, which keeps new tests out
    while the running ones finish (no waiting for a gap that may never come). Consecutive ``serial``
    tests keep the room; a worker that ends lets go of it with its process."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self._gate = open(folder / "alone.gate", "a")
        self._room = open(folder / "alone.room", "a")
        self.held: str | None = None  # "shared" or "alone"

    def enter(self, alone: bool) -> None:
        import fcntl

        want = "alone" if alone else "shared"
        if self.held == want == "alone":
            return
        self.leave()
        mode = fcntl.LOCK_EX if alone else fcntl.LOCK_SH
        fcntl.flock(self._gate, mode)
        try:
            fcntl.flock(self._room, mode)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self.held = want

    def leave(self) -> None:
        import fcntl

        if self.held is not None:
            fcntl.flock(self._room, fcntl.LOCK_UN)
            self.held = None


_ALONE = pytest.StashKey[_Alone]()


def pytest_configure(config):
    # a worker of a pytest-xdist run: its basetemp (pytest-N/popen-gwK) lies in the run's own folder
    if getattr(config, "workerinput", None) is not None and config.option.basetemp:
        config.stash[_ALONE] = _Alone(Path(config.option.basetemp).parent)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Every test inside :class:`_Alone` (pytest-xdist workers only): a ``serial`` one alone."""
    turn = item.config.stash.get(_ALONE, None)
    if turn is None:
        return (yield)
    alone = _alone(item)
    turn.enter(alone)
    try:
        return (yield)
    finally:
        if not (alone and nextitem is not None and _alone(nextitem)):
            turn.leave()


SESSION_INPUTS = {
    "tp": FIXTURES / "tp_2rank",
    "two": FIXTURES / "handmade" / "two_rank",
    "gb": FIXTURES / "handmade" / "gpu_breakdown",
    "dlrm": TRACES / "param_dlrm_8rank_v100",
}
"""The inputs that many test files read as a store of their own: name → path (ingested as run ``name``)."""


@pytest.fixture(scope="session")
def session_store(tmp_path_factory):
    """``session_store(name)`` → the :class:`~tracekit.store.Store` of :data:`SESSION_INPUTS`'s input
    ``name`` alone, ingested with the default options as run ``name``, once per session (per worker
    under pytest-xdist); a shared trace that is absent skips the test. For reading only: a test that
    ingests, replaces or damages a run makes a store of its own. When the session ends, every such
    store is checked byte for byte against what its ingest wrote."""
    from tracekit.ingest import ingest_paths
    from tracekit.store import Store

    built: dict[str, tuple] = {}

    def get(name: str):
        if name not in built:
            src = SESSION_INPUTS[name]
            if not src.exists():
                shared_trace(str(src.relative_to(TRACES)))  # skips, saying which
            st = Store(tmp_path_factory.mktemp(f"session-{name}"))
            assert ingest_paths([src], st, run_id=name) == name
            built[name] = (st, store_snapshot(st.path))
        return built[name][0]

    yield get
    changed = [name for name, (st, files) in built.items() if store_snapshot(st.path) != files]
    assert not changed, f"a test wrote into the session stores {changed}: they are read-only (make a store of your own)"


def view_rows(store, sql: str, run_ids, setup=None) -> list[dict]:
    """The rows of ``sql`` as dicts (column → value), on an analyses connection over ``run_ids``
    of ``store``; ``setup(con)`` runs first (e.g. reference options). The connection is closed."""
    from tracekit import analyses

    con = analyses.connect(store, run_ids=list(run_ids))
    try:
        if setup is not None:
            setup(con)
        cur = con.execute(sql)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]
    finally:
        con.close()


def write_two_windows(dst: Path) -> Path:
    """fixtures/handmade/two_rank with every event again 1 s later, one file per rank in ``dst``:
    two profiler windows in one file, the second one's seq restarting at 0. Returns ``dst``."""
    import copy
    import json

    dst.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        doc = json.loads((FIXTURES / "handmade" / "two_rank" / f"rank{r}.json").read_text())
        later = copy.deepcopy(doc["traceEvents"])
        for e in later:
            if "ts" in e:
                e["ts"] += 1_000_000.0
        doc["traceEvents"] += later
        (dst / f"rank{r}.json").write_text(json.dumps(doc))
    return dst


def two_node_ray_cluster(module_name: str):
    """A generator for a module-scoped fixture: a local Ray cluster of two nodes of one CPU each
    (100 MiB object stores) that this process joins; the test module ``module_name`` is pickled
    by value so that its functions run in the workers. Skips without Ray. Shuts both down after."""
    import importlib.util
    import sys

    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install 'tracekit[ray]')")
    import ray
    from ray.cluster_utils import Cluster

    mb = 100 * 2**20
    c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, object_store_memory=mb))
    try:
        c.add_node(num_cpus=1, object_store_memory=mb)
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False, logging_level="ERROR")
        ray.cloudpickle.register_pickle_by_value(sys.modules[module_name])
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
