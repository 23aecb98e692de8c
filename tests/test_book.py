"""The book builds with no warning, and every page is complete once rendered.

nbval (run by the same test command) re-executes each chapter and compares its
stored outputs; this file checks the other half: what the reader sees.
"""

import re
from html.parser import HTMLParser

import nbformat
import pytest

from conftest import CHAPTERS, ROOT, toc_files


@pytest.fixture(scope="module")
def site(built_site):
    html, returncode, log = built_site
    assert returncode == 0, f"book build failed or warned:\n{log}"
    return html


class PageText(HTMLParser):
    """The visible text of the article, and its images."""

    def __init__(self):
        super().__init__()
        self.text, self.prose, self.images, self.skip, self.code = [], [], [], 0, 0

    def handle_starttag(self, tag, attrs):
        self.skip += tag in ("script", "style")
        self.code += tag == "pre"
        if tag == "img":
            self.images.append(dict(attrs))

    def handle_endtag(self, tag):
        self.skip -= tag in ("script", "style")
        self.code -= tag == "pre"

    def handle_data(self, data):
        if not self.skip:
            self.text.append(data)
            if not self.code:
                self.prose.append(data)


def read_page(site, name):
    html = (site / f"{name}.html").read_text()
    article = html[html.index("<article"): html.index("</article>")]
    parser = PageText()
    parser.feed(article)
    return article, " ".join(parser.text), parser.images, " ".join(parser.prose)


def test_every_toc_file_exists_and_every_chapter_is_in_the_toc():
    files = toc_files()
    for f in files:
        assert (ROOT / f"{f}.md").exists() or (ROOT / f"{f}.ipynb").exists(), f
    assert {f"book/{c.stem}" for c in CHAPTERS} <= set(files)
    assert len(CHAPTERS) >= 6


@pytest.mark.parametrize("name", toc_files())
def test_page_has_no_raw_markup_or_placeholder(site, name):
    article, text, images, prose = read_page(site, name)
    assert "$" not in prose, f"{name}: a formula was not converted to math (a raw $ in the text)"
    for raw in ("{literalinclude}", "{cite}", "{doc}", "{numref}", "```", ":::", "TODO", "TBD",
                "Lorem", "placeholder"):
        assert raw not in text, f"{name}: raw or placeholder text {raw!r} in the page"
    assert "Traceback" not in text, f"{name}: a traceback in the page"
    assert len(text.split()) > 150, f"{name}: page is nearly empty"


@pytest.mark.parametrize("chapter", [c.stem for c in CHAPTERS])
def test_chapter_page_has_code_outputs_and_captioned_figures(site, chapter):
    article, text, images, _ = read_page(site, f"book/{chapter}")
    assert "cell_output" in article, f"{chapter}: no stored outputs rendered"
    assert images, f"{chapter}: no figure"
    for image in images:
        assert image.get("alt"), f"{chapter}: an image without alt text: {image.get('src')}"
    assert article.count("<figcaption") >= len(images), f"{chapter}: a figure without caption"
    assert re.search(r"\bdef\s+\w+\s*\(", text), f"{chapter}: no library code included"
    assert re.search(r"Summary", text), f"{chapter}: no summary"


def markdown_sources():
    for path in sorted((ROOT / "book").glob("*.md")):
        yield path.name, path.read_text()
    for path in CHAPTERS:
        cells = nbformat.read(path, as_version=4).cells
        yield path.name, "\n\n".join(c.source if c.cell_type == "markdown" else "CODE" for c in cells)


@pytest.mark.parametrize("name,source", list(markdown_sources()), ids=[n for n, _ in markdown_sources()])
def test_no_section_is_empty(name, source):
    """Every heading is followed by something before the next heading."""
    source = re.sub(r"```.*?```", "CODE", source, flags=re.S)
    blocks = re.split(r"^(#{1,6} .*)$", source, flags=re.M)
    headings, bodies = blocks[1::2], blocks[2::2]
    for i, (heading, body) in enumerate(zip(headings, bodies)):
        level = len(heading) - len(heading.lstrip("#"))
        next_level = len(headings[i + 1]) - len(headings[i + 1].lstrip("#")) if i + 1 < len(headings) else 0
        has_subsections = next_level > level
        assert body.strip() or has_subsections, f"{name}: the section {heading!r} is empty"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_notebook_is_stored_executed_in_order_without_errors(chapter):
    notebook = nbformat.read(chapter, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), f"{chapter.name}: not executed top to bottom"
    for cell in code:
        assert not any(o.output_type == "error" for o in cell.outputs), f"{chapter.name}: stored error"
        stderr = [o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stderr"]
        assert not stderr, f"{chapter.name}: a warning in the stored output: {stderr[0][:300]}"
    literal = [c for c in notebook.cells if c.cell_type == "markdown" and "{literalinclude} /src/mha/" in c.source]
    assert literal, f"{chapter.name}: shows no library code by inclusion"
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            for match in re.finditer(r"\{literalinclude\} (\S+)\n(?::language: \w+\n)?:pyobject: (\S+)", cell.source):
                path, obj = ROOT / match.group(1).lstrip("/"), match.group(2).split(".")[0]
                assert re.search(rf"^(def|class) {obj}\b", path.read_text(), re.M), f"{obj} not in {path}"


def literalincludes():
    """(page, path, pyobject) of every {literalinclude} in the book's notebooks and pages."""
    found = []
    directive = re.compile(r"```\{literalinclude\} (\S+)\n((?::[^\n]*\n)*)")
    for page in sorted((ROOT / "book").glob("*.ipynb")) + sorted((ROOT / "book").glob("*.md")):
        cells = nbformat.read(page, as_version=4).cells if page.suffix == ".ipynb" else []
        texts = [c.source + "\n" for c in cells if c.cell_type == "markdown"] or [page.read_text()]
        for text in texts:
            for match in directive.finditer(text):
                obj = re.search(r":pyobject: (\S+)", match[2])
                found.append((page.name, match[1], obj[1] if obj else None))
    return found


def defines(path, dotted):
    """Whether a Python file defines `dotted` at its top level: a function, a class, or Class.method."""
    import ast

    body = ast.parse(path.read_text()).body
    for name in dotted.split("."):
        match = [n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name]
        if not match:
            return False
        body = match[0].body
    return True


def test_every_literalinclude_names_a_file_and_an_object_that_exist():
    includes = literalincludes()
    assert len(includes) > 30, "the book shows library code by {literalinclude}"
    for page, path, pyobject in includes:
        source = ROOT / path.lstrip("/")
        assert source.is_file(), f"{page}: {{literalinclude}} {path}: no such file"
        if pyobject:
            assert defines(source, pyobject), f"{page}: {path} defines no {pyobject}"


def test_the_intro_counts_the_exercises_and_their_checks_exactly():
    """The intro's numbers are those of the chapters: every exercise, the checked Implement ones,
    and the Predict and Experiment ones graded by hand."""
    from tools.publishing.handout_manifest import chapter_exercises

    exercises = [e for page in toc_files() if (ROOT / f"{page}.ipynb").exists()
                 for e in chapter_exercises(ROOT / f"{page}.ipynb")]
    implement = [e for e in exercises if e["kind"] == "Implement"]
    assert all(e["checks"] for e in implement), "an Implement exercise without a check"
    intro = " ".join((ROOT / "book" / "intro.md").read_text().split())
    assert f"exercises, {len(exercises)} in all" in intro
    assert f"The {len(implement)} Implement exercises each come with an automatic check" in intro
    assert f"the {len(exercises) - len(implement)} Predict and Experiment exercises" in intro
