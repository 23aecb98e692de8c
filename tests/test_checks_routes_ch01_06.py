"""The routes to an answer of chapters 1 to 6 (issue #25, point 4): a right solution written from scratch
passes on every seed (0..9); and what each exercise may not call (`forbids`, `packages`) agrees with its text,
so that a student edition of mha without those functions refuses the library's routes and keeps the
permitted functions working."""

import math
import re

import numpy as np
import pytest

from learners import SEEDS, failures_on_every_seed, run, student_edition
from solutions_ch01_06 import CHAPTERS_1_TO_6, FROM_SCRATCH, encoder_block_with

import mha.numpy as mnp
from mha.checks.registry import CHECKS


def test_every_check_of_chapters_1_to_6_has_a_solution_from_scratch_here():
    assert sorted(FROM_SCRATCH) == sorted(CHAPTERS_1_TO_6)
    assert {name for name, check in CHECKS.items() if check.make_cases.__module__ in
            {f"mha.checks.ch0{n}" for n in range(1, 7)}} == set(CHAPTERS_1_TO_6)


@pytest.mark.parametrize("name", CHAPTERS_1_TO_6)
def test_a_right_solution_from_scratch_passes_on_every_seed(name):
    for seed in SEEDS:
        assert run(name, FROM_SCRATCH[name], seed).startswith(f"check_{name}: all "), seed


# What each exercise may not call, and may ------------------------------------------------------------

# The library functions that each exercise's text permits (the rest of `may_use` is NumPy or SciPy).
PERMITTED = {"self_attention": {"softmax", "masked_softmax"}, "symmetric_attention": {"softmax"},
             "scaled_dot_product_attention": {"masked_softmax"}, "head_attention": {"masked_softmax"},
             "multihead_attention_loop": {"head_attention"},
             "encoder_block": {"multihead_attention", "layer_norm", "feed_forward"}}


@pytest.mark.parametrize("name", CHAPTERS_1_TO_6)
def test_forbids_names_library_functions_and_never_what_the_text_permits(name):
    check = CHECKS[name]
    assert set(check.forbids) <= set(mnp.__all__) and name not in check.forbids
    for allowed in PERMITTED.get(name, ()):
        assert f"mnp.{allowed}" in check.may_use and allowed not in check.forbids, allowed
    assert "torch" not in check.packages
    assert set(check.packages) == ({"scipy"} if name in ("feed_forward", "encoder_block") else set())


@pytest.mark.parametrize("name,routes", [
    ("softmax", {"log_softmax", "masked_softmax", "masked_softmax_", "cross_entropy"}),
    ("self_attention", {"scaled_dot_product_attention", "head_attention", "symmetric_attention"}),
    ("symmetric_attention", {"self_attention", "head_attention"}),
    ("scaled_dot_product_attention", {"head_attention", "chunked_attention", "attend_with_cache"}),
    ("head_attention", {"scaled_dot_product_attention", "multihead_attention"}),
    ("multihead_attention_loop", {"multihead_attention", "grouped_query_attention"}),
    ("split_heads", {"heads_from_fused"}),
    ("causal_mask", {"causal_mask_after"}),
    ("multihead_attention", {"split_heads", "merge_heads", "scaled_dot_product_attention", "softmax"}),
    ("layer_norm", {"decoder_only_transformer"}),
    ("feed_forward", {"relu", "gelu", "gelu_tanh"}),
    ("encoder_block", {"encoder", "decoder_block"}),
])
def test_the_library_routes_of_the_issue_are_forbidden(name, routes):
    assert routes <= set(CHECKS[name].forbids)


def softmax_by_log_softmax(x, axis=-1):
    return np.exp(mnp.log_softmax(x, axis))


def softmax_by_masked_softmax(x, axis=-1):
    return np.moveaxis(mnp.masked_softmax(np.moveaxis(x, axis, -1)), -1, axis)


def self_attention_by_sdpa(X, exclude_self=False):
    return mnp.scaled_dot_product_attention(X, X, X, ~np.eye(X.shape[-2], dtype=bool) if exclude_self else None)


def self_attention_by_head(X, exclude_self=False):
    eye = np.eye(X.shape[-1], dtype=X.dtype)
    return mnp.head_attention(X, eye, eye, mask=~np.eye(X.shape[-2], dtype=bool) if exclude_self else None)


def layer_norm_by_torch(X, gamma, beta, eps=1e-5):
    import torch
    out = torch.nn.functional.layer_norm(torch.from_numpy(X), X.shape[-1:], torch.from_numpy(gamma),
                                         None if beta is None else torch.from_numpy(beta), eps)
    return out.numpy()


def layer_norm_by_qk_norm(X, gamma, beta, eps=1e-5):  # the centred vectors, RMS-normed as one head each
    d = X.shape[-1]
    out = mnp.rms_norm_per_head((X - X.sum(axis=-1, keepdims=True) / d)[..., None, :], gamma, 1, eps)[..., 0, 0, :]
    return out if beta is None else out + beta


def feed_forward_by_library_activations(X, W_1, b_1, W_2, b_2, activation="relu"):
    if activation not in ("relu", "gelu"):
        raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
    H = X @ W_1 if b_1 is None else X @ W_1 + b_1
    H = mnp.gelu(H) if activation == "gelu" else mnp.relu(H)
    return H @ W_2 if b_2 is None else H @ W_2 + b_2


def encoder_block_by_encoder(X, n_heads, *, mask=None, norm_first=False, eps=1e-5, activation="relu", **params):
    out, weights = mnp.encoder(X, [params], n_heads, mask=mask, norm_first=norm_first, eps=eps, activation=activation)
    return out, weights[0]


def causal_mask_by_causal_mask_after(T):
    return mnp.causal_mask_after(T, 0)


ROUTES = [("softmax", softmax_by_log_softmax), ("softmax", softmax_by_masked_softmax),
          ("self_attention", self_attention_by_sdpa), ("self_attention", self_attention_by_head),
          ("layer_norm", layer_norm_by_torch), ("layer_norm", layer_norm_by_qk_norm),
          ("feed_forward", feed_forward_by_library_activations),
          ("encoder_block", encoder_block_by_encoder), ("causal_mask", causal_mask_by_causal_mask_after)]


@pytest.mark.parametrize("name,route", ROUTES, ids=[fn.__name__ for _, fn in ROUTES])
def test_a_library_route_is_refused_in_the_notebook_and_fails_in_the_student_edition(name, route, monkeypatch):
    """In the learner's kernel the route is refused, naming the library function it calls (torch aside: the
    notebook's kernel has it, the grader's worker does not); in the student edition, it fails."""
    if route is not layer_norm_by_torch:
        for message in failures_on_every_seed(name, route, seeds=(0, 1)):
            assert re.search(rf"^{name} calls mha's own \w+, which does this exercise's work", message), message
    with student_edition(name, monkeypatch):
        for message in failures_on_every_seed(name, route):
            assert "this is the exercise" in message or "ModuleNotFoundError: import of torch" in message, message


# Solutions that use what the text permits, as the book's do, by the route the text asks for: they pass in the
# student edition.


def self_attention_by_masked_softmax(X, exclude_self=False):  # the text's loop, each row by mnp.masked_softmax
    T, rows = X.shape[-2], []
    for i in range(T):
        scores = np.einsum("...d,...td->...t", X[..., i, :], X) / math.sqrt(X.shape[-1])  # (..., T)
        rows.append(mnp.masked_softmax(scores, np.arange(T) != i if exclude_self else None))
    w = np.stack(rows, axis=-2)  # (..., T, T)
    return w @ X, w


def symmetric_by_einsum_and_softmax(X, W):
    E = np.einsum("...td,de->...te", X, W)
    w = mnp.softmax(np.einsum("...ie,...je->...ij", E, E) / math.sqrt(W.shape[1]))
    return np.einsum("...ij,...jd->...id", w, X), w


def sdpa_by_masked_softmax(Q, K, V, mask=None):  # the text's loop over the queries, each row by mnp.masked_softmax
    T_q, T_k = Q.shape[-2], K.shape[-2]
    mask = None if mask is None else np.broadcast_to(mask, (*np.shape(mask)[:-2], T_q, T_k))  # (..., T_q, T_k)
    rows = []
    for t in range(T_q):
        scores = np.einsum("...d,...sd->...s", Q[..., t, :], K) / math.sqrt(Q.shape[-1])  # (..., T_k)
        rows.append(mnp.masked_softmax(scores, None if mask is None else mask[..., t, :]))
    w = np.stack(rows, axis=-2).astype(np.result_type(Q, K, V))  # (..., T_q, T_k)
    return w @ V, w


def head_by_einsum_and_masked_softmax(X, W_q, W_k, W_v=None, *, context=None, mask=None):  # every product by einsum
    source = X if context is None else context
    Q, K = np.einsum("...td,de->...te", X, W_q), np.einsum("...sd,de->...se", source, W_k)
    V = source if W_v is None else np.einsum("...sd,dv->...sv", source, W_v)
    w = mnp.masked_softmax(np.einsum("...te,...se->...ts", Q, K) / math.sqrt(W_q.shape[1]), mask)
    w = w.astype(np.result_type(Q, K, V))
    return np.einsum("...ts,...sv->...tv", w, V), w


def loop_by_head_attention(X, heads, W_o, *, context=None, mask=None):  # a sum over heads, each by mnp.head_attention
    source = X if context is None else context
    grid = (*np.broadcast_shapes(X.shape[:-2], source.shape[:-2]), len(heads), X.shape[-2], source.shape[-2])
    mask = None if mask is None else np.broadcast_to(mask, grid)
    out, start, weights = 0, 0, []
    for i, head in enumerate(heads):
        head_out, w = mnp.head_attention(X, *head, context=context, mask=None if mask is None else mask[..., i, :, :])
        out = out + head_out @ W_o[start:start + head_out.shape[-1]]  # its own slice of W_o
        start += head_out.shape[-1]
        weights.append(w)
    return out, np.stack(weights, axis=-3)


PERMITTED_ROUTES = [("self_attention", self_attention_by_masked_softmax),
                    ("symmetric_attention", symmetric_by_einsum_and_softmax),
                    ("scaled_dot_product_attention", sdpa_by_masked_softmax),
                    ("head_attention", head_by_einsum_and_masked_softmax),
                    ("multihead_attention_loop", loop_by_head_attention),
                    ("encoder_block", encoder_block_with(mnp.multihead_attention))]


@pytest.mark.parametrize("name,solution", PERMITTED_ROUTES, ids=[n for n, _ in PERMITTED_ROUTES])
def test_a_solution_that_calls_only_what_the_text_permits_passes_in_the_student_edition(name, solution, monkeypatch):
    assert set(PERMITTED) == {n for n, _ in PERMITTED_ROUTES}
    with student_edition(name, monkeypatch):
        for seed in SEEDS:
            run(name, solution, seed)
