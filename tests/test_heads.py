"""mha.heads: the two-relation task, identical heads staying identical, heads that
specialise, and knocking heads out (chapter 7's claims, as tests)."""

import pytest
import torch

import mha.numpy as mn
import mha.torch as mt
from mha.heads import (AttentionReadout, TwoRelationTask, head_difference, knock_out_mask,
                       make_heads_identical)
from mha.tasks import train

TASK = TwoRelationTask(T=8, n_symbols=8, d_value=4)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_every_symbol_appears_twice_and_the_targets_are_the_two_relations():
    X, Y, symbols = TASK.batch(16, torch.Generator().manual_seed(0))
    assert X.shape == (16, 8, TASK.d_in) == (16, 8, 20) and Y.shape == (16, 8, TASK.d_out) == (16, 8, 8)
    for row in symbols.tolist():
        assert sorted(row.count(s) for s in set(row)) == [2, 2, 2, 2]
    one_hot, values, positions = X[..., :8], X[..., 8:12], X[..., 12:]
    assert torch.equal(one_hot.argmax(-1), symbols) and torch.equal(positions[0], torch.eye(8))
    partner = TASK.partners(symbols)
    for b in range(16):
        for t in range(8):
            p = int(partner[b, t])
            assert p != t and symbols[b, p] == symbols[b, t]
            assert torch.equal(Y[b, t, :4], values[b, t - 1])  # t - 1 = -1 wraps to the last token
            assert torch.equal(Y[b, t, 4:], values[b, p])
    assert TASK.labels(symbols[0])[0] == f"0 {'ABCDEFGH'[symbols[0, 0]]}"


def test_bad_task_sizes_are_refused():
    with pytest.raises(ValueError, match="even"):
        TwoRelationTask(T=7)
    with pytest.raises(ValueError, match="n_symbols"):
        TwoRelationTask(T=8, n_symbols=3)


def test_identical_heads_compute_the_same_output():
    torch.manual_seed(0)
    model = AttentionReadout(TASK.d_in, 3, TASK.d_out, d_head=6)
    assert head_difference(model) > 0.1
    assert make_heads_identical(model) is model and head_difference(model) == 0.0
    X, _, _ = TASK.batch(4, torch.Generator().manual_seed(1))
    _, weights = model(X, return_weights=True)
    assert torch.equal(weights[:, 0], weights[:, 1]) and torch.equal(weights[:, 0], weights[:, 2])


def test_only_the_loop_module_is_accepted():
    with pytest.raises(TypeError, match="MultiHeadAttentionLoop"):
        make_heads_identical(mt.MultiHeadAttention(8, 2))


def trained(n_heads=2, identical=False, d_head=None, steps=400, seed=0):
    torch.manual_seed(seed)
    model = AttentionReadout(TASK.d_in, n_heads, TASK.d_out, d_head)
    if identical:
        make_heads_identical(model)
    losses = train(model, TASK.make_batch(64), steps=steps, lr=0.01, seed=seed)
    return model, losses


@pytest.fixture(scope="module")
def held_out():
    return TASK.batch(512, torch.Generator().manual_seed(123))


@pytest.fixture(scope="module")
def specialised():
    return trained()[0]


def test_identical_heads_stay_exactly_identical_and_learn_one_relation_only(held_out):
    X, Y, _ = held_out
    twin, _ = trained(identical=True, steps=150)
    assert head_difference(twin) == 0.0
    with torch.no_grad():
        previous, partner = TASK.part_losses(twin(X), Y)
    assert max(previous, partner) > 0.5, "two copies of one head cannot fetch both values"


def test_random_heads_split_the_two_relations(specialised, held_out):
    X, Y, symbols = held_out
    assert head_difference(specialised) > 1
    with torch.no_grad():
        _, weights = specialised(X, return_weights=True)
        assert max(TASK.part_losses(specialised(X), Y)) < 0.05
    previous = mn.attention_at_offset(weights.numpy(), -1).mean(axis=0)  # (h,)
    partner = TASK.partner_attention(weights, symbols).numpy()
    assert previous.argmax() != partner.argmax()
    assert previous.max() > 0.9 and partner.max() > 0.9


def test_knocking_out_a_head_removes_exactly_its_relation(specialised, held_out):
    X, Y, symbols = held_out
    with torch.no_grad():
        _, weights = specialised(X, return_weights=True)
        previous_head = int(mn.attention_at_offset(weights.numpy(), -1).mean(axis=0).argmax())
        without_previous = TASK.part_losses(specialised(X, mask=knock_out_mask(2, previous_head)), Y)
        without_partner = TASK.part_losses(specialised(X, mask=knock_out_mask(2, 1 - previous_head)), Y)
    assert without_previous[0] > 0.5 > 0.05 > without_previous[1]
    assert without_partner[1] > 0.5 > 0.05 > without_partner[0]


def test_the_knock_out_mask_equals_deleting_the_heads_rows_of_W_o():
    torch.manual_seed(0)
    model = AttentionReadout(TASK.d_in, 4, TASK.d_out)
    X, _, _ = TASK.batch(3, torch.Generator().manual_seed(2))
    mask = knock_out_mask(4, [1, 3])
    assert mask.shape == (4, 1, 1) and mask.flatten().tolist() == [True, False, True, False]
    with torch.no_grad():
        masked, weights = model(X, mask=mask, return_weights=True)
        model.attention.W_o.weight[:, 5:10] = 0  # d_head = 5: head 1's columns in nn.Linear storage
        model.attention.W_o.weight[:, 15:20] = 0
        deleted = model(X)
    assert (masked - deleted).abs().max() < 1e-6
    assert weights[:, 1].abs().max() == 0 and weights[:, 3].abs().max() == 0
    assert torch.allclose(weights[:, 0].sum(-1), torch.ones(3, 8))


def test_knock_out_mask_refuses_a_head_that_does_not_exist():
    with pytest.raises(ValueError, match="head 4 does not exist"):
        knock_out_mask(4, 4)


def test_wide_heads_learn_the_task_faster_than_narrow_ones(held_out):
    X, Y, _ = held_out
    final = {}
    for kind, d_head in (("narrow", None), ("wide", TASK.d_in)):
        model, _ = trained(n_heads=4, d_head=d_head, steps=250)
        with torch.no_grad():
            final[kind] = sum(TASK.part_losses(model(X), Y))
        heads = sum(p.numel() for p in model.attention.parameters())
        assert heads == 4 * TASK.d_in * 4 * (d_head or TASK.d_in // 4)
    assert final["wide"] < final["narrow"]
