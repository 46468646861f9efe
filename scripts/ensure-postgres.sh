#!/usr/bin/env bash
# Make sure a PostgreSQL server (initdb, pg_ctl) is installed for the multi-worker tests.
# The tests start and stop their own throw-away cluster; this only installs the binaries.
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
  exit 0
fi
source "$(dirname "$0")/apt-install.sh"
apt_install PostgreSQL postgresql
# Debian's package starts a cluster of its own; the tests do not use it.
(service postgresql stop || pg_ctlcluster --force "$(ls /etc/postgresql | head -1)" main stop) >/dev/null 2>&1 || true
