"""The suite's own machinery: the order of the work units, the kernel passes, the table of times and
`make quick`'s stamps (tests/unit_order.py, kernel_passes.py, stage_times.py, quick.py)."""

import json

import pytest

import kernel_passes
import quick
import stage_times
import unit_order


def test_the_longest_units_start_first_and_the_two_workers_end_together():
    durations = {"a": 100.0, "b": 60.0, "c": 50.0, "d": 10.0}
    assert unit_order.schedule(durations) == ["a", "b", "c", "d"]  # b and c on one worker (110), a and d (110)


def test_a_unit_that_would_wait_on_the_other_workers_build_is_passed_over(monkeypatch):
    monkeypatch.setattr(unit_order, "SHARED_BUILDS", {"site": ({"site_1", "site_2"}, 50.0)})
    durations = {"site_1": 100.0, "site_2": 90.0, "x": 30.0, "y": 30.0, "z": 5.0}
    order = unit_order.schedule(durations)
    # site_1 builds from t=0; site_2 would wait until t=50, so x then y go first on the other worker
    assert order[:4] == ["site_1", "x", "y", "site_2"]
    assert sorted(order) == sorted(durations)


def test_a_pass_never_measured_is_estimated_from_its_chapter():
    seconds = {"book/05_x.ipynb": 20.0}
    assert unit_order.estimate("book/05_x.ipynb@generic", seconds) == 30.0
    assert unit_order.estimate("tests/test_new.py", seconds) == unit_order.UNKNOWN_SECONDS


@pytest.mark.parametrize("asked,expected", [("", []), ("all", ["generic", "avx2"]), ("generic", ["generic"]),
                                            (" avx2 , generic ", ["avx2", "generic"])])
def test_the_kernel_passes_asked(monkeypatch, asked, expected):
    monkeypatch.setenv("MHA_KERNEL_PASSES", asked)
    assert kernel_passes.passes_asked() == expected


def test_an_unknown_kernel_pass_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("MHA_KERNEL_PASSES", "generic,avx512")
    with pytest.raises(pytest.UsageError, match="avx512"):
        kernel_passes.passes_asked()


@pytest.mark.parametrize("capability,runs,main_env", [("AVX512", ["generic", "avx2"], {}),
                                                      ("AVX2", ["generic"], kernel_passes.PASSES["avx2"])])
def test_the_avx2_pass_is_dropped_only_where_it_repeats_the_main_run(monkeypatch, capability, runs, main_env):
    monkeypatch.setenv("MHA_KERNEL_PASSES", "all")
    monkeypatch.setattr(kernel_passes, "native_capability", lambda: capability)
    assert kernel_passes.passes_to_run() == (runs, main_env)


def notebook(prose, code):
    return json.dumps({"cells": [{"cell_type": "markdown", "source": prose, "metadata": {}},
                                 {"cell_type": "code", "source": code, "metadata": {}}]}).encode()


def test_the_grading_view_of_a_notebook_sees_code_and_directives_not_prose():
    view = quick.code_and_directives
    base = view(notebook("Some prose.\n```{exercise}\n:label: ex-ch5-x\n", "x = 1"))
    assert view(notebook("Other prose.\n```{exercise}\n:label: ex-ch5-x\n", "x = 1")) == base
    assert view(notebook("Some prose.\n```{exercise}\n:label: ex-ch5-y\n", "x = 1")) != base
    assert view(notebook("Some prose.\n```{exercise}\n:label: ex-ch5-x\n", "x = 2")) != base


def test_a_claims_file_reads_its_own_chapter_and_the_site_reads_them_all():
    claims_files, _ = quick.book_inputs("tests/test_claims_ch05.py")
    assert [p.name for p in claims_files] == [p.rsplit("/", 1)[-1] for p in quick.chapters() if "/05_" in p]
    site_files, view = quick.book_inputs("tests/test_site.py")
    assert view is None and len([p for p in site_files if p.suffix == ".ipynb"]) == len(quick.chapters())
    _, grading_view = quick.book_inputs("tests/test_grading.py")
    assert grading_view is quick.code_and_directives
    assert quick.book_inputs("tests/test_masks.py") is None


def test_a_unit_is_stamped_only_when_it_and_every_pass_of_it_passed(tmp_path, monkeypatch):
    monkeypatch.setattr(quick, "STAMPS", tmp_path / "stamps.json")
    monkeypatch.setattr(quick, "SNAPSHOT", tmp_path / "snapshot.json")
    quick.SNAPSHOT.write_text(json.dumps({"book/05_x.ipynb": "h5", "book/06_y.ipynb": "h6", "tests/test_a.py": "ha",
                                          "tests/test_b.py": "hb"}))
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"exitstatus": 1, "units": {"book/05_x.ipynb": 1, "book/05_x.ipynb@generic": 1,
                                                          "book/06_y.ipynb": 1, "book/06_y.ipynb@avx2": 1,
                                                          "tests/test_a.py": 1},
                               "failed": ["book/06_y.ipynb@avx2"]}))
    assert quick.record(run) == 2
    assert json.loads(quick.STAMPS.read_text()) == {"book/05_x.ipynb": "h5", "tests/test_a.py": "ha"}
    assert quick.plan({"book/05_x.ipynb": "h5", "tests/test_a.py": "changed", "tests/test_b.py": "hb"}) == [
        "tests/test_a.py", "tests/test_b.py"]


def test_the_table_shows_the_stages_the_passes_and_the_slowest_units(tmp_path, monkeypatch):
    monkeypatch.setattr(stage_times, "FOLDER", tmp_path)
    monkeypatch.setattr(stage_times, "STAGES", tmp_path / "stages.json")
    monkeypatch.setattr(stage_times, "MAIN", tmp_path / "main.json")
    stage_times.start()
    stage_times.mark("install")
    stage_times.MAIN.write_text(json.dumps({"units": {"book/05_x.ipynb": 10.0, "book/05_x.ipynb@generic": 14.0,
                                                      "tests/test_heads.py@generic": 6.0, "tests/test_site.py": 50.0},
                                            "failed": ["tests/test_site.py"]}))
    stage_times.mark("pytest session")
    rows = dict(stage_times.rows())
    assert [name for name, _ in stage_times.rows()][:2] == ["install", "pytest session"]
    assert rows["    chapters (+ tests/test_heads.py), generic kernels"] == 20.0
    assert rows["    chapters (+ tests/test_heads.py), this CPU's kernels"] == 10.0
    assert rows["  busy worker-seconds in the pytest session"] == 80.0
    assert "    tests/test_site.py  (FAILED)" in rows
