#!/usr/bin/env bash
# Sourced by the ensure-*.sh scripts: apt_install NAME PACKAGE installs PACKAGE (apt, as root),
# or says what to install and exits when this is not root.
apt_install() {
  if [ "$(id -u)" != "0" ]; then
    echo "$1 is not installed and this is not root: install the '$2' package" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$2" >/dev/null
}
