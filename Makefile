PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# One environment, .venv, and two stamps in it, for two kinds of people:
#   USER_STAMP  what a user needs, .[all] (the command line, the simulator, the gateway, plots,
#               Redis, OpenTelemetry, the request classifier): make demo. About 370 MB.
#   STAMP       what a developer needs, .[dev,tiers]: all of .[all], plus the test, lint and
#               deployment tools and SGLang's gateway: make test, lint, bench. About 760 MB.
# .[dev,tiers] holds every package of .[all], so a developer's current environment serves the
# demo without another install, and make test after make demo adds only the developer's tools.
# One environment (not two) because the README's commands name .venv/bin/llmroute whichever
# the reader ran first.
STAMP := $(VENV)/.installed
USER_STAMP := $(VENV)/.installed-all

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
# The main suite on openai 2.x, less the modules that never touch openai's client (pure logic,
# the SGLang launcher and stand-in, the simulator, CLI plumbing, fuzzing of llmroute's own
# decoders, load and soak runs): they pass or fail alike on either major, and running them twice
# would double make test's time (the whole suite on openai 2.x took 20 min on a loaded 2-core
# machine, this part about a third of it). New test modules run on both majors by default.
OPENAI2_SKIP := $(FRAMEWORKS) \
	tests/sglang/test_sglang_launcher.py tests/sglang/test_sglang_standin.py \
	tests/sglang/test_sglang_gateway.py tests/sglang/test_sglang_presets.py \
	tests/sglang/test_sglang_metrics.py tests/cli/test_cli_sglang.py tests/cli/test_cli_cache.py \
	tests/cli/test_cli_demo.py tests/cli/test_cli_bench.py tests/cli/test_cli_chat.py \
	tests/testing/test_simulator.py tests/testing/test_simulator_responses.py \
	tests/cache/test_cache_stores.py tests/cache/test_cache_keys.py tests/client/test_catalog.py \
	tests/config/test_config.py tests/routing/test_stats.py tests/routing/test_policies.py \
	tests/routing/test_prefix.py tests/protocols/test_protocol_anthropic.py \
	tests/transport/test_sse.py tests/transport/test_h2_corners.py tests/routing/test_health.py \
	tests/routing/test_shared_stats.py tests/reliability/test_fuzz_sse.py \
	tests/reliability/test_fuzz_anthropic.py tests/reliability/test_fuzz_config.py \
	tests/reliability/test_load.py tests/reliability/test_soak.py \
	tests/reliability/test_secrets.py tests/tiers/test_tiers.py tests/docs/test_docs_paths.py \
	tests/docs/test_docs_snippets.py tests/deploy/test_deploy.py
# (The docs' blocks are checked once, in the main environment: it has every extra they use,
# tiers' wordllama included, which .venvs/openai2 does not install.)
# Anthropic's wire format only, and a ratio of two timings that a loaded machine can upset.
OPENAI2_DESELECT := tests/reliability/test_hostile_bodies.py::test_anthropic_prefill_skip_is_linear
OPENAI2_TESTS := tests $(addprefix --ignore=,$(OPENAI2_SKIP)) \
	$(addprefix --deselect=,$(OPENAI2_DESELECT))

# Real Helm for tests/deploy/test_deploy.py: the Helm v4 library inside PyPI's helm-sdkpy wheel, unpacked
# (no helm binary ships in a registry package; the wheel asks for Python 3.12, and its library,
# loaded with ctypes, needs none). tests/deploy_tools.py says how it renders the chart.
HELM_SDK := helm-sdkpy==0.1.32
HELM_DIR := $(VENVS)/helm

.PHONY: demo test test-main envs test-openai2 test-frameworks lint bench bench-litellm-env clean
# The environments outlive a run (make would delete a stamp built through two pattern rules).
.PRECIOUS: $(VENVS)/%/.installed

$(STAMP): pyproject.toml  # the developer's environment (see the top)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,tiers]'
	touch $(STAMP)

$(HELM_DIR)/.installed: $(STAMP)
	rm -rf $(HELM_DIR)
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--dest $(HELM_DIR) '$(HELM_SDK)'
	cd $(HELM_DIR) && $(CURDIR)/$(BIN)/python -m zipfile -e helm_sdkpy-*.whl .
	touch $@

$(VENVS)/%/.installed: pyproject.toml $(REQS)-%.txt
	rm -rf $(VENVS)/$*
	$(PYTHON) -m venv $(VENVS)/$*
	$(VENVS)/$*/bin/python -m pip install --quiet --upgrade pip
	$(VENVS)/$*/bin/python -m pip install --quiet -r $(REQS)-$*.txt
	touch $@

# A line per step, and pip's own lines (no --quiet): a first install takes a while.
$(USER_STAMP): pyproject.toml
	@echo "make demo: 1/3: the environment $(VENV)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then \
		echo "make demo: 2/3: $(VENV) has the developer's extras, which include .[all]"; \
	else \
		echo "make demo: 2/3: pip install -e '.[all]': llmroute and what a user needs" \
			"(about 370 MB; pip's lines follow)"; \
		$(BIN)/python -m pip install --disable-pip-version-check -e '.[all]'; \
	fi
	@touch $@

demo: $(USER_STAMP)
	@echo "make demo: 3/3: llmroute demo"
	$(BIN)/llmroute demo

# After the main suite: the three environments install side by side (they are independent;
# 1.5 to 4.5 min on two cores with a warm pip cache, by the machine's load), then run.
test: test-main
	$(MAKE) -j3 envs
	$(MAKE) test-openai2 test-frameworks

envs: $(VENVS)/openai2/.installed $(VENVS)/fw3/.installed $(VENVS)/instructor/.installed

test-main: $(STAMP) $(HELM_DIR)/.installed
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

# LiteLLM's proxy for benchmarks/gateway.py, in an environment of its own (never the dev one).
bench-litellm-env:
	$(PYTHON) -m venv .venv-litellm
	.venv-litellm/bin/python -m pip install --quiet 'litellm[proxy]' || \
		(echo "LiteLLM could not be installed: benchmarks/gateway.py skips it"; rm -rf .venv-litellm)

clean:
	rm -rf $(VENV) $(VENVS) .venv-litellm .pytest_cache .ruff_cache .hypothesis build dist
