#!/usr/bin/env bash
# `make test`: install what is missing, start PostgreSQL, Redis and Docker, lint, run the suite.
# Extra arguments go to pytest (e.g. `make test ARGS="-k billing"`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test
. scripts/services.sh

mkdir -p var
test_redis_url="${TEST_REDIS_URL:-redis://127.0.0.1:6391/0}"
start_postgres
start_redis_for_url "$test_redis_url" var/test-redis
start_dockerd

echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .

echo "==> pytest"
export DATABASE_URL="${TEST_DATABASE_URL:-postgres://gpumkt:gpumkt@127.0.0.1:5432/gpumkt}"
export REDIS_URL="$test_redis_url"
mkdir -p var/staticfiles  # whitenoise serves through finders in tests; it wants the root to exist
exec .venv/bin/pytest -n "${PYTEST_WORKERS:-3}" --dist loadfile "$@"
