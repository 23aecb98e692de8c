"""Exercises and the instructors' handout.

Every chapter has exercises of the three kinds with worked solutions; the
handout made by tools/publishing/make_handout.py holds no line of any solution in any file
but the key, and no link from its website leads to one (no repository button;
launch buttons only to the student repository of handout.yml); its notebooks
stop at the first stub, and the key's code passes every check. Grading:
tests/test_grading.py.
"""

import contextlib
import functools
import html
import io
import re
import shutil
from pathlib import Path

import nbformat
import pydata_sphinx_theme
import pytest
import sphinx_book_theme
import yaml
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from conftest import CHAPTERS, ROOT
from handouts import code_solutions, prose_solutions, shared_handout, solution_lines
from leaks import crawl, found_in, readable_texts, text_files
from site_browser import DESKTOP_FACTS, Visit, chromium_browser, serve

from tools.publishing import colab_cell, handout_manifest, make_handout, student_copy

KINDS = {"Implement", "Predict", "Experiment"}
STUDENT_REPOSITORY = ("https://github.com/example-course/mha-students", "main")
LAUNCH_SITES = ("colab.research.google.com", "mybinder.org")


def exercises(path):
    """(label, kind, difficulty) of each exercise in a chapter."""
    return [(e["label"], e["kind"], e["difficulty"]) for e in handout_manifest.chapter_exercises(path)]


@functools.cache
def distinctive_solution_lines():
    """Every chapter's solution lines, but those that the library's sources or the website
    theme's own files also hold (`return allowed`): they are no sign of a leak."""
    lines = {line for chapter in CHAPTERS for line in solution_lines(chapter)}
    shared = text_files(ROOT / "src", Path(pydata_sphinx_theme.__file__).parent,
                        Path(sphinx_book_theme.__file__).parent)
    return lines - found_in(lines, shared)


@pytest.fixture(scope="module")
def handout(tmp_path_factory):
    """The handout as `make handout` writes it when handout.yml names no student repository, website
    included: the one that the grading tests share (tests/handouts.py), built once per run. Read only."""
    return shared_handout(tmp_path_factory, html=True)


@pytest.fixture(scope="module")
def handout_with_student_repository(tmp_path_factory):
    """A handout of its own: with a student repository, its notebooks (install cell) and website (launch
    buttons) differ from the shared handout's."""
    return make_handout.make_handout(tmp_path_factory.mktemp("handout") / "out", repository=STUDENT_REPOSITORY)


@pytest.fixture(scope="module")
def student_copy_to_run(handout, tmp_path_factory):
    """The shared handout's student copy, copied: the notebooks run there, where they may write files."""
    return Path(shutil.copytree(handout / "student", tmp_path_factory.mktemp("run") / "student"))


def handout_files(handout):
    """Every file of a handout but the answer key."""
    return [p for p in handout.rglob("*") if p.is_file() and p.relative_to(handout).parts[0] != "key"]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_chapter_has_four_exercises_of_the_three_kinds(chapter):
    found = exercises(chapter)
    assert len(found) >= 4, f"{chapter.name}: {len(found)} exercises"
    assert {kind for _, kind, _ in found} == KINDS, f"{chapter.name}: kinds {found}"
    assert len(code_solutions(chapter)) >= 1
    assert solution_lines(chapter), f"{chapter.name}: no solution text found"
    cells = nbformat.read(chapter, as_version=4).cells
    explained = len(prose_solutions(cells))
    assert explained >= sum(kind != "Implement" for _, kind, _ in found), \
        f"{chapter.name}: a Predict or Experiment exercise without a written explanation"


def test_instructor_page_lists_every_exercise():
    page = (ROOT / "book" / "instructors.md").read_text()
    for chapter in CHAPTERS:
        for label, _, _ in exercises(chapter):
            assert label in page, f"{label} missing from the instructors' page"
    assert "This public book shows every solution" in page, "the warning that the book shows the solutions"


@pytest.mark.parametrize("which", ["handout", "handout_with_student_repository"])
def test_no_solution_is_reachable_from_the_student_site_or_copy(which, request):
    """Every local link from the website stays in it; no file of the handout but the key
    (pages, downloads, notebooks, the list of exercises, the library) holds a solution line."""
    handout = request.getfixturevalue(which)
    reached, _ = crawl(handout / "html")
    assert {p.relative_to(handout / "html").as_posix() for p in reached} >= {
        f"book/{c.stem}.html" for c in CHAPTERS} | {f"_sources/book/{c.name}" for c in CHAPTERS}
    lines = distinctive_solution_lines()
    for path in handout_files(handout):
        texts = readable_texts(path)
        leaked = found_in(lines, texts) if texts else set()
        assert not leaked, f"{path.relative_to(handout)} holds solution text: {sorted(leaked)[:3]}"
    for page in (handout / "html" / "book").glob("*.html"):
        assert 'class="solution' not in page.read_text(), f"a solution admonition in {page.name}"


@pytest.mark.parametrize("which", ["handout", "handout_with_student_repository"])
def test_nothing_in_the_handout_leads_to_the_public_repository(which, request):
    """No repository, edit or issue button; the public repository's address (and its GitHub
    Pages site) written in no file but the key: no Colab, Binder or pip link to its notebooks."""
    handout = request.getfixturevalue(which)
    url, _ = colab_cell.repository()
    owner_repo = url.split("github.com/")[1].lower()
    needles = [owner_repo, f"{owner_repo.split('/')[0]}.github.io"]
    for path in handout_files(handout):
        texts = readable_texts(path) or []
        assert not any(n in t.lower() for n in needles for t in texts), f"{path.relative_to(handout)} names {url}"
    for page in (handout / "html").rglob("*.html"):
        assert "btn-source-" not in page.read_text(), f"a repository, edit or issue button in {page.name}"


def test_the_leak_detector_sees_solutions_where_they_are(handout, tmp_path):
    """The detector above finds the key's solutions in its notebooks, and a solution line
    cut into highlighted tokens on a web page."""
    lines = distinctive_solution_lines()
    for chapter in CHAPTERS:
        assert found_in(lines, readable_texts(handout / "key" / chapter.name)), chapter.name
    line = max(lines, key=len)
    page = tmp_path / "page.html"
    page.write_text("<pre>" + "".join(f'<span class="n">{html.escape(t)}</span>' for t in re.split(r"(\W)", line))
                    + "</pre>")
    assert found_in(lines, readable_texts(page)) == {line}


def launch_links(handout):
    _, external = crawl(handout / "html")
    return {link for link in external if any(site in link for site in LAUNCH_SITES)}


def test_without_a_student_repository_there_is_no_launch_button_nor_colab_cell(handout):
    assert launch_links(handout) == set()
    config = yaml.safe_load((handout / "student" / "_config.yml").read_text())
    assert config["html"]["use_repository_button"] is False and not config["repository"]["url"]
    for path in (handout / "student" / "book").glob("*.ipynb"):
        assert not any(colab_cell.is_install_cell(c) for c in nbformat.read(path, as_version=4).cells)


def test_launch_buttons_open_the_student_repository_only(handout_with_student_repository):
    handout, (url, branch) = handout_with_student_repository, STUDENT_REPOSITORY
    owner_repo = url.split("github.com/")[1]
    links = launch_links(handout)
    assert {site for site in LAUNCH_SITES if any(site in link for link in links)} == set(LAUNCH_SITES)
    for link in links:
        assert f"/{owner_repo}/" in link, f"a launch button to another repository: {link}"
        opened = re.search(rf"/{branch}[/?](?:urlpath=lab/tree/)?(book/\w+\.ipynb)$", link)
        assert opened and (handout / "student" / opened.group(1)).is_file(), f"{link}: no student notebook"
    for path in (handout / "student" / "book").glob("[0-9]*.ipynb"):
        first = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        assert colab_cell.is_install_cell(first) and f'"git+{url}@{branch}"' in first.source


def test_the_student_repository_is_one_setting_and_never_the_public_one(tmp_path):
    settings = tmp_path / "handout.yml"
    settings.write_text("student_repository:\n  url: https://github.com/example-course/mha-students/\n")
    assert student_copy.student_repository(settings) == STUDENT_REPOSITORY
    settings.write_text(f"student_repository:\n  url: {colab_cell.repository()[0]}\n  branch: main\n")
    with pytest.raises(SystemExit, match="public course repository"):
        student_copy.student_repository(settings)
    page = (ROOT / "book" / "instructors.md").read_text()
    assert "handout.yml" in page and "student_repository" in page


def test_public_book_keeps_its_solutions():
    for chapter in CHAPTERS:
        text = " ".join(c.source for c in nbformat.read(chapter, as_version=4).cells)
        assert text.count("{solution") >= len(exercises(chapter))
        assert ":class: dropdown" in text


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_student_notebook_stops_at_the_first_stub(student_copy_to_run, chapter):
    student = student_copy_to_run / "book" / chapter.name
    notebook = nbformat.read(student, as_version=4)
    stubs = [i for i, c in enumerate(notebook.cells) if "exercise-stub" in c.metadata.get("tags", [])]
    assert stubs, f"{chapter.name}: no stub in the student notebook"
    for i in stubs:
        assert "raise NotImplementedError" in notebook.cells[i].source
        assert notebook.cells[i].source.lstrip().startswith("def "), "a stub is a function to fill in"
        assert "check_" in notebook.cells[i + 1].source, "a stub must be followed by its check"
    client = NotebookClient(notebook, timeout=300, kernel_name="python3", shutdown_kernel="immediate",
                            resources={"metadata": {"path": str(student.parent)}})  # killed: a graceful end waits ~2 s
    with pytest.raises(CellExecutionError) as info:
        client.execute()
    assert info.value.ename == "NotImplementedError"
    ran = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code" and c.execution_count]
    assert max(ran) == stubs[0] + 1, "execution must stop at the check right after the first stub"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_key_code_passes_its_check(chapter):
    setup = next(c.source for c in nbformat.read(chapter, as_version=4).cells
                 if c.cell_type == "code" and "google.colab" not in c.source)  # the imports cell
    for label, code, check in code_solutions(chapter):
        if not make_handout.stub_for(code):
            continue  # a predict-then-run solution: nbval runs it with the chapter
        assert "check_" in check, f"{label}: the cell after the solution must run its check"
        namespace = {}
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(setup, namespace)
            exec(code, namespace)
            exec(check, namespace)
        assert "passed" in printed.getvalue(), f"{label}: check did not report success"


# The students' website is sent as a zip: it must work with no network at all.

@pytest.fixture(scope="module")
def student_site(handout):
    yield from serve(handout / "html")


@pytest.fixture(scope="module")
def browser():
    yield from chromium_browser(needs_mathjax=False)


def test_the_student_site_loads_no_script_or_style_from_elsewhere(handout):
    for page in (handout / "html").rglob("*.html"):
        text = page.read_text()
        remote = re.findall(r'<(?:script|link)\b[^>]*(?:src|href)="(?:https?:)?//[^"]*"', text)
        assert not remote, f"{page.relative_to(handout / 'html')}: loads {remote[:3]}"
        assert "thebe" not in text.lower(), f"{page.relative_to(handout / 'html')}: thebe is still there"
    assert (handout / "html" / "_static" / "mathjax" / "tex-mml-chtml.js").is_file()


@pytest.mark.parametrize("page", ["book/intro.html", f"book/{CHAPTERS[0].stem}.html", f"book/{CHAPTERS[-1].stem}.html"])
def test_the_student_site_typesets_its_formulas_with_the_network_blocked(browser, student_site, page):
    visit = Visit(browser, student_site, page, offline=True)
    try:
        facts = visit.page.evaluate(DESKTOP_FACTS)
    finally:
        visit.close()
    assert not visit.external, f"{page}: asked the network for {visit.external}"
    assert not visit.errors and not visit.failed, (visit.errors, visit.failed)
    if page != "book/intro.html":
        assert facts["math"] > 5, f"{page}: only {facts['math']} formulas"
    assert not facts["untypeset"] and not facts["math_errors"], (facts["untypeset"][:3], facts["math_errors"][:3])
