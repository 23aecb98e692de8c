"""The built site, tested in a real browser: Debian's chromium, driven by Playwright.

A fresh build of the book is served on 127.0.0.1 and every page is visited, as a
reader would: no JavaScript error; every formula typeset by MathJax; every image
loaded, with alt text; on chapter pages, code cells with outputs, captioned
figures, and launch (Colab, Binder) and download buttons that point at this
chapter's notebook; readable on a phone-width screen; figures still visible in
dark mode. The search page must find "softmax". A screenshot of each chapter
page is saved to _build/screenshots/ (look at them).

The pages load MathJax 3 from a CDN, which the test machines cannot reach: the
test answers those requests with the `mathjax@3` package from the npm registry,
which `make test` installs into .cache/mathjax. Any other request that leaves
127.0.0.1 is refused and reported. Without chromium, Playwright or that package
the tests skip with the reason, unless the environment variable CI is set: then
they fail.
"""

import functools
import http.server
import io
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
MATHJAX = ROOT / ".cache" / "mathjax" / "node_modules" / "mathjax"
MATHJAX_CDN = re.compile(r"^https://cdn\.jsdelivr\.net/npm/mathjax@3[^/]*/(?P<path>[^?#]+)")
SCREENSHOTS = ROOT / "_build" / "screenshots"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 375, "height": 740}


def toc_pages():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    return [f"{f}.html" for f in files]


PAGES = ["index.html", "search.html", "genindex.html"] + toc_pages()
CHAPTERS = sorted(p.stem for p in (ROOT / "book").glob("[0-9][0-9]_*.ipynb"))


def missing(reason):
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so the browser test may not skip: run `make test`)")
    pytest.skip(f"{reason}; `make test` installs it (as root on Debian)")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    result = subprocess.run([str(jupyter_book), "build", str(ROOT), "--path-output", str(out)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"book build failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return out / "_build" / "html"


@pytest.fixture(scope="module")
def server(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        missing(f"no {CHROMIUM}")
    if not (MATHJAX / "es5" / "tex-mml-chtml.js").exists():
        missing(f"MathJax 3 is not in {MATHJAX.relative_to(ROOT)}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("the playwright package is not installed")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


PAGE_TIMEOUT_MS = 180_000


class Visit:
    """One page opened in a fresh browser context, with everything that went wrong recorded."""

    def __init__(self, browser, base, page, viewport=DESKTOP, color_scheme="light"):
        self.errors, self.external, self.failed = [], [], []
        self.context = browser.new_context(viewport=viewport, color_scheme=color_scheme)
        # Generous: under `pytest -n 2` the other worker keeps both cores busy, and a long
        # chapter's formulas and figures then take far longer than the default 30 s to settle.
        self.context.set_default_timeout(PAGE_TIMEOUT_MS)
        self.context.route("**/*", functools.partial(self.route, base))
        self.page = self.context.new_page()
        self.page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))
        self.page.on("console", lambda msg: msg.type == "error" and self.errors.append(f"console: {msg.text}"))
        self.page.on("response", lambda r: r.status >= 400 and self.failed.append(f"{r.status} {r.url}"))
        self.page.goto(f"{base}/{page}", wait_until="load")
        self.page.wait_for_load_state("networkidle")
        if self.page.evaluate("() => !!window.MathJax && !!MathJax.startup"):
            self.page.evaluate("() => MathJax.startup.promise")
        self.page.evaluate("""() => Promise.all([...document.images].map(img => img.complete ? null :
            new Promise(done => { img.addEventListener('load', done); img.addEventListener('error', done); })))""")

    def route(self, base, route):
        url = route.request.url
        if url.startswith(base):
            return route.continue_()
        match = MATHJAX_CDN.match(url)
        if match and (MATHJAX / match["path"]).is_file():
            return route.fulfill(path=str(MATHJAX / match["path"]))
        self.external.append(url)
        return route.abort()

    def settle(self):
        """Wait until the theme's transitions (sidebars sliding, colours fading) have ended."""
        self.page.wait_for_timeout(50)
        self.page.wait_for_function("() => document.getAnimations().every(a => a.playState !== 'running')",
                                    timeout=30_000)

    def close(self):
        self.context.close()


DESKTOP_FACTS = """() => {
    const article = document.querySelector('article') || document.querySelector('.bd-content');
    const prose = article.cloneNode(true);
    prose.querySelectorAll('pre, code, script, style, mjx-container, .MathJax').forEach(e => e.remove());
    const maths = [...document.querySelectorAll('.math')];
    return {
        title: document.title,
        prose: prose.textContent,
        article: article.innerText,
        math: maths.length,
        untypeset: maths.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.slice(0, 80)),
        math_errors: [...document.querySelectorAll('mjx-merror')].map(e => e.getAttribute('data-mjx-error') || e.textContent),
        images: [...document.images].map(img => ({src: img.getAttribute('src'), width: img.naturalWidth,
            alt: (img.getAttribute('alt') || '').trim(), in_article: article.contains(img),
            caption: (img.closest('figure')?.querySelector('figcaption')?.textContent || '').trim()})),
        inputs: article.querySelectorAll('div.cell div.cell_input').length,
        outputs: article.querySelectorAll('div.cell div.cell_output').length,
        links: [...document.querySelectorAll('a[href]')].map(a => a.href),
        download: [...document.querySelectorAll('a.btn-download-source-button')].map(a => a.href),
    };
}"""

PHONE_FACTS = """() => {
    const width = window.innerWidth;
    const fits = e => e.getBoundingClientRect().right <= width + 1 && e.getBoundingClientRect().left >= -1;
    // A wide table or code block may scroll inside its own box, if that box fits the screen.
    const scrollsInside = e => {
        for (let box = e.parentElement; box; box = box.parentElement)
            if (getComputedStyle(box).overflowX !== 'visible' && fits(box)) return true;
        return false;
    };
    const article = document.querySelector('article') || document.querySelector('.bd-content');
    const wide = [...article.querySelectorAll('p, li, h1, h2, h3, figure, img, dl, table, .admonition')]
        .filter(e => e.getBoundingClientRect().width > 0 && !fits(e) && !scrollsInside(e))
        .map(e => e.tagName + ': ' + e.textContent.trim().slice(0, 60));
    const p = article.querySelector('p');
    return {width, page_width: document.scrollingElement.scrollWidth, wide,
            font: p ? parseFloat(getComputedStyle(p).fontSize) : 16};
}"""


def is_chapter(page):
    return page.startswith("book/") and Path(page).stem in CHAPTERS


def inspect(browser, base, page):
    """What a reader gets on `page`: at desktop width in light mode, then in dark mode, then on a phone.

    One load per page; dark mode and the phone width are applied to the loaded
    page (the theme follows the system's colour scheme; the layout is CSS).
    """
    visit = Visit(browser, base, page)
    try:
        facts = {"desktop": visit.page.evaluate(DESKTOP_FACTS)}
        if is_chapter(page):
            chapter = Path(page).stem
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            visit.page.screenshot(path=str(SCREENSHOTS / f"{chapter}.jpg"), full_page=True, type="jpeg", quality=80)
            launch = visit.page.locator(".dropdown-launch-buttons button")
            facts["launch_menu"] = launch.count()
            if launch.count():
                launch.first.click()
                facts["colab_visible_after_click"] = visit.page.locator(
                    ".dropdown-launch-buttons a[href*='colab']").first.is_visible()
                visit.page.keyboard.press("Escape")
                visit.page.mouse.move(0, 0)
            if facts["desktop"]["download"]:
                facts["download_body"] = visit.context.request.get(facts["desktop"]["download"][0]).body()
            facts["dark"] = dark_mode_facts(visit, chapter)
        visit.page.set_viewport_size(PHONE)
        visit.settle()
        facts["phone"] = visit.page.evaluate(PHONE_FACTS)
        if page == f"book/{CHAPTERS[0]}.html":
            visit.page.evaluate("() => window.scrollTo(0, 0)")
            visit.page.screenshot(path=str(SCREENSHOTS / f"phone_{CHAPTERS[0]}.png"))
    finally:
        visit.close()
    facts["errors"], facts["external"], facts["failed"] = visit.errors, visit.external, visit.failed
    return facts


def dark_mode_facts(visit, chapter):
    """Switch the system to dark mode; measure how each figure looks.

    A figure inside a collapsed block (an exercise's solution) is hidden in both
    modes: only the figures a reader sees in light mode are measured in dark mode.
    """
    figures = visit.page.locator("article figure img")
    shown = [figures.nth(i).is_visible() for i in range(figures.count())]
    visit.page.emulate_media(color_scheme="dark")
    visit.page.wait_for_function("() => document.documentElement.dataset.theme === 'dark'", timeout=30_000)
    visit.settle()
    looks = []
    for i in range(figures.count()):
        if shown[i]:
            image = figures.nth(i)
            visible = image.is_visible()
            looks.append({"visible": visible, "grey": luminance(image.screenshot(timeout=60_000)) if visible else (0, 0)})
    if chapter == CHAPTERS[0] and figures.count():
        figures.first.scroll_into_view_if_needed()
        visit.page.screenshot(path=str(SCREENSHOTS / f"dark_{chapter}.png"))
    background = visit.page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    visit.page.emulate_media(color_scheme="light")
    visit.settle()
    return {"figures": looks, "background": background}


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


def luminance(png):
    """Mean and spread of the grey levels of a screenshot."""
    from PIL import Image, ImageStat

    stat = ImageStat.Stat(Image.open(io.BytesIO(png)).convert("L"))
    return stat.mean[0], stat.stddev[0]


def test_every_built_page_is_visited(site):
    built = {p.relative_to(site).as_posix() for p in site.rglob("*.html")
             if not p.relative_to(site).parts[0].startswith("_")}
    assert built == set(PAGES), f"pages not visited: {built - set(PAGES)}; not built: {set(PAGES) - built}"


@pytest.mark.parametrize("page", PAGES)
def test_page_loads_without_javascript_error(look, page):
    facts = look(page)
    assert not facts["errors"], f"{page}: JavaScript errors: {facts['errors']}"
    assert not facts["failed"], f"{page}: requests that failed: {facts['failed']}"
    assert not facts["external"], f"{page}: requests leaving the site (other than MathJax): {facts['external']}"
    if page in toc_pages():  # (the search page and the empty general index have little text)
        text = facts["desktop"]["article"]
        assert facts["desktop"]["title"] and len(text.split()) > 100, f"{page}: nearly empty"


@pytest.mark.parametrize("page", PAGES)
def test_every_formula_is_typeset(look, page):
    facts = look(page)["desktop"]
    assert not facts["untypeset"], f"{page}: formulas MathJax did not typeset: {facts['untypeset'][:5]}"
    assert not facts["math_errors"], f"{page}: TeX errors: {facts['math_errors'][:5]}"
    for raw in ("$", "\\(", "\\)", "\\[", "\\]", "\\frac", "\\mathrm"):
        at = facts["prose"].find(raw)
        assert at < 0, f"{page}: raw TeX {raw!r} in the text: ...{facts['prose'][max(0, at - 60): at + 60]}..."


def test_formulas_are_there_to_typeset(look):
    """Guards the test above: the chapters have formulas, and MathJax rendered them."""
    facts = look(f"book/{CHAPTERS[0]}.html")["desktop"]
    assert facts["math"] > 10 and not facts["untypeset"]


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


def test_publishing_workflow_runs_the_ci_command_and_publishes_this_build():
    """The GitHub Pages workflow stays equivalent to .ci/run, and publishes what `make book` builds."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "publish.yml").read_text())
    build = workflow["jobs"]["test-and-build"]
    runs = [step.get("run", "") for step in build["steps"]]
    assert "bash .ci/run" in runs and "make book" in runs and runs.index("bash .ci/run") < runs.index("make book")
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^book:.*\n\t.*jupyter-book build \. -W -n", (ROOT / "Makefile").read_text(), re.M)
    pages = [s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact")]
    assert pages and pages[0]["with"]["path"] == "_build/html"
    deploy = workflow["jobs"]["deploy"]
    assert deploy["needs"] == "test-and-build" and deploy["steps"][0]["uses"].startswith("actions/deploy-pages")
    assert "pull_request" in deploy["if"], "a pull request must not publish"
