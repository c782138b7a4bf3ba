#!/usr/bin/env bash
# Installs RabbitMQ and Redis from the distribution's packages when they are
# missing, for the sink tests (test/rabbittest, test/redistest start them as
# child processes in temporary folders). No service is configured or started
# here; quiet when both are present.
set -euo pipefail
have_rabbitmq() {
  { [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || command -v rabbitmq-server >/dev/null 2>&1; } &&
    command -v epmd >/dev/null 2>&1
}
have_redis() { command -v redis-server >/dev/null 2>&1; }
missing=()
have_rabbitmq || missing+=(rabbitmq-server)
have_redis || missing+=(redis-server)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "not found: ${missing[*]}: installing the distribution's packages" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# The packages start their services where an init system runs; the tests
# start their own brokers on free ports and need none of them.
$SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
have_rabbitmq || { echo "rabbitmq-server installed but its start script or epmd is still not found" >&2; exit 1; }
have_redis || { echo "redis-server installed but still not found" >&2; exit 1; }
