"""The checks of chapter 17's exercises (mha.checks.ch17): absorbed_latent_decode, sink_softmax, select_top_k_keys and
route_tokens. Their references give the formulas' answers (the expanded decode, gpt-oss's concatenated softmax,
solutions written from scratch) on every case they draw; the named traps are there; every wrong solution that a
learner writes fails on its named case, on every seed, with the hint that fits; every catalogued mistake fails with
its own hint; the expanded keys are refused by the memory case; the library's routes are refused, in the notebook
and in the student edition; right solutions from scratch pass there; and the exercises' texts agree with the checks."""

from pathlib import Path

import numpy as np
import pytest

from learners import SEEDS, exercise_texts, hint_of, student_edition, torch_twin
from solutions_ch17 import CHAPTER_17, FROM_SCRATCH, all_cases, failures_on_every_seed, labelled, run
from wrong_ch17 import TRAPPED, expanded_keys, router_written, softmax

import mha.numpy as mnp
import mha.checks
from mha.checks import ch17_choices
from mha.checks.reference import reference
from mha.checks.registry import CHECKS, expected_answer

ROOT = Path(__file__).resolve().parents[1]
ABSORBED, SINKS, TOP_K, ROUTER = CHAPTER_17


def scratch(name):
    """The right solutions from scratch of check `name` (the first bears the exercise's name)."""
    return [f for f in FROM_SCRATCH if f.__name__.startswith(name)]


# The references give the formulas' answers ------------------------------------------------------------------------


@pytest.mark.parametrize("name", CHAPTER_17)
def test_the_reference_agrees_with_solutions_from_scratch_on_every_case(name):
    """Each from-scratch solution (no code of the library) gives the reference's answer on the named and random cases
    of ten seeds, within 1e-12 in float64 and 1e-5 in float32; the choices (booleans, experts) exactly."""
    for case in all_cases(name):
        if case.raises:
            continue
        expected = expected_answer(name, case)
        for solution in scratch(name):
            got = case.call(solution)
            for e, g in zip(*(x if isinstance(x, tuple) else (x,) for x in (expected, got))):
                assert e.dtype == g.dtype and e.shape == g.shape, (case.label, solution.__name__)
                if e.dtype.kind in "bi":
                    assert np.array_equal(e, g), (case.label, solution.__name__)
                else:
                    tol = 1e-5 if e.dtype == np.float32 else 1e-12
                    np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=f"{case.label} {solution.__name__}")


def test_the_absorbed_reference_equals_the_expanded_decode_in_float64():
    for case in all_cases(ABSORBED, SEEDS[:3]):
        if case.args[0].dtype == np.float64 and case.peak_bytes is None:
            out, weights = expected_answer(ABSORBED, case)
            out_e, weights_e = case.call(mnp.expanded_latent_decode)
            np.testing.assert_allclose(out, out_e, rtol=1e-12, atol=1e-12, err_msg=case.label)
            np.testing.assert_allclose(weights, weights_e, rtol=1e-12, atol=1e-12, err_msg=case.label)


def test_the_sink_reference_equals_gpt_oss_s_eager_attention():
    """transformers' gpt_oss eager attention: the sinks concatenated as a column of the scores, a softmax, the column
    dropped. Its weights, with queries and keys that give our scores, are the reference's (float64)."""
    torch = pytest.importorskip("torch")
    from transformers.models.gpt_oss import modeling_gpt_oss

    class Module(torch.nn.Module):
        def __init__(self, sinks):
            super().__init__()
            self.sinks, self.num_key_value_groups, self.training = torch.nn.Parameter(sinks), 1, False
    for case in all_cases(SINKS, SEEDS[:3]):
        scores, sinks = case.args
        if scores.dtype != np.float64:
            continue
        T_k = scores.shape[-1]
        queries = torch.from_numpy(scores.reshape(-1, *scores.shape[-3:]))  # (B, h, T_q, T_k): q . e_k = the scores
        keys = torch.eye(T_k, dtype=torch.float64).expand(queries.shape[0], scores.shape[-3], T_k, T_k)
        mask = torch.zeros(queries.shape[0], 1, scores.shape[-2], T_k, dtype=torch.float64)
        _, weights = modeling_gpt_oss.eager_attention_forward(
            Module(torch.from_numpy(sinks)), queries.nan_to_num(neginf=0.0), keys, keys, torch.where(
                torch.from_numpy(np.isneginf(scores).reshape(queries.shape)), -torch.inf, mask), scaling=1.0)
        expected = expected_answer(SINKS, case)
        finite = np.isfinite(scores).any(axis=-1)  # transformers' rows with every key masked are NaN (ours 0)
        theirs = weights.detach().numpy().reshape(scores.shape)
        np.testing.assert_allclose(expected[finite], theirs[finite], rtol=1e-12, atol=1e-14, err_msg=case.label)


def test_the_router_reference_chooses_and_weighs_as_deepseek_v3_and_qwen3_moe_do():
    """transformers' routers, their weight the identity so that their logits are the case's: DeepseekV3TopkRouter
    (sigmoid, e_score_correction_bias, one group) for the sigmoid cases, Qwen3MoeTopKRouter (softmax) for the softmax
    cases without a bias. Both compute in float32 and leave the chosen experts unsorted (sorted=False): the same
    experts, compared in index order, and the same weights. Cases with a tie at the edge of the choice are left out
    (torch.topk's choice among ties is not defined)."""
    torch = pytest.importorskip("torch")
    from transformers import DeepseekV3Config, Qwen3MoeConfig
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter
    compared = 0
    for case in all_cases(ROUTER, SEEDS[:4]):
        (logits, top_k), kw = case.args, {"scoring": "softmax", "normalize": False, "bias": None} | case.kwargs
        n, bias = logits.shape[-1], kw["bias"]
        if case.raises or (kw["scoring"] == "softmax" and bias is not None):
            continue
        scores = 1 / (1 + np.exp(-logits)) if kw["scoring"] == "sigmoid" else softmax(logits.astype(np.float64))
        best = -np.sort(-(scores + (0 if bias is None else bias)), axis=-1)[..., :top_k + 1]
        if (np.diff(best, axis=-1) == 0).any():
            continue  # a tie: torch.topk may take either
        rounded = logits.astype(np.float32).astype(logits.dtype)  # what transformers computes with
        weights, experts = reference(ROUTER)(rounded, top_k, **case.kwargs)
        if kw["scoring"] == "sigmoid":
            router = DeepseekV3TopkRouter(DeepseekV3Config(
                hidden_size=n, n_routed_experts=n, num_experts_per_tok=top_k, n_group=1, topk_group=1,
                norm_topk_prob=kw["normalize"], routed_scaling_factor=1.0))
            if bias is not None:
                router.e_score_correction_bias.copy_(torch.from_numpy(np.asarray(bias, dtype=np.float32)))
        else:
            router = Qwen3MoeTopKRouter(Qwen3MoeConfig(hidden_size=n, num_experts=n, num_experts_per_tok=top_k,
                                                       norm_topk_prob=kw["normalize"]))
        with torch.no_grad():
            router.weight.copy_(torch.eye(n))
            _, theirs, chosen = router(torch.from_numpy(logits.astype(np.float32)))
        chosen, theirs = chosen.numpy().reshape(experts.shape), theirs.float().numpy().reshape(weights.shape)
        ours_in_order, theirs_in_order = np.argsort(experts, axis=-1), np.argsort(chosen, axis=-1)
        assert np.array_equal(np.take_along_axis(experts, ours_in_order, -1),
                              np.take_along_axis(chosen, theirs_in_order, -1)), case.label
        np.testing.assert_allclose(np.take_along_axis(weights, ours_in_order, -1), np.take_along_axis(
            theirs, theirs_in_order, -1), rtol=2e-6, atol=1e-7, err_msg=case.label)
        compared += 1
    assert compared >= 20


# The traps are in the named cases ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_the_first_cases_hold_their_traps_on_every_seed(seed):
    q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale = CHECKS[ABSORBED].named_cases(seed)[0].args
    assert W_uk.shape[-2:] == (latents.shape[-1], q_nope.shape[-1]) and W_uk.shape[1] == W_uk.shape[2] == W_uv.shape[2]
    assert 1.3 <= scale * (q_nope.shape[-1] + q_rope.shape[-1]) ** 0.5 <= 1.9
    scores, sinks = CHECKS[SINKS].named_cases(seed)[0].args
    assert scores.shape[-3] == scores.shape[-2] == len(sinks) != scores.shape[-1] and len(set(sinks)) == len(sinks)
    assert (sinks > 0).any() and (sinks < 0).any()
    tied, k = CHECKS[TOP_K].named_cases(seed)[0].args
    kth = -np.sort(-tied, axis=-1)[:, k - 1:k]
    assert k == 2 and ((tied == kth).sum(axis=-1) >= 2).all() and ((tied > kth).sum(axis=-1) < k).all()
    logits, top_k = CHECKS[ROUTER].named_cases(seed)[0].args
    order = np.argsort(-logits, axis=-1)[..., :top_k]
    assert (np.diff(order, axis=-1) < 0).any(), "some token's best expert has a higher index than its second"


def test_the_other_named_cases_hold_their_traps():
    long = labelled(ABSORBED, "a long cache")
    _, _, latents, _, W_uk, _, _ = long.args
    assert 8 * latents.shape[-2] * W_uk.shape[-1] > 2 * long.peak_bytes > 8 * 4 * latents.size
    (_, q_rope, _, rotary_keys, _, _, scale) = labelled(ABSORBED, "scores of 1050").args
    assert (scale * (q_rope @ np.swapaxes(rotary_keys, -1, -2)) > 1000).all()
    scores, sinks = labelled(SINKS, "a causal mask").args
    assert np.isneginf(scores).all(axis=-1).sum() == 1 and np.isneginf(scores).any(axis=-1).sum() > 1
    scores, k = labelled(TOP_K, "a causal mask").args
    assert (labelled(TOP_K, "a causal mask").kwargs["mask"].sum(axis=-1) < k).sum() == 2
    case = labelled(TOP_K, "blocking the highest scores")
    assert (np.where(case.kwargs["mask"], -np.inf, case.args[0]).max(axis=-1) >
            np.where(case.kwargs["mask"], case.args[0], -np.inf).max(axis=-1)).all()
    case = labelled(ROUTER, "a bias that changes the choice")
    logits, bias = case.args[0], case.kwargs["bias"]
    scores = 1 / (1 + np.exp(-logits))
    by = {how: np.argsort(-values, axis=-1, kind="stable")[..., :2]
          for how, values in (("right", scores + bias), ("ignored", scores), ("logits", logits + bias))}
    assert not np.array_equal(by["right"], by["ignored"]) and not np.array_equal(by["right"], by["logits"])
    assert not np.array_equal(by["logits"], by["ignored"])


# Wrong solutions a learner writes: their named case, their hint ------------------------------------------------------


@pytest.mark.parametrize("name,fn,hint,case", TRAPPED, ids=[f"{i}-{t[0]}" for i, t in enumerate(TRAPPED)])
def test_a_trap_fails_on_its_named_case_on_every_seed_with_its_hint(name, fn, hint, case):
    if getattr(fn, "default_sort", False) and not ch17_choices.DEFAULT_SORT_REORDERS_TIES:
        # NumPy's default sort keeps the ties' order on this machine: the solution is right here, and passes.
        for seed in SEEDS:
            run(name, fn, seed)
        return
    messages = failures_on_every_seed(name, fn)
    assert hint in hint_of(messages[0]), messages[0]
    for message in messages:
        assert f"on the case '{case}" in message, message


def test_the_expanded_keys_fail_the_memory_case_with_its_words_and_no_hint():
    for message in failures_on_every_seed(ABSORBED, expanded_keys, seeds=SEEDS[:3]):
        assert "on the case 'a long cache" in message and "never form the keys" in message, message
        assert not hint_of(message), message


def test_the_router_s_reference_raises_on_its_last_case_and_only_there():
    cases = CHECKS[ROUTER].named_cases(0)
    assert [c.raises for c in cases] == [None] * (len(cases) - 1) + [ValueError]
    with pytest.raises(ValueError, match="relu"):
        cases[-1].call(mnp.route_tokens)
    assert not any(c.raises for name in (ABSORBED, SINKS, TOP_K) for c in CHECKS[name].named_cases(0))


def test_an_unknown_scoring_must_raise():
    def anything_else_is_a_softmax(logits, top_k, *, scoring="softmax", normalize=False, bias=None):
        scoring = "sigmoid" if scoring == "sigmoid" else "softmax"
        return router_written()(logits, top_k, scoring=scoring, normalize=normalize, bias=bias)
    for message in failures_on_every_seed(ROUTER, anything_else_is_a_softmax, seeds=SEEDS[:2]):
        assert "where it must raise ValueError" in message, message


@pytest.mark.parametrize("name", CHAPTER_17)
def test_the_catalogue_is_large_and_every_mistake_fails_with_its_own_hint_on_every_seed(name):
    from learners import unguarded
    mistakes = CHECKS[name].mistakes
    assert len(mistakes) >= 8
    hints = [m.hint for m in mistakes]
    assert all(len(h.split()) >= 8 for h in hints) and len(set(hints)) == len(hints)
    for m in mistakes:
        for message in failures_on_every_seed(name, unguarded(m.fn), seeds=SEEDS[:4]):
            # The default sort's order of equal scores may be the reversed one's: both hints say kind='stable'.
            hints = TIE_HINTS[name] if m.fn.__name__ in UNSTABLE else (m.hint,)
            assert hint_of(message) in hints, (m.fn.__name__, message)


UNSTABLE = ("top_k_keys_unstable", "router_unstable_sort", "top_k_keys_later_ties", "router_later_ties_first")
TIE_HINTS = {name: tuple(m.hint for m in CHECKS[name].mistakes if m.fn.__name__ in UNSTABLE)
             for name in (TOP_K, ROUTER)}


# Routes: the library's functions ------------------------------------------------------------------------------------


ROUTES = [
    (ABSORBED, lambda *args: mnp.absorbed_latent_decode(*args), "calls mha's own absorbed_latent_decode"),
    (ABSORBED, lambda *args: mnp.expanded_latent_decode(*args), "calls mha's own expanded_latent_decode"),
    (ABSORBED, lambda q_nope, q_rope, latents, rotary_keys, W_uk, W_uv, scale: (lambda w: (np.einsum(
        "...ht,...tr,hrv->...hv", w, latents, W_uv), w))(mnp.softmax(scale * (np.einsum(
            "...hn,hrn,...tr->...ht", q_nope, W_uk, latents) + q_rope @ np.swapaxes(rotary_keys, -1, -2)))),
     "calls mha's own softmax"),
    (SINKS, lambda scores, sinks: mnp.sink_softmax(scores, sinks), "calls mha's own sink_softmax"),
    (SINKS, lambda scores, sinks: mnp.softmax(np.concatenate(
        [scores, np.broadcast_to(sinks[:, None, None], scores.shape[:-1] + (1,))], -1))[..., :-1],
     "calls mha's own softmax"),
    (TOP_K, lambda scores, k, mask=None: mnp.select_top_k_keys(scores, k, mask), "calls mha's own select_top_k_keys"),
    (TOP_K, lambda scores, k, mask=None: mnp.route_tokens(np.where(mask, scores, -1e30) if mask is not None
                                                          else scores, min(k, scores.shape[-1])),
     "calls mha's own route_tokens"),
    (ROUTER, lambda logits, top_k, **kw: mnp.route_tokens(logits, top_k, **kw), "calls mha's own route_tokens"),
    (ROUTER, lambda logits, top_k, **kw: (lambda scores: (scores, np.argsort(-scores, kind="stable")))(
        mnp.softmax(logits)), "calls mha's own softmax"),
    (ROUTER, lambda logits, top_k, **kw: mnp.route_tokens_in_groups(logits, top_k, n_groups=1, top_groups=1, **kw),
     "calls mha's own route_tokens_in_groups"),
]


@pytest.mark.parametrize("name,route,words", ROUTES, ids=[f"{i}-{r[0]}" for i, r in enumerate(ROUTES)])
def test_the_library_s_routes_are_refused(name, route, words):
    for message in failures_on_every_seed(name, route, seeds=SEEDS[:2]):
        assert words in message, message


@pytest.mark.parametrize("name", CHAPTER_17)
def test_the_torch_twin_is_refused(name):
    for message in failures_on_every_seed(name, torch_twin(name), seeds=SEEDS[:1]):
        assert f"calls mha's own {name}" in message, message


@pytest.mark.parametrize("fn", FROM_SCRATCH, ids=[f.__name__ for f in FROM_SCRATCH])
def test_a_solution_from_scratch_passes_on_every_seed_and_in_the_student_edition(fn, monkeypatch):
    name = next(n for n in CHAPTER_17 if fn.__name__.startswith(n))
    count = len(CHECKS[name].named_cases(0))
    for seed in SEEDS[:3]:
        assert run(name, fn, seed) == f"check_{name}: all {count} cases passed."
    with student_edition(name, monkeypatch):
        for seed in SEEDS[3:5]:
            assert run(name, fn, seed).startswith(f"check_{name}: all "), seed


def test_the_grader_passes_solutions_from_scratch_and_refuses_the_expanded_keys_and_the_library():
    """tools/grading in its worker (the student edition, no torch; bubblewrap where it works): the memory case
    measured from outside still lets the absorbed form through (the worker's own copies of the inputs and the answer
    take about 14 MiB of the 48) and stops the keys formed head by head."""
    import inspect
    import textwrap

    import nbformat

    from tools.grading import notebook, sandbox

    def cell(*functions, named=None):
        sources = [textwrap.dedent(inspect.getsource(f)) for f in functions]
        renamed = f"\n\n{named} = {functions[-1].__name__}\n" if named else ""
        return "import numpy as np\nimport mha.numpy as mnp\n\n" + "\n\n".join(sources) + renamed

    def grade(cells, names, seed):
        book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
        checks = [{"check": f"check_{n}", "function": n} for n in names]
        return notebook.run_checks(book, checks, {f"check_{n}": seed for n in names}, sandbox.Limits(), [ROOT])

    right = [f for f in FROM_SCRATCH if f.__name__ in CHAPTER_17]
    for seed in (5, 6):
        outcomes = grade([cell(f) for f in right], CHAPTER_17, seed)
        assert all(status == "passed" for status, _ in outcomes.values()), outcomes
    (status, message), = grade([cell(softmax, expanded_keys, named=ABSORBED)], [ABSORBED], 5).values()
    assert status == "failed" and "on the case 'a long cache" in message and "never form the keys" in message
    (status, message), = grade([cell(sink_library, named=SINKS)], [SINKS], 5).values()
    assert status == "failed" and "switched off while this exercise is graded" in message, message


def sink_library(scores, sinks):
    return mnp.sink_softmax(scores, sinks)


def test_the_checks_settings():
    for name in CHAPTER_17:
        check = CHECKS[name]
        assert check.float32_promised != (name == TOP_K) and check.packages == () and not check.fresh
        module = "mha.checks.ch17_choices" if name in (TOP_K, ROUTER) else "mha.checks.ch17"
        assert check.make_cases.__module__ == module and getattr(mha.checks, f"check_{name}").__name__ == \
            f"check_{name}"
    catalogued = {m.fn.__name__ for name in (TOP_K, ROUTER) for m in CHECKS[name].mistakes}
    assert {"top_k_keys_unstable", "router_unstable_sort"} <= catalogued or not ch17_choices.DEFAULT_SORT_REORDERS_TIES
    assert CHECKS[ABSORBED].returns == ("out", "weights") and CHECKS[ROUTER].returns == ("weights", "experts")
    assert {"expanded_latent_decode", "softmax", "scaled_dot_product_attention"} <= set(CHECKS[ABSORBED].absent())
    assert {"softmax", "route_tokens", "scaled_dot_product_attention"} <= set(CHECKS[SINKS].absent())
    assert set(CHECKS[TOP_K].absent()) == {"select_top_k_keys", "top_k_filter", "filter_logits", "route_tokens",
                                           "route_tokens_in_groups", "mixture_of_experts"}
    assert {"select_top_k_keys", "route_tokens_in_groups", "softmax"} <= set(CHECKS[ROUTER].absent())
    assert [CHECKS[name].may_use for name in CHAPTER_17] == [
        "NumPy, nothing from mha", "NumPy, nothing from mha",
        "NumPy: np.argsort, np.sort or np.argpartition (not mnp.top_k_filter or mnp.route_tokens)",
        "NumPy, nothing from mha"]


# The exercises' texts --------------------------------------------------------------------------------------------------


TEXTS = exercise_texts(17)
WORDS = {  # what each text must say: its inputs, its rules, the errors and bounds its cases hold
    ABSORBED: ("`W_uk`", "`W_uv`", "`scale`", "`weights`", "nothing from `mha`", "48 MiB"),
    SINKS: ("`sinks`", "one learned logit per head", "zeros", "nothing from `mha`"),
    TOP_K: ("earlier key", "fewer than", "`mnp.top_k_filter`", "`mnp.route_tokens`", "boolean"),
    ROUTER: ("sigmoid", "`bias`", "lower index", "int64", "`ValueError`", "nothing from `mha`"),
}


@pytest.mark.parametrize("name", CHAPTER_17)
def test_the_exercise_s_text_agrees_with_the_check(name):
    assert name in TEXTS, f"chapter 17 has no Implement exercise for {name}"
    text = " ".join(TEXTS[name].split())
    for words in WORDS[name]:
        assert words in text, words
    assert f"`{name}(" in text, "the text gives the signature"
