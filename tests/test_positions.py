"""Positions (chapter 10): sinusoidal tables, learned tables and ALiBi.

Each function against a formula written here from scratch; the sinusoidal shift as a linear map;
numpy == torch, also on `meta`; permutation equivariance without positions and its loss with them; the errors; the
chapter's task. Attention with ALiBi's score bias: tests/test_positions_bias.py. The chapter's
claims about trained models, over ten seeds: tests/test_claims_ch10.py."""

import math

import numpy as np
import pytest
import torch
from conftest import DEVICES, assert_matches_cpu, on_device

import mha.numpy as mn
import mha.torch as mt
from mha.experiments.positions import LastAssignmentTask, held_out, train_recall

# The sinusoidal table -------------------------------------------------------------------


def sinusoid_by_loops(T, d, base=10000.0, offset=0):
    """Vaswani et al.'s formula, one entry at a time."""
    table = np.zeros((T, d))
    for t in range(T):
        for i in range(d // 2):
            angle = (offset + t) / base ** (2 * i / d)
            table[t, 2 * i], table[t, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return table


@pytest.mark.parametrize("T,d,base,offset", [(7, 6, 10000.0, 0), (5, 2, 100.0, 3), (1, 16, 10.0, 1000),
                                             (20, 32, 10000.0, 7)])
def test_sinusoidal_positions_follow_the_formula_in_both_faces(T, d, base, offset):
    expected = sinusoid_by_loops(T, d, base, offset)
    ours = mn.sinusoidal_positions(T, d, base=base, offset=offset)
    theirs = mt.sinusoidal_positions(T, d, base=base, offset=offset, dtype=torch.float64)
    assert ours.shape == (T, d) and ours.dtype == np.float64
    assert np.abs(ours - expected).max() < 1e-12
    assert np.abs(theirs.numpy() - ours).max() < 1e-12  # sin and pow may differ in the last bit


def test_sinusoidal_dtypes_and_the_empty_table():
    assert mn.sinusoidal_positions(4, 8, dtype=np.float32).dtype == np.float32
    assert mt.sinusoidal_positions(4, 8).dtype == torch.get_default_dtype()
    assert mt.sinusoidal_positions(4, 8, dtype=torch.bfloat16).dtype == torch.bfloat16
    assert mn.sinusoidal_positions(0, 4).shape == (0, 4) and mt.sinusoidal_positions(0, 4).shape == (0, 4)
    assert mt.sinusoidal_positions(3, 4, device="meta").device.type == "meta"


@pytest.mark.parametrize("k", [0, 1, 5, 37])
def test_a_shift_by_k_is_one_block_diagonal_rotation_for_every_position(k):
    d = 12
    M = mn.sinusoidal_shift(k, d)
    table = mn.sinusoidal_positions(60, d)
    shifted = mn.sinusoidal_positions(60, d, offset=k)
    assert np.abs(table @ M - shifted).max() < 1e-12  # the same M for all 60 positions t
    assert np.abs(M @ M.T - np.eye(d)).max() < 1e-12  # a rotation: orthogonal
    blocks = np.kron(np.eye(d // 2), np.ones((2, 2)))  # where a block-diagonal matrix of 2 x 2 blocks may be nonzero
    assert np.all(M[blocks == 0] == 0)
    theta = 10000.0 ** (-np.arange(0, d, 2) / d)
    for i, angle in enumerate(k * theta):
        block = M[2 * i:2 * i + 2, 2 * i:2 * i + 2]
        assert np.allclose(block, [[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    assert np.abs(mn.sinusoidal_shift(2, d) @ mn.sinusoidal_shift(3, d) - mn.sinusoidal_shift(5, d)).max() < 1e-12


def test_the_frequencies_fall_geometrically_from_1():
    theta = mn.sinusoidal_frequencies(8, base=10000.0)
    assert np.allclose(theta, [1.0, 0.1, 0.01, 0.001])


# Learned tables ----------------------------------------------------------------------------


def test_add_positions_adds_the_rows_at_the_offset_in_both_faces():
    rng = np.random.default_rng(0)
    X, table = rng.normal(size=(2, 3, 5, 4)), rng.normal(size=(9, 4))
    out = mn.add_positions(X, table, offset=2)
    assert np.array_equal(out, X + table[2:7])
    assert np.array_equal(mt.add_positions(torch.tensor(X), torch.tensor(table), offset=2).numpy(), out)
    assert mn.add_positions(X.astype(np.float32), table).dtype == np.float32


def test_learned_positions_module_equals_the_numpy_face_and_runs_on_meta():
    torch.manual_seed(0)
    module = mt.LearnedPositions(10, 6, dtype=torch.float64)
    assert isinstance(module.table, torch.nn.Parameter) and module.table.shape == (10, 6)
    assert 0.7 < module.table.std().item() < 1.3  # nn.Embedding's N(0, 1)
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    expected = mn.add_positions(x.numpy(), module.numpy_params()["table"], offset=3)
    assert np.array_equal(module(x, offset=3).detach().numpy(), expected)
    module(x).sum().backward()
    assert torch.equal(module.table.grad[:4], torch.full((4, 6), 2.0, dtype=torch.float64))  # 2 sequences
    assert torch.equal(module.table.grad[4:], torch.zeros(6, 6, dtype=torch.float64))
    on_meta = mt.LearnedPositions(10, 6, device="meta")
    assert on_meta(torch.empty(2, 4, 6, device="meta")).device.type == "meta"


def test_sinusoidal_module_equals_the_function_at_any_length_and_on_meta():
    module = mt.SinusoidalPositions(8, base=100.0)
    x = torch.randn(3, 50, 8, dtype=torch.float64)
    table = mn.sinusoidal_positions(50, 8, base=100.0, offset=4)
    assert np.abs(module(x, offset=4).numpy() - (x.numpy() + table)).max() < 1e-12
    assert list(module.parameters()) == []
    assert module(torch.empty(2, 5, 8, device="meta", dtype=torch.float16)).dtype == torch.float16


@pytest.mark.parametrize("face", ["numpy", "torch"])
def test_a_table_refuses_a_sequence_longer_than_itself(face):
    X, table = np.zeros((2, 6, 4)), np.zeros((8, 4))
    add = mn.add_positions if face == "numpy" else lambda X, t, offset=0: mt.add_positions(
        torch.tensor(X), torch.tensor(t), offset=offset)
    message = r"sequence of T=6 at offset 3 .* but the position table holds only max_len=8 positions"
    with pytest.raises(ValueError, match=message):
        add(X, table, offset=3)
    with pytest.raises(ValueError, match="the position table has width 5 but X has width d=4"):
        add(X, np.zeros((8, 5)))
    with pytest.raises(ValueError, match="offset must be at least 0"):
        add(X, table, offset=-1)


def test_the_modules_errors():
    with pytest.raises(ValueError, match=r"sequence of T=11 at offset 0 .* max_len=10"):
        mt.LearnedPositions(10, 4)(torch.zeros(11, 4))
    with pytest.raises(ValueError, match="expects width 4"):
        mt.LearnedPositions(10, 4)(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="d_model=5 is odd"):
        mt.SinusoidalPositions(5)
    with pytest.raises(ValueError, match="d_model=7 is odd"):
        mn.sinusoidal_positions(3, 7)
    with pytest.raises(ValueError, match="base must be a number greater than 1"):
        mn.sinusoidal_positions(3, 4, base=1.0)
    with pytest.raises(ValueError, match="T must be at least 0"):
        mt.sinusoidal_positions(-1, 4)
    with pytest.raises(TypeError, match="dtype must be a floating-point dtype"):
        mn.sinusoidal_positions(3, 4, dtype=np.int64)


# ALiBi ---------------------------------------------------------------------------------------


def test_alibi_slopes_for_8_heads_are_the_powers_of_one_half():
    expected = [1 / 2 ** k for k in range(1, 9)]
    assert np.array_equal(mn.alibi_slopes(8), expected)
    assert torch.equal(mt.alibi_slopes(8, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64))


def press_slopes(n):
    """The slopes as Press et al.'s code computes them (their get_slopes, written out)."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + press_slopes(2 * closest)[0::2][:n - closest]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 12, 16, 20])
def test_alibi_slopes_follow_press_et_al_for_any_number_of_heads(n):
    assert np.allclose(mn.alibi_slopes(n), press_slopes(n), rtol=1e-14, atol=0)
    assert np.allclose(mt.alibi_slopes(n, dtype=torch.float64).numpy(), press_slopes(n), rtol=1e-14, atol=0)


def test_the_rule_for_6_heads_by_hand():
    assert np.array_equal(mn.alibi_slopes(6), [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8])


@pytest.mark.parametrize("T_q,T_k", [(4, 4), (1, 6), (3, 7)])
def test_alibi_bias_by_loops_and_in_both_faces(T_q, T_k):
    slopes = np.array([0.5, 0.125, 0.01])
    expected = np.zeros((3, T_q, T_k))
    for h, m in enumerate(slopes):
        for i in range(T_q):
            for j in range(T_k):
                expected[h, i, j] = -m * abs((T_k - T_q + i) - j)
    ours = mn.alibi_bias(T_q, T_k, slopes)
    assert np.array_equal(ours, expected)
    assert np.array_equal(mt.alibi_bias(T_q, T_k, torch.tensor(slopes)).numpy(), expected)
    assert not np.signbit(ours).any() or (ours[np.signbit(ours)] < 0).all()  # no -0.0 on the diagonal


def test_alibi_bias_of_the_last_query_is_the_last_row_of_the_square_one():
    slopes = mn.alibi_slopes(4)
    assert np.array_equal(mn.alibi_bias(1, 9, slopes), mn.alibi_bias(9, 9, slopes)[:, -1:, :])
    assert mt.alibi_bias(2, 5, mt.alibi_slopes(4, device="meta")).device.type == "meta"


def test_alibi_errors():
    with pytest.raises(ValueError, match="T_q=5 queries cannot be the last of only T_k=3 positions"):
        mn.alibi_bias(5, 3, [0.5])
    with pytest.raises(ValueError, match="slopes must have 1 dimensions"):
        mn.alibi_bias(2, 2, [[0.5]])
    with pytest.raises(TypeError, match="slopes must be a floating-point tensor"):
        mt.alibi_bias(2, 2, torch.tensor([1]))
    with pytest.raises(ValueError, match="n_heads must be at least 1"):
        mn.alibi_slopes(0)


# Permutation equivariance ---------------------------------------------------------------------


def test_attention_without_positions_is_permutation_equivariant_and_with_them_is_not():
    rng = np.random.default_rng(1)
    T, d = 7, 8
    X = rng.normal(size=(T, d))
    params = {name: rng.normal(size=(d, d)) / math.sqrt(d) for name in ("W_q", "W_k", "W_v", "W_o")}
    perm = rng.permutation(T)
    out, _ = mn.multihead_attention(X, n_heads=2, **params)
    out_permuted, _ = mn.multihead_attention(X[perm], n_heads=2, **params)
    assert np.abs(out_permuted - out[perm]).max() < 1e-12
    for table in (mn.sinusoidal_positions(T, d), rng.normal(size=(T, d))):
        with_pos, _ = mn.multihead_attention(mn.add_positions(X, table), n_heads=2, **params)
        with_pos_permuted, _ = mn.multihead_attention(mn.add_positions(X[perm], table), n_heads=2, **params)
        assert np.abs(with_pos_permuted - with_pos[perm]).max() > 1e-3
    slopes = mn.alibi_slopes(2)
    with_alibi, _ = mn.multihead_attention(X, n_heads=2, bias=mn.alibi_bias(T, T, slopes), **params)
    with_alibi_permuted, _ = mn.multihead_attention(X[perm], n_heads=2, bias=mn.alibi_bias(T, T, slopes), **params)
    assert np.abs(with_alibi_permuted - with_alibi[perm]).max() > 1e-3


# The chapter's task --------------------------------------------------------


def test_the_task_answers_the_last_assignment():
    task = LastAssignmentTask(n_keys=4, n_values=8)
    tokens, answers = task.batch(500, 12, torch.Generator().manual_seed(0))
    assert tokens.shape == (500, 12) and answers.shape == (500,)
    for row, answer in zip(tokens.tolist(), answers.tolist()):
        words = task.words(row)
        asked = words[-1][0]
        last = [w for w in words[:-1] if w[0] == asked][-1]
        assert words[-1] == asked + "?" and int(last[2:]) == answer
    last = task.last_assignment(tokens)  # (500,): where the answer was assigned
    assert torch.equal(tokens[torch.arange(500), last] % 8, answers)
    assert torch.equal(tokens[torch.arange(500), last] // 8, tokens[:, -1] - 32)
    blind = task.order_blind_accuracy(tokens)
    assert 0.3 < blind < 0.6
    test_tokens, test_answers = held_out(task, 12)  # the chapter's test set: seed 123, 1000 sequences
    assert torch.equal(test_tokens, task.batch(1000, 12, torch.Generator().manual_seed(123))[0])
    assert torch.equal(test_answers, task.answer(test_tokens))


def test_a_model_without_positions_cannot_see_the_order_of_the_assignments():
    task = LastAssignmentTask()
    model = train_recall(task, "none", steps=30).model
    tokens, _ = task.batch(64, 16, torch.Generator().manual_seed(1))
    shuffled = tokens.clone()
    shuffled[:, :-1] = tokens[:, torch.randperm(15)]
    with torch.no_grad():
        assert (model(shuffled) - model(tokens)).abs().max() < 1e-5
    learned = train_recall(task, "learned", steps=30).model
    with torch.no_grad():
        assert (learned(shuffled) - learned(tokens)).abs().max() > 1e-2


# Devices and gradients ----------------------------------------------------------------------------


def biased_attention():
    """A MultiHeadAttention given ALiBi's bias and a causal mask, as one module for the device tests."""
    class Biased(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = mt.MultiHeadAttention(8, 2, dtype=torch.float64)

        def forward(self, x, return_weights=False):
            slopes = mt.alibi_slopes(2, dtype=x.dtype, device=x.device)
            bias = mt.alibi_bias(x.shape[-2], x.shape[-2], slopes)  # made where x is
            return self.attention(x, bias=bias, causal=True, return_weights=return_weights)
    return Biased()


def position_cases():
    torch.manual_seed(0)
    return [("learned", mt.LearnedPositions(10, 8, dtype=torch.float64)), ("sinusoidal", mt.SinusoidalPositions(8)),
            ("alibi-attention", biased_attention())]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,module", position_cases(), ids=[c[0] for c in position_cases()])
def test_the_position_modules_run_on_any_device(name, module, device):
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    with torch.no_grad():
        assert_matches_cpu(on_device(module, device)(x.to(device)), module(x), device, name)


@pytest.mark.parametrize("name,module", position_cases(), ids=[c[0] for c in position_cases()])
def test_gradcheck_of_the_position_modules(name, module):
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: module(x), (x,), eps=1e-6, atol=1e-5)
    if name == "learned":
        table = module.table.detach().clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda t: mt.add_positions(x.detach(), t, offset=2), (table,))
