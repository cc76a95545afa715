PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-litellm-env clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/llmroute demo

test: $(STAMP)
	$(BIN)/ruff check llmroute tests benchmarks
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check llmroute tests benchmarks
	$(BIN)/ruff format --check llmroute tests benchmarks
	$(BIN)/pyright

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

# LiteLLM's proxy for benchmarks/gateway.py, in an environment of its own (never the dev one).
bench-litellm-env:
	$(PYTHON) -m venv .venv-litellm
	.venv-litellm/bin/python -m pip install --quiet 'litellm[proxy]' || \
		(echo "LiteLLM could not be installed: benchmarks/gateway.py skips it"; rm -rf .venv-litellm)

clean:
	rm -rf $(VENV) .venv-litellm .pytest_cache .ruff_cache .hypothesis build dist
