# Two commands on a fresh machine:  make book   (build the book, CPU defaults)
#                                   make test   (unit tests + nbval over every chapter notebook)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# No MPLBACKEND here: chapter kernels must keep the inline backend, or figures vanish from
# the notebooks and the book (unit tests set Agg in tests/conftest.py).
unexport MPLBACKEND
# Chapters refit the same studies (chapter 6 repeats fits of chapters 4 and 5; `make test` then
# `make book` execute every chapter twice): looped.fit keeps each fit here, keyed by its runs,
# arguments and the fitter's source, and reuses it.  `make clean` empties it.
export LOOPED_FIT_CACHE ?= $(CURDIR)/_build/fit-cache
NBVAL  := --nbval-lax --current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: venv book notebooks test test-unit test-nbval html-check corpus clean

venv: $(STAMP)
$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

book: venv
	jupyter-book build . -W -n --keep-going

notebooks: venv  ## regenerate the executed nbval references book/NN_*.ipynb from the .md sources
	$(PY) tools/notebooks.py $(CHAPTERS)

test: test-unit test-nbval

test-unit: venv
	$(PY) -m pytest

test-nbval: venv
	$(PY) tools/notebooks.py --check
	$(PY) -m pytest -p no:cacheprovider $(NBVAL) book/[0-9][0-9]_*.ipynb

html-check: venv  ## after `make book` (builds it first only if there is no build yet)
	test -f _build/html/index.html || $(MAKE) book
	$(PY) .ci/check_html.py _build/html

corpus: venv  ## download the prose corpus's pinned sources (~380 MB) into data/sources (CI skips it)
	$(PY) -m looped.corpus fetch

clean:
	rm -rf _build .pytest_cache
