"""Whether a learner's function is the library's code: syntax trees compared, names and docstrings aside.

`normalised(node)` is a function's syntax tree with its docstrings and annotations dropped and
every name (arguments, variables, globals such as `np`, the function's own name) renamed by order
of first appearance: two functions that differ only in names, comments, docstrings, layout or
annotations give the same text.

`copies_of(cells, name, chapter)` is what tools/grading/notebook.py writes in the `copy` column of
grades.csv for the function `name` of a submitted notebook (its code cells `cells`), in the grader's
own process. It takes the definition of `name` that the notebook leaves in force (the last top-level
`def`) and the learner's own functions that it calls, however deep, and compares each with

- the library function it replaces, `mha.numpy.<name>`, and every function of mha.numpy that this
  one calls, however deep (read with `inspect` in the grader's process);
- every function or method that the chapter shows with `{literalinclude}` (tools/publishing/listings.py),
  read from the grader's own copy of the chapter, `chapter` (never from the submission). Gradescope's
  zip (tools/grading/make_gradescope.py) holds no book/: there the library alone is compared.

Identical normalised trees are a copy: "the library's code: mha.numpy.softmax". Otherwise two
functions are compared as token sequences (the normalised tree's text with every renamed name written
alike, so that one added statement does not renumber the rest), by difflib's ratio: at `NEAR` (0.9)
or more the copy is near, reported with its similarity ("nearly the library's code (93% alike): ..."),
but only when both functions have at least `SHORT_NODES` syntax-tree nodes (30, about two short
statements). Below that (`return np.repeat(x, n_rep, axis=-3)`, a formula on one line) everyone
writes the same tokens: a short function is reported only when identical, marked "short, often
written alike", for the instructor to judge. The column never changes a grade.

Why 0.9 (measured on the library of November 2026): the from-scratch solutions of
tests/solutions_*.py score at most 0.87 against the library and the listings (top_k_filter, four
lines written the way the library writes them), most below 0.8; a copy of an exercise's library
function with one statement added, one attribute renamed or one constant changed scores 0.94 or
more. What it cannot see: statements reordered or rewritten, loops written as comprehensions,
algebraic rewrites, code from anywhere but the library and the chapter.

The comparisons run in the grader's process, outside the sandbox, so they are bounded: a learner's
function is compared only with candidates whose length allows a ratio of NEAR (difflib's quick
bounds first), and a notebook's comparisons stop after COMPARE_SECONDS, saying so in the column.
"""

import ast
import contextlib
import copy
import difflib
import functools
import inspect
import re
import sys
import textwrap
import time
import types
from dataclasses import dataclass
from pathlib import Path

import nbformat

NEAR = 0.9  # difflib ratio of the token sequences from which a copy is reported as near
SHORT_NODES = 30  # fewer syntax-tree nodes (about two short statements): short, reported only when identical
LIBRARY = "mha.numpy"
COMPARE_SECONDS = 20.0  # the most a notebook's comparisons may take in the grader's process
ROOT = Path(__file__).resolve().parents[2]


def is_docstring(statement):
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


class Renamer(ast.NodeTransformer):
    """Names, arguments and function names replaced by v0, v1, ... in order of first appearance
    (all by `v` when `numbered` is False); docstrings, decorators and annotations dropped."""

    def __init__(self, numbered=True):
        self.names, self.numbered = {}, numbered

    def new_name(self, name):
        return self.names.setdefault(name, f"v{len(self.names)}" if self.numbered else "v")

    def visit_FunctionDef(self, node):
        node.name = self.new_name(node.name)
        node.decorator_list, node.returns, node.type_comment = [], None, None
        if node.body and is_docstring(node.body[0]):
            node.body = node.body[1:] or [ast.Pass()]
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        node.name = self.new_name(node.name)
        if node.body and is_docstring(node.body[0]):
            node.body = node.body[1:] or [ast.Pass()]
        self.generic_visit(node)
        return node

    def visit_arg(self, node):
        node.arg, node.annotation, node.type_comment = self.new_name(node.arg), None, None
        return node

    def visit_Name(self, node):
        node.id = self.new_name(node.id)
        return node

    def visit_AnnAssign(self, node):
        self.generic_visit(node)
        node.annotation = ast.Constant(None)
        return node


def normalised(node, numbered=True):
    """The text of `node`'s normalised syntax tree (see the module's docstring); `numbered=False`
    writes every name alike (`v`), for the similarity of two trees."""
    tree = Renamer(numbered).visit(copy.deepcopy(node))
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


TOKEN = re.compile(r"'(?:[^'\\]|\\.)*'|\w+|[^\w\s]")
SILENT = {"(", ")", ",", "Load", "Store", "Del"}  # tokens that tell nothing of the code


@dataclass(frozen=True)
class Shape:
    """What is compared of one function: its normalised text, its tokens (names written alike), its size."""
    text: str
    tokens: tuple
    nodes: int

    @classmethod
    def of(cls, node):
        alike = Renamer(numbered=False).visit(copy.deepcopy(node))
        text = ast.dump(alike, annotate_fields=False, include_attributes=False)
        tokens = tuple(t for t in TOKEN.findall(text) if t not in SILENT)
        return cls(normalised(node), tokens, sum(not isinstance(n, ast.expr_context) for n in ast.walk(alike)))


def similarity(a, b):
    """difflib's ratio (0 to 1) of two Shapes' token sequences; 1 for identical normalised trees."""
    if a.text == b.text:
        return 1.0
    matcher = difflib.SequenceMatcher(None, a.tokens, b.tokens, autojunk=False)
    return matcher.ratio() if matcher.real_quick_ratio() >= NEAR and matcher.quick_ratio() >= NEAR else 0.0


@dataclass(frozen=True)
class Candidate:
    """A function a learner could have copied: `label` names it in the report, `key` (module, qualified
    name) tells the same function met twice (in the library and in a listing)."""
    label: str
    key: tuple
    shape: Shape


# The library ---------------------------------------------------------------------------------------------

def function_node(fn):
    """The syntax tree of a function's definition, from its source."""
    return ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]


def library_label(fn):
    face = sys.modules.get(LIBRARY)
    short = getattr(face, fn.__name__, None) is fn
    return f"{LIBRARY}.{fn.__name__}" if short else f"{fn.__module__}.{fn.__qualname__}"


def called_in_library(fn, node):
    """The functions of mha.numpy that `fn` (whose syntax tree is `node`) names: `f(...)`, `module.f`."""
    found = []
    for part in ast.walk(node):
        value = None
        if isinstance(part, ast.Name):
            value = fn.__globals__.get(part.id)
        elif isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name):
            owner = fn.__globals__.get(part.value.id)
            if isinstance(owner, types.ModuleType) and owner.__name__.startswith(LIBRARY):
                value = getattr(owner, part.attr, None)
        value = inspect.unwrap(value) if callable(value) else value
        if isinstance(value, types.FunctionType) and value.__module__.startswith(LIBRARY + "."):
            found.append(value)
    return found


@functools.lru_cache(maxsize=None)
def library_candidates(name):
    """`mha.numpy.<name>` and the functions of mha.numpy it calls, however deep, as Candidates
    ([] when mha.numpy has no function `name`)."""
    import mha.numpy as face
    first = getattr(face, name, None)
    first = inspect.unwrap(first) if callable(first) else first
    todo, seen, found = [first] if isinstance(first, types.FunctionType) else [], set(), []
    while todo:
        fn = todo.pop(0)
        if fn in seen:
            continue
        seen.add(fn)
        try:
            node = function_node(fn)
        except (OSError, TypeError, SyntaxError):  # no source to read
            continue
        found.append(Candidate(library_label(fn), (fn.__module__, fn.__qualname__), Shape.of(node)))
        todo += called_in_library(fn, node)
    return tuple(found)


# The chapter's listings ----------------------------------------------------------------------------------

def module_of(path):
    """`/src/mha/numpy/attention.py` -> `mha.numpy.attention`; a file outside src/ keeps its path."""
    parts = Path(path.lstrip("/")).with_suffix("").parts
    if parts[:1] != ("src",):
        return path.lstrip("/")
    return ".".join(p for p in parts[1:] if p != "__init__")


def functions_in(node, prefix=""):
    """(qualified name, node) of the function `node`, of the methods of a class, of a module's functions."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [(prefix + node.name, node)]
    if isinstance(node, ast.ClassDef):
        return [f for part in node.body for f in functions_in(part, f"{prefix}{node.name}.")
                if not isinstance(part, ast.ClassDef)]
    if isinstance(node, ast.Module):
        return [f for part in node.body for f in functions_in(part, prefix)]
    return []


def shown_line_numbers(listing):
    """The line numbers of its file that `listing` shows (`:start-at:`, `:lines:` ... applied), or None
    when they cannot be told (then all of the object or file counts as shown)."""
    from tools.publishing.hidden_listings import shown_lines
    try:
        return shown_lines(listing)[1]
    except Exception:  # noqa: BLE001 - an option this reading does not know: the whole object
        return None


def is_shown(function, numbers):
    return numbers is None or bool(numbers & set(range(function.lineno, function.end_lineno + 1)))


@functools.lru_cache(maxsize=None)
def listed_candidates(chapter):
    """Every function and method that the chapter at `chapter` (a path) shows with `{literalinclude}`,
    in part or whole (a listing of part of a file, `:start-at:` or `:lines:`, shows the functions it cuts into)."""
    from tools.publishing.listings import listed_node, listings
    found = {}
    for listing in listings(nbformat.read(chapter, as_version=4)):
        try:
            node = listed_node(listing)
        except (LookupError, SyntaxError):
            continue
        prefix, numbers = listing.pyobject.rpartition(".")[0], shown_line_numbers(listing)
        for qualified, function in functions_in(node, prefix + "." if prefix else ""):
            if not is_shown(function, numbers):
                continue
            module = module_of(listing.path)
            label = f"{module}.{qualified}" if module.startswith("mha") else f"{module}: {qualified}"
            found.setdefault((module, qualified), Candidate(label, (module, qualified), Shape.of(function)))
    return tuple(found.values())


def candidates(name, chapter):
    """The library's candidates for `name`, then the chapter's listings; one shown by both is labelled
    "(shown in the chapter)"."""
    listed = {c.key: c for c in (listed_candidates(str(chapter)) if chapter else ())}
    merged = [Candidate(c.label + (" (shown in the chapter)" if c.key in listed else ""), c.key, c.shape)
              for c in library_candidates(name)]
    known = {c.key for c in merged}
    return merged + [Candidate(f"{c.label} (the chapter's listing)", c.key, c.shape)
                     for c in listed.values() if c.key not in known]


# The learner's functions ---------------------------------------------------------------------------------

def rebound(statement):
    """The names a top-level statement other than a `def` binds (assigned, imported, deleted, a class)."""
    names = [statement.name] if isinstance(statement, ast.ClassDef) else []
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        names += [(alias.asname or alias.name).split(".")[0] for alias in statement.names]
    return names + [part.id for part in ast.walk(statement) if isinstance(part, ast.Name)
                    and isinstance(part.ctx, (ast.Store, ast.Del))]


def learner_definitions(cells):
    """{name: the top-level `def` the notebook leaves in force, or None when a later statement rebinds it}
    over the code cells (strings) in order; a cell that does not parse is skipped."""
    from tools.grading.notebook_slice import python_of
    defined = {}
    for source in cells:
        try:
            tree = ast.parse(python_of(source))
        except SyntaxError:
            continue
        for statement in tree.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined[statement.name] = statement
            else:
                for bound in rebound(statement):
                    if bound in defined:
                        defined[bound] = None
    return {name: node for name, node in defined.items() if node is not None}


def learner_functions(defined, name):
    """[(name, node)]: the definition of `name` in force, then the learner's functions it calls, however
    deep ([] when the notebook defines no `name`); `defined`: learner_definitions of the notebook."""
    todo, found = [name] if name in defined else [], {}
    while todo:
        current = todo.pop(0)
        if current in found:
            continue
        found[current] = defined[current]
        todo += [n.id for n in ast.walk(defined[current]) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                 and n.id in defined]
    return list(found.items())


# The report ----------------------------------------------------------------------------------------------

def best_match(shape, known):
    """(similarity, candidate) of the candidate most like `shape`, or None when none is a copy."""
    scored = [(similarity(shape, c.shape), c) for c in known]
    scored = [(s, c) for s, c in scored if s == 1.0 or (s >= NEAR and min(shape.nodes, c.shape.nodes) >= SHORT_NODES)]
    return max(scored, key=lambda sc: sc[0], default=None)


def described(similar, candidate, shape):
    """One finding: "the library's code: mha.numpy.softmax", "nearly the library's code (93% alike): ..."."""
    whose = "the library's code" if candidate.key[0].startswith("mha") else "the chapter's code"
    if similar < 1.0:
        return f"nearly {whose} ({int(similar * 100)}% alike): {candidate.label}"
    short = ", short, often written alike" if shape.nodes < SHORT_NODES else ""
    return f"{whose}{short}: {candidate.label}"


def copies_of(cells, name, chapter=None, defined=None, deadline=None):
    """What the `copy` column says of the function `name` of a notebook whose code cells are `cells`
    (strings), against the library and the listings of `chapter` (the grader's own copy of the chapter's
    notebook, a path): "" when nothing matched, else "; "-separated findings, the function's own first.
    `defined`: learner_definitions(cells), when already read; `deadline` (time.monotonic()): past it, the
    functions not yet compared are said to be so."""
    known = candidates(name, chapter)
    said = []
    for own, node in learner_functions(learner_definitions(cells) if defined is None else defined, name):
        if deadline is not None and time.monotonic() > deadline:
            said.append(f"`{own}` and the functions after it not compared (past {COMPARE_SECONDS:g} s)")
            break
        shape = Shape.of(node)
        match = best_match(shape, known)
        if match:
            said.append(("" if own == name else f"helper `{own}`: ") + described(*match, shape))
    return "; ".join(said)


def copy_column(cells, functions, notebook):
    """{function: what the `copy` column says} for the graded `functions` of a submission whose code cells
    are `cells`, against the chapter `notebook` as the manifest names it (`book/05_....ipynb`), read from
    the grader's own repository, within COMPARE_SECONDS for the notebook. It never stops the grading: a
    failure is said in the column."""
    chapter = ROOT / notebook if (ROOT / notebook).is_file() else None
    found, defined, deadline = {}, None, time.monotonic() + COMPARE_SECONDS
    for name in dict.fromkeys(functions):
        try:
            defined = learner_definitions(cells) if defined is None else defined
            found[name] = copies_of(cells, name, chapter, defined, deadline)
        except Exception as error:  # noqa: BLE001 - the grade stands whatever the comparison meets
            found[name] = f"not compared ({type(error).__name__}: {error})"
    return found


def warm_up(chapter):
    """Read the library's and the listings' functions for the checks of `chapter` (a manifest's chapter) now,
    so that the processes that grade its notebooks, forked after, find them read."""
    for exercise in chapter["exercises"]:
        for check in exercise["checks"]:
            with contextlib.suppress(Exception):  # copy_column says it, notebook by notebook
                candidates(check["function"], ROOT / chapter["notebook"])
