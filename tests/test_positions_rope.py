"""Chapter 10's RoPE models: the "rope" kind of RecallModel and its dynamic NTK reading, "rope_dynamic".

The rotated attention against the formula written here with loops; scores that depend on the
distance only; dynamic NTK that changes nothing up to the training length and stretches the
slowest pair beyond it; the choice of the base; the errors. The claims about trained models,
over ten seeds: tests/test_claims_ch10.py."""

import math

import numpy as np
import pytest
import torch
from conftest import DEVICES, assert_matches_cpu, on_device

from mha.experiments.positions import (ROPE_BASE, TEST_LENGTHS, LastAssignmentTask, RecallModel, dynamic_ntk,
                                       stretched_rope, weight_beyond)
from mha.torch.rotary import rotary_frequencies

TASK = LastAssignmentTask()


def random_model(kind, seed=0):
    """A float64 RecallModel of `kind` with weights drawn large enough that the scores matter."""
    torch.manual_seed(seed)
    model = RecallModel(TASK, kind).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def rotate_by_hand(vector, position, base):
    """Turn the pair (i, i + d/2) of `vector` (d,) by position * base^(-2i/d), one pair at a time."""
    d, out = len(vector), vector.copy()
    for i in range(d // 2):
        angle = position * base ** (-2 * i / d)
        a, b = vector[i], vector[i + d // 2]
        out[i], out[i + d // 2] = a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle)
    return out


def rope_model_by_hand(model, tokens):
    """The RoPE model's logits (n_values,) and the question's weights (h, T), from the formula, in NumPy."""
    p = {name: value.detach().numpy() for name, value in model.named_parameters()}
    x = p["embed.weight"][tokens]  # (T, d)
    T, d, h = len(tokens), x.shape[1], model.attention.n_heads
    d_head = d // h

    def project(name, rows):
        return rows @ p[f"attention.{name}.weight"].T + p[f"attention.{name}.bias"]

    q, k, v = project("W_q", x[-1]), project("W_k", x), project("W_v", x)  # (d,), (T, d), (T, d)
    outputs, weights = [], []
    for head in range(h):
        cols = slice(head * d_head, (head + 1) * d_head)
        q_rotated = rotate_by_hand(q[cols], T - 1, model.rope_base)  # the question sits at T - 1
        scores = np.array([q_rotated @ rotate_by_hand(k[j, cols], j, model.rope_base) for j in range(T)])
        w = np.exp(scores / math.sqrt(d_head) - (scores / math.sqrt(d_head)).max())
        w /= w.sum()
        weights.append(w)
        outputs.append(w @ v[:, cols])  # (d_head,)
    out = np.concatenate(outputs) @ p["attention.W_o.weight"].T + p["attention.W_o.bias"]  # (d,)
    return out @ p["readout.weight"].T + p["readout.bias"], np.array(weights)


@pytest.mark.parametrize("T", [1, 5, 16, 40])
def test_the_rope_model_rotates_the_query_and_the_keys_as_the_formula_says(T):
    model = random_model("rope")
    tokens, _ = TASK.batch(3, max(T, 2), torch.Generator().manual_seed(T))
    tokens = tokens[:, -T:]  # T = 1: the question alone
    with torch.no_grad():
        logits, weights = model(tokens, return_weights=True)  # (3, n_values), (3, h, T)
    for row in range(3):
        expected_logits, expected_weights = rope_model_by_hand(model, tokens[row].numpy())
        assert np.abs(logits[row].numpy() - expected_logits).max() < 1e-12
        assert np.abs(weights[row].numpy() - expected_weights).max() < 1e-12
    if T > 1:
        assert weights.std(-1).max() > 0.01  # the weights are not uniform: the test sees the rotation


def test_a_score_depends_on_the_distance_to_the_question_only():
    """Put tokens in front: RoPE's (and ALiBi's) weights on the old keys keep their ratios; the sinusoids' do not."""
    tokens, _ = TASK.batch(5, 10, torch.Generator().manual_seed(1))  # (5, 10)
    prefix, _ = TASK.batch(5, 7, torch.Generator().manual_seed(2))
    longer = torch.cat([prefix[:, :-1], tokens], dim=-1)  # (5, 16): six tokens in front
    change = {}
    for kind in ("rope", "alibi", "sinusoidal"):
        model = random_model(kind)
        with torch.no_grad():
            _, short = model(tokens, return_weights=True)  # (5, h, 10)
            _, long = model(longer, return_weights=True)  # (5, h, 16)
        tail = long[..., 6:] / long[..., 6:].sum(-1, keepdim=True)  # (5, h, 10): the old keys, renormalised
        change[kind] = (tail - short).abs().max().item()
    assert change["rope"] < 1e-12 and change["alibi"] < 1e-12
    assert change["sinusoidal"] > 1e-3


def test_dynamic_ntk_changes_nothing_up_to_the_training_length_and_stretches_beyond():
    model = random_model("rope")
    stretched = stretched_rope(model)
    assert model.kind == "rope" and model.rope_scaling is None  # a copy: the trained model is unchanged
    assert stretched.kind == "rope_dynamic" and stretched.rope_scaling == dynamic_ntk(16)
    for T in range(1, 17):
        tokens, _ = TASK.batch(4, max(T, 2), torch.Generator().manual_seed(T))
        with torch.no_grad():
            assert torch.equal(stretched(tokens[:, -T:]), model(tokens[:, -T:])), T
    for T in (17, 32, 128):
        tokens, _ = TASK.batch(4, T, torch.Generator().manual_seed(T))
        with torch.no_grad():
            assert (stretched(tokens) - model(tokens)).abs().max() > 1e-6, T
    built = RecallModel(TASK, "rope_dynamic")  # the kind can also be made directly
    assert built.rope_scaling == dynamic_ntk(16)


@pytest.mark.parametrize("T", [17, 32, 64, 128])
def test_dynamic_ntk_with_factor_1_fits_the_slowest_pair_into_the_turn_it_had_in_training(T):
    """"the slowest pair turns over T positions as far as it turned over max_len, the fastest keeps its speed"."""
    d_head = 8
    plain, _ = rotary_frequencies(d_head, ROPE_BASE, dtype=torch.float64)  # (d_head / 2,)
    scaled, factor = rotary_frequencies(d_head, ROPE_BASE, dynamic_ntk(16), seq_len=T, dtype=torch.float64)
    assert factor == 1.0
    assert abs(scaled[-1].item() * T - plain[-1].item() * 16) < 1e-12
    assert scaled[0].item() == plain[0].item() == 1.0
    assert (scaled[1:] < plain[1:]).all() and (torch.diff(plain / scaled) > 0).all()  # slower pairs slowed more


def test_the_base_lets_the_slowest_pair_turn_less_than_once_over_the_longest_test():
    """The reason given for ROPE_BASE = 100 (d_head = 8: four pairs)."""
    d_head, longest = 32 // 4, max(TEST_LENGTHS)
    slowest = ROPE_BASE ** (-(d_head - 2) / d_head)  # radians per position of the last pair
    assert slowest * longest < 2 * math.pi  # no two positions up to 128 share all their angles
    assert slowest * 15 > 0.4  # over the training distances, the slowest pair still turns
    llama = 10000.0 ** (-np.arange(0, d_head, 2) / d_head)  # (4,): Llama's base
    assert llama[2] * 15 < 0.2 and llama[3] * 15 < 0.02  # its two slowest pairs barely turn within 16


def test_weight_beyond_counts_the_keys_farther_back_than_the_distance():
    model = random_model("none")
    with torch.no_grad():
        model.attention.W_q.weight.zero_()
        model.attention.W_q.bias.zero_()  # every score 0: uniform weights, 1 / T on each key
    for T in (8, 16, 17, 128):
        assert abs(weight_beyond(model, TASK, T) - max(T - 16, 0) / T) < 1e-12, T
    assert abs(weight_beyond(model, TASK, 128, distance=0) - 127 / 128) < 1e-12


def test_the_errors():
    with pytest.raises(ValueError, match=r"positions must be one of .*'rope'.*got 'rotary'"):
        RecallModel(TASK, "rotary")
    with pytest.raises(ValueError, match=r"expected a RecallModel with positions 'rope', got 'alibi'"):
        stretched_rope(random_model("alibi"))
    with pytest.raises(TypeError, match=r"expected a RecallModel with positions 'rope', got a Linear"):
        stretched_rope(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_the_rope_models_run_on_any_device(device):
    for model in (random_model("rope"), stretched_rope(random_model("rope"))):
        tokens, _ = TASK.batch(2, 40, torch.Generator().manual_seed(0))
        with torch.no_grad():
            got = on_device(model, device)(tokens.to(device), return_weights=True)
            assert_matches_cpu(got, model(tokens, return_weights=True), device, model.kind)


def test_gradients_reach_the_query_and_the_keys_through_the_rotation():
    model = random_model("rope")
    tokens, _ = TASK.batch(2, 6, torch.Generator().manual_seed(0))
    b_q, b_k = (model.attention.get_submodule(name).bias.detach().clone().requires_grad_() for name in ("W_q", "W_k"))

    def logits_for(b_q, b_k):
        params = {"attention.W_q.bias": b_q, "attention.W_k.bias": b_k}
        return torch.func.functional_call(model, params, (tokens,))  # (2, n_values)

    assert torch.autograd.gradcheck(logits_for, (b_q, b_k), eps=1e-6, atol=1e-5)
