"""Whether a learner's function is the library's code: syntax trees compared, names and docstrings aside.

`normalised(node)` is a function's syntax tree with its docstrings and annotations dropped and
every name (arguments, variables, globals such as `np`, the function's own name) renamed by order
of first appearance: two functions that differ only in names, comments, docstrings, layout or
annotations give the same text.
"""

import ast
import copy


def is_docstring(statement):
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


class Renamer(ast.NodeTransformer):
    """Names, arguments and function names replaced by v0, v1, ... in order of first appearance;
    docstrings and annotations dropped."""

    def __init__(self):
        self.names = {}

    def new_name(self, name):
        return self.names.setdefault(name, f"v{len(self.names)}")

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


def normalised(node):
    """The text of `node`'s normalised syntax tree (see the module's docstring)."""
    tree = Renamer().visit(copy.deepcopy(node))
    return ast.dump(tree, annotate_fields=False, include_attributes=False)
