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

bench:  ## install what is missing, start PostgreSQL, run the performance budgets in bench/; the table of figures goes to var/bench/table.md
	@bash scripts/bench.sh

cluster-demo:  ## the production recipe on this machine: 2 web behind Caddy, 3 workers, beat, 8 renters racing
	@scripts/bootstrap.sh test && PYTHONPATH=. .venv/bin/python -m deploy.cluster_demo

clean:
	rm -rf var/staticfiles .pytest_cache .ruff_cache .mypy_cache
