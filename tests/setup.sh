#!/usr/bin/env bash
# Test set-up beyond `pip install -e '.[test]'`: HTA in its own venv (for the HTA cross-check)
# and Debian's chromium (for the HTML report test). Idempotent; each part is skipped quietly
# when already there. Tests that need a part skip with a reason when it is missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/../benchmarks/setup_hta.sh"
bash "$here/setup_chromium.sh"
