# The two set-up commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

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

test: lint docs
	$(BIN)/python -m pytest -q

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build site src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
