# The two set-up commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Byte-code is written whatever the environment says (PYTHONDONTWRITEBYTECODE), so that what
# the tools and the suite import is compiled once, not again in each of the suite's hundreds
# of child processes (the install leaves compiling to first use: see .installed-test).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test check lint docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

# make test's tools, the test and docs extras in one install (1.4 GB). --no-compile: pip
# byte-compiles every installed file, one at a time (about 30 s of ~17,000 files, most never
# imported); the suite compiles what it imports, once (see test).
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --no-compile -e '.[test,docs]'
	touch $@ $(VENV)/.installed-docs

demo: $(VENV)/.installed
	$(BIN)/python examples/demo.py

# mypy reads numpy's stubs, pinned for Python >= 3.11 (pyproject's test extra); numpy 2.4
# does not install on 3.10, whose older stubs disagree, so there the type check is skipped.
lint: $(VENV)/.installed-test
	$(BIN)/ruff check src tests benchmarks examples
	@if $(BIN)/python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then \
		$(BIN)/mypy; \
	else echo "mypy skipped on Python 3.10 (numpy 2.4's stubs need 3.11+)"; fi

$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[docs]'
	touch $@

# The documentation site (mkdocs.yml: docs/ and the API reference from the docstrings) into
# site/, git-ignored; a warning (a broken link or anchor, a docstring griffe cannot parse)
# fails the build.
docs: $(VENV)/.installed-docs
	$(BIN)/mkdocs build --strict --quiet

# The whole suite, slow tests included, one worker per core; a worker takes a whole file
# (module fixtures are built once, the files of one module never race).
PYTEST_PARALLEL := -n auto --dist loadfile

test: lint docs
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

# The inner loop (docs/development.md): lint, types and the tests not marked slow, leaving
# out what runs child processes by the dozen (remote servers, the scanner's real-loader
# oracles, the real-world corpus, the installed command's journeys, every docs example).
# make test before a merge.
CHECK_SKIP := --ignore=tests/remote --ignore=tests/realworld --ignore=tests/scanning \
	--ignore=tests/test_journeys.py --ignore=tests/test_docs.py

check: lint
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not slow" $(CHECK_SKIP)

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build site src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
