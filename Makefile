.PHONY: run test lint format bench clean

run:  ## install what is missing and start the whole marketplace locally
	@bash scripts/run.sh

test:  ## install what is missing and run lint plus the whole test suite
	@bash scripts/test.sh $(ARGS)

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

format:
	.venv/bin/ruff check --fix . && .venv/bin/ruff format .

bench:  ## run the performance budgets in bench/
	@for script in bench/*.py; do echo "== $$script"; .venv/bin/python $$script || exit 1; done

clean:
	rm -rf var/staticfiles .pytest_cache .ruff_cache
