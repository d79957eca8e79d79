"""The model functions added for the measured-vs-model analysis, on hand-worked values."""

from __future__ import annotations

import pytest

from tracekit.errors import BadInputError
from tracekit.model import layered_exposed_time, pipeline_bubble_fraction


def test_layered_exposed_time():
    # compute longer than transfer: only the last layer's transfer is exposed
    assert layered_exposed_time(1e-3, 2e-3, 80) == pytest.approx(1e-3)
    # transfer 3 ms, compute 1 ms, 4 layers: 3 + 3·(3 − 1) = 9 ms
    assert layered_exposed_time(3e-3, 1e-3, 4) == pytest.approx(9e-3)
    with pytest.raises(BadInputError):
        layered_exposed_time(1e-3, 1e-3, 0)


def test_pipeline_bubble_fraction():
    assert pipeline_bubble_fraction(2, 4) == pytest.approx(1 / 5)  # (2−1)/(4+2−1)
    assert pipeline_bubble_fraction(8, 8) == pytest.approx(7 / 15)
    assert pipeline_bubble_fraction(1, 3) == 0.0
    with pytest.raises(BadInputError):
        pipeline_bubble_fraction(4, 0)
