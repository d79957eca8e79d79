#!/usr/bin/env bash
# Create (or check) the virtual environment that runs HTA (HolisticTraceAnalysis 0.5.0)
# for the HTA cross-check test and the benchmark: <repo>/.venv-hta (override with HTA_VENV).
#
# HTA lives in its own environment so that it never changes the versions of pandas,
# numpy, pyarrow or duckdb that tracekit runs with. Idempotent: a second run only
# checks the pins and exits. Needs python3 (3.10+) and PyPI; about 290 MB on disk.
#
# HTA 0.5.0 declares jupyterlab, pytest and pydot as requirements, but importing
# TraceAnalysis and running get_comm_comp_overlap needs none of them, so HTA is
# installed with --no-deps and only the packages it imports are added (this saves
# ~215 MB; `pip check` will name the three missing ones, which is expected).
# The versions below are the ones tested: HTA 0.5.0 gives the same overlap numbers
# with them as an independent computation of its definition (tests/analyses/test_hta_crosscheck.py).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${HTA_VENV:-$(cd "$here/.." && pwd)/.venv-hta}"
py="${PYTHON:-python3}"

pins=(
    "pandas==3.1.1"
    "numpy==2.4.6"
    "python-dateutil==4.0.0"
    "tzdata==2026.6"
    "plotly==7.1.0"
    "narwhals==2.29.0"
    "packaging==26.4"
    "networkx==3.6.1"
    "psutil==7.2.2"
    "PyYAML==6.0.4"
)
hta_pin="HolisticTraceAnalysis==0.5.0"

check() {
    "$venv/bin/python" - "$hta_pin" "${pins[@]}" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    if version(name) != want:
        sys.exit(1)
from hta.trace_analysis import TraceAnalysis  # noqa: F401  (the import the helper needs)
EOF
}

if [ -x "$venv/bin/python" ] && check; then
    echo "HTA environment ready: $venv"
    exit 0
fi

echo "creating the HTA environment in $venv ..."
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$hta_pin"
if ! check; then
    echo "setup_hta.sh: the environment in $venv does not import HTA with the pinned versions" >&2
    exit 1
fi
echo "HTA environment ready: $venv"
