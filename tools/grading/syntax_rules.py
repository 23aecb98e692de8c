"""The grader's reading of the route an exercise asks for: the rules of mha.checks.syntax on the student's cells.

The grader never asks the worker what the student's code looks like: it parses the notebook itself. A student's
function is the last top-level statement of the notebook that binds its name: a `def`, a `lambda` assigned to
the name, or the name of another function (`softmax = my_softmax`, followed). Anything else (an import, a call's
result) is no function of the student's to read, and the worker's run decides. The student's helpers are the
functions bound this way whose names the function reads, found transitively, as the notebook's check finds them
among the function's globals. The uses and the message come from the same code as the notebook's check
(mha.checks.syntax), so that both give the same verdict.
"""

import ast

from mha.checks.syntax import DYNAMIC, Use, broken_rule, uses_in_tree
from tools.grading.notebook_slice import statement_units


def bindings(cells):
    """{name: the syntax tree of the function it is bound to at the end of the notebook, or None}."""
    bound = {}
    for _, code, names, _ in statement_units(cells):
        node = ast.parse(code).body[0]
        for name in names:
            bound[name] = binding_of(node, name)
    return {name: followed(bound, name) for name in bound}


def binding_of(node, name):
    """What a top-level statement binds `name` to: a def or a lambda's tree, another name (str), or None."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
        return node
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        if node.targets[0].id == name and isinstance(node.value, ast.Lambda):
            return node.value
        if node.targets[0].id == name and isinstance(node.value, ast.Name):
            return node.value.id
    return None


def followed(bound, name):
    """The function tree that `name` ends at, through names bound to other names (None if none)."""
    seen = set()
    while isinstance(bound.get(name), str) and name not in seen:
        seen.add(name)
        name = bound[name]
    found = bound.get(name)
    return None if isinstance(found, str) else found


ALIAS_CALLS = ("getattr", "eval", "exec", "compile", "__import__", "vars")  # values the grader cannot name


def aliases(cells):
    """{name: what the notebook's top level binds it to, when that is another object's name}: `from numpy import
    tril as lower` and `lower = np.tril` give {"lower": "tril"}; a name bound by a computed getattr, eval, ... gives
    the token of a name the check cannot read (mha.checks.syntax.DYNAMIC)."""
    found = {}
    for _, code, names, _ in statement_units(cells):
        node = ast.parse(code).body[0]
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                original = alias.name.rsplit(".", 1)[-1]
                if alias.asname and alias.asname != original:
                    found[alias.asname] = original
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            named = value_name(node.value, found)
            if named and named != node.targets[0].id:
                found[node.targets[0].id] = named
            else:
                found.pop(node.targets[0].id, None)
    return found


def value_name(value, found):
    """The name that an assigned value stands for (np.tril: "tril"), DYNAMIC for a value made by getattr with a
    computed name, eval, ...; None for anything else."""
    if isinstance(value, ast.Attribute):
        return value.attr
    if isinstance(value, ast.Name):
        return found.get(value.id)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ALIAS_CALLS:
        attribute = value.args[1] if value.func.id == "getattr" and len(value.args) > 1 else None
        if isinstance(attribute, ast.Constant) and isinstance(attribute.value, str):
            return attribute.value
        return DYNAMIC
    return None


def with_aliases(uses, names):
    """`uses` and, for each name read that is an alias, a use of the name it stands for."""
    extra = [Use(use.line, use.column, names[use.token], f"`{use.token}`" if names[use.token] == DYNAMIC else "")
             for use in uses if use.token in names]
    return sorted(set(uses) | set(extra))


def students_functions(cells, function):
    """[(name, uses)] of the student's `function` and of the student's functions it uses, transitively; [] when
    the notebook binds `function` to no function of theirs."""
    trees, names = bindings(cells), aliases(cells)
    found, todo, seen = [], [function], set()
    while todo:
        name = todo.pop(0)
        tree = trees.get(name)
        if tree is None or id(tree) in seen:
            continue
        seen.add(id(tree))
        uses = with_aliases(uses_in_tree(tree), names)
        found.append((tree.name if hasattr(tree, "name") else "<lambda>", uses))
        todo.extend(use.token for use in uses if use.token.isidentifier() and trees.get(use.token) is not None)
    return found


def broken_rule_in(cells, check, function):
    """None, or the message of the first rule of `check` (a registry Check) that the student's `function` breaks."""
    if not check.rules:
        return None
    functions = students_functions(cells, function)
    return broken_rule(check.name, check.rules, functions) if functions else None
