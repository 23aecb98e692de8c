"""The browser side of tests/test_site.py: open a page of the built site in chromium with every
request outside 127.0.0.1 refused, gather what a reader sees, and run axe-core on it.
"""

import functools
import io
import os
import re
from pathlib import Path

import pytest

from conftest import CHAPTERS as CHAPTER_PATHS, ROOT

from tools.publishing import make_pdf  # its local HTTP server

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
MATHJAX = ROOT / ".cache" / "mathjax" / "node_modules" / "mathjax"
MATHJAX_CDN = re.compile(r"^https://cdn\.jsdelivr\.net/npm/mathjax@3[^/]*/(?P<path>[^?#]+)")
AXE = ROOT / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"  # `make browser` installs it
SCREENSHOTS = ROOT / "_build" / "screenshots"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 375, "height": 740}
CHAPTERS = [p.stem for p in CHAPTER_PATHS]


PAGE_TIMEOUT_MS = 180_000


def missing(reason):
    """Skip for want of a browser, except in CI, where that is a failure."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so the browser test may not skip: run `make test`)")
    pytest.skip(f"{reason}; `make test` installs it (as root on Debian)")


def chromium_browser(needs_mathjax):
    """Debian's chromium under Playwright (a generator, for a fixture), or a skip saying what is missing."""
    if not CHROMIUM.exists():
        missing(f"no {CHROMIUM}")
    if needs_mathjax and not (MATHJAX / "es5" / "tex-mml-chtml.js").exists():
        missing(f"MathJax 3 is not in {MATHJAX.relative_to(ROOT)}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("the playwright package is not installed")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


def serve(folder):
    """Serve `folder` on 127.0.0.1 (a generator, for a fixture): yields the base URL."""
    httpd, base = make_pdf.serve(folder)
    yield base
    httpd.shutdown()
    httpd.server_close()


class Visit:
    """One page opened in a fresh browser context, with everything that went wrong recorded.

    Requests outside the site are refused and recorded in `external`: the site must work alone,
    MathJax included. Only with offline=False is MathJax's CDN answered from the local npm copy."""

    def __init__(self, browser, base, page, viewport=DESKTOP, color_scheme="light", offline=True):
        self.offline, self.base = offline, base
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
        # What was still loading when the wait for network idle gave up (not an error in itself).
        self.unsettled = self.open(f"{base}/{page}")

    def open(self, url):
        """make_pdf.open_page, with MathJax awaited only where it is served: from the site, or
        from its CDN answered locally (offline=False). A refused request would only time out,
        while the page's raw formulas and `external` say what went wrong."""
        def served(src):
            return src.startswith(self.base) or bool(not self.offline and MATHJAX_CDN.match(src))

        return make_pdf.open_page(self.page, url, mathjax_served=served)

    def route(self, base, route):
        url = route.request.url
        if url.startswith(base):
            return route.continue_()
        match = MATHJAX_CDN.match(url)
        if match and not self.offline and (MATHJAX / match["path"]).is_file():
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
        mathjax_outside: [...document.scripts].map(s => s.src)
            .filter(src => /mathjax/i.test(src) && !src.startsWith(location.origin)),
        math_errors: [...document.querySelectorAll('mjx-merror')].map(e => e.getAttribute('data-mjx-error') || e.textContent),
        images: [...document.images].map(img => ({src: img.getAttribute('src'), width: img.naturalWidth,
            alt: (img.getAttribute('alt') || '').trim(), in_article: article.contains(img),
            caption: (img.closest('figure')?.querySelector('figcaption')?.textContent || '').trim()})),
        inputs: article.querySelectorAll('div.cell div.cell_input').length,
        outputs: article.querySelectorAll('div.cell div.cell_output').length,
        links: [...document.querySelectorAll('a[href]')].map(a => a.href),
        download: [...document.querySelectorAll('a.btn-download-source-button')].map(a => a.href),
        clipped: [...article.querySelectorAll('pre')]
            .filter(p => p.getBoundingClientRect().width > 0 && p.scrollWidth > p.clientWidth + 1)
            .map(p => p.textContent.trim().slice(0, 80)),
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


# axe-core's rules on the whole page. A node counts as the course's own when it lies in the article
# (the chapter's text and outputs, the head viewer) or in the footer line that _config.yml writes.
AXE_RUN = """async () => {
    const own = [...document.querySelectorAll('article.bd-article, .mha-footer')];
    const result = await axe.run(document, {resultTypes: ['violations'], elementRef: true});
    return result.violations.map(v => ({rule: v.id, help: v.help, nodes: v.nodes.map(n => ({
        own: own.some(o => n.element instanceof Node && o.contains(n.element)),
        target: n.target.join(' '), html: n.html.slice(0, 160)}))}));
}"""


def axe_violations(visit):
    """axe-core's violations on the page as it is now (None without axe-core): [{rule, help, nodes}]."""
    if not AXE.is_file():
        return None
    if not visit.page.evaluate("() => !!window.axe"):
        visit.page.add_script_tag(path=str(AXE))  # inline: no request leaves the page
    return visit.page.evaluate(AXE_RUN)


def is_chapter(page):
    return page.startswith("book/") and Path(page).stem in CHAPTERS


def inspect(browser, base, page):
    """What a reader gets on `page`: at desktop width in light mode, then in dark mode, then on a phone;
    with axe-core's findings in light and dark mode.

    One load per page; dark mode and the phone width are applied to the loaded
    page (the theme follows the system's colour scheme; the layout is CSS).
    """
    visit = Visit(browser, base, page)
    try:
        facts = {"desktop": visit.page.evaluate(DESKTOP_FACTS), "axe": {"light": axe_violations(visit)}}
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
        facts["dark"] = dark_mode_facts(visit, Path(page).stem if is_chapter(page) else None)
        facts["axe"]["dark"] = facts["dark"].pop("axe")
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
    """Switch the system to dark mode; run axe-core; on a chapter, measure how each figure looks.

    A figure inside a collapsed block (an exercise's solution) is hidden in both
    modes: only the figures a reader sees in light mode are measured in dark mode.
    """
    figures = visit.page.locator("article figure img")
    shown = [chapter is not None and figures.nth(i).is_visible() for i in range(figures.count())]
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
    violations = axe_violations(visit)
    visit.page.emulate_media(color_scheme="light")
    visit.settle()
    return {"figures": looks, "background": background, "axe": violations}


def luminance(png):
    """Mean and spread of the grey levels of a screenshot."""
    from PIL import Image, ImageStat

    stat = ImageStat.Stat(Image.open(io.BytesIO(png)).convert("L"))
    return stat.mean[0], stat.stddev[0]
