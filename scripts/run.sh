#!/usr/bin/env bash
# `make run`: install what is missing and start the whole marketplace on the embedded defaults.
# Ctrl-C stops everything this script started.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh run || echo "!! set-up was incomplete; starting what can start"
. scripts/services.sh

export DEBUG=1
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6390/0}"
PORT="${PORT:-8000}"
mkdir -p var/log
py=.venv/bin/python
pids=()
cleanup() {
  echo; echo "==> stopping"
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  redis-cli -p 6390 shutdown nosave >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 0' INT TERM

start_redis 6390 var/redis || { echo "!! Redis is required: apt-get install redis-server"; exit 1; }
$py manage.py migrate --noinput -v0
$py manage.py collectstatic --noinput -v0

simulated=0
if [ "$(id -u)" = 0 ] && [ -x /usr/sbin/sshd ] && command -v dockerd >/dev/null && start_dockerd; then
  $py manage.py platform_key >/dev/null 2>&1 || true
  key_args=(); [ -f var/platform_ssh_key.pub ] && key_args=(--authorize var/platform_ssh_key.pub)
  $py manage.py simhosts --count 3 "${key_args[@]}" > var/log/simhosts.log 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -f var/simhosts/hosts.json ] && break; sleep 0.1; done
  simulated=1
else
  echo "!! simulated hosts need root, openssh-server and docker.io; starting without them"
fi
$py manage.py demo_data --simhosts "$([ $simulated = 1 ] && echo var/simhosts/hosts.json)"

.venv/bin/celery -A marketplace worker -l info --concurrency 2 > var/log/worker.log 2>&1 &
pids+=($!)
.venv/bin/celery -A marketplace beat -l info --schedule var/celerybeat-schedule > var/log/beat.log 2>&1 &
pids+=($!)
.venv/bin/uvicorn marketplace.asgi:application --host 127.0.0.1 --port "$PORT" > var/log/web.log 2>&1 &
pids+=($!)

for _ in $(seq 100); do curl -fs "http://127.0.0.1:$PORT/accounts/login/" >/dev/null 2>&1 && break; sleep 0.1; done
cat <<MSG

  GPU Marketplace is running:  http://127.0.0.1:$PORT/
    renter:         renter / renter-demo-pass   (has demo credit)
    host provider:  provider / provider-demo-pass
    admin:          admin / admin-demo-pass     (http://127.0.0.1:$PORT/admin/)
  API docs: http://127.0.0.1:$PORT/api/v1/docs/     logs: var/log/
  Press Ctrl-C to stop.
MSG
wait -n "${pids[@]}"
echo "!! a process exited; see var/log/"
