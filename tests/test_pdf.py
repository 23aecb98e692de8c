"""The book as one PDF (`make pdf`, tools/publishing/make_pdf.py): every chapter is in it, with its title
as a bookmark; formulas are typeset (their symbols are text, no TeX source is left); the
figures are embedded; no launch, download or navigation button is printed; and the page
count is that of a book. The test prints the site that this test run built (shared with
tests/test_site.py), so it adds the printing only: about a minute on two cores."""

import json
import re
import unicodedata

import pytest

from conftest import CHAPTERS
from site_browser import chromium_browser

from tools.publishing import make_pdf


def plain(text):
    """Text as written in the sources: ligatures ("ﬀ") spelled out, typographic quotes made straight."""
    return unicodedata.normalize("NFKC", text).replace("\u2019", "'").replace("\u2018", "'")


def chapter_title(path):
    """The chapter's title: the first Markdown heading of its notebook."""
    cells = json.loads(path.read_text())["cells"]
    first = next(c for c in cells if c["cell_type"] == "markdown")
    return "".join(first["source"]).splitlines()[0].lstrip("# ").strip()


@pytest.fixture(scope="module")
def book(built_site, tmp_path_factory):
    html, code, log = built_site
    assert code == 0, log
    for _ in chromium_browser(needs_mathjax=True):  # skips (or fails in CI) without chromium or MathJax
        break
    from pypdf import PdfReader
    return PdfReader(make_pdf.print_book(html, tmp_path_factory.mktemp("pdf") / "book.pdf"))


@pytest.fixture(scope="module")
def text(book):
    return plain("\n".join(page.extract_text() for page in book.pages))


def test_every_chapter_is_in_the_pdf_with_a_bookmark(book, text):
    bookmarks = [plain(item.title) for item in book.outline if not isinstance(item, list)]
    for chapter in CHAPTERS:
        title = chapter_title(chapter)
        assert title in text.replace("\n", " "), f"{chapter.name}: its title {title!r} is not in the PDF"
        assert any(title in mark for mark in bookmarks), f"{chapter.name}: no bookmark for {title!r}"
    assert len(bookmarks) == len(make_pdf.toc_pages()), "one bookmark per page of the table of contents"


def test_formulas_are_typeset_not_left_as_tex(text):
    for raw in ("$$", "\\frac", "\\sqrt", "\\(", "\\mathrm", "\\top"):
        assert raw not in text, f"raw TeX {raw!r} in the PDF"
    # Inline math left as TeX: $...$ on one line. A lone "$" is no formula: chapter 14 prints a
    # sample that a model wrote at a high temperature, and it holds one.
    inline = re.findall(r"\$[^$\n]{1,80}\$", text)
    assert not inline, f"raw TeX in the PDF: {inline[:3]}"
    for symbol in ("√", "∈", "×", "⊤"):
        assert symbol in text, f"no typeset {symbol!r} in the PDF: are the formulas there?"


def embedded_images(xobjects):
    """The image XObjects among a page's (or a form's) XObjects, those inside its forms included.

    Counted from the objects' dictionaries: `page.images` would decode every image (half a minute)."""
    found = 0
    for name in xobjects:
        xobject = xobjects[name].get_object()
        if xobject.get("/Subtype") == "/Image":
            found += 1
        elif xobject.get("/Subtype") == "/Form" and "/XObject" in xobject.get("/Resources", {}):
            found += embedded_images(xobject["/Resources"]["/XObject"].get_object())
    return found


def test_figures_are_embedded(book):
    images = sum(embedded_images(page["/Resources"]["/XObject"].get_object()) for page in book.pages
                 if "/XObject" in page.get("/Resources", {}))
    assert images >= 2 * len(CHAPTERS), f"only {images} images embedded for {len(CHAPTERS)} chapters"


def test_no_button_or_navigation_is_printed(text):
    for chrome in ("Download source file", "Fullscreen", "Print to PDF", "Launch", "Skip to main content",
                   "Back to top", "previous page", "next page"):  # whole words: "LaunchTimeout" is code, no button
        assert not re.search(rf"\b{re.escape(chrome)}\b", text), f"{chrome!r} was printed"


def test_the_page_count_is_that_of_a_book(book):
    assert 20 * len(CHAPTERS) <= len(book.pages) <= 80 * len(CHAPTERS), f"{len(book.pages)} pages"
