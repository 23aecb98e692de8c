# Two commands (see README.md):
#   make book   build the course into _build/html
#   make test   install what is needed, then run every test
# Both create a virtual environment in .venv on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYTHONHASHSEED := 0

.PHONY: book test clean notebooks handout

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "The course is built: open _build/html/index.html"

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg tests book

clean:
	rm -rf _build .pytest_cache .hypothesis

# For maintainers: re-execute every chapter and store fresh outputs.
notebooks: $(STAMP)
	$(BIN)/python tools/execute_notebooks.py

# For instructors: student notebooks (solutions removed), answer key, student website.
handout: $(STAMP)
	$(BIN)/python tools/make_handout.py _handout
