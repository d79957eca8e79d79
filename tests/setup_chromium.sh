#!/usr/bin/env bash
# Install Debian's chromium for tests/report/test_html_report.py (headless browser check of the HTML report).
# Idempotent and quiet: does nothing when a chromium binary is already on PATH. Needs root (apt-get);
# when it cannot install, it says so and exits 0: the browser test then skips with the reason.
set -u
for b in chromium chromium-browser; do
    if command -v "$b" >/dev/null 2>&1; then
        exit 0
    fi
done
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup_chromium.sh: chromium missing and apt-get unavailable (not root?); the browser test will skip" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core fonts-liberation >/dev/null; }; then
    echo "setup_chromium.sh: apt-get install chromium failed; the browser test will skip" >&2
fi
exit 0
