#!/usr/bin/env bash
# Test set-up beyond `pip install -e '.[test]'`: HTA in its own venv (for the HTA cross-check)
# and Debian's chromium (for the HTML report test). Idempotent; each part is skipped quietly
# when already there. A part that cannot be installed (no registry, no root) is reported and
# left out: the tests that need it then skip with the reason.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/../benchmarks/setup_hta.sh" || echo "tests/setup.sh: HTA set-up failed; the HTA cross-check will skip" >&2
bash "$here/setup_chromium.sh" || echo "tests/setup.sh: chromium set-up failed; the browser test will skip" >&2
exit 0
