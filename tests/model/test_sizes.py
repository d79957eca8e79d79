"""One size reading for every command-line option (tracekit.model.units.parse_size), by table."""

from __future__ import annotations

import pytest

from tracekit.cli import main
from tracekit.errors import BadInputError
from tracekit.model.units import parse_size

TABLE = [
    # written, bytes: decimal with B (alpha-beta.md "Units"), binary with i or the bare letter (nccl-tests -b/-e)
    ("4096", 4096),
    ("4096B", 4096),
    ("1e9", 1_000_000_000),
    ("1KB", 1_000),
    ("1kB", 1_000),
    ("16MB", 16_000_000),
    ("1GB", 1_000_000_000),
    ("1.5GB", 1_500_000_000),
    ("1KiB", 1_024),
    ("16MiB", 16_777_216),
    ("1GiB", 1_073_741_824),
    ("1K", 1_024),
    ("16M", 16_777_216),
    ("1G", 1_073_741_824),
    ("1g", 1_073_741_824),
    (" 2 M ", 2_097_152),
    (4096, 4096),
]


@pytest.mark.parametrize("text, expected", TABLE)
def test_parse_size_table(text, expected):
    got = parse_size(text)
    assert got == expected and type(got) is int


@pytest.mark.parametrize("bad", ["", "G", "1Gb", "1 gigabyte", "-1K", "1.5B", "nan", "1KiBB", True])
def test_parse_size_rejects(bad):
    with pytest.raises(BadInputError):
        parse_size(bad)


def test_fraction_allowed_only_when_asked():
    assert parse_size("1.5B", whole=False) == 1.5


def test_sweep_uses_the_same_reading():
    from tracekit.collectors.workloads.sweep import parse_size as sweep_size

    for text, expected in TABLE:
        assert sweep_size(text) == expected


def test_predict_accepts_1G_as_the_sweep_does(capsys):
    # 1G = 2**30 B; all_reduce ring on 2 ranks: 2(n−1)/n · S = 2**30 B sent per rank
    assert main(["predict", "all_reduce", "--bytes", "1G", "--ranks", "2", "--link", "nvlink4", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["size_bytes"] == 2**30
