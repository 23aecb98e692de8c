"""Positions (chapter 10): sinusoidal tables, learned tables, ALiBi, and attention with a score bias.

Each function against a formula written here from scratch; the sinusoidal shift as a linear map;
the bias path against F.scaled_dot_product_attention with a float mask; numpy == torch, also on
`meta`; permutation equivariance without positions and its loss with them; the errors; and the
chapter's training claims over several seeds."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, assert_matches_cpu, on_device

import mha.numpy as mn
import mha.torch as mt
from mha.experiments.positions import LastAssignmentTask, accuracy, train_recall

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


# Attention with a score bias --------------------------------------------------------------------


def random_qkv(B=2, h=3, T_q=5, T_k=5, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, h, T, d, generator=g, dtype=torch.float64) for T in (T_q, T_k, T_k))


@pytest.mark.parametrize("T_q,T_k", [(5, 5), (2, 6)])
def test_the_bias_path_equals_pytorch_with_a_float_mask(T_q, T_k):
    q, k, v = random_qkv(T_q=T_q, T_k=T_k)
    bias = mt.alibi_bias(T_q, T_k, mt.alibi_slopes(3, dtype=torch.float64))  # (h, T_q, T_k)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    out, weights = mt.scaled_dot_product_attention(q, k, v, bias=bias)
    assert (out - expected).abs().max() < 1e-12
    out_np, weights_np = mn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), bias=bias.numpy())
    assert np.abs(out_np - expected.numpy()).max() < 1e-12 and np.abs(weights_np - weights.numpy()).max() < 1e-12


def test_a_bias_with_a_boolean_mask_and_a_fully_masked_row():
    q, k, v = random_qkv()
    bias = mt.alibi_bias(5, 5, mt.alibi_slopes(3, dtype=torch.float64))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    mask[1, 0, 2] = False  # sequence 1, query 2 may attend to nothing
    float_mask = bias.masked_fill(~mask, float("-inf"))  # (2, 3, 5, 5)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask)
    out, weights = mt.scaled_dot_product_attention(q, k, v, mask, bias=bias)
    assert (out - expected).abs().max() < 1e-12
    assert torch.all(weights[1, :, 2] == 0) and torch.all(out[1, :, 2] == 0)
    out_np, weights_np = mn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), mask.numpy(),
                                                         bias=bias.numpy())
    assert np.abs(out_np - expected.numpy()).max() < 1e-12 and np.all(weights_np[1, :, 2] == 0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_the_module_takes_a_bias_on_its_fast_and_explicit_paths_and_equals_the_numpy_face(causal, with_mask):
    torch.manual_seed(0)
    layer = mt.MultiHeadAttention(8, 2, dtype=torch.float64).eval()
    x = torch.randn(3, 6, 8, dtype=torch.float64)
    bias = mt.alibi_bias(6, 6, mt.alibi_slopes(2, dtype=torch.float64))
    mask = mt.padding_mask([6, 4, 0], 6) if with_mask else None  # the last sequence has no real key
    with torch.no_grad():
        fast = layer(x, mask=mask, causal=causal, bias=bias)
        explicit, weights = layer(x, mask=mask, causal=causal, bias=bias, return_weights=True)
    assert (fast - explicit).abs().max() < 1e-12
    full_mask = np.ones((6, 6), dtype=bool) if mask is None else mask.numpy()
    full_mask = full_mask & (mn.causal_mask(6) if causal else True)
    ours, ours_weights = mn.multihead_attention(x.numpy(), n_heads=2, mask=full_mask, bias=bias.numpy(),
                                                **layer.numpy_params())
    assert np.abs(ours - fast.numpy()).max() < 1e-12 and np.abs(ours_weights - weights.numpy()).max() < 1e-12
    on_meta = layer.to("meta")(x.to("meta"), causal=causal, bias=bias.to("meta"))
    assert on_meta.shape == (3, 6, 8)


def test_a_zero_bias_changes_nothing_and_a_constant_one_too():
    q, k, v = random_qkv()
    plain, _ = mn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy())
    shifted, _ = mn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), bias=np.full((5, 5), 3.0))
    assert np.abs(plain - shifted).max() < 1e-12  # a softmax ignores a constant added to a row


def test_the_bias_errors():
    q, k, v = random_qkv()
    with pytest.raises(ValueError, match=r"bias has shape \(4, 5, 5\) but scores have shape \(2, 3, 5, 5\)"):
        mn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), bias=np.zeros((4, 5, 5)))
    with pytest.raises(ValueError, match=r"bias has shape \(5, 6\)"):
        mt.scaled_dot_product_attention(q, k, v, bias=torch.zeros(5, 6, dtype=torch.float64))
    with pytest.raises(TypeError, match="bias must be a floating-point tensor"):
        mt.scaled_dot_product_attention(q, k, v, bias=torch.zeros(5, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="bias must be an array of numbers"):
        mn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), bias=np.zeros((5, 5), dtype=bool))
    with pytest.raises(ValueError, match=r"bias has shape \(3, 6, 6\) but scores have shape \(2, 3, 5, 5\)"):
        mt.MultiHeadAttention(6, 3)(torch.zeros(2, 5, 6), bias=torch.zeros(3, 6, 6))
    # A float32 score with a float64 bias stays float32.
    out, weights = mn.scaled_dot_product_attention(*(a.numpy().astype(np.float32) for a in (q, k, v)),
                                                   bias=np.zeros((5, 5)))
    assert out.dtype == weights.dtype == np.float32


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


# The chapter's task and its training claims --------------------------------------------------------


def test_the_task_answers_the_last_assignment():
    task = LastAssignmentTask(n_keys=4, n_values=8)
    tokens, answers = task.batch(500, 12, torch.Generator().manual_seed(0))
    assert tokens.shape == (500, 12) and answers.shape == (500,)
    for row, answer in zip(tokens.tolist(), answers.tolist()):
        words = task.words(row)
        asked = words[-1][0]
        last = [w for w in words[:-1] if w[0] == asked][-1]
        assert words[-1] == asked + "?" and int(last[2:]) == answer
    blind = task.order_blind_accuracy(tokens)
    assert 0.3 < blind < 0.6


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


@pytest.fixture(scope="module")
def trained():
    """The chapter's four models, over three seeds: accuracies at the lengths of the figure."""
    torch.set_num_threads(1)
    task = LastAssignmentTask()
    lengths = (8, 16, 32, 64, 128)
    results = {}
    for kind in ("none", "learned", "sinusoidal", "alibi"):
        for seed in (0, 1, 2):
            model = train_recall(task, kind, seed=seed).model
            results[kind, seed] = {T: accuracy(model, task, T) for T in lengths if kind != "learned" or T <= 16}
    return task, results


def test_the_chapters_training_claims_hold_for_three_seeds(trained):
    task, results = trained
    ceiling = {T: task.order_blind_accuracy(task.batch(1000, T, torch.Generator().manual_seed(123))[0])
               for T in (16, 64)}
    for seed in (0, 1, 2):
        assert abs(results["none", seed][16] - ceiling[16]) < 0.05  # position-blind: at the ceiling
        assert results["learned", seed][16] > 0.85 and results["sinusoidal", seed][16] > 0.85
        assert results["alibi", seed][16] > 0.8
        assert results["sinusoidal", seed][64] < 0.3 and results["sinusoidal", seed][128] < 0.3
        assert min(results["alibi", seed].values()) > 0.8  # ALiBi holds at every length
        assert results["alibi", seed][128] > results["alibi", seed][16] - 0.05
    mean = {(kind, T): np.mean([results[kind, seed][T] for seed in (0, 1, 2)])
            for kind in ("none", "sinusoidal") for T in (16, 64)}
    assert mean["sinusoidal", 64] < ceiling[64]  # past the training length, worse than blind
    assert abs(mean["none", 64] - ceiling[64]) < 0.05


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_mixed_lengths_exercise_claims_hold(seed):
    torch.set_num_threads(1)
    task = LastAssignmentTask()
    lengths = tuple(range(8, 17))
    learned = train_recall(task, "learned", T=lengths, seed=seed).model
    sinusoidal = train_recall(task, "sinusoidal", T=lengths, seed=seed).model
    alibi = train_recall(task, "alibi", T=lengths, seed=seed).model
    assert accuracy(learned, task, 8) > 0.85 and accuracy(sinusoidal, task, 8) > 0.85
    assert accuracy(sinusoidal, task, 64) < 0.3 and accuracy(alibi, task, 64) > 0.8


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
