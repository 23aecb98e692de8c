"""mha.experiments.heads: the two-relation task, identical heads staying identical, knocking
heads out, and the small functions of the chapters' sweeps.

The one exact claim of training, that identical heads stay identical, is asserted bit for
bit; `make test` runs this file under several kinds of CPU kernels and thread counts (see
the Makefile). What training does beyond that is a claim over seeds: it is asserted in
tests/test_claims_ch07.py, from the stored tables of the sweeps.
"""

import numpy as np
import pytest
import torch

import mha.numpy as mn
import mha.torch as mt
from conftest import assert_close
from mha.experiments.counting import attention_multiply_adds, attention_parameters
from mha.experiments import heads
from mha.experiments.heads import (AttentionReadout, SumOfHeadsAttention, TwoRelationTask, head_difference,
                                   knock_out_mask, make_heads_identical)
from mha.experiments.tasks import train

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


def test_only_a_sum_of_heads_is_accepted():
    for other in (mt.MultiHeadAttention(8, 2), mt.MultiHeadAttentionLoop(8, 2)):
        with pytest.raises(TypeError, match="SumOfHeadsAttention"):
            make_heads_identical(other)
        with pytest.raises(TypeError, match="SumOfHeadsAttention"):
            head_difference(other)
    with pytest.raises(TypeError, match="MultiHeadAttentionLoop"):
        SumOfHeadsAttention.from_loop(mt.MultiHeadAttention(8, 2))


@pytest.mark.parametrize("d_head", [None, 3, 8])
def test_the_sum_of_heads_equals_the_loop_of_chapter_4_from_the_same_seed(d_head):
    """Same random start for the same seed, and the same function: concatenate then W_o."""
    torch.manual_seed(7)
    loop = mt.MultiHeadAttentionLoop(8, 2, d_head, dtype=torch.float64)
    torch.manual_seed(7)
    ours = SumOfHeadsAttention(8, 2, d_head, dtype=torch.float64)
    x, context = torch.randn(3, 5, 8, dtype=torch.float64), torch.randn(3, 6, 8, dtype=torch.float64)
    mask = mt.padding_mask(torch.tensor([6, 2, 1]), 6) & torch.tensor([True, False])[:, None, None]
    for args in ((x,), (x, context, mask)):
        (out, weights), (expected, expected_weights) = ours(*args, return_weights=True), loop(*args, return_weights=True)
        assert_close(out, expected, what="output")
        assert torch.equal(weights, expected_weights)  # the heads themselves are the same modules' arithmetic
    assert_close(SumOfHeadsAttention.from_loop(loop)(x), loop(x), what="from_loop")


def test_the_sum_of_heads_equals_the_numpy_loop():
    torch.manual_seed(3)
    ours = SumOfHeadsAttention(6, 3, dtype=torch.float64)
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    expected, expected_weights = mn.multihead_attention_loop(x.numpy(), **ours.numpy_params(), mask=mn.causal_mask(4))
    out, weights = ours(x, mask=mt.causal_mask(4), return_weights=True)
    assert_close(out, expected, what="output")
    assert_close(weights, expected_weights, what="weights")
    assert ours.numpy_params()["W_o"].shape == (6, 6)


def test_each_head_owns_its_block_of_W_o():
    """No parameter is shared between heads: every head's tensors are its own storage."""
    torch.manual_seed(0)
    ours = SumOfHeadsAttention(12, 3)
    pointers = [p.data_ptr() for head in ours.heads for p in head.parameters()]
    assert len(set(pointers)) == len(pointers) == 3 * 4
    assert all(head.W_o.weight.shape == (12, 4) for head in ours.heads)


def test_the_sum_of_heads_runs_on_meta_tensors():
    ours = SumOfHeadsAttention(8, 2, device="meta")
    out, weights = ours(torch.empty(3, 5, 8, device="meta"), return_weights=True)
    assert out.device.type == weights.device.type == "meta" and weights.shape == (3, 2, 5, 5)


def test_bad_input_to_the_sum_of_heads_is_refused():
    ours = SumOfHeadsAttention(8, 2)
    with pytest.raises(ValueError, match="width 8"):
        ours(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match="mask"):
        ours(torch.randn(2, 5, 8), mask=torch.ones(3, 5, 5, dtype=torch.bool))


def trained(n_heads=2, identical=False, d_head=None, steps=400, seed=0):
    return heads.trained_readout(seed, n_heads, d_head, identical=identical, steps=steps)


@pytest.fixture(scope="module")
def held_out():
    return heads.held_out()


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    """Run a test with 1, then 2 threads: the kernels split their work differently."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def test_identical_heads_stay_exactly_identical_and_learn_one_relation_only(held_out, threads):
    X, Y, _ = held_out
    twin = trained(identical=True, steps=150)
    assert head_difference(twin) == 0.0  # bit for bit, on any CPU and with any number of threads
    with torch.no_grad():
        previous, partner = TASK.part_losses(twin(X), Y)
    assert max(previous, partner) > 0.5, "two copies of one head cannot fetch both values"


# What training does on chapter 7's task (the heads split, knock-outs, the layouts at an equal
# budget, a perturbation of 1e-9 breaking the tie) is asserted over seeds in
# tests/test_claims_ch07.py, from the stored tables of mha.experiments.heads' sweeps.


def test_the_knock_out_mask_equals_deleting_the_heads_rows_of_W_o():
    torch.manual_seed(0)
    model = AttentionReadout(TASK.d_in, 4, TASK.d_out)
    X, _, _ = TASK.batch(3, torch.Generator().manual_seed(2))
    mask = knock_out_mask(4, [1, 3])
    assert mask.shape == (4, 1, 1) and mask.flatten().tolist() == [True, False, True, False]
    with torch.no_grad():
        masked, weights = model(X, mask=mask, return_weights=True)
        model.attention.heads[1].W_o.weight.zero_()  # W_O,1: head 1's rows of W_O
        model.attention.heads[3].W_o.weight.zero_()
        deleted = model(X)
    assert torch.equal(masked, deleted)  # both add exact zeros for heads 1 and 3
    assert weights[:, 1].abs().max() == 0 and weights[:, 3].abs().max() == 0
    assert torch.allclose(weights[:, 0].sum(-1), torch.ones(3, 8))


def test_knock_out_mask_refuses_a_head_that_does_not_exist():
    with pytest.raises(ValueError, match="head 4 does not exist"):
        knock_out_mask(4, 4)


@pytest.mark.parametrize("n_heads, d_head", heads.LAYOUTS)
def test_layouts_of_an_equal_budget_have_equal_parameters_and_multiply_adds(n_heads, d_head):
    """Chapter 7's fair comparison: layouts with the same h * d_head have the same costs."""
    model = AttentionReadout(TASK.d_in, n_heads, TASK.d_out, d_head)
    budget = n_heads * d_head
    n_params = attention_parameters(TASK.d_in, n_heads, d_head)
    assert sum(p.numel() for p in model.attention.parameters()) == n_params == 4 * TASK.d_in * budget
    cost = attention_multiply_adds(8, 8, TASK.d_in, n_heads, d_head).total
    assert cost == (4 * 8 * TASK.d_in + 2 * 8 * 8) * budget  # projections, then scores and sums


def test_fit_takes_the_same_steps_as_train():
    """The sweeps' loop (which records after each step) and tasks.train move a model alike."""
    models = []
    for loop in ("fit", "train"):
        torch.manual_seed(4)
        model = AttentionReadout(TASK.d_in, 2, TASK.d_out)
        if loop == "fit":
            heads.fit(model, torch.optim.Adam(model.parameters(), lr=0.01), 4, steps=5)
        else:
            train(model, TASK.make_batch(64), steps=5, lr=0.01, seed=4)
        models.append(model)
    for p, q in zip(*(m.parameters() for m in models)):
        assert torch.equal(p, q)


def test_the_slope_network_adds_its_branches_and_its_target_is_the_absolute_slope():
    x, target = heads.slope_signals(torch.Generator().manual_seed(0), batch_size=3, length=6)
    assert x.shape == target.shape == (3, 1, 6)
    assert torch.equal(target[..., 2], (x[..., 3] - x[..., 1]).abs())
    assert torch.equal(target[..., 0], (x[..., 1] - x[..., 5]).abs())  # the ends wrap around
    torch.manual_seed(0)
    network = heads.SlopeNetwork()
    with torch.no_grad():
        assert torch.equal(network(x), network.branches[0](x) + network.branches[1](x))
    assert heads.split_step([0.0, 0.05, 0.2, 3.0]) == 2 and heads.split_step([0.0, 0.01]) == 2


def test_three_identical_wide_heads_stay_identical_bit_for_bit(threads):
    twin = trained(n_heads=3, identical=True, d_head=TASK.d_in, steps=60)
    assert head_difference(twin) == 0.0


@pytest.mark.parametrize("variant", ["W_o block doubled, Adam", "SGD"])
def test_the_tie_needs_every_parameter_equal_but_no_particular_optimiser(variant):
    """Chapter 7's exercise: unequal W_O blocks break the tie at once; SGD keeps it exactly."""
    torch.manual_seed(21)
    pair = make_heads_identical(AttentionReadout(TASK.d_in, 2, TASK.d_out))
    if variant == "SGD":
        sgd, draws = torch.optim.SGD(pair.parameters(), lr=0.1), torch.Generator().manual_seed(4)
        for _ in range(50):
            inputs, targets = TASK.make_batch(64)(draws)
            sgd.zero_grad()
            torch.nn.functional.mse_loss(pair(inputs), targets).backward()
            sgd.step()
    else:
        with torch.no_grad():
            pair.attention.heads[1].W_o.weight *= 2.0
        train(pair, TASK.make_batch(64), steps=50, lr=0.01, seed=4)
    first, second = pair.attention.heads
    gap = max(float((getattr(first, n).weight - getattr(second, n).weight).detach().abs().max())
              for n in ("W_q", "W_k", "W_v"))
    assert gap == 0.0 if variant == "SGD" else gap > 0.01
