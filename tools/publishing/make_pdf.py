"""The whole book as one PDF: `make pdf` writes _build/pdf/book.pdf.

    python -m tools.publishing.make_pdf                    # build the site offline, then print it
    python -m tools.publishing.make_pdf --site DIR         # print a site already built in DIR

The route: the HTML site, built with MathJax served by the site itself
(book/_ext/offline_site.py), is printed page by page, in the order of _toc.yml, by
the Debian chromium that the browser test already uses (through Playwright), and
the pages are joined into one PDF with pypdf, with one bookmark per page and the
page's sections beneath it. Why not LaTeX: Jupyter Book's LaTeX builder would need
a TeX Live of several hundred megabytes, and converted SVG figures and Unicode in
code; the printed HTML is the book exactly as readers see it, formulas typeset by
the same MathJax, figures embedded as they are on the site. The launch, download
and navigation buttons, the sidebars and the footer are hidden for print.
"""

import argparse
import functools
import http.server
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import yaml
from pypdf import PdfWriter

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "_build" / "pdf" / "book.pdf"
CHROMIUM = "/usr/bin/chromium"
MATHJAX = ROOT / ".cache" / "mathjax" / "node_modules" / "mathjax" / "es5"  # what `make browser` installs
MATHJAX_CDN = "https://cdn.jsdelivr.net/npm/mathjax@3"
HIDE_FOR_PRINT = """
.bd-header, .bd-sidebar-primary, .bd-sidebar-secondary, .header-article, .bd-header-article,
.prev-next-area, .bd-footer, .bd-footer-content, footer, .article-header-buttons, .dropdown-launch-buttons,
.btn-download-source-button, .headerlink, #pst-back-to-top, .search-button-field { display: none !important; }
.bd-main .bd-content .bd-article-container { max-width: 100% !important; }
body { font-size: 11pt; }
"""


def toc_pages():
    """The pages of _toc.yml, without suffix, in reading order: intro, notation, chapters, back matter."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]


def build_site(folder):
    """The book's HTML with MathJax served locally: folder/_build/html."""
    env = {**os.environ, "MHA_OFFLINE_SITE": "1"}
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    done = subprocess.run([str(jupyter_book), "build", str(ROOT), "-W", "-n", "--keep-going",
                           "--path-output", str(folder)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"the book did not build:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    return folder / "_build" / "html"


def serve(folder):
    """An HTTP server for `folder` on 127.0.0.1, in a thread: (server, base URL)."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_port}"


def answer(base, route):
    """Requests inside the site go through; MathJax's CDN is answered from the local npm copy
    (for a site built without OFFLINE=1); anything else is refused."""
    url = route.request.url
    if url.startswith(base):
        return route.continue_()
    path = MATHJAX / url.split("/es5/")[-1].split("?")[0] if url.startswith(MATHJAX_CDN) else None
    return route.fulfill(path=str(path)) if path and path.is_file() else route.abort()


def open_page(page, url, network_timeout_ms=30_000, mathjax_served=lambda src: True):
    """Go to `url`; wait until the page's formulas are typeset and its images decoded.

    Network idle is waited for at most `network_timeout_ms`: on a loaded machine a page
    was seen to never go idle (once in a PDF run, once in a browser test), so what a
    reader needs is awaited directly: MathJax's startup, where the page loads it from a
    source that `mathjax_served(src)` says is answered (a refused one would only time
    out), and every image. Returns the URLs still in flight when the wait for idle gave up."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    in_flight = set()
    page.on("request", lambda request: in_flight.add(request.url))
    page.on("requestfinished", lambda request: in_flight.discard(request.url))
    page.on("requestfailed", lambda request: in_flight.discard(request.url))
    page.goto(url, wait_until="load")
    try:
        page.wait_for_load_state("networkidle", timeout=network_timeout_ms)
        unsettled = []
    except PlaywrightTimeout:
        unsettled = sorted(in_flight)
    sources = page.evaluate("() => [...document.scripts].map(s => s.src).filter(s => s.includes('tex-mml'))")
    if any(mathjax_served(src) for src in sources):
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
        page.evaluate("() => MathJax.startup.promise")
    page.evaluate("""() => Promise.all([...document.images].map(img => img.complete ? null :
        new Promise(done => { img.addEventListener('load', done); img.addEventListener('error', done); })))""")
    return unsettled


def print_page(browser, base, page_path, target):
    """One page of the site, printed to `target`; returns its title."""
    page = browser.new_page(viewport={"width": 1000, "height": 1200})
    page.set_default_timeout(180_000)
    page.route("**/*", functools.partial(answer, base))
    open_page(page, f"{base}/{page_path}.html")
    page.add_style_tag(content=HIDE_FOR_PRINT)
    page.emulate_media(media="print")
    title = page.evaluate("() => (document.querySelector('article h1') || {}).textContent || document.title")
    page.pdf(path=str(target), format="A4", print_background=True, outline=True, tagged=True,
             margin={"top": "18mm", "bottom": "18mm", "left": "16mm", "right": "16mm"})
    page.close()
    return title.replace("#", "").strip()


def print_book(site, output):
    from playwright.sync_api import sync_playwright
    httpd, base = serve(site)
    writer = PdfWriter()
    try:
        with sync_playwright() as playwright, tempfile.TemporaryDirectory() as scratch:
            browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                                 args=["--headless", "--no-sandbox", "--disable-gpu"])
            for i, page in enumerate(toc_pages()):
                part = Path(scratch) / f"{i:02d}.pdf"
                title = print_page(browser, base, page, part)
                writer.append(str(part), outline_item=title, import_outline=True)
            browser.close()
    finally:
        httpd.shutdown()
    writer.add_metadata({"/Title": yaml.safe_load((ROOT / "_config.yml").read_text())["title"]})
    writer.page_mode = "/UseOutlines"  # a reader opens the PDF with its bookmarks shown
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "wb") as stream:
        writer.write(stream)
    return output


def main(args):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, help="an offline build of the site to print")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    options = parser.parse_args(args)
    from tools.publishing.output_folder import file_refusal
    why = file_refusal(options.output, ".pdf", lambda path: path.read_bytes()[:5] == b"%PDF-")
    if why:
        parser.error(f"--output: {why}; nothing was overwritten")
    site = options.site or build_site(ROOT / "_build" / "pdf" / "site")
    output = print_book(site, options.output)
    print(f"{output}: {len(PdfWriter(str(output)).pages)} pages")


if __name__ == "__main__":
    main(sys.argv[1:])
