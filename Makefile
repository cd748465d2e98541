.PHONY: run test test-quick vast-cli-doc lint format bench clean cluster-demo

run:  ## install what is missing and start the whole marketplace locally
	@bash scripts/run.sh

test:  ## install what is missing and run lint plus the whole test suite
	@bash scripts/test.sh $(ARGS)

test-quick:  ## the inner loop: lint and the suite without the system and browser tests
	@bash scripts/test.sh --quick $(ARGS)

vast-cli-doc:  ## rewrite docs/vast-cli-compatibility.md from a passing run of the vastai CLI
	@UPDATE_VAST_CLI_DOC=1 bash scripts/test.sh tests/vast/test_cli_conformance.py

# mypy's Django plugin loads the settings, which want SECRET_KEY unless DEBUG=1; the check
# serves nothing, so DEBUG=1 rather than a made-up key. [tool.mypy] says what it checks.
lint:  ## ruff, then mypy (billing and core strictly)
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && DEBUG=1 .venv/bin/mypy

format:
	.venv/bin/ruff check --fix . && .venv/bin/ruff format .

# bench_common.py, offer_queries.py and bench_table.py are modules the benches use, not benches.
# Each bench adds its budgets' rows to var/bench/results.jsonl; bench_table.py makes them the
# README's table (var/bench/table.md, printed at the end). Any bench over budget or failing
# makes the whole target fail.
bench:  ## run the performance budgets in bench/; the table of figures goes to var/bench/table.md
	@bash -c '. scripts/services.sh; tune_kernel_for_caddy'  # as make run and make test do: the gateway bench's Caddy reloads
	@mkdir -p var/bench; : > var/bench/results.jsonl; : > var/bench/exits; failed=""; \
	for script in bench/[a-z]*.py; do case $$script in bench/bench_common.py|bench/offer_queries.py|bench/bench_table.py) continue;; esac; \
	echo "== $$script"; BENCH_RESULTS="$(CURDIR)/var/bench/results.jsonl" .venv/bin/python $$script; code=$$?; \
	echo "$$script $$code" >> var/bench/exits; [ $$code = 0 ] || failed="$$failed $$script"; done; \
	.venv/bin/python bench/bench_table.py var/bench > var/bench/table.md; echo; cat var/bench/table.md; \
	if [ -n "$$failed" ]; then echo "over budget or failed:$$failed"; exit 1; fi

cluster-demo:  ## the production recipe on this machine: 2 web behind Caddy, 3 workers, beat, 8 renters racing
	@scripts/bootstrap.sh test && PYTHONPATH=. .venv/bin/python -m deploy.cluster_demo

clean:
	rm -rf var/staticfiles .pytest_cache .ruff_cache .mypy_cache
