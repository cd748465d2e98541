#!/usr/bin/env bash
# `make test`: install what is missing, start PostgreSQL, Redis and Docker, lint, run the suite.
# Extra arguments go to pytest (e.g. `make test ARGS="-k billing"`). Without them the money
# tests run a second time on SQLite; the script fails if either run fails.
# `--quick` first (`make test-quick`): the inner loop, without the system and browser tests
# (simulated hosts, Chromium) or the SQLite run, and with the lighter Hypothesis profile.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = --quick ]; then
  quick=1
  shift
fi
scripts/bootstrap.sh test
. scripts/services.sh

mkdir -p var
test_redis_url="${TEST_REDIS_URL:-redis://127.0.0.1:6391/0}"
start_postgres
start_redis_for_url "$test_redis_url" var/test-redis
start_dockerd
tune_kernel_for_caddy

echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "==> mypy (beside the tests: a cold check takes a minute of one core; its report follows them)"
# The Django plugin loads the settings, which want SECRET_KEY unless DEBUG=1; a type check
# serves nothing, so DEBUG=1 rather than a made-up key. [tool.mypy] says what it checks.
mypy_log="$(mktemp)"
DEBUG=1 .venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_log"' EXIT
mypy_report() {  # waits for mypy, prints what it said; 1 when it failed
  local result=0
  wait "$mypy_pid" || result=1
  echo "==> mypy"
  cat "$mypy_log"
  return "$result"
}

echo "==> pytest"
# TEST_NAMESPACE (0-9) keeps a run beside another on this machine apart: its own databases,
# Redis databases, simulated hosts' addresses and container labels (tests/environment.py).
database=gpumkt
if [ "${TEST_NAMESPACE:-0}" != 0 ]; then database="gpumkt_ns${TEST_NAMESPACE}"; fi
export DATABASE_URL="${TEST_DATABASE_URL:-postgres://gpumkt:gpumkt@127.0.0.1:5432/$database}"
export REDIS_URL="$test_redis_url"
mkdir -p var/staticfiles  # whitenoise serves through finders in tests; it wants the root to exist
status=0
if [ "$quick" = 1 ]; then
  # The light profile unless one is named (tests/conftest.py); CI=true keeps the full one.
  .venv/bin/pytest -n "${PYTEST_WORKERS:-3}" --dist loadfile -m "not system and not browser" "$@" \
    || status=$?
  mypy_report || status=1
  exit "$status"
fi
# Every example the properties ask for, as in CI (tests/conftest.py).
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
# The slowest tests are listed at the end, so each run says where the suite's time goes.
.venv/bin/pytest -n "${PYTEST_WORKERS:-3}" --dist loadfile --durations=30 "$@" || status=$?

# The ledger again on SQLite, `make run`'s database: billing/ and core/pg_bulk.py write differently
# there (no arrays, no COPY-style bulk statements), and only this job runs those branches. Run
# with the whole suite only: ARGS choose tests, and these are not the ones chosen. Each xdist
# worker makes its own file database (tests/billing/conftest.py); pytest-randomly shuffles
# this job too and prints its seed.
SQLITE_MONEY_TESTS=(
  tests/billing/test_holds.py tests/billing/test_metering.py tests/billing/test_concurrency.py
  tests/billing/test_rentals_in_step.py tests/billing/test_admin.py tests/billing/test_payouts.py
)
if [ $# -eq 0 ]; then
  echo "==> pytest on SQLite: the money tests"
  sqlite_dir="$(mktemp -d)"
  DATABASE_URL="sqlite:///$sqlite_dir/marketplace.sqlite3" \
    .venv/bin/pytest -n "${PYTEST_WORKERS:-3}" --dist loadfile "${SQLITE_MONEY_TESTS[@]}" \
    || status=$?
  rm -rf "$sqlite_dir"
fi
mypy_report || status=1
exit "$status"
