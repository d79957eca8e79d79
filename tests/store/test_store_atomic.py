"""Replacing a run is one step for readers, and a writer killed at any step leaves a store the next
writer puts right (issue 17, item 4).

The crash is real: a forked child runs the ingest with every file-system step of the store writer
(tracekit.store.fs) wrapped, and ends itself with os._exit before step k (no cleanup, no
``finally``), for k = 1, 2, ... until a run gets through. After each, the store must read as the old
run or the new one, complete; after the next writer's start, nothing may be left over.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import tracekit.store as store_mod
from tests.conftest import FIXTURES
from tracekit.ingest import ingest_paths
from tracekit.store import OWNER_FILE, Store

OLD = FIXTURES / "handmade" / "two_rank"
NEW = FIXTURES / "defects" / "ts_zero.json"
CRASHED, DONE, FAILED = 71, 72, 73


def _content(store: Store, rid: str = "r") -> dict[str, bytes] | None:
    """The files of the run as readers see it (through its link), or None when it is missing."""
    if rid not in store.run_ids():
        return None
    d = store.run_dir(rid)
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and p.name != OWNER_FILE}


def _run_in_child(k: int, fn) -> int:
    """Run fn() in a forked child that dies (os._exit) just before its k-th store file-system step."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = FAILED
        try:
            calls = [0]
            for name in ("mkdir", "write_text", "rename", "symlink", "unlink", "exchange", "rmtree"):
                orig = getattr(store_mod.fs, name)

                def wrapped(*a, _orig=orig, **kw):
                    calls[0] += 1
                    if calls[0] == k:
                        os._exit(CRASHED)
                    return _orig(*a, **kw)

                setattr(store_mod.fs, name, wrapped)
            fn()
            code = DONE
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _leftovers(store: Store) -> list[str]:
    """What should not be there once a writer has started: staging, links, stray versions."""
    out = []
    if (store.path / ".staging").exists():
        out += [f".staging/{p.name}" for p in (store.path / ".staging").iterdir()]
    runs, versions = store.runs_dir, store.versions_dir
    current = set()
    if runs.is_dir():
        for p in runs.iterdir():
            if p.is_symlink():
                current.add(os.path.basename(os.readlink(p)))
            else:
                assert store_mod.RUN_ID_RE.match(p.name), p  # a plain run directory of an older store
            if (p / OWNER_FILE).exists():
                out.append(f"runs/{p.name}/{OWNER_FILE}")
    if versions.is_dir():
        out += [f"versions/{p.name}" for p in versions.iterdir() if p.name not in current]
    return out


def _next_writer(store: Store) -> None:
    with store.staging():
        pass


def _crash_everywhere(base: Path, tmp_path, fn, expect_old, expect_new, *, patch=None, gaps=None) -> int:
    """Crash the writer before each of its steps in turn; returns how many steps it has.

    ``gaps``: a list that collects the steps after which the run was missing until the next writer
    (only the fallback replace without renameat2 has one); None: there may be none."""
    steps = 0
    for k in range(1, 200):
        work = tmp_path / f"k{k}"
        if base.exists():
            shutil.copytree(base, work, symlinks=True)
        st = Store(work)
        code = _run_in_child(k, lambda: (patch() if patch else None, fn(st)))
        assert code in (CRASHED, DONE), code
        seen = _content(st)
        if seen is None and expect_old is not None and gaps is not None:
            gaps.append(k)
        else:
            assert seen in (expect_old, expect_new), f"step {k}: the run is neither the old nor the new one"
        _next_writer(st)
        assert _leftovers(st) == [], f"step {k}"
        assert _content(st) in (expect_old, expect_new), f"step {k}"
        shutil.rmtree(work, ignore_errors=True)
        if code == DONE:
            assert seen == expect_new
            return k - 1
        steps = k
    raise AssertionError(f"the writer never finished ({steps} steps)")


@pytest.fixture
def old_store(tmp_path):
    st = Store(tmp_path / "base")
    ingest_paths([str(OLD)], st, run_id="r")
    return st


def _new_content(tmp_path) -> dict[str, bytes]:
    st = Store(tmp_path / "fresh")
    ingest_paths([str(NEW)], st, run_id="r")
    return _content(st)


def test_crash_at_every_step_of_a_replace(tmp_path, old_store):
    old = _content(old_store)
    new_files = _new_content(tmp_path)
    # run.parquet holds created_at, so the new run is compared by its rows rather than bytes:
    # record what the finished replace gives, then require exactly that or the old run.
    done = tmp_path / "done"
    shutil.copytree(old_store.path, done, symlinks=True)
    ingest_paths([str(NEW)], Store(done), run_id="r", replace=True)
    new = _content(Store(done))
    assert new.keys() == new_files.keys() and new != old
    n = _crash_everywhere(old_store.path, tmp_path, _replace_with_fixed_clock(new), old, new)
    assert n >= 8  # staging mkdir/owner, version rename, link, rename, owner unlink, rmtree, ...


def _replace_with_fixed_clock(expected):
    """ingest --replace whose run.parquet is byte-identical to ``expected``'s (created_at fixed)."""
    run_bytes = expected["run.parquet"]

    def fn(st):
        orig_commit = store_mod.Staging.commit

        def commit(self, run_id, *, replace=False):
            (self.dir / "run.parquet").write_bytes(run_bytes)
            return orig_commit(self, run_id, replace=replace)

        store_mod.Staging.commit = commit
        ingest_paths([str(NEW)], st, run_id="r", replace=True)

    return fn


def test_crash_at_every_step_of_a_first_ingest(tmp_path):
    done = Store(tmp_path / "done")
    ingest_paths([str(NEW)], done, run_id="r")
    new = _content(done)

    def fn(st):
        orig_commit = store_mod.Staging.commit

        def commit(self, run_id, *, replace=False):
            (self.dir / "run.parquet").write_bytes(new["run.parquet"])
            return orig_commit(self, run_id, replace=replace)

        store_mod.Staging.commit = commit
        ingest_paths([str(NEW)], st, run_id="r")

    n = _crash_everywhere(tmp_path / "nothing", tmp_path, fn, None, new)
    assert n >= 5


def _to_plain_directory(st: Store, rid: str = "r") -> None:
    """Make the run look as stores written before versioned runs: runs/<id> a plain directory."""
    link = st.run_dir(rid)
    target = link.resolve()
    os.unlink(link)
    os.rename(target, link)


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "fallback"])
def test_crash_at_every_step_replacing_a_plain_directory_run(tmp_path, old_store, exchange):
    _to_plain_directory(old_store)
    assert not old_store.run_dir("r").is_symlink() and old_store.run_ids() == ["r"]
    old = _content(old_store)
    done = tmp_path / "done"
    shutil.copytree(old_store.path, done, symlinks=True)
    ingest_paths([str(NEW)], Store(done), run_id="r", replace=True)
    new = _content(Store(done))

    def no_exchange():
        def refuse(a, b):
            raise NotImplementedError("test")

        store_mod.fs.exchange = refuse

    gaps = []
    n = _crash_everywhere(old_store.path, tmp_path, _replace_with_fixed_clock(new), old, new,
                          patch=None if exchange else no_exchange, gaps=gaps)
    assert n >= 8
    # with renameat2 never missing; without it, only a crash between the two renames (one step)
    assert len(gaps) == (0 if exchange else 1), gaps


def test_readers_always_see_the_run_during_30_replaces(tmp_path, old_store):
    src = old_store.run_dir("r").resolve()
    files = {p.relative_to(src): p.read_bytes() for p in src.rglob("*") if p.is_file() and p.name != OWNER_FILE}
    stop = threading.Event()
    polled = threading.Event()  # set after each poll: the writer waits for one between replaces
    polls, missing, errors = [0], [0], []

    def reader():
        while not stop.is_set():
            st = Store(old_store.path)
            try:
                if "r" not in st.run_ids() or not st.has_run("r"):
                    missing[0] += 1
                pq.ParquetFile(st.run_dir("r") / "run.parquet").read()
                if polls[0] % 8 == 0:  # a whole connection now and then (slower)
                    con = st.connect(run_ids=["r"])
                    con.execute("SELECT count(*) FROM events").fetchone()
                    con.close()
            except Exception as exc:  # noqa: BLE001 - any failure to read counts
                errors.append(repr(exc))
            polls[0] += 1
            polled.set()

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(30):
            with old_store.staging() as stg:
                for rel, data in files.items():
                    (stg.dir / rel).parent.mkdir(parents=True, exist_ok=True)
                    (stg.dir / rel).write_bytes(data)
                polled.clear()
                stg.commit("r", replace=True)
            assert polled.wait(120), "the reader stopped polling"
    finally:
        stop.set()
        t.join()
    assert polls[0] >= 30
    assert missing[0] == 0 and errors == [], (missing[0], errors[:3])
    # a version a reader held when it was replaced stays for the next writer; then one is left
    _next_writer(old_store)
    assert [p.name for p in old_store.runs_dir.iterdir()] == ["r"]
    assert [p.name for p in old_store.versions_dir.iterdir()] == ["r@30"]


def test_replace_is_refused_without_flag_and_leaves_the_store(tmp_path, old_store):
    before = _content(old_store)
    from tracekit.errors import BadInputError

    with pytest.raises(BadInputError, match="already exists"):
        ingest_paths([str(NEW)], old_store, run_id="r")
    assert _content(old_store) == before and _leftovers(old_store) == []


def test_legacy_aside_directory_is_restored(tmp_path, old_store):
    """tracekit before versioned runs moved the old run to .staging/<hex>.old during a replace; a
    crash there lost the run. The next writer puts it back (or removes it when the run exists)."""
    before = _content(old_store)
    _to_plain_directory(old_store)
    aside = old_store.path / ".staging" / ("ab" * 16 + ".old")
    aside.parent.mkdir()
    os.rename(old_store.run_dir("r"), aside)
    assert old_store.run_ids() == []
    _next_writer(old_store)
    assert _content(old_store) == before and _leftovers(old_store) == []
    # the run is there again: a second aside copy of it is simply removed
    aside.parent.mkdir()
    shutil.copytree(old_store.run_dir("r"), aside)
    _next_writer(old_store)
    assert not aside.exists() and _content(old_store) == before


def test_unwritable_outputs_are_one_line_and_write_nothing(tmp_path, capsys):
    """export --perfetto, analyze --html to a directory, into a missing system folder or below a
    file: exit 2, one line naming the path (atomic_output), nothing left beside it."""
    from tracekit.cli import main

    st = tmp_path / "st"
    ingest_paths([FIXTURES / "tp_2rank"], Store(st), run_id="tp")
    afile = tmp_path / "afile"
    afile.write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    cases = [
        (["export", "--perfetto", str(tmp_path)], f"{tmp_path}: is a directory"),
        (["export", "--perfetto", str(afile / "x.json")], f"{afile / 'x.json'}: cannot create its folder"),
        (["export", "--perfetto", "/proc/tk-no-such.json"], "/proc/tk-no-such.json: cannot write there"),
        (["analyze", "--html", "/proc/tk-no-such.html"], "/proc/tk-no-such.html: cannot write there"),
    ]
    for args, msg in cases:
        capsys.readouterr()
        rc = main(args + ["--store", str(st)])
        err = capsys.readouterr().err
        assert rc == 2, (args, err)
        assert msg in err and "internal error" not in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
