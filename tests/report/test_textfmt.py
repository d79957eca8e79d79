"""The number helpers shared by the terminal report, the HTML report and the diff (values by hand)."""

from __future__ import annotations

from tracekit.report.textfmt import fmt_bytes, fmt_ms, fmt_num, fmt_pct, fmt_pp, fmt_us


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


def test_short_kernel_name_keeps_what_tells_kernels_apart():
    from tracekit.report.textfmt import short_kernel_name

    sqrt = ("void at::native::vectorized_elementwise_kernel<4, at::native::sqrt_kernel_cuda(at::TensorIteratorBase&)"
            "::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int)")
    assert short_kernel_name(sqrt) == ("vectorized_elementwise_kernel<4, sqrt_kernel_cuda(TensorIteratorBase&)::λ::λ, "
                                       "Array<char*, 2> >(int)")
    assert short_kernel_name(sqrt, 40) == "vectorized_elementwise_kernel<4, sqrt_k…"
    assert len(short_kernel_name(sqrt, 40)) == 40
    nccl = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
    assert short_kernel_name(nccl) == nccl and short_kernel_name(None) == "—"


def test_piped_output_honours_columns(monkeypatch):
    """Piped (pytest captures stdout: not a terminal), the console takes $COLUMNS when it is a
    positive number, else the command's own width."""
    from tracekit.report.textfmt import output_console

    monkeypatch.setenv("COLUMNS", "90")
    assert output_console(120).width == 90
    for bad in ("", "wide", "0"):
        monkeypatch.setenv("COLUMNS", bad)
        assert output_console(120).width == 120
    monkeypatch.delenv("COLUMNS")
    assert output_console(160).width == 160
