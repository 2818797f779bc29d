#!/usr/bin/env bash
# The episode player's tests open it in a real browser: Debian's chromium, installed with
# apt-get (nothing else is downloaded). scripts/setup.sh runs this for the test extras, so
# the README's test command and CI install the same things.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
# only what the browser needs to run headless: no recommends (they pull ~100 packages,
# systemd among them)
$SUDO apt-get install -y -q --no-install-recommends chromium \
  || { $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends chromium; } \
  || echo "chromium could not be installed: the browser tests will be skipped, with the reason"
