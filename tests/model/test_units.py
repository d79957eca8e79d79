"""Unit parsing and formatting of the α–β model (reference: decimal KB/MB/GB, per-direction bandwidth)."""

import pytest

from tracekit.errors import BadInputError
from tracekit.model import format_bandwidth, format_bytes, format_time, parse_bandwidth, parse_bytes, parse_time


@pytest.mark.parametrize(
    "text, expected",
    [
        ("100MB", 1e8),  # 100 × 1e6
        ("256KB", 256e3),  # 256 × 1e3 (decimal, as nccl-tests)
        ("1GiB", 2**30),  # binary only when written as such
        ("1GB", 1e9),
        ("1.342GB", 1.342e9),
        ("4 MiB", 4 * 2**20),
        ("1KiB", 1024),
        ("2TB", 2e12),
        ("720kB", 720e3),  # the prefix's case does not matter, the B does
        ("4096", 4096),
        ("1e9", 1e9),
        ("0", 0),
        ("12 bytes", 12),
        ("  8B ", 8),
        (1e8, 1e8),
        (7, 7),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("bad", ["1M", "1G", "100Mb", "-1", "-1MB", "abc", "1 KBB", "", "MB", "1e999", "1.2.3MB", True])
def test_parse_bytes_rejects(bad):
    with pytest.raises(BadInputError) as err:
        parse_bytes(bad)
    message = str(err.value)
    assert "\n" not in message
    assert "size" in message or "bytes" in message


def test_parse_bytes_bare_prefix_says_which():
    with pytest.raises(BadInputError, match="KiB"):
        parse_bytes("1K")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("400Gb/s", 5e10),  # 400e9 bits / 8
        ("400Gbps", 5e10),
        ("400 Gbit/s", 5e10),
        ("900GB/s bidirectional", 4.5e11),  # explicit marker halves the two-way sum
        ("900 GB/s (bidirectional)", 4.5e11),
        ("900GB/s bidir", 4.5e11),
        ("360GB/s", 3.6e11),
        ("450 GB/s per direction", 4.5e11),
        ("25GiB/s", 25 * 2**30),
        ("3.125GB/s", 3.125e9),
        ("25Gb/s", 3.125e9),  # 25 GbE = 3.125 GB/s, the eth25 nominal
        ("1e9", 1e9),
        (3.6e11, 3.6e11),
    ],
)
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("bad", ["360GB", "0GB/s", "-5GB/s", "fast", "GB/s", "bidirectional", "10 parsecs/s", 0])
def test_parse_bandwidth_rejects(bad):
    with pytest.raises(BadInputError) as err:
        parse_bandwidth(bad)
    assert "\n" not in str(err.value)
    assert "bandwidth" in str(err.value)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2us", 2e-6),
        ("2µs", 2e-6),  # micro sign
        ("2μs", 2e-6),  # Greek mu
        ("1ms", 1e-3),
        ("0.1ms", 1e-4),
        ("10ns", 1e-8),
        ("1s", 1.0),
        ("1.5 s", 1.5),
        ("3", 3.0),
        ("0", 0.0),
        (2e-6, 2e-6),
    ],
)
def test_parse_time(text, expected):
    assert parse_time(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("bad", ["2m", "-1ms", "two us", "", "1 hour", "nan"])
def test_parse_time_rejects(bad):
    with pytest.raises(BadInputError) as err:
        parse_time(bad)
    assert "\n" not in str(err.value)
    assert "time" in str(err.value)


def test_formatting():
    assert format_bytes(1e8) == "100 MB"
    assert format_bytes(720e3) == "720 KB"
    assert format_bytes(12) == "12 B"
    assert format_time(12e-6) == "12 µs"
    assert format_time(1.2e-3) == "1.2 ms"
    assert format_time(2.5) == "2.5 s"
    assert format_time(5e-9) == "5 ns"
    assert format_time(0) == "0 s"
    assert format_bandwidth(3.6e11) == "360 GB/s"
