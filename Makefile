# Two commands on a fresh machine: `make demo` and `make test`. Both build .venv themselves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DEMO_ENGINE ?= sglang-mlx

.PHONY: help venv browser demo test lint bench briefs mlx-lm-models clean
.DEFAULT_GOAL := help

# Every target with a `## what it does` note, one line each (`make` alone prints it).
help:  ## List the targets, one line each
	@grep -E '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)$$/\1\t\2/' | \
	  awk -F'\t' '{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	# Everything of kvdoctor[all] but sglang's own requirements (those of its CUDA server).
	$(PY) -m pip install -q -e '.[dev,torch,mlx,dryrun,ray]'
	# The engine for --dry-run, without its GPU dependency tree (its MLX modules need only msgspec and psutil).
	$(PY) -m pip install -q --no-deps sglang==0.5.23
	touch $(STAMP)

venv: $(STAMP)  ## Build .venv: kvdoctor with every extra, torch 2.13.0 (CPU) and sglang 0.5.23

demo: $(STAMP)  ## Check two demo models (one broken) and write build/demo/report.html
	$(PY) -m kvdoctor.load.synth fixtures/models/openai__gpt-oss-20b build/demo/gpt-oss-20b 3
	$(PY) -m kvdoctor.load.synth fixtures/models/openai__gpt-oss-20b build/demo/gpt-oss-20b-broken 3
	cp fixtures/demo/gpt-oss-20b-broken/config.json build/demo/gpt-oss-20b-broken/config.json
	$(VENV)/bin/kvdoctor check build/demo/gpt-oss-20b build/demo/gpt-oss-20b-broken --engine $(DEMO_ENGINE) \
	  --kv-budget 40GiB --html-output build/demo/report.html; \
	  echo "kvdoctor exit code: $$? (0 clean, 1 findings at or above --fail-on, 2 input error); HTML: build/demo/report.html"
	$(VENV)/bin/kvdoctor check build/demo/gpt-oss-20b --engine vllm --deploy fixtures/demo/vllm-too-long.yaml --select VLM002; \
	  echo "kvdoctor exit code: $$? (the vLLM refusal above, caught before deploy)"

# Headless Chromium renders the HTML report in a test (Debian's package; skipped where it cannot be had).
browser:  ## Install headless Chromium for the HTML report test (skipped where it cannot be had)
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  fi || echo "chromium could not be installed: the browser test will be skipped"; \
	fi

test: $(STAMP) browser  ## Run the whole test suite on two workers
	$(PY) -m pytest -n 2

# Static guardrails over the package (ruff, then mypy; settings in pyproject.toml). Uses the venv as it
# is: run `make venv` first on a fresh clone (.ci/run does).
lint:  ## ruff and mypy over the package (settings in pyproject.toml)
	$(PY) -m ruff check kvdoctor tests
	$(PY) -m mypy

bench: $(STAMP)  ## Time the benchmarks of docs/performance.md (bench/run.py)
	$(PY) bench/run.py

# After editing rules/*.yaml: the index of what each finding carries (tests/test_catalog.py checks it).
briefs: $(STAMP)  ## Rewrite rules/briefs.json and descriptions.json after editing rules/*.yaml
	$(PY) -c "from kvdoctor.catalog import write_briefs; print(write_briefs())"

# After upgrading the pinned mlx-lm: the model list the base install reads (kvdoctor/data/mlx_lm_models.json).
mlx-lm-models: $(STAMP)  ## Rewrite kvdoctor/data/mlx_lm_models.json from the installed (pinned) mlx-lm
	$(PY) tools/mlx_lm_models.py

clean:  ## Remove .venv, build/ and the test caches
	rm -rf $(VENV) build .pytest_cache .hypothesis
