"""The built site, tested in a real browser: Debian's chromium, driven by Playwright.

A fresh build of the book is served on 127.0.0.1 and every page is visited, as a
reader would: no JavaScript error; every formula typeset by MathJax; every image
loaded, with alt text; on chapter pages, code cells with outputs, captioned
figures, and launch (Colab, Binder) and download buttons that point at this
chapter's notebook; readable on a phone-width screen; figures still visible in
dark mode. The search page must find "softmax". A screenshot of each chapter
page is saved to _build/screenshots/ (look at them).

Every request that leaves 127.0.0.1 is refused and reported: the site must work
alone, as on a student's laptop with no network. So it serves MathJax 3 itself
(book/_ext/offline_site.py copies the `mathjax@3` npm package that `make test`
installs into .cache/mathjax); a site that loads MathJax from a CDN fails
test_every_formula_is_typeset, which says so.

Accessibility: axe-core (npm, `make browser` installs it into .cache/axe) runs on
every page in light and in dark mode; test_accessibility_of_the_course_s_own_content
and test_accessibility_of_the_theme_within_its_baseline say how its findings are held.

Without chromium, Playwright, MathJax or axe-core the tests skip with the reason,
unless the environment variable CI is set: then they fail.
"""

import json
import re

import pytest
import yaml

from conftest import ROOT, toc_files
from site_browser import AXE, CHAPTERS, Visit, chromium_browser, inspect, missing, serve
from viewer_browser import drive_keyboard, drive_viewer


# The chapters that show mha.viewer's interactive head viewer in an output.
VIEWER_CHAPTERS = [c for c in CHAPTERS if "data-mha-viewer" in (ROOT / "book" / f"{c}.ipynb").read_text()]
PAGES = ["index.html", "search.html", "genindex.html"] + [f"{f}.html" for f in toc_files()]
MODES = ["light", "dark"]
AXE_BASELINE = ROOT / "tests" / "data" / "axe_baseline.json"  # {page: {mode: {rule: nodes}}}, the theme's only


@pytest.fixture(scope="module")
def site(built_site):
    """The book as `make book` builds it (shared with tests/test_book.py: built once per run)."""
    html, _, log = built_site
    assert (html / "index.html").exists(), f"the book was not built:\n{log}"
    return html


@pytest.fixture(scope="module")
def server(site):
    yield from serve(site)


@pytest.fixture(scope="module")
def browser():
    yield from chromium_browser(needs_mathjax=True)


@pytest.fixture(scope="module")
def look(browser, server):
    """inspect(page), once per page: the tests on a page share one visit (and its failure)."""
    seen = {}

    def facts(page):
        if page not in seen:
            try:
                seen[page] = inspect(browser, server, page)
            except Exception as error:  # noqa: BLE001 - stored, and raised again for each test of the page
                seen[page] = error
        if isinstance(seen[page], Exception):
            raise seen[page]
        return seen[page]

    return facts


def repository():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url = config["repository"]["url"].rstrip("/")
    return config, url.split("github.com/")[1], config["repository"].get("branch", "main")


def test_every_built_page_is_visited(site):
    built = {p.relative_to(site).as_posix() for p in site.rglob("*.html")
             if not p.relative_to(site).parts[0].startswith("_")}
    assert built == set(PAGES), f"pages not visited: {built - set(PAGES)}; not built: {set(PAGES) - built}"


@pytest.mark.parametrize("page", PAGES)
def test_page_loads_without_javascript_error(look, page):
    facts = look(page)
    assert not facts["errors"], f"{page}: JavaScript errors: {facts['errors']}"
    assert not facts["failed"], f"{page}: requests that failed: {facts['failed']}"
    assert not facts["external"], f"{page}: requests leaving the site: {facts['external']}"
    if page in [f"{f}.html" for f in toc_files()]:  # (the search page and the empty general index have little text)
        text = facts["desktop"]["article"]
        assert facts["desktop"]["title"] and len(text.split()) > 100, f"{page}: nearly empty"


@pytest.mark.parametrize("page", PAGES)
def test_every_formula_is_typeset(look, page):
    """With the network blocked: MathJax comes from the site itself, and typesets every formula."""
    facts = look(page)["desktop"]
    assert not facts["mathjax_outside"], (
        f"{page}: the page loads MathJax from outside the site, {facts['mathjax_outside']}, and the test refuses "
        f"every request that leaves 127.0.0.1: the site must serve MathJax itself (book/_ext/offline_site.py)")
    assert not facts["untypeset"], f"{page}: formulas MathJax did not typeset: {facts['untypeset'][:5]}"
    assert not facts["math_errors"], f"{page}: TeX errors: {facts['math_errors'][:5]}"
    for raw in ("$", "\\(", "\\)", "\\[", "\\]", "\\frac", "\\mathrm"):
        at = facts["prose"].find(raw)
        assert at < 0, f"{page}: raw TeX {raw!r} in the text: ...{facts['prose'][max(0, at - 60): at + 60]}..."


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_formulas_are_there_to_typeset(look, chapter):
    """Guards the test above: every chapter has formulas (80 or more today), and MathJax rendered them."""
    facts = look(f"book/{chapter}.html")["desktop"]
    assert facts["math"] >= 20 and not facts["untypeset"], f"{chapter}: {facts['math']} formulas"


@pytest.mark.parametrize("page", PAGES)
def test_every_image_is_loaded_and_has_alt_text(look, page):
    for image in look(page)["desktop"]["images"]:
        assert image["width"] > 0, f"{page}: image not loaded: {image['src']}"
        assert image["alt"], f"{page}: image without alt text: {image['src']}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_shows_code_outputs_and_captioned_figures(look, chapter):
    facts = look(f"book/{chapter}.html")["desktop"]
    assert facts["inputs"] >= 5 and facts["outputs"] >= 3, \
        f"{chapter}: {facts['inputs']} code cells and {facts['outputs']} outputs shown"
    assert "google.colab" not in facts["article"], f"{chapter}: the Colab install cell is shown on the page"
    figures = [i for i in facts["images"] if i["in_article"]]
    assert figures, f"{chapter}: no figure"
    for image in figures:
        assert image["caption"], f"{chapter}: a figure without caption: {image['src']}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_launch_and_download_buttons_point_at_the_chapter_notebook(look, chapter):
    config, owner_repo, branch = repository()
    launch = config["launch_buttons"]
    notebook = f"book/{chapter}.ipynb"
    assert (ROOT / notebook).exists()
    facts = look(f"book/{chapter}.html")
    links = facts["desktop"]["links"]
    colab = f"{launch['colab_url'].rstrip('/')}/github/{owner_repo}/blob/{branch}/{notebook}"
    binder = f"{launch['binderhub_url'].rstrip('/')}/v2/gh/{owner_repo}/{branch}?urlpath="
    assert colab in links, f"{chapter}: no Colab button to {colab}"
    binder_links = [link for link in links if link.startswith(binder)]
    assert binder_links and all(link.endswith(f"tree/{notebook}") for link in binder_links), \
        f"{chapter}: Binder buttons {binder_links} do not open {notebook}"
    assert facts["launch_menu"] == 1 and facts["colab_visible_after_click"], f"{chapter}: the launch menu does not open"
    download = facts["desktop"]["download"]
    assert len(download) == 1 and download[0].endswith(f"/_sources/{notebook}"), download
    assert json.loads(facts["download_body"]) == json.loads((ROOT / notebook).read_text()), \
        f"{chapter}: the download button does not serve {notebook}"


def test_search_finds_softmax(browser, server):
    visit = Visit(browser, server, "search.html?q=softmax")
    try:
        visit.page.wait_for_function(
            "() => /found \\d+ page/.test(document.querySelector('#search-results')?.innerText)", timeout=60_000)
        hits = visit.page.eval_on_selector_all("#search-results ul.search li a", "links => links.map(a => a.href)")
    finally:
        visit.close()
    assert any(f"book/{CHAPTERS[0]}.html" in hit for hit in hits), f"softmax not found in chapter 1: {hits}"
    assert len({h.split("#")[0] for h in hits}) >= 3, f"softmax should be found on several pages: {hits}"
    assert not visit.errors, visit.errors


def test_the_head_viewer_is_used_where_the_book_reads_heads():
    assert {"07_why_heads_differ", "11_training_a_transformer"} <= set(VIEWER_CHAPTERS), VIEWER_CHAPTERS


@pytest.mark.parametrize("chapter", VIEWER_CHAPTERS)
def test_head_viewers_work_on_the_static_page_with_the_network_blocked(browser, server, chapter):
    """Every viewer on the page: choose layers, click heads, point at tokens, then drive it with the
    arrow keys, and see the right weights, with no kernel and every request outside the site refused."""
    visit = Visit(browser, server, f"book/{chapter}.html")
    try:
        roots = visit.page.locator("[data-mha-viewer]")
        assert roots.count() >= 1, f"{chapter}: no head viewer on the page"
        checked = [drive_viewer(visit.page, roots.nth(i)) for i in range(roots.count())]
        pressed = [drive_keyboard(visit.page, roots.nth(i)) for i in range(roots.count())]
    finally:
        visit.close()
    assert all(n >= 3 for n in checked) and all(n >= 10 for n in pressed), (checked, pressed)
    assert not visit.errors and not visit.external, (visit.errors, visit.external)


@pytest.mark.parametrize("page", PAGES)
def test_no_code_line_is_clipped_at_desktop_width(look, page):
    """A long line of code or output wraps; it never hides past its box's edge."""
    clipped = look(page)["desktop"]["clipped"]
    assert not clipped, f"{page}: code or output wider than its box: {clipped[:3]}"


@pytest.mark.parametrize("page", PAGES)
def test_narrow_screen_has_no_horizontal_overflow(look, page):
    facts = look(page)["phone"]
    assert facts["page_width"] <= facts["width"], f"{page}: the page scrolls sideways on a phone: {facts}"
    assert not facts["wide"], f"{page}: text wider than a phone screen: {facts['wide'][:5]}"
    assert facts["font"] >= 14, f"{page}: text too small on a phone ({facts['font']} px)"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_dark_mode_keeps_figures_visible(look, chapter):
    dark = look(f"book/{chapter}.html")["dark"]
    assert dark["figures"], f"{chapter}: no figure"
    for i, figure in enumerate(dark["figures"]):
        mean, spread = figure["grey"]
        assert figure["visible"], f"{chapter}: figure {i + 1} hidden in dark mode"
        # The figures are drawn dark on white: they stay readable only on a light ground.
        assert mean > 120, f"{chapter}: figure {i + 1} is dark in dark mode (mean grey {mean:.0f}; page {dark['background']})"
        assert spread > 10, f"{chapter}: figure {i + 1} shows no contrast in dark mode (spread {spread:.0f})"


def axe_findings(look, page, mode):
    """axe-core's violations on `page` in `mode`, or a skip (a failure under CI) without axe-core."""
    found = look(page)["axe"][mode]
    if found is None:
        missing(f"axe-core is not in {AXE.parent.relative_to(ROOT)} (npm install axe-core@4.14.1)")
    return found


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("page", PAGES)
def test_accessibility_of_the_course_s_own_content(look, page, mode):
    """axe-core finds nothing in the course's own content, on every page, in light and dark mode.

    The course's own content is what lies inside the article (`article.bd-article`: the text,
    the code cells and their outputs, the figures, the head viewer) or in the footer line of
    _config.yml. Everything else (the sidebars, the header bar, the search dialog) is the
    theme's. The course's violations are never kept in a baseline: they are fixed."""
    own = [(v["rule"], n["target"], n["html"]) for v in axe_findings(look, page, mode) for n in v["nodes"] if n["own"]]
    assert not own, f"{page} ({mode} mode): axe-core finds in the course's content (rule, where, html): {own[:5]}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("page", PAGES)
def test_accessibility_of_the_theme_within_its_baseline(look, page, mode):
    """The theme's violations (outside the course's content) stay within tests/data/axe_baseline.json.

    The baseline counts the nodes of each (page, mode, rule) that no template or CSS override in
    book/_templates or book/_static could fix. A rule not in it, or more nodes than it counts,
    fails; a page or mode missing from it has an empty baseline. Fewer nodes pass: lower the
    count in the file, so that the fixed violation cannot come back unseen."""
    theme = {}
    for violation in axe_findings(look, page, mode):
        nodes = [n["target"] for n in violation["nodes"] if not n["own"]]
        if nodes:
            theme[violation["rule"]] = nodes
    allowed = json.loads(AXE_BASELINE.read_text()).get(page, {}).get(mode, {})
    over = {rule: nodes for rule, nodes in theme.items() if len(nodes) > allowed.get(rule, 0)}
    assert not over, (f"{page} ({mode} mode): the theme's violations beyond the baseline "
                      f"{ {rule: allowed.get(rule, 0) for rule in over} } (rule: where): {over}")


def test_the_accessibility_baseline_names_only_pages_and_modes_of_the_site():
    baseline = json.loads(AXE_BASELINE.read_text())
    unknown = set(baseline) - set(PAGES)
    assert not unknown, f"pages in {AXE_BASELINE.name} that the site has not: {unknown}"
    for page, modes in baseline.items():
        assert set(modes) <= set(MODES), (page, modes)
        assert all(isinstance(n, int) and n > 0 for rules in modes.values() for n in rules.values()), (page, modes)
