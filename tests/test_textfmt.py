"""The number helpers shared by the terminal report, the HTML report and the diff (values by hand)."""

from __future__ import annotations

from tracekit.textfmt import fmt_bytes, fmt_ms, fmt_num, fmt_pct, fmt_pp, fmt_us


def test_every_helper_writes_a_dash_for_none():
    assert {f(None) for f in (fmt_bytes, fmt_us, fmt_ms, fmt_pct, fmt_pp, fmt_num)} == {"—"}


def test_units_and_signs():
    assert fmt_bytes(131072) == "131.1 kB" and fmt_bytes(512) == "512 B" and fmt_bytes(2.5e12) == "2.5 TB"
    assert fmt_bytes(1_048_576) == "1.049 MB"
    assert fmt_us(12_345) == "12.3" and fmt_us(1_234_567_890) == "1,234,567.9"
    assert fmt_ms(1_234_567) == "1.235" and fmt_ms(-1_234_567, signed=True) == "-1.235"
    assert fmt_ms(5e5, signed=True) == "+0.500"
    assert fmt_pct(0.1234) == "12.3%" and fmt_pct(0.05, signed=True) == "+5.0%" and fmt_pp(-0.05) == "-5.0 pp"
    assert fmt_num(1234567) == "1,234,567" and fmt_num(2.0) == "2.00" and fmt_num(3.14159, 3) == "3.142"
