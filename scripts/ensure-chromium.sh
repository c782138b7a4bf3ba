#!/usr/bin/env bash
# Installs Debian's chromium for the monitor's browser test when it is missing.
# A machine where it cannot be installed still runs every other test: the
# browser test then skips with a message that says why.
set -uo pipefail
for b in /usr/bin/chromium /usr/bin/chromium-browser; do
  [ -x "$b" ] && exit 0
done
echo "chromium not found: installing the distribution's chromium package for the browser test" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null; }; then
  echo "warning: could not install chromium; the browser test will be skipped" >&2
fi
exit 0
