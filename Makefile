PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Test environments of their own, one per tests/compat/requirements-NAME.txt, in .venvs/NAME:
#   openai2     the newest openai 2.x (httpx, no httpx2) and llama-index-llms-openai (openai<3)
#   fw3         pydantic-ai, openai-agents, langchain-openai beside the newest openai 3.x
#   instructor  instructor, whose jiter cap holds openai back to an older 3.x
# The frameworks do not install beside the newest openai (shared/PITFALLS.md), so one shared
# environment would silently test old versions. A stamp per environment: re-runs reinstall
# only when pyproject.toml or the environment's requirements change.
VENVS := .venvs
REQS := tests/compat/requirements
FRAMEWORKS := tests/compat/frameworks
# The frameworks each environment must import (a failing import is an error there, not a skip).
FRAMEWORKS_openai2 := llama-index-llms-openai
FRAMEWORKS_fw3 := pydantic-ai-slim openai-agents langchain-openai
FRAMEWORKS_instructor := instructor
# The main suite on openai 2.x: all of it but the reliability folder (soak, load and fuzz tests
# that exercise llmroute's own transport and decoder, not openai's major) and the frameworks.
OPENAI2_TESTS := tests --ignore=tests/reliability --ignore=$(FRAMEWORKS)

.PHONY: demo test test-main test-openai2 test-frameworks lint bench clean
# The environments outlive a run (make would delete a stamp built through two pattern rules).
.PRECIOUS: $(VENVS)/%/.installed

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(VENVS)/%/.installed: pyproject.toml $(REQS)-%.txt
	rm -rf $(VENVS)/$*
	$(PYTHON) -m venv $(VENVS)/$*
	$(VENVS)/$*/bin/python -m pip install --quiet --upgrade pip
	$(VENVS)/$*/bin/python -m pip install --quiet -r $(REQS)-$*.txt
	touch $@

demo: $(STAMP)
	$(BIN)/llmroute demo

test: test-main test-openai2 test-frameworks

test-main: $(STAMP)
	$(BIN)/ruff check llmroute tests benchmarks
	$(BIN)/python -m pytest -q

test-openai2: $(VENVS)/openai2/.installed
	$(VENVS)/openai2/bin/python -c 'import importlib.util as u, openai, sys; \
	    sys.exit(f"openai {openai.__version__} here, or httpx2 installed: want 2.x on httpx" \
	             if not openai.__version__.startswith("2.") or u.find_spec("httpx2") else 0)'
	$(VENVS)/openai2/bin/python -m pytest -q $(OPENAI2_TESTS)

test-frameworks: test-frameworks-openai2 test-frameworks-fw3 test-frameworks-instructor

test-frameworks-%: $(VENVS)/%/.installed
	LLMROUTE_TEST_FRAMEWORKS="$(FRAMEWORKS_$*)" $(VENVS)/$*/bin/python -m pytest -q $(FRAMEWORKS)

lint: $(STAMP)
	$(BIN)/ruff check llmroute tests benchmarks
	$(BIN)/ruff format --check llmroute tests benchmarks
	$(BIN)/pyright

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) $(VENVS) .pytest_cache .ruff_cache .hypothesis build dist
