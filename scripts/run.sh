#!/usr/bin/env bash
# `make run`: install what is missing and start the whole marketplace on the embedded defaults.
# Ctrl-C stops everything this script started (and nothing it found running).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh run || echo "!! set-up was incomplete; starting what can start"
. scripts/services.sh

die() {
  echo "!! $*"
  exit 1
}

[ -x .venv/bin/python ] || die "no Python environment (.venv); see the messages above"

export DEBUG=1
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6390/0}"
PORT="${PORT:-8000}"
# The cluster gateway (Caddy): clusters' URLs on GATEWAY_PORT, its admin API on loopback (not
# Caddy's default 2019: on a machine where installing Debian's caddy started caddy.service,
# that admin API is the system's Caddy, which the gateway's config must not replace).
GATEWAY_PORT="${GATEWAY_PORT:-8080}"
export GATEWAY_ADMIN="${GATEWAY_ADMIN:-127.0.0.1:2099}"
export GATEWAY_URL="${GATEWAY_URL:-http://127.0.0.1:$GATEWAY_PORT}"
# Set, every route push puts the gateway's server back into a Caddy that lost it (killed and
# started again, reloaded): the gateway heals itself within a push.
export GATEWAY_LISTEN="${GATEWAY_LISTEN:-127.0.0.1:$GATEWAY_PORT}"
export GATEWAY_AUTH_UPSTREAM="${GATEWAY_AUTH_UPSTREAM:-127.0.0.1:$PORT}"
mkdir -p var/log
py=.venv/bin/python
# Every container this checkout's marketplace starts carries this label, so stopping removes
# exactly those (and never another local marketplace's, sharing the machine's Docker).
RUN_LABEL="gpumkt.make-run=$(pwd | sha256sum | cut -c1-12)"
export CONTAINER_EXTRA_LABELS="${CONTAINER_EXTRA_LABELS:+$CONTAINER_EXTRA_LABELS,}$RUN_LABEL"
pids=()

# Redis: start one on REDIS_URL's port when it points at this machine and nothing answers;
# a Redis elsewhere (or already running here) is used as it is and never shut down.
read -r _ redis_port <<<"$(redis_url_address "$REDIS_URL")"

# The Docker Engines this marketplace's containers run on, those answering: the system's, and
# the one the simulated hosts that enforce disk sizes use (its socket named where it is made).
engines() {
  command -v docker >/dev/null || return 0
  local engine quota
  quota=$($py -c "from hosts.devtools.sim_docker import QUOTA_DOCKER_SOCKET as s; print(s)")
  for engine in "${DOCKER_HOST:-unix:///var/run/docker.sock}" $quota; do
    DOCKER_HOST=$engine docker info >/dev/null 2>&1 && echo "$engine"
  done
}

cleanup() {
  echo; echo "==> stopping"
  local engine engines_up instances="" ours
  engines_up=$(engines)
  # The containers removed below are renters' rentals in this marketplace's records: end them
  # first, through the platform (charged to now), or the next start finds them gone and blames
  # their hosts (a container killed counts against a machine's reliability).
  for engine in $engines_up; do
    instances+=" $(DOCKER_HOST=$engine docker ps -a --filter "label=$RUN_LABEL" \
      --format '{{.Label "gpumkt.instance"}}')"
  done
  if [ -n "${instances// /}" ]; then
    # shellcheck disable=SC2086  # one uuid a word
    $py manage.py demo_stop $instances || echo "!! could not end the rentals (see above)"
  fi
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  if [ "$REDIS_STARTED" = 1 ]; then
    redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
  fi
  # The Docker Engines are system services other programs' containers may run on: they stay
  # up, and only the containers this checkout's marketplace made (its label) are removed.
  for engine in $engines_up; do
    ours=$(DOCKER_HOST=$engine docker ps -aq --filter "label=$RUN_LABEL")
    if [ -n "$ours" ]; then
      echo "==> removing the containers this marketplace made ($engine)"
      # shellcheck disable=SC2086
      DOCKER_HOST=$engine docker rm -f $ours >/dev/null 2>&1 || true
    fi
  done
}
trap cleanup EXIT
trap 'exit 0' INT TERM

start_redis_for_url "$REDIS_URL" var/redis \
  || die "Redis is required at $REDIS_URL: apt-get install redis-server"

$py manage.py migrate --noinput -v0 || die "migrate failed (see above); the database at DATABASE_URL is not usable"
$py manage.py collectstatic --noinput -v0 || die "collectstatic failed (see above)"

simulated=0
if [ "$(id -u)" = 0 ] && [ -x /usr/sbin/sshd ] && command -v dockerd >/dev/null && start_dockerd; then
  # demo_data puts the provider team's key in each host's authorized_keys, as a provider would.
  rm -f var/simhosts/hosts.json  # the last run's: it must not pass for this run's hosts
  $py manage.py simhosts --count 3 > var/log/simhosts.log 2>&1 &
  simhosts=$!
  pids+=($simhosts)
  # The first run also builds the SSH image, which takes a while.
  echo "==> starting simulated hosts (var/log/simhosts.log)"
  for _ in $(seq 1800); do
    [ -f var/simhosts/hosts.json ] && { simulated=1; break; }
    kill -0 "$simhosts" 2>/dev/null || break
    sleep 0.1
  done
  if [ "$simulated" != 1 ]; then
    echo "!! the simulated hosts did not start (see var/log/simhosts.log); starting without them"
    kill "$simhosts" 2>/dev/null
    pids=()
  fi
else
  echo "!! simulated hosts need root, openssh-server and docker.io; starting without them"
fi
$py manage.py demo_data --simhosts "$([ $simulated = 1 ] && echo var/simhosts/hosts.json)" \
  || die "demo_data failed (see above); not starting the web server"

# The gateway runs as a plain process (no systemd), its state under var/caddy; its config is
# pushed over the admin API once the database is ready (gateway_load below).
if command -v caddy >/dev/null; then
  tune_kernel_for_caddy
  mkdir -p var/caddy
  printf '{"admin": {"listen": "%s"}}' "$GATEWAY_ADMIN" > var/caddy/boot.json
  XDG_DATA_HOME="$PWD/var/caddy" XDG_CONFIG_HOME="$PWD/var/caddy" \
    caddy run --config var/caddy/boot.json > var/log/gateway.log 2>&1 &
  pids+=($!)
  loaded=0
  for _ in $(seq 50); do
    if $py manage.py gateway_load --listen "127.0.0.1:$GATEWAY_PORT" > var/log/gateway-load.log 2>&1; then
      loaded=1; break
    fi
    sleep 0.2
  done
  [ "$loaded" = 1 ] || echo "!! the cluster gateway did not take its config; see var/log/gateway*.log"
else
  echo "!! caddy is not installed (apt-get install caddy): clusters get no URL"
  export GATEWAY_ADMIN=""
fi

.venv/bin/celery -A marketplace worker -l info --concurrency 2 > var/log/worker.log 2>&1 &
pids+=($!)
.venv/bin/celery -A marketplace beat -l info --schedule var/celerybeat-schedule > var/log/beat.log 2>&1 &
pids+=($!)
# As the production unit: no per-message deflate, so the team feed writes one frame for all
# sockets (core/fanout.py).
.venv/bin/uvicorn marketplace.asgi:application --host 127.0.0.1 --port "$PORT" --ws-per-message-deflate false > var/log/web.log 2>&1 &
web=$!
pids+=($web)

# Wait for the login page (with Python: a fresh Debian has no curl).
up() {
  $py -c "import sys, urllib.request
try:
    urllib.request.urlopen('http://127.0.0.1:$PORT/accounts/login/', timeout=2)
except Exception:
    sys.exit(1)"
}
answered=0
for _ in $(seq 150); do
  if up; then answered=1; break; fi
  kill -0 "$web" 2>/dev/null || die "the web server exited; see var/log/web.log"
  sleep 0.2
done
[ "$answered" = 1 ] || die "the web server did not answer on port $PORT; see var/log/web.log"

cat <<MSG

  GPU Marketplace is running:  http://127.0.0.1:$PORT/
    renter:         renter / renter-demo-pass   (has demo credit)
    host provider:  provider / provider-demo-pass
    admin:          admin / admin-demo-pass     (http://127.0.0.1:$PORT/admin/)
  API docs: http://127.0.0.1:$PORT/api/v1/docs/     logs: var/log/
  cluster gateway: $GATEWAY_URL/clusters/<id>/service/
  Press Ctrl-C to stop.
MSG
wait -n "${pids[@]}"
echo "!! a process exited; see var/log/"
