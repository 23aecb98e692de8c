"""The rule of CONTRIBUTING.md, "Claims hold beyond the case tried", held up for every chapter.

- every chapter that trains, draws at random or sweeps has its claims test,
  tests/test_claims_chNN.py, which asserts the chapter's sentences over at least 5 seeds;
- no chapter states a result over fewer than five seeds, starts or draws;
- every registered sweep has a stored table of at least 5 seeds, made under generic kernels,
  and a claims test that re-derives one of its rows;
- every registered sweep names held-out seeds, none of them in its table, and a claims test
  computes them (`held_out_rows` or `held_out_column` with the sweep's name) to assert on them.
"""

import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest

import mha.experiments
from mha.experiments import seeds

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
# Code that trains a model, draws at random or sweeps a range: its results are claims over seeds.
RANDOM_OR_TRAINED = re.compile(r"\btrain\w*\(|default_rng\(|manual_seed\(|\brandn\(|\brandint\(|\.normal\(")
FEW_SEEDS = re.compile(r"\b(two|three|four|[2-4])\s+(random\s+|different\s+|training\s+)?(seeds|starts|draws|runs)\b",
                       re.IGNORECASE)


def cells(path, kind):
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == kind]


def claims_test(chapter):
    return ROOT / "tests" / f"test_claims_ch{chapter.name[:2]}.py"


def registered_sweeps():
    for info in pkgutil.iter_modules(mha.experiments.__path__):
        importlib.import_module(f"mha.experiments.{info.name}")
    return dict(seeds.SWEEPS)


def test_the_chapters_are_found():
    assert len(CHAPTERS) >= 12


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_with_random_or_trained_results_has_a_claims_test(chapter):
    if not any(RANDOM_OR_TRAINED.search(code) for code in cells(chapter, "code")):
        return
    test = claims_test(chapter)
    assert test.exists(), f"{chapter.name} trains or draws at random, but {test.name} does not exist"
    text = test.read_text()
    assert "assert" in text and "def test_" in text, f"{test.name} asserts nothing"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_chapter_states_a_result_over_fewer_than_five_seeds(chapter):
    found = [m.group(0) for text in cells(chapter, "markdown") + cells(chapter, "code")
             for m in FEW_SEEDS.finditer(text)]
    assert not found, f"{chapter.name} states results over too few seeds: {found} (at least {seeds.MIN_SEEDS})"


def test_every_sweep_has_a_stored_table_of_enough_seeds_made_under_generic_kernels():
    sweeps = registered_sweeps()
    stored = {path.stem for path in seeds.TABLES.glob("*.json")}
    assert stored == set(sweeps), f"stored tables {sorted(stored)} but registered sweeps {sorted(sweeps)}"
    kernels = " ".join(f"{k}={v}" for k, v in seeds.GENERIC_KERNELS.items())
    for name, sweep in sweeps.items():
        table = seeds.load(name)
        assert table["seeds"] == sorted(sweep.seeds), f"{name}: stored seeds differ from the sweep's; re-run it"
        assert len(table["rows"]) >= seeds.MIN_SEEDS and table["kernels"] == kernels, name


def test_every_sweep_is_rederived_by_a_claims_test():
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_claims_ch*.py"))
    for name in registered_sweeps():
        assert re.search(rf"rederive\(\s*['\"]{name}['\"]", tests), f"no claims test re-derives a row of {name}"


def test_every_sweep_names_held_out_seeds_outside_its_table():
    for name, sweep in registered_sweeps().items():
        assert sweep.held_out, f"{name} names no held-out seeds: @seeds.sweep(..., held_out=(...))"
        assert not set(sweep.held_out) & set(seeds.load(name)["seeds"]), f"{name}: held-out seeds in its table"


def test_every_sweeps_held_out_seeds_are_asserted_by_a_claims_test():
    """Statically: some claims test calls held_out_rows or held_out_column with the sweep's name
    (a literal, or a module-level constant assigned that literal)."""
    texts = [p.read_text() for p in (ROOT / "tests").glob("test_claims_ch*.py")]
    for name in registered_sweeps():
        assert any(held_out_call(text, name) for text in texts), f"no claims test runs the held-out seeds of {name}"


def held_out_call(text, name):
    """Whether `text` calls seeds.held_out_rows / held_out_column on `name`, directly or through a
    constant (NAME = "..."), or through a helper taking the name (`column(key, name=...)`)."""
    constants = [c for c, value in re.findall(r"^(\w+)\s*=\s*['\"]([^'\"]+)['\"]", text, re.M) if value == name]
    quoted = rf"['\"]{re.escape(name)}['\"]"
    if re.search(rf"held_out_(rows|column)\(\s*{quoted}", text):
        return True
    if any(re.search(rf"held_out_(rows|column)\(\s*{c}\b", text) for c in constants):
        return True
    # a helper whose name argument is passed on: held_out_column(name, ...) and the sweep named elsewhere
    helper = re.search(r"held_out_(rows|column)\(\s*name\b", text)
    return bool(helper) and (re.search(quoted, text) is not None or bool(constants))


def test_the_static_check_finds_a_call_and_not_a_mention():
    assert held_out_call('rows = seeds.held_out_rows("x_sweep")', "x_sweep")
    assert held_out_call('NAME = "x_sweep"\nvalues = seeds.held_out_column(NAME, "key")', "x_sweep")
    assert not held_out_call('seeds.rederive("x_sweep", 0)\nseeds.held_out_rows("other")', "x_sweep")


def test_held_out_seeds_must_lie_outside_the_table():
    with pytest.raises(ValueError, match=r"held-out seeds \[3\] are in the table's seeds"):
        seeds.sweep("overlapping", seeds=range(5), tolerance=0.1, held_out=(3, 100))


def test_a_sweep_needs_five_seeds_and_a_tolerance():
    with pytest.raises(ValueError, match="3 seeds; a claim needs at least 5"):
        seeds.sweep("too_few", seeds=range(3), tolerance=0.1)
    with pytest.raises(ValueError, match="tolerance must be positive"):
        seeds.sweep("no_tolerance", seeds=range(5), tolerance=0)
    with pytest.raises(ValueError, match="no sweep named 'nowhere'"):
        seeds.get_sweep("nowhere")
