#!/usr/bin/env bash
# Starts the real parts the project needs, if they are not running. Sourced by run.sh/test.sh.
#   start_redis PORT DIR   start_postgres   start_dockerd

start_redis() {
  local port="$1" dir
  dir="$(realpath -m "$2")"
  mkdir -p "$dir"
  if redis-cli -p "$port" ping >/dev/null 2>&1; then return; fi
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --daemonize yes \
    --save "" --appendonly no --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
    --maxclients 20000
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && return; sleep 0.1; done
  echo "!! redis did not start on port $port (see $dir/redis.log)"; return 1
}

start_postgres() {
  local version
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -1)
  [ -n "$version" ] || { echo "!! PostgreSQL is not installed"; return 1; }
  if ! pg_lsclusters -h | awk '{print $4}' | grep -q online; then
    # Test databases need no durability; this makes the suite several times faster.
    local conf="/etc/postgresql/$version/main/conf.d/gpumkt-test.conf"
    if [ ! -f "$conf" ]; then
      printf "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 300\n" > "$conf"
    fi
    pg_ctlcluster "$version" main start
  fi
  for _ in $(seq 50); do su postgres -c "pg_isready -q" && break; sleep 0.2; done
  su postgres -c "psql -qtAc \"SELECT 1 FROM pg_roles WHERE rolname='gpumkt'\"" | grep -q 1 \
    || su postgres -c "psql -qc \"CREATE ROLE gpumkt LOGIN SUPERUSER PASSWORD 'gpumkt'\""
  su postgres -c "psql -qtAc \"SELECT 1 FROM pg_database WHERE datname='gpumkt'\"" | grep -q 1 \
    || su postgres -c "createdb -O gpumkt gpumkt"
}

start_dockerd() {
  .venv/bin/python -c "
from pathlib import Path
from hosts.simulation import ensure_dockerd, ensure_image
Path('var').mkdir(exist_ok=True)
ensure_dockerd(log_path=Path('var/dockerd.log'))
ensure_image()"
}
