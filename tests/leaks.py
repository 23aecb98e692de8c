"""Reading a handout as a student could: every file, every link, every download.

Used by tests/test_handout.py to prove that no solution is reachable from the
student website or the student copy (everything under _handout/ but key/).
"""

import functools
import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat

LINK_ATTRIBUTES = {"href", "src", "action", "data", "poster", "formaction"}
JSON_ESCAPE = re.compile(r'\\(["\\/nt])')
WORD = re.compile(r"\w+")


def normal(text):
    return re.sub(r"\s+", " ", text).strip()


class PageParts(HTMLParser):
    """An HTML page's visible text (scripts and styles aside) and every address in its attributes."""

    def __init__(self):
        super().__init__()
        self.parts, self.links, self.skip = [], [], 0

    def handle_starttag(self, tag, attrs):
        self.skip += tag in ("script", "style")
        for name, value in attrs:
            if value and name in LINK_ATTRIBUTES:
                self.links.append(value)
            if value and name == "srcset":
                self.links += [part.split()[0] for part in value.split(",") if part.strip()]
        refresh = dict(attrs).get("content") or ""
        if tag == "meta" and "url=" in refresh.lower():  # <meta http-equiv="Refresh" content="0; url=...">
            self.links.append(refresh[refresh.lower().index("url=") + 4:].strip())

    def handle_endtag(self, tag):
        self.skip -= tag in ("script", "style")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def page_parts(path):
    parser = PageParts()
    parser.feed(Path(path).read_text())
    return parser


def readable_texts(path):
    """A file's text as a browser, Jupyter or a program shows it, each normalised:
    as stored, with HTML escapes undone, with JSON escapes undone, an HTML page's
    visible text, a notebook's cells. None for a binary file (an image, a font)."""
    path = Path(path)
    try:
        raw = path.read_text()
    except UnicodeDecodeError:
        return None
    texts = [raw, html.unescape(raw),
             JSON_ESCAPE.sub(lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), raw)]
    if path.suffix == ".html":
        texts.append("".join(page_parts(path).parts))
    if path.suffix == ".ipynb":
        cells = nbformat.read(path, as_version=4).cells
        texts.append("\n".join(c.source + json.dumps(c.get("outputs", [])) for c in cells))
    return [normal(text) for text in texts]


@functools.lru_cache(maxsize=None)
def words_of(line):
    """The words of a line: a solution line is looked for in every file of a handout, its words found once."""
    return frozenset(WORD.findall(line))


def found_in(lines, texts):
    """The lines that occur in any of the texts (a word test first, then the substring test)."""
    needed_words = {line: words_of(line) for line in lines}
    found = set()
    for text in texts:
        words = set(WORD.findall(text))
        found |= {line for line, needed in needed_words.items() if needed <= words and line in text}
    return found


def crawl(html_root):
    """(files reached, external addresses) following every local link from index.html.

    Raises AssertionError for a local link that leaves the website's folder."""
    root = Path(html_root).resolve()
    reached, external, todo = set(), set(), [root / "index.html"]
    while todo:
        page = todo.pop()
        if page in reached or not page.is_file():
            continue
        reached.add(page)
        if page.suffix != ".html":
            continue
        for link in page_parts(page).links:
            address = urlsplit(link)
            if address.scheme in ("http", "https") or link.startswith("//"):
                external.add(link)
            elif not address.scheme and address.path:
                target = (page.parent / unquote(address.path)).resolve()
                assert target == root or root in target.parents, f"{page.name}: {link} leads out of the website"
                todo.append(target / "index.html" if target.is_dir() else target)
    return reached, external


def text_files(*folders):
    """The normalised text of every text file under these folders (what the handout shares with the public)."""
    texts = []
    for folder in folders:
        for path in Path(folder).rglob("*"):
            if path.is_file() and path.suffix not in (".pyc", ".png", ".woff", ".woff2", ".ttf", ".svg"):
                try:
                    texts.append(normal(path.read_text()))
                except UnicodeDecodeError:
                    continue
    return texts
