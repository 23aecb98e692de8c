"""The route an exercise's text asks for, read from the learner's code: rules on a function's syntax.

Many exercises ask for another route than the library's: a loop over the queries, `np.einsum` for every
product, no `reshape`, no `np.tril`. A `Rule` holds what the text forbids and requires, and the text itself,
for the message:

    EINSUM = Rule("write every product with np.einsum: no `@`, np.matmul or np.dot",
                  forbids=("@", "matmul", "dot"), requires=("einsum",))

The code is read as a list of `Use`s, each a token and its line: a global name read or called (`tril`), an
attribute (`.tril`, written as its name), the operator `@`, a loop (`loop`: for, while; `comprehension`), an
assignment to an item or a slice (`[] =`), an ordering comparison (`<`: <, <=, > or >=), an assignment to an
attribute (`.shape =`). A rule forbids tokens anywhere, and requires one of its tokens somewhere. Both apply to
the exercise's function and to the learner's own functions that it uses, found transitively. Whoever reads code
this way can be dodged by a computed name: `getattr` with a name that is not written out, `eval`, `exec`,
`compile`, `__import__`, `vars` and `__dict__` break every rule-checked function ("the check reads your code").

The notebook's check reads the function's source (`inspect`), or, where there is none (a function made by
`exec` of a string), its code objects (`uses_in_code`). The grader parses the student's notebook itself
(tools/grading/syntax_rules.py). Both judge with `broken_rule`, on the same `Use`s.
"""

import ast
import dis
import inspect
import textwrap
import types
from dataclasses import dataclass

DYNAMIC = "dynamic"  # the token of a name the check cannot read (getattr with a computed name, eval, ...)
DYNAMIC_CALLS = ("eval", "exec", "compile", "__import__", "vars")
ORDERINGS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
SHOWN = {"@": "the operator `@`", "loop": "a loop (for or while)", "comprehension": "a comprehension",
         "[] =": "an assignment to an item or slice (`table[...] = ...`)",
         "<": "an ordering comparison (<, <=, > or >=)"}


@dataclass(frozen=True)
class Rule:
    """What an exercise's text forbids (`forbids`: tokens used nowhere) and requires (`requires`: one of these tokens
    used somewhere), with the text of the rule as the exercise states it."""
    text: str
    forbids: tuple = ()
    requires: tuple = ()

    def __post_init__(self):
        if not self.text or not (self.forbids or self.requires):
            raise ValueError("a Rule needs its text and at least one token to forbid or require")


@dataclass(frozen=True, order=True)
class Use:
    """One thing a function's code uses: where (`line`, 1 = the line of its `def`; `column`), and the `token`."""
    line: int
    column: int
    token: str
    said: str = ""  # how the message shows it, when not by its token


def shown(token):
    """How a message names a token."""
    return SHOWN.get(token, f"`{token}`")


# Reading a syntax tree ----------------------------------------------------------------------------------------


def bound_inside(node):
    """The names that a function's code binds locally (its parameters and what it assigns, at any depth)."""
    names = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.arg):
            names.add(inner.arg)
        elif isinstance(inner, ast.Name) and isinstance(inner.ctx, (ast.Store, ast.Del)):
            names.add(inner.id)
        elif isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and inner is not node:
            names.add(inner.name)
        elif isinstance(inner, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in inner.names)
        elif isinstance(inner, ast.ExceptHandler) and inner.name:
            names.add(inner.name)
    return names


def uses_of_node(inner, local, at, called):
    """The `Use`s of one node of a syntax tree (`local`: the names bound inside the function; `at(node, token)`;
    `called`: the ids of the nodes `getattr` that are called, which `call_uses` reads)."""
    if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Load) and inner.id not in local:
        if inner.id in DYNAMIC_CALLS or (inner.id == "getattr" and id(inner) not in called):
            return [at(inner, DYNAMIC, f"`{inner.id}`")]
        return [] if inner.id == "getattr" else [at(inner, inner.id)]
    if isinstance(inner, ast.Attribute):
        if isinstance(inner.ctx, ast.Store):
            return [at(inner, f".{inner.attr} =")]
        return [at(inner, DYNAMIC, "`__dict__`")] if inner.attr == "__dict__" else [at(inner, inner.attr)]
    if isinstance(inner, (ast.Import, ast.ImportFrom)):
        return [at(inner, token) for token in imported_tokens(inner)]
    if isinstance(inner, (ast.BinOp, ast.AugAssign)) and isinstance(inner.op, ast.MatMult):
        return [at(inner, "@")]
    if isinstance(inner, (ast.For, ast.AsyncFor, ast.While)):
        return [at(inner, "loop")]
    if isinstance(inner, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return [at(inner, "comprehension")]
    if isinstance(inner, ast.Subscript) and isinstance(inner.ctx, ast.Store):
        return [at(inner, "[] =")]
    if isinstance(inner, ast.Compare) and any(isinstance(op, ORDERINGS) for op in inner.ops):
        return [at(inner, "<")]
    if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id not in local:
        return call_uses(inner, at)
    return []


def imported_tokens(node):
    """What an import inside the learner's function uses: every part of the module's dotted name and each name it
    takes (`from gguf.quants import dequantize`: gguf, quants, dequantize), as if written out."""
    modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    taken = [] if isinstance(node, ast.Import) else [alias.name for alias in node.names]
    return [part for module in modules for part in module.split(".") if part] + [name for name in taken if name != "*"]


def call_uses(call, at):
    """The `Use`s of a call of a global name beyond the name: getattr's attribute, or a name the check cannot read."""
    if call.func.id == "getattr":
        attribute = call.args[1] if len(call.args) > 1 else None
        if isinstance(attribute, ast.Constant) and isinstance(attribute.value, str):
            return [at(call, attribute.value)]
        return [at(call, DYNAMIC, "`getattr` with a computed name")]
    return []


def uses_in_tree(node):
    """The sorted `Use`s of a function's syntax tree (an ast.FunctionDef or ast.Lambda, with its decorators and
    defaults), its lines counted from its `def` (or `lambda`)."""
    local, first = bound_inside(node), node.lineno
    called = {id(inner.func) for inner in ast.walk(node) if isinstance(inner, ast.Call)}

    def at(inner, token, said=""):
        return Use(inner.lineno - first + 1, inner.col_offset, token, said)
    return sorted({use for inner in ast.walk(node) for use in uses_of_node(inner, local, at, called)})


def function_node(tree, name=None):
    """The first function definition (named `name`, if given) or lambda in a syntax tree, or None."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and name in (None, node.name):
            return node
        if isinstance(node, ast.Lambda) and name in (None, "<lambda>"):
            return node
    return None


# Reading code objects (a function made by exec of a string has no source) ------------------------------------


COMPREHENSIONS = ("<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>")  # the code objects of comprehensions
BACKWARD = ("JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "POP_JUMP_BACKWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_FALSE",
            "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE")
ORDERING_OPS = ("<", "<=", ">", ">=")


def instruction_token(instructions, i, outer_locals):
    """(token, said) of instruction i of a code object's listing, or None."""
    op, value = instructions[i].opname, instructions[i].argval
    if op in ("LOAD_GLOBAL", "LOAD_NAME") or (op in ("LOAD_DEREF", "LOAD_CLASSDEREF") and value not in outer_locals):
        if value in DYNAMIC_CALLS:
            return DYNAMIC, f"`{value}`"
        if value == "getattr":
            return getattr_token(instructions, i)
        return value, ""
    if op in ("LOAD_ATTR", "LOAD_METHOD"):
        return (DYNAMIC, "`__dict__`") if value == "__dict__" else (value, "")
    if op in ("IMPORT_NAME", "IMPORT_FROM"):  # an import inside the function (uses_in_code splits a dotted module)
        return value, ""
    if op == "STORE_ATTR":
        return f".{value} =", ""
    if op == "BINARY_OP" and instructions[i].argrepr in ("@", "@="):
        return "@", ""
    if op == "FOR_ITER" or op in BACKWARD:
        return "loop", ""  # a comprehension's own code object: see uses_in_code
    if op in ("STORE_SUBSCR", "STORE_SLICE"):
        return "[] =", ""
    if op == "COMPARE_OP" and value in ORDERING_OPS:
        return "<", ""
    return None


def getattr_token(instructions, i):
    """getattr(obj, "name") with the name written out: (name, ""); any other use of getattr: the dynamic token."""
    following = [x for x in instructions[i + 1: i + 6] if x.opname not in ("PUSH_NULL", "PRECALL")][:3]
    if (len(following) == 3 and following[0].opname.startswith("LOAD_") and following[1].opname == "LOAD_CONST"
            and isinstance(following[1].argval, str) and following[2].opname == "CALL" and following[2].arg == 2):
        return following[1].argval, ""
    return DYNAMIC, "`getattr` with a computed name"


def uses_in_code(code, first=None, outer_locals=frozenset()):
    """The sorted `Use`s of a code object and the code objects inside it (comprehensions, nested functions)."""
    first = code.co_firstlineno if first is None else first
    instructions = list(dis.get_instructions(code))
    found, comprehension = set(), code.co_name in COMPREHENSIONS
    for i, instruction in enumerate(instructions):
        token = instruction_token(instructions, i, outer_locals)
        token = ("comprehension", "") if comprehension and token and token[0] == "loop" else token
        if token is not None:
            position = instruction.positions
            line = position.lineno - first + 1 if position and position.lineno else 0
            column = (position.col_offset or 0) if position else 0
            parts = token[0].split(".") if instruction.opname == "IMPORT_NAME" else [token[0]]  # gguf.quants: both
            found.update(Use(line, column, part, token[1]) for part in parts if part)
    inner_locals = outer_locals | set(code.co_varnames) | set(code.co_cellvars)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found.update(uses_in_code(const, first, inner_locals))
    return sorted(found)


def uses_of_function(fn):
    """The `Use`s of a Python function: from its source where inspect can read it, else from its code objects."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        node = function_node(ast.parse(source), fn.__code__.co_name)
    except (OSError, TypeError, SyntaxError, IndentationError):
        node = None
    return uses_in_tree(node) if node is not None else uses_in_code(fn.__code__)


# The rules, on a function and its helpers ---------------------------------------------------------------------


def broken_rule(exercise, rules, functions):
    """None, or the message naming the first rule that the code breaks and where. `functions`: [(name, uses)], the
    exercise's function first, then the learner's helpers it uses (found transitively)."""
    if not rules:
        return None
    for name, uses in functions:
        for use in uses:
            if use.token == DYNAMIC:
                return (f"{exercise} does not follow the route the exercise asks for: `{name}` uses {use.said} on "
                        f"line {use.line} of `{name}`: the check reads your code to see that route ("
                        f"{'; '.join(rule.text for rule in rules)}): write every name out (no getattr with a "
                        f"computed name, eval, exec, compile, __import__, vars or __dict__)")
    for rule in rules:
        broken = forbidden_use(exercise, rule, functions) or missing_use(exercise, rule, functions)
        if broken:
            return broken
    return None


def forbidden_use(exercise, rule, functions):
    """The message for the first use of a token that `rule` forbids, or None."""
    for name, uses in functions:
        for use in uses:
            if use.token in rule.forbids:
                whose = "" if name == functions[0][0] else f", a function of yours that {functions[0][0]} uses,"
                return (f"{exercise} does not follow the route the exercise asks for: {rule.text}\n"
                        f"  `{name}`{whose} uses {shown(use.token)} on line {use.line} of `{name}`")
    return None


def missing_use(exercise, rule, functions):
    """The message when none of the tokens that `rule` requires is used, or None."""
    if not rule.requires or any(use.token in rule.requires for _, uses in functions for use in uses):
        return None
    wanted = " or ".join(shown(token) for token in rule.requires)
    where = (f"neither `{functions[0][0]}` nor any function of yours it uses uses" if len(functions) > 1
             else f"`{functions[0][0]}` never uses")
    return f"{exercise} does not follow the route the exercise asks for: {rule.text}\n  {where} {wanted}"


# The notebook's side: the learner's function object, and the functions of theirs it uses ------------------------


def learners_functions(fn):
    """[(name, uses)] of `fn` and of the learner's own functions it uses, found transitively: functions whose globals
    are `fn`'s (defined beside it, as in one notebook), reached by a name it reads (a global or a closure's)."""
    found, todo, seen = [], [fn], set()
    while todo:
        function = todo.pop(0)
        if id(function) in seen:
            continue
        seen.add(id(function))
        uses = uses_of_function(function)
        uses = sorted(set(uses) | set(renamed_uses(function, uses, fn.__globals__)))
        found.append((function.__name__, uses))
        for use in uses:
            helper = resolved(function, use.token)
            if isinstance(helper, types.FunctionType) and helper.__globals__ is fn.__globals__:
                todo.append(helper)
    return found


def renamed_uses(function, uses, learners_globals):
    """The `Use`s of what a name read by `function` was imported or assigned as: `lower` after
    `from numpy import tril as lower` also uses `tril`; a module alias, its last name (`rope_scaling`)."""
    renamed = []
    for use in uses:
        value = resolved(function, use.token)
        if isinstance(value, types.FunctionType) and value.__globals__ is learners_globals:
            continue  # a function of the learner's: read as a helper
        if isinstance(value, types.ModuleType):
            name = value.__name__.rsplit(".", 1)[-1]
        else:
            name = getattr(value, "__name__", None) if callable(value) else None
        if isinstance(name, str) and name != use.token:
            renamed.append(Use(use.line, use.column, name))
    return renamed


def resolved(function, name):
    """What `name` stands for in `function`: a closure's variable, else a global (None if neither)."""
    if not name.isidentifier():
        return None
    free = function.__code__.co_freevars
    if name in free and function.__closure__:
        try:
            return function.__closure__[free.index(name)].cell_contents
        except ValueError:  # an empty cell
            return None
    return function.__globals__.get(name)


def broken_rule_of(exercise, rules, fn):
    """None, or the message of the first rule that the learner's `fn` (or a helper of theirs) breaks."""
    fn = inspect.unwrap(fn) if rules else fn
    if not rules or not isinstance(fn, types.FunctionType):
        return None
    return broken_rule(exercise, rules, learners_functions(fn))


# Rules that several exercises state ------------------------------------------------------------------------------

PRODUCTS = ("@", "matmul", "dot", "tensordot", "inner", "vdot")  # the products other than np.einsum
TRANSPOSES = ("reshape", "transpose", "swapaxes", "moveaxis", "rollaxis", "T", "mT", "permute_dims", "as_strided",
              "matrix_transpose", ".shape =")  # what reorders or reshapes an array's axes
TRIANGLES = ("tril", "triu", "tri", "tril_indices", "triu_indices", "tril_indices_from", "triu_indices_from")


def einsum_products(what="every product"):
    """The rule "write every product with np.einsum" (`what`: which products)."""
    return Rule(f"write {what} with np.einsum: no `@`, np.matmul, np.dot or np.tensordot",
                forbids=PRODUCTS, requires=("einsum",))


def a_loop(over, comprehension=False):
    """The rule "an explicit Python loop over ..." (`over`: what it walks): a for or while statement, or also a
    comprehension where the text allows one."""
    loops = ("loop", "comprehension") if comprehension else ("loop",)
    kind = "a for loop or a comprehension" if comprehension else "a for statement"
    return Rule(f"write an explicit Python loop ({kind}) over {over}", requires=loops)
