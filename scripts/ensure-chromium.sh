#!/usr/bin/env bash
# Make sure headless Chromium is installed: tests/test_report.py renders report.md with it.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "Chromium is not installed and this is not root: install the 'chromium' package" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
