#!/usr/bin/env bash
# `make bench`: install what is missing, start PostgreSQL, run every bench in bench/ (each
# starts its own Redis, web processes, sshd and Docker Engine as it needs them), write the
# README's table to var/bench/table.md. Fails when any bench is over its budget or fails.
# bench_common.py, offer_queries.py and bench_table.py are modules the benches use, not
# benches. Each bench adds its budgets' rows to var/bench/results.jsonl.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test || exit 1
. scripts/services.sh
start_postgres || exit 1
tune_kernel_for_caddy  # as make run and make test do: the gateway bench's Caddy reloads

mkdir -p var/bench
: > var/bench/results.jsonl
: > var/bench/exits
# The machine's speeds before and after (bench_common.reference_loop_ms and
# reference_round_trip_us), for the table's header.
echo "before $(.venv/bin/python bench/bench_common.py)" > var/bench/machine
failed=""
for script in bench/[a-z]*.py; do
  case $script in bench/bench_common.py | bench/offer_queries.py | bench/bench_table.py) continue ;; esac
  echo "== $script"
  BENCH_RESULTS="$PWD/var/bench/results.jsonl" .venv/bin/python "$script"
  code=$?
  echo "$script $code" >> var/bench/exits
  [ "$code" = 0 ] || failed="$failed $script"
done
echo "after $(.venv/bin/python bench/bench_common.py)" >> var/bench/machine
.venv/bin/python bench/bench_table.py var/bench > var/bench/table.md
echo
cat var/bench/table.md
if [ -n "$failed" ]; then
  echo "over budget or failed:$failed"
  exit 1
fi
