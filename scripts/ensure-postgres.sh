#!/usr/bin/env bash
# Installs the PostgreSQL server binaries from the distribution's packages when
# none are on this machine. The relay's harness (internal/pgcluster) then starts
# throwaway clusters from them; no service is configured here.
set -euo pipefail
have_pg() {
  local d
  if command -v pg_config >/dev/null 2>&1; then
    d=$(pg_config --bindir 2>/dev/null || true)
    [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && return 0
  fi
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && return 0
  done
  return 1
}
if [ -n "${RELAY_TEST_DATABASE_URL:-}" ] || have_pg; then
  exit 0
fi
echo "PostgreSQL server binaries not found: installing the distribution's postgresql package" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq postgresql >/dev/null
have_pg || { echo "postgresql installed but initdb/postgres still not found" >&2; exit 1; }
