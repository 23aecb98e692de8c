"""The code of a notebook that a set of names depends on, statement by statement.

tools/grading/grade.py runs a student's functions without running the whole chapter
(training a model, timing loops, importing what the function never uses): only
the top-level statements that bind those names, then the statements that bind
the names those statements read, and so on, in notebook order. The names come
from Python's own `symtable` (after IPython turns magics into Python), so a
function's parameters and local variables are not taken for global names.

What a slice can miss: a name bound where no symbol table sees it (`exec`,
`globals()[...]`, a star import), and side effects of the statements it leaves
out (`sys.path.insert`, `os.chdir`, draws from a random generator). Grading
then runs the whole notebook instead (see tools/grading/notebook.py).
"""

import ast
import symtable

from IPython.core.inputtransformer2 import TransformerManager

TRANSFORMER = TransformerManager()


def python_of(source):
    """The Python that IPython runs for a cell (magics become function calls)."""
    return TRANSFORMER.transform_cell(source)


def statements(source):
    """The top-level statements of a cell, each as code, or None when the cell does not parse."""
    code = python_of(source)
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    lines = code.splitlines(keepends=True)
    firsts = [min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) for node in tree.body]
    return ["".join(lines[first - 1: node.end_lineno]) for first, node in zip(firsts, tree.body)]


def global_names(code):
    """(names bound, names read) at the global level of some Python code."""
    table = symtable.symtable(code, "<cell>", "exec")
    bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    read = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    for inner in nested_tables(table):
        for symbol in inner.get_symbols():
            if symbol.is_global() and symbol.is_referenced():
                read.add(symbol.get_name())
            if symbol.is_declared_global() and symbol.is_assigned():
                bound.add(symbol.get_name())
    return bound, read


def nested_tables(table):
    """Every function and class scope inside a symbol table, however deep."""
    for child in table.get_children():
        yield child
        yield from nested_tables(child)


def code_binding(cells, wanted):
    """[(cell index, code)]: the statements needed to bind the names in `wanted`, cell by cell, in order.

    A statement is needed when it binds a wanted name, or a name that a needed
    statement reads. Cells that do not parse are left out (they would fail anyway).
    """
    units = list(statement_units(cells))
    chosen, seen, todo = set(), set(), set(wanted)
    while todo:
        name = todo.pop()
        seen.add(name)
        for number, (_, _, bound, read) in enumerate(units):
            if name in bound and number not in chosen:
                chosen.add(number)
                todo |= read - seen
    by_cell = {}
    for number in sorted(chosen):
        by_cell.setdefault(units[number][0], []).append(units[number][1])
    return [(i, "\n".join(code.rstrip("\n") for code in codes)) for i, codes in by_cell.items()]


def statement_units(cells):
    """(cell index, code, names bound, names read) for each top-level statement of the code cells."""
    for i, cell in enumerate(cells):
        for code in (statements(cell.source) or []) if cell.cell_type == "code" else []:
            try:
                yield (i, code, *global_names(code))
            except SyntaxError:  # parses, yet cannot run: `return` outside a function, ...
                continue



if __name__ == "__main__":  # a module, not a command: `--help` says so, and nothing runs
    import argparse
    SAID = ("A module of tools/grading/grade.py (tools/grading/notebook.py), which imports it: "
            "it has no command of its own.")
    argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=SAID).parse_args()
    print(f"tools/grading/notebook_slice.py: {SAID}")
