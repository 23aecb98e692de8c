"""The rules on a learner's code (mha.checks.syntax): what they read, from the source and from code objects alike;
helpers found transitively; names the check cannot read; and the message, which names the rule and where."""

import ast
import textwrap

import pytest

from mha.checks.syntax import DYNAMIC, Rule, a_loop, broken_rule_of, einsum_products, uses_in_code, uses_in_tree

EINSUM = (einsum_products(),)
LOOP = (a_loop("the queries"),)
NO_TRIL = (Rule("without np.tril", forbids=("tril",)),)


def made_by_exec(source, name="f", **namespace):
    """The function `name` of `source`, exec'd into a namespace: no source for inspect to read."""
    namespace = {"np": pytest.importorskip("numpy"), **namespace}
    exec(compile(textwrap.dedent(source), "<learner>", "exec"), namespace)
    return namespace[name]


def tokens_both_ways(source):
    """The set of tokens read from the syntax tree, and from the code objects, of the function in `source`."""
    source = textwrap.dedent(source)
    tree = ast.parse(source).body[0]
    return {u.token for u in uses_in_tree(tree)}, {u.token for u in uses_in_code(made_by_exec(source).__code__)}


@pytest.mark.parametrize("source,token", [
    ("def f(x):\n    return x @ x\n", "@"),
    ("def f(x):\n    x @= x\n    return x\n", "@"),
    ("def f(x):\n    return np.tril(x)\n", "tril"),
    ("def f(x):\n    return x.T\n", "T"),
    ("def f(x):\n    x.shape = (2, 2)\n    return x\n", ".shape ="),
    ("def f(x):\n    for i in range(3):\n        x = x + i\n    return x\n", "loop"),
    ("def f(x):\n    while x < 3:\n        x = x + 1\n    return x\n", "loop"),
    ("def f(x):\n    return [i for i in x]\n", "comprehension"),
    ("def f(x):\n    x[0] = 1\n    return x\n", "[] ="),
    ("def f(x):\n    return x <= 1\n", "<"),
    ("def f(x):\n    from numpy import tril\n    return tril(x)\n", "tril"),
    ("def f(x):\n    from gguf.quants import dequantize\n    return dequantize(x, 3)\n", "gguf"),
    ("def f(x):\n    import gguf.quants as q\n    return q.dequantize(x, 3)\n", "gguf"),
    ("def f(x):\n    return getattr(np, 'tril')(x)\n", "tril"),
    ("def f(x, name):\n    return getattr(np, name)(x)\n", DYNAMIC),
    ("def f(x):\n    return eval('np.tril')(x)\n", DYNAMIC),
    ("def f(x):\n    return np.__dict__['tril'](x)\n", DYNAMIC),
])
def test_the_source_and_the_code_objects_read_the_same_use(source, token):
    from_tree, from_code = tokens_both_ways(source)
    assert token in from_tree and token in from_code


def test_a_local_variable_is_no_name_of_the_library():
    from_tree, from_code = tokens_both_ways("def f(x):\n    tril = x + 1\n    return tril\n")
    assert "tril" not in from_tree and "tril" not in from_code


def test_a_rule_message_names_the_rule_the_function_and_the_line():
    def f(x):
        y = x + 1
        return y @ y
    message = broken_rule_of("symmetric_attention", EINSUM, f)
    assert message.startswith("symmetric_attention does not follow the route the exercise asks for: write every "
                              "product with np.einsum: no `@`, np.matmul, np.dot or np.tensordot\n")
    assert "`f` uses the operator `@` on line 3 of `f`" in message


def test_a_required_use_missing_is_named():
    message = broken_rule_of("self_attention", LOOP, lambda X: X)
    assert "write an explicit Python loop (a for statement) over the queries" in message
    assert "`<lambda>` never uses a loop (for or while)" in message


def test_pasted_code_without_source_is_still_judged():
    f = made_by_exec("def f(x):\n    return np.tril(x)\n")
    assert "`f` uses `tril` on line 2 of `f`" in broken_rule_of("causal_mask", NO_TRIL, f)
    g = made_by_exec("def f(x):\n    return (x[:, None] >= x).astype(bool)\n")
    assert broken_rule_of("causal_mask", NO_TRIL, g) is None


def test_a_helper_of_the_learner_is_read_transitively_and_a_library_function_is_not():
    f = made_by_exec("""
        def inner(x):
            return np.tril(x)
        def middle(x):
            return inner(x)
        def f(x):
            return middle(x)
    """)
    message = broken_rule_of("causal_mask", NO_TRIL, f)
    assert "`inner`, a function of yours that f uses, uses `tril` on line 2 of `inner`" in message
    from_library = made_by_exec("def f(x):\n    return causal_mask(x)\n", causal_mask=__import__("mha.numpy").numpy.causal_mask)
    assert broken_rule_of("causal_mask", NO_TRIL, from_library) is None  # mha's own: refused by the guard, not here


def test_a_loop_in_a_helper_counts():
    f = made_by_exec("""
        def rows(x):
            return np.stack([row for row in x]) if False else [x for _ in range(1) for _ in range(1)]
        def walk(x):
            for i in range(2):
                x = x + i
            return x
        def f(x):
            return walk(x)
    """)
    assert broken_rule_of("self_attention", LOOP, f) is None


def test_a_computed_name_breaks_the_rules():
    f = made_by_exec("def f(x, name='tril'):\n    return getattr(np, name)(x)\n")
    message = broken_rule_of("causal_mask", NO_TRIL, f)
    assert "`getattr` with a computed name on line 2 of `f`" in message and "the check reads your code" in message
    assert broken_rule_of("padding_mask", (), f) is None  # an exercise without rules reads nothing


def test_a_rule_needs_its_text_and_a_token():
    with pytest.raises(ValueError):
        Rule("", forbids=("tril",))
    with pytest.raises(ValueError):
        Rule("without anything")


RENAMED = {
    "an import under another name": "from numpy import tril as lower\n",
    "an assignment at the top": "lower = np.tril\n",
    "a module imported under another name": "import numpy as n\nlower = n.tril\n",
}


@pytest.mark.parametrize("binding", RENAMED.values(), ids=RENAMED.keys())
def test_a_library_function_under_another_name_is_still_read(binding):
    """`lower(...)` after `from numpy import tril as lower` uses np.tril: the notebook's check (the function's
    globals) and the grader (the notebook's top-level statements) both see it."""
    import nbformat
    from mha.checks.registry import registered
    from tools.grading.syntax_rules import broken_rule_in
    source = binding + "def causal_mask(T):\n    return lower(np.ones((T, T), dtype=bool))\n"
    f = made_by_exec(source, "causal_mask")
    assert "uses `tril`" in broken_rule_of("causal_mask", registered("causal_mask").rules, f)
    cells = [nbformat.v4.new_code_cell("import numpy as np"), nbformat.v4.new_code_cell(source)]
    assert "uses `tril`" in broken_rule_in(cells, registered("causal_mask"), "causal_mask")


def test_a_name_bound_by_a_computed_getattr_at_the_top_breaks_the_rules_in_the_grader():
    import nbformat
    from mha.checks.registry import registered
    from tools.grading.syntax_rules import broken_rule_in
    source = "lower = getattr(np, 'tr' + 'il')\ndef causal_mask(T):\n    return lower(np.ones((T, T), dtype=bool))\n"
    cells = [nbformat.v4.new_code_cell("import numpy as np"), nbformat.v4.new_code_cell(source)]
    assert "the check reads your code" in broken_rule_in(cells, registered("causal_mask"), "causal_mask")
    assert "uses `tril`" in broken_rule_of("causal_mask", registered("causal_mask").rules,
                                           made_by_exec(source, "causal_mask"))
