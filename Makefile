# The two commands of the README: `make book` and `make test`. Both set everything up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROFILE ?= auto
DATA_STAMP := data/raw/.fetched

.PHONY: book chromium test test-full test-gpu test-privacy-mutants paper gpu-bundle notebooks data venv bench lint clean help

help:
	@echo "make book   - set up, fetch data, execute every notebook, build the HTML book (PROFILE=$(PROFILE):"
	@echo "              each page at paper where its results are complete, else quick; PROFILE=quick: all quick)"
	@echo "make test   - set up, fetch data, run the test suite"
	@echo "make test-full - the rest: slow end-to-end checks and heavy statistical audits"
	@echo "make test-gpu - the tests that exercise CUDA (skipped without a GPU)"
	@echo "make test-privacy-mutants - mutation testing of the privacy code (mutmut; hours; MUTANTS_MIN=N stops, the next run resumes)"
	@echo "make bench  - engine benchmark (saved under data/bench/)"
	@echo "make paper  - one slice of the paper-scale campaign (a GPU; BUDGET_MIN=25)"
	@echo "make gpu-bundle - wheels and gzipped data for an offline GPU node (bash tools/gpu-slice.sh there)"

# ---- environment: a venv with the pinned requirements --------------------------------
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt 2>&1 | grep -v "is ignored: it is neither" || true
	$(PY) -c "import torch, torchvision, dp_accounting, papermill, jupyter_book"
	$(PY) -m pip install -q --no-deps -e .
	@# the study (studies/, lab/) beside the library: on the environment's path from this checkout
	echo "$(CURDIR)" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/fedlib-study.pth"
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (fedlib)" >/dev/null
	touch $@

venv: $(STAMP)

# The optional Flower extra (fedlib.flower): the tests need it, and so does the book (its Flower page
# runs Flower's own DP wrappers beside fedlib's DP-FedAvg, fedlib/flower/dp_check.py).
FLOWER_STAMP := $(VENV)/.flower
$(FLOWER_STAMP): $(STAMP) requirements-flower.txt
	$(PY) -m pip install -q -r requirements-flower.txt 2>&1 | grep -v "is ignored: it is neither" || true
	$(PY) -c "import flwr, ray"
	touch $@

# ---- data ---------------------------------------------------------------------------
$(DATA_STAMP): $(STAMP)
	$(PY) -m fedlib data fashionmnist mnist
	touch $@

data: $(DATA_STAMP)

# ---- book -----------------------------------------------------------------------------
notebooks: $(DATA_STAMP) $(FLOWER_STAMP)
	$(PY) -m lab.notebooks --into-book --profile $(PROFILE)

# The browser check needs Chromium: installed here when this is a Debian-like machine and we are root;
# otherwise make book stops and says how (SKIP_BROWSER_CHECK=1 builds without the check, on purpose).
chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then exit 0; fi; \
	if [ -n "$(SKIP_BROWSER_CHECK)" ]; then exit 0; fi; \
	if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = "0" ]; then \
		echo "installing chromium for the browser check of the book (apt-get)"; \
		apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
		|| { echo "error: could not install chromium; install it (apt-get install chromium) or run SKIP_BROWSER_CHECK=1 make book"; exit 1; }; \
	else echo "error: the browser check of the book needs Chromium: install it (e.g. apt-get install chromium) or run SKIP_BROWSER_CHECK=1 make book"; exit 1; fi

book: chromium notebooks
	$(VENV)/bin/jupyter-book build -W -n --keep-going book/
	@if [ -n "$(SKIP_BROWSER_CHECK)" ]; then echo "browser check skipped (SKIP_BROWSER_CHECK is set)"; \
	else $(PY) -m lab.browser_check book/_build/html --screenshots book/_build/screenshots; fi
	@echo "book: $(CURDIR)/book/_build/html/index.html"

# ---- tests ------------------------------------------------------------------------------
# make test: one test of every module and mechanism (about 8-9 minutes of pytest on 2 cores; the time
# is printed). make test-full: the rest (slow end-to-end checks and heavy statistical audits);
# .ci/run runs both.
test: $(DATA_STAMP) $(FLOWER_STAMP)
	$(VENV)/bin/ruff check fedlib studies lab tests notebooks
	@start=$$(date +%s); $(PY) -m pytest -m "not heavy and not e2e"; rc=$$?; \
	echo "make test: pytest took $$(( $$(date +%s) - start )) s of wall time"; exit $$rc

test-full: $(DATA_STAMP) $(FLOWER_STAMP)
	$(VENV)/bin/ruff check fedlib studies lab tests notebooks
	@start=$$(date +%s); $(PY) -m pytest -m "heavy or e2e"; rc=$$?; \
	echo "make test-full: pytest took $$(( $$(date +%s) - start )) s of wall time"; exit $$rc

# Mutation testing of the privacy code (mutmut; hours on a 2-core CPU, not part of make test): the
# report, with every mutant's status and the argument for each equivalent survivor, goes to
# data/audits/privacy-mutants.json; it fails while a survivor is unexplained. MUTANTS_MIN=N stops
# after N minutes; the next run resumes (mutmut keeps its verdicts in .mutants/).
test-privacy-mutants: $(DATA_STAMP) $(FLOWER_STAMP)
	$(PY) -m lab.privacy_mutants run $(if $(MUTANTS_MIN),--budget-min $(MUTANTS_MIN))

test-gpu: $(DATA_STAMP)
	$(PY) -m pytest -m gpu -v -rs

# One slice of the paper-scale campaign (meant for a GPU): trains what the pages still miss.
paper: $(DATA_STAMP)
	$(PY) -m lab.campaign plan --profile paper
	$(PY) -m lab.campaign run --profile paper --budget-min $(or $(BUDGET_MIN),25)

# What an offline GPU node lacks (wheels, gzipped datasets), into .whl/ and .gpudata/ (git-ignored);
# on the node: bash tools/gpu-slice.sh MINUTES OUTDIR.
gpu-bundle: $(DATA_STAMP)
	$(PY) -m lab.gpu_bundle $(if $(DATASETS),--datasets $(DATASETS))

bench: $(DATA_STAMP)
	$(PY) -m lab.bench --json --save

clean:
	rm -rf book/_build book/chapters/*.ipynb
