#!/usr/bin/env bash
# Starts the real parts the project needs, if they are not running. Sourced by run.sh/test.sh.
#   start_redis PORT DIR   start_postgres   start_dockerd
# Each function returns non-zero with a line starting "!!" that says what is wrong and what to
# do; none of them stops a service it did not start.

REDIS_STARTED=0  # set to 1 by start_redis when it started a server (callers stop only those)

start_redis() {
  local port="$1" dir
  dir="$(realpath -m "$2")"
  mkdir -p "$dir"
  if ! command -v redis-server >/dev/null; then
    echo "!! redis-server is not installed: apt-get install redis-server"; return 1
  fi
  if redis-cli -p "$port" ping >/dev/null 2>&1; then return 0; fi
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --daemonize yes \
    --save "" --appendonly no --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
    --maxclients 20000 || { echo "!! redis-server would not start on port $port (see $dir/redis.log)"; return 1; }
  for _ in $(seq 50); do
    if redis-cli -p "$port" ping >/dev/null 2>&1; then REDIS_STARTED=1; return 0; fi
    sleep 0.1
  done
  echo "!! redis did not start on port $port (see $dir/redis.log)"; return 1
}

# "HOST PORT" of a redis:// URL (port 6379 when it names none).
redis_url_address() {
  local address=${1#*://}
  address=${address#*@}
  address=${address%%/*}
  if [ "${address%:*}" = "$address" ] || [ "${address%]}" != "$address" ]; then
    echo "$address 6379"
  else
    echo "${address%:*} ${address##*:}"
  fi
}

# Start a Redis for URL when it points at this machine; one elsewhere is only used.
start_redis_for_url() {
  local url="$1" dir="$2" host port
  read -r host port <<<"$(redis_url_address "$url")"
  case "$host" in
    127.0.0.1 | localhost | "[::1]") start_redis "$port" "$dir" ;;
    *) echo "==> using the Redis at $host:$port" ;;
  esac
}

# The first PostgreSQL cluster as "VERSION NAME PORT STATUS", or nothing when there is none.
_pg_cluster() {
  pg_lsclusters -h 2>/dev/null | awk 'NR == 1 {print $1, $2, $3, $4}'
}

_pg_as_postgres() {
  su postgres -s /bin/sh -c "$1"
}

start_postgres() {
  if ! command -v pg_lsclusters >/dev/null; then
    echo "!! PostgreSQL is not installed: apt-get install postgresql"; return 1
  fi
  if [ "$(id -u)" != 0 ]; then
    # Managing the Debian cluster (pg_ctlcluster, su postgres) needs root. Without it, use a
    # server that is already up and has the gpumkt role and database.
    if PGPASSWORD=gpumkt psql -h 127.0.0.1 -U gpumkt -d gpumkt -qtAc "SELECT 1" >/dev/null 2>&1; then
      return 0
    fi
    echo "!! start_postgres needs root to start PostgreSQL and create the gpumkt role and database."
    echo "!! Run as root, or start PostgreSQL yourself and create them:"
    echo "!!   CREATE ROLE gpumkt LOGIN SUPERUSER PASSWORD 'gpumkt'; CREATE DATABASE gpumkt OWNER gpumkt;"
    echo "!! (or set TEST_DATABASE_URL to a database you have)"
    return 1
  fi
  local version name port status
  read -r version name port status <<<"$(_pg_cluster)"
  if [ -z "${version:-}" ]; then
    version=$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -1)
    [ -n "$version" ] || { echo "!! no PostgreSQL server binaries under /usr/lib/postgresql"; return 1; }
    echo "==> creating PostgreSQL cluster $version/main"
    pg_createcluster "$version" main >/dev/null || { echo "!! pg_createcluster $version main failed"; return 1; }
    read -r version name port status <<<"$(_pg_cluster)"
  fi
  [ "$port" = 5432 ] || echo "!! PostgreSQL cluster $version/$name listens on port $port; the tests expect 5432 (or set TEST_DATABASE_URL)"
  if [ "$status" != online ]; then
    # Test databases need no durability; this makes the suite several times faster.
    local confdir="/etc/postgresql/$version/$name/conf.d"
    mkdir -p "$confdir"
    if [ ! -f "$confdir/gpumkt-test.conf" ]; then
      printf "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 300\n" \
        > "$confdir/gpumkt-test.conf"
    fi
    pg_ctlcluster "$version" "$name" start \
      || { echo "!! PostgreSQL $version/$name would not start (see /var/log/postgresql/postgresql-$version-$name.log)"; return 1; }
  fi
  local ready=0
  for _ in $(seq 100); do
    if pg_isready -q -p "$port"; then ready=1; break; fi
    sleep 0.2
  done
  if [ "$ready" != 1 ]; then
    echo "!! PostgreSQL $version/$name did not accept connections within 20 s (see /var/log/postgresql/postgresql-$version-$name.log)"
    return 1
  fi
  _pg_as_postgres "psql -p $port -qtAc \"SELECT 1 FROM pg_roles WHERE rolname='gpumkt'\"" | grep -q 1 \
    || _pg_as_postgres "psql -p $port -qc \"CREATE ROLE gpumkt LOGIN SUPERUSER PASSWORD 'gpumkt'\"" \
    || { echo "!! could not create the PostgreSQL role gpumkt"; return 1; }
  _pg_as_postgres "psql -p $port -qtAc \"SELECT 1 FROM pg_database WHERE datname='gpumkt'\"" | grep -q 1 \
    || _pg_as_postgres "createdb -p $port -O gpumkt gpumkt" \
    || { echo "!! could not create the PostgreSQL database gpumkt"; return 1; }
}

# dockerd refuses to start while its pid file names a live process, and after a crash or a
# container restart that pid may belong to anything. Remove the file unless the process it
# names is a dockerd (which may still be starting; then it is left alone).
clear_stale_docker_pid() {
  local pidfile="${1:-/var/run/docker.pid}" pid comm
  [ -f "$pidfile" ] || return 0
  pid=$(tr -dc '0-9' <"$pidfile")
  if [ -n "$pid" ] && [ -r "/proc/$pid/comm" ]; then
    comm=$(cat "/proc/$pid/comm" 2>/dev/null)
    [ "$comm" = dockerd ] && return 0
  fi
  echo "==> removing stale $pidfile (pid ${pid:-none} is not a running dockerd)"
  rm -f "$pidfile"
}

DOCKERD_STARTED=0  # set to 1 by start_dockerd when it started the engine (callers stop only that)
start_dockerd() {
  local before
  before=$(pgrep -x dockerd || true)  # a dockerd of the system's, perhaps still starting
  if ! docker info >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
      echo "!! Docker Engine is not answering and starting it needs root (or start it: systemctl start docker)"
      return 1
    fi
    clear_stale_docker_pid /var/run/docker.pid
  fi
  local started=0
  .venv/bin/python -c "
from pathlib import Path
from hosts.devtools.sim_docker import ensure_dockerd
Path('var').mkdir(exist_ok=True)
ensure_dockerd(log_path=Path('var/dockerd.log'))" || started=1
  # Ours only if no dockerd ran before and one runs now (even if it failed to answer).
  if [ -z "$before" ] && pgrep -x dockerd >/dev/null; then DOCKERD_STARTED=1; fi
  [ "$started" = 0 ] || { echo "!! Docker Engine did not start (see var/dockerd.log)"; return 1; }
  .venv/bin/python -c "
from hosts.devtools.sim_docker import ensure_image
ensure_image()" || { echo "!! the test image could not be made (is busybox-static installed?)"; return 1; }
}

# Stop a Docker Engine that start_dockerd started; its containers stop with it (and are seen
# as exited by the platform's reconcile when it runs again).
stop_dockerd() {
  local pid
  pid=$(tr -dc '0-9' </var/run/docker.pid 2>/dev/null)
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  echo "!! dockerd (pid $pid) is still stopping"
}

# The gateway's Caddy reloads its config on every route push and, in 2.6, closes its old
# listening socket; unless the kernel migrates the connections queued on it to the new one,
# it resets them (a client sees "connection reset" during a rolling update). The production
# unit sets this before Caddy starts (deploy/systemd/caddy.service.d/gpumkt.conf); `make run`
# and `make test` run Caddy too, so they set it as well. It only changes what happens to
# connections queued on a closing SO_REUSEPORT listener (Linux 5.14+), nothing else.
tune_kernel_for_caddy() {
  local setting=/proc/sys/net/ipv4/tcp_migrate_req
  [ -e "$setting" ] || return 0
  [ "$(cat "$setting")" = 1 ] && return 0
  if [ "$(id -u)" = 0 ]; then
    echo 1 > "$setting" && echo "==> net.ipv4.tcp_migrate_req=1 (Caddy reloads keep queued connections)"
  else
    echo "!! net.ipv4.tcp_migrate_req is 0 and this is not root: a rolling update may reset a connection."
  fi
}
