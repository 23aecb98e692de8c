"""Has a submission kept the handout's check cells? Found by reading, not running.

A check cell is intact when some code cell of the submission is the handout's
check cell, up to formatting and comments (the two parse to the same Python).
Otherwise each of its checks is named with what happened to it, the first of:

  printed over  a cell prints the check's success message instead of running it;
  renamed       a cell runs the check on another function than the exercise's,
                or imports the check under another name;
  edited        a cell runs the check on the right function, but is not the
                handout's cell (lines added, removed or changed);
  removed       no cell runs the check.
"""

import ast
import re

from tools.grading.notebook_slice import python_of


def parsed(source):
    """The syntax tree of a cell's code, or None when it does not parse."""
    try:
        return ast.parse(python_of(source))
    except SyntaxError:
        return None


def same_code(tree, other):
    return tree is not None and other is not None and ast.dump(tree) == ast.dump(other)


def where(number, source):
    """How the report names a cell: its position and its first line."""
    first = next((line.strip() for line in source.splitlines() if line.strip()), "")
    return f"cell {number} (`{first[:60]}{'...' if len(first) > 60 else ''}`)"


def prints_success(tree, source, check):
    """Does the cell hold a string that reads like the check's success message?"""
    if tree is None:
        texts = [source]
    else:
        texts = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    return any(re.search(re.escape(check) + r"\b.*pass", text, re.S) for text in texts)


def arguments_of_calls(tree, check):
    """The first argument (as code) of every call `check(...)` in a cell."""
    if tree is None:
        return []
    return [ast.unparse(node.args[0]) if node.args else "" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == check]


def how_tampered(code_cells, check, function):
    """What happened to `check`, whose handout cell is missing: one line for the report."""
    trees = [(number, source, parsed(source)) for number, source in code_cells]
    for number, source, tree in trees:
        if prints_success(tree, source, check):
            return f"printed over: {where(number, source)} prints {check}'s message instead of running it"
    for number, source, tree in trees:
        arguments = arguments_of_calls(tree, check)
        other = [a for a in arguments if a != function]
        if other:
            return f"renamed: {where(number, source)} runs {check} on `{other[0]}`, not on `{function}`"
        if arguments:
            return f"edited: {where(number, source)} runs {check} but is not the handout's check cell"
    for number, source, tree in trees:
        if re.search(r"\b" + re.escape(check) + r"\b", source):
            return f"renamed: {where(number, source)} names {check} but never calls it by that name"
    return f"removed: no cell runs {check}"


def tampered_checks(cells, exercise):
    """{check: what happened to it} for the checks of one exercise whose check cell is not intact."""
    code_cells = [(number, cell.source) for number, cell in enumerate(cells, 1) if cell.cell_type == "code"]
    handout_cell = parsed(exercise["check_cell"])
    if any(same_code(parsed(source), handout_cell) for _, source in code_cells):
        return {}
    return {c["check"]: how_tampered(code_cells, c["check"], c["function"]) for c in exercise["checks"]}



if __name__ == "__main__":  # a module, not a command: `--help` says so, and nothing runs
    import argparse
    SAID = ("A module of tools/grading/grade.py (tools/grading/notebook.py), which imports it: "
            "it has no command of its own.")
    argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=SAID).parse_args()
    print(f"tools/grading/check_cells.py: {SAID}")
