#!/usr/bin/env bash
# Make sure headless Chromium is installed: tests/test_report.py renders report.md with it.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
source "$(dirname "$0")/apt-install.sh"
apt_install Chromium chromium
