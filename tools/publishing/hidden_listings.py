"""Which listings the students do not see: the library's answer to an exercise, and its routes.

An Implement exercise asks the learner to write a function that `mha.numpy` holds (`check_softmax`
tests a `softmax` that `mha.numpy.softmax` answers). The students' edition
(tools/publishing/make_handout.py) must not show that answer anywhere, in any chapter. So it hides
every `{literalinclude}` (tools/publishing/listings.py) that shows

- the library's function itself (`mha.numpy.NAME`);
- a route of it: a function of `mha.numpy` that it calls or names, and those that they call, in
  turn (`causal_lm_loss` calls `log_softmax` and `cross_entropy`); private helpers included;
- a function that the exercise's check forbids (registry `CHECKS[NAME].forbids`, and the routes
  outside mha.numpy below) that computes the answer on its own way: one that does not itself reach
  the exercise's function through its routes (`heads_from_fused` shows how `split_heads` splits;
  `encoder` only calls `encoder_block`, and its listing shows no answer).

A listing of a whole file, or of some of its lines (`:lines:`, `:start-at:`, ...), is hidden when the
lines it shows hold a line of such a function's body. Nothing here is listed by hand but the routes
outside `mha.numpy` (EXTRA_ROUTES): the exercises come from the chapters' exercise directives
(tools/publishing/handout_manifest.py), the routes from the syntax trees of mha.numpy's modules.

    answer_objects("causal_lm_loss")  # {("src/mha/numpy/model.py", "causal_lm_loss"), (..., "log_softmax"), ...}
    hidden(listing)                   # the Exercise that hides it, or None
    note(listing, exercise, chapter)  # what the students read in its place
"""

import ast
import functools
import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

from tools.publishing.listings import ROOT, find_object

NUMPY_FACE = "mha.numpy"
# Routes outside mha.numpy that compute an exercise's answer (the grader's student edition holds mha.numpy alone,
# so no check can forbid them there): mha.text.bits_per_character(total_nats, n_characters) is the formula.
EXTRA_ROUTES = {"loss_to_bits_per_character": ("mha.text.bits_per_character",)}
CHAPTER = re.compile(r"^(\d+)_")


@dataclass(frozen=True)
class Exercise:
    """An Implement exercise's function: the exercise's `label`, its `chapter` number and the `function` it asks for."""
    label: str
    chapter: int
    function: str


@functools.cache
def implement_exercises(book=ROOT / "book"):
    """Every (exercise, function) pair of the book's Implement exercises, chapter by chapter, as Exercises."""
    from tools.publishing.handout_manifest import chapter_exercises
    found = []
    for path in sorted(Path(book).glob("[0-9][0-9]_*.ipynb")):
        chapter = int(CHAPTER.match(path.name).group(1))
        found += [Exercise(entry["label"], chapter, check["function"]) for entry in chapter_exercises(path)
                  for check in entry["checks"]]
    return tuple(found)


# The library's objects ----------------------------------------------------------------------------------

def library_object(name):
    """The object that `name` names: `softmax` in mha.numpy, or a dotted path (`mha.text.bits_per_character`)."""
    module, _, attribute = name.rpartition(".") if "." in name else (NUMPY_FACE, "", name)
    found = getattr(importlib.import_module(module), attribute, None)
    if found is None:
        raise LookupError(f"{module} has no {attribute}")
    return inspect.unwrap(found)


def object_key(obj):
    """(file relative to the repository, qualified name) of a function or class of the library."""
    return Path(inspect.getsourcefile(obj)).resolve().relative_to(ROOT).as_posix(), obj.__qualname__


def in_numpy_face(obj):
    """Whether `obj` is a function or class defined in a module of mha.numpy."""
    module = getattr(obj, "__module__", "") or ""
    return (inspect.isfunction(obj) or inspect.isclass(obj)) and (module == NUMPY_FACE or
                                                                  module.startswith(NUMPY_FACE + "."))


@functools.cache
def module_tree(path):
    return ast.parse((ROOT / path).read_text())


def local_names(node):
    """The names that a function binds itself (arguments, assignments, loop variables, imports)."""
    names = {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    names |= {(alias.asname or alias.name).split(".")[0] for n in ast.walk(node)
              if isinstance(n, (ast.Import, ast.ImportFrom)) for alias in n.names}
    return names


def named_objects(node, namespace):
    """The objects of `namespace` (a module's globals) that the code of `node` names: `softmax`, `attention.softmax`."""
    local = local_names(node) - {node.name}
    found = []
    for part in ast.walk(node):
        if isinstance(part, ast.Name) and isinstance(part.ctx, ast.Load) and part.id not in local:
            found.append(namespace.get(part.id))
        elif isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id not in local:
            owner = namespace.get(part.value.id)
            found.append(getattr(owner, part.attr, None) if inspect.ismodule(owner) else None)
    return [inspect.unwrap(obj) for obj in found if obj is not None]


def direct_routes(obj):
    """The functions and classes of mha.numpy (other than `obj`) that the code of `obj` names."""
    path, qualname = object_key(obj)
    node = find_object(module_tree(path), qualname)
    if node is None:
        raise LookupError(f"{path} defines no {qualname}")
    namespace = vars(inspect.getmodule(obj))
    return [found for found in named_objects(node, namespace) if in_numpy_face(found) and found is not obj]


@functools.cache
def routes(name):
    """The keys (object_key) of every function or class of mha.numpy that `name`'s object reaches, transitively."""
    start = library_object(name)
    seen, todo = {object_key(start)}, [start]
    while todo:
        for found in direct_routes(todo.pop()):
            if object_key(found) not in seen:
                seen.add(object_key(found))
                todo.append(found)
    return frozenset(seen - {object_key(start)})


def forbidden_names(name):
    """The library names that the check of `name` forbids, and its routes outside mha.numpy."""
    from mha.checks.registry import CHECKS
    check = CHECKS.get(name)
    return tuple(dict.fromkeys((*(check.forbids if check else ()), *EXTRA_ROUTES.get(name, ()))))


def computes_on_its_own(forbidden, name):
    """Whether the forbidden function computes `name`'s answer in its own code: through its routes it reaches
    neither `name`'s function, nor another function that the check forbids, nor an exercise's function that
    `name`'s library function calls too; any of those would do the work for it, and its listing shows a call."""
    if "." in forbidden:
        return True  # a route outside mha.numpy (EXTRA_ROUTES): its code is the answer
    exercises = {object_key(library_object(e.function)) for e in implement_exercises()}
    others = {object_key(library_object(f)) for f in (name, *forbidden_names(name)) if f != forbidden}
    return not routes(forbidden) & (others | (routes(name) & exercises))


@functools.cache
def answer_objects(name):
    """The (file, qualname) pairs that show `name`'s answer: its library function, that function's routes, and
    the functions its check forbids that compute the answer on their own."""
    found = {object_key(library_object(name))} | routes(name)
    for forbidden in forbidden_names(name):
        if computes_on_its_own(forbidden, name):
            found.add(object_key(library_object(forbidden)))
    return frozenset(found)


# Listings -----------------------------------------------------------------------------------------------

@functools.cache
def body_lines(path, qualname):
    """The line numbers of an object's body in `path`, its docstring aside (a signature shows no answer)."""
    node = find_object(module_tree(path), qualname)
    body = node.body[1:] if node.body and is_docstring(node.body[0]) else node.body
    return frozenset(line for statement in body for line in range(statement.lineno, statement.end_lineno + 1))


def is_docstring(statement):
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


def option(listing, name):
    """The value of a listing's option `:name:`, or None."""
    found = re.search(rf"^[ \t]*:{name}:[ \t]*(.*?)[ \t]*$", listing.text, re.M)
    return found.group(1) if found else None


def selected_lines(numbers, spec):
    """The lines of `numbers` that a `:lines:` spec picks ("1-12", "3, 5-", "-4"), counted from 1 among them."""
    picked = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        first, dash, last = part.partition("-")
        start = int(first) if first else 1
        stop = (int(last) if last else len(numbers)) if dash else start
        picked += numbers[start - 1:stop]
    return picked


def cut(numbers, lines, listing):
    """`numbers` after the `:start-at:`, `:start-after:`, `:end-before:` and `:end-at:` options of `listing`."""
    def first_holding(text, among):
        return next((i for i, n in enumerate(among) if text in lines[n - 1]), None)
    for name, keep_match in (("start-at", True), ("start-after", False)):
        text = option(listing, name)
        found = None if text is None else first_holding(text, numbers)
        if found is not None:
            numbers = numbers[found if keep_match else found + 1:]
    for name, keep_match in (("end-before", False), ("end-at", True)):
        text = option(listing, name)
        found = None if text is None else first_holding(text, numbers)
        if found is not None:
            numbers = numbers[:found + 1 if keep_match else found]
    return numbers


@functools.cache
def shown_lines(listing):
    """(file relative to the repository, the line numbers that `listing` shows), as Sphinx's literalinclude
    picks them: the object (`:pyobject:`) or the whole file, then the start and end options, then `:lines:`."""
    from tools.publishing.listings import listed_node
    lines = listing.file.read_text().splitlines()
    node = listed_node(listing)
    if isinstance(node, ast.Module):
        numbers = list(range(1, len(lines) + 1))
    else:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        numbers = list(range(first, node.end_lineno + 1))
    numbers = cut(numbers, lines, listing)
    if option(listing, "lines"):
        numbers = selected_lines(numbers, option(listing, "lines"))
    return listing.file.resolve().relative_to(ROOT).as_posix(), frozenset(numbers)


def shown_answers(listing):
    """The Exercises whose answer `listing` shows (an answer object's body line among its lines), in book order,
    with the answer objects it shows: [(exercise, [qualname, ...])]."""
    path, numbers = shown_lines(listing)
    found = []
    for exercise in implement_exercises():
        names = sorted(name for file, name in answer_objects(exercise.function)
                       if file == path and body_lines(file, name) & numbers)
        if names:
            found.append((exercise, names))
    return found


def hidden(listing, chapter=None):
    """The Exercise that hides `listing` from the students, or None. Of several, the one whose function the
    listing shows, else the first of `chapter` (the listing's chapter number), else the first in the book."""
    found = shown_answers(listing)
    if not found:
        return None
    own = [e for e, names in found if e.function in names]
    here = [e for e, _ in found if e.chapter == chapter]
    return (own or here or [e for e, _ in found])[0]


# What the students read instead -------------------------------------------------------------------------

def note(names, exercise, chapter=None):
    """The sentence that replaces hidden listings in the students' edition: where the learner writes
    `exercise.function`, and that the listings (of `names`, the answer objects they show) are in the instructor's
    edition. `chapter`: the number of the listings' chapter (an exercise of another chapter is named with it)."""
    names = sorted(dict.fromkeys(names), key=lambda name: name != exercise.function)  # the exercise's own first
    writes = "write" if chapter is None or exercise.chapter >= chapter else "wrote"
    where = f"{{ref}}`{exercise.label}`" + ("" if exercise.chapter == chapter else f" (chapter {exercise.chapter})")
    listed = " and ".join(f"`{name}`" for name in names)
    if names == [exercise.function]:
        library = "the library's version is"
    elif exercise.function in names:
        library = f"the library's {listed} are"
    else:
        library = f"the library's {listed}, which would give it away, {'is' if len(names) == 1 else 'are'}"
    return f"*You {writes} `{exercise.function}` yourself in {where}; {library} in the instructor's edition.*"


def hidden_runs(source, chapter=None):
    """The hidden listings of a Markdown cell's `source`, as runs: [(start, end, exercise, names)], one run for
    listings that follow each other (nothing but blank lines between them) and are hidden by the same exercise."""
    from tools.publishing.listings import listings_in
    runs, position = [], 0
    for listing in listings_in(source):
        start = source.index(listing.text.rstrip("\n"), position)
        end = position = start + len(listing.text.rstrip("\n"))
        exercise = hidden(listing, chapter)
        if exercise is None:
            continue
        names = dict(shown_answers(listing))[exercise]
        if runs and runs[-1][2] == exercise and not source[runs[-1][1]:start].strip():
            runs[-1] = (runs[-1][0], end, exercise, runs[-1][3] + names)
        else:
            runs.append((start, end, exercise, names))
    return runs


def students_markdown(source, chapter=None):
    """A Markdown cell's `source` as the students read it: each run of hidden listings replaced by its note."""
    for start, end, exercise, names in reversed(hidden_runs(source, chapter)):
        source = source[:start] + note(names, exercise, chapter) + source[end:]
    return source
