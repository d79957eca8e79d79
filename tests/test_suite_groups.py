"""The suite's own grouping (tests/conftest.py): a run whose test groups pytest-xdist lost is stopped."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import pytest_xdist_node_collection_finished


def _node(dist: str):
    return SimpleNamespace(config=SimpleNamespace(getoption=lambda name, default=None: dist if name == "dist" else default))


def test_ids_without_their_group_stop_the_run():
    ids = ["tests/a.py::test_x@tests/a.py", "tests/b.py::test_y[1]", "tests/c.py::test_z[a@b]"]
    with pytest.raises(pytest.exit.Exception, match=r"lost the test groups of 2 tests \(e\.g\. tests/b\.py::test_y\[1\];"):
        pytest_xdist_node_collection_finished(_node("loadgroup"), ids)


def test_grouped_ids_and_other_schedules_pass():
    grouped = ["tests/a.py::test_x@tests/a.py", "tests/c.py::test_z[a@b]@jobs"]
    assert pytest_xdist_node_collection_finished(_node("loadgroup"), grouped) is None
    assert pytest_xdist_node_collection_finished(_node("load"), ["tests/b.py::test_y[1]"]) is None
