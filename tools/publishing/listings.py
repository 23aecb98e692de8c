"""The library code that a chapter shows: its `{literalinclude}` listings, found and read.

A chapter shows a function of the library with a Markdown cell such as

    ```{literalinclude} /src/mha/numpy/attention.py
    :language: python
    :pyobject: softmax
    ```

`listings(notebook)` finds them all; `listed_node(listing)` reads the object it shows (a
function, a class or `Class.method`) from the file, as a syntax tree; `listed_source` as text.
tools/publishing/make_handout.py hides some of them from the students (see hidden_listings),
and tools/grading/copies.py compares the learners' functions with them.
"""

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIRECTIVE = re.compile(r"^(?P<fence>`{3,}|:{3,})\{literalinclude\}[ \t]+(?P<path>\S+)[ \t]*\n"
                       r"(?P<options>(?:[ \t]*:[\w-]+:[^\n]*\n)*)(?P<body>.*?)^(?P=fence)[ \t]*$\n?", re.M | re.S)
PYOBJECT = re.compile(r"^[ \t]*:pyobject:[ \t]*(\S+)", re.M)


@dataclass(frozen=True)
class Listing:
    """One `{literalinclude}` of a notebook: in Markdown cell `cell`, the file `path` (as the directive
    writes it: `/src/...` from the repository's root) and the object `pyobject` ("" for a whole file);
    `text` is the directive as the cell holds it."""
    cell: int
    path: str
    pyobject: str
    text: str

    @property
    def file(self):
        """The listed file on disk."""
        return ROOT / self.path.lstrip("/")


def listings_in(source, cell=0):
    """The listings of one Markdown cell's source, in order."""
    found = []
    for match in DIRECTIVE.finditer(source if source.endswith("\n") else source + "\n"):
        pyobject = PYOBJECT.search(match.group("options"))
        found.append(Listing(cell, match.group("path"), pyobject.group(1) if pyobject else "", match.group(0)))
    return found


def listings(notebook):
    """Every listing of a notebook (an nbformat notebook), cell by cell."""
    return [listing for i, c in enumerate(notebook.cells) if c.cell_type == "markdown"
            for listing in listings_in(c.source, i)]


def find_object(tree, dotted):
    """The node of `dotted` ("name" or "Class.method") among the statements of `tree`, or None."""
    body, node = tree.body, None
    for part in dotted.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node


def listed_node(listing):
    """The syntax tree of what `listing` shows: the object's node, or the whole module for no pyobject.
    LookupError when the file or the object is not there."""
    if not listing.file.is_file():
        raise LookupError(f"{listing.path}: no such file")
    tree = ast.parse(listing.file.read_text())
    if not listing.pyobject:
        return tree
    node = find_object(tree, listing.pyobject)
    if node is None:
        raise LookupError(f"{listing.path} defines no {listing.pyobject}")
    return node


def listed_source(listing):
    """The text that `listing` shows (decorators included)."""
    text = listing.file.read_text()
    node = listed_node(listing)
    if isinstance(node, ast.Module):
        return text
    lines = text.splitlines()
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "\n".join(lines[first - 1:node.end_lineno]) + "\n"
