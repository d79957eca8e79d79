"""A figure whose big arrays are spliced into the page row by row (tracekit.report.html.spliced_figure,
_figure_html) is written exactly as plotly writes the same figure with the arrays in its dict, with
either of plotly's JSON engines."""

from __future__ import annotations

import copy
import json

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from tracekit.report.html import _SPLICE, _figure_html, figure_dict, spliced_figure


def _figure():
    fig = go.Figure(go.Heatmap(z=[[0.0]], x=[0, 1, 2], y=["rank 0", "rank 1"], customdata=[[["a", "b"]]],
                               hovertemplate="%{customdata[0]}<extra></extra>"))
    fig.update_layout(title="waits </script> µs")
    return fig


ROW = [["pg:0", "1.5 MB </b>"], ["pg:1", "é ≤ 2"], ["NaN", "Infinity"]]  # strings that look like constants
Z = [[1.5, None, 2.0e-7], [float("nan"), 3.0, 1234567.0]]
CUSTOM = [ROW, ROW]  # one row object for every rank, as the wait heatmap passes it


@pytest.mark.parametrize("engine", ["json", "orjson"])
def test_spliced_page_is_plotlys(engine, monkeypatch):
    if engine == "orjson":
        pytest.importorskip("orjson")
    monkeypatch.setattr(pio.json.config, "default_engine", engine)
    whole = _figure_html(figure_dict(_figure(), {0: dict(z=copy.deepcopy(Z), customdata=copy.deepcopy(CUSTOM))}), "w")
    spliced = _figure_html(spliced_figure(figure_dict(_figure(), {0: dict(z=_SPLICE.format(0), customdata=_SPLICE.format(1))}),
                                          {_SPLICE.format(0): Z, _SPLICE.format(1): CUSTOM}), "w")
    assert spliced == whole
    assert "\\u003c\\u002fb\\u003e" in spliced and "null" in spliced  # escaped as plotly does; NaN → null


def test_placeholder_must_occur_once():
    fig = spliced_figure(figure_dict(_figure(), {0: dict(z=_SPLICE.format(0))}), {_SPLICE.format(1): [[1.0]]})
    with pytest.raises(AssertionError):
        _figure_html(fig, "w")


def test_the_page_template_is_plotly_white_in_plotlys_key_order():
    """A figure laid out by _layout (template "none") is written with plotly_white, the very dict (and
    key order) plotly writes for a figure given template="plotly_white"; another template is kept."""
    from tracekit.report.html import _layout, _white_template

    fig = go.Figure(go.Bar(x=[1, 2], y=[3, 4]))
    _layout(fig, "title", 400)
    want = go.Figure(go.Bar(x=[1, 2], y=[3, 4]))
    want.update_layout(title=dict(text="title", x=0.01, xanchor="left", font=dict(size=18)), template="plotly_white")
    got = _white_template(fig.to_dict())["layout"]["template"]
    assert json.dumps(got) == json.dumps(want.to_dict()["layout"]["template"])  # the same keys in the same order
    other = go.Figure(layout=dict(template="ggplot2")).to_dict()
    assert _white_template(copy.deepcopy(other)) == other
    assert got["layout"]["paper_bgcolor"] == "white" and got["layout"]["plot_bgcolor"] == "white"
