"""Chapter 11's decoder-only Transformer: equal to one assembled from PyTorch's own layers, the NumPy
face equal to the PyTorch face, the loss equal to F.cross_entropy, the warm-up's values, generation,
and clear errors for bad input."""

import copy
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mha.numpy as mnp
import mha.numpy.model as numpy_model
import mha.torch as mt
import mha.torch.model as torch_model

V, D, H, LAYERS, D_FF, MAX_LEN = 11, 12, 3, 2, 20, 9


class PyTorchGPT(nn.Module):
    """The same model from PyTorch's layers: nn.Embedding, a position table as an nn.Parameter,
    nn.TransformerEncoderLayer (pre-norm, GELU) with a causal mask, nn.LayerNorm, nn.Linear."""

    def __init__(self, dropout=0.0, dtype=torch.float64):
        super().__init__()
        self.embedding = nn.Embedding(V, D, dtype=dtype)
        self.table = nn.Parameter(torch.randn(MAX_LEN, D, dtype=dtype))
        layer = nn.TransformerEncoderLayer(D, H, D_FF, dropout, activation="gelu", batch_first=True,
                                           norm_first=True, dtype=dtype)
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(LAYERS))
        for layer in self.layers:  # different weights in every layer
            for p in layer.parameters():
                nn.init.normal_(p, std=0.3)
        self.norm = nn.LayerNorm(D, dtype=dtype)
        self.output = nn.Linear(D, V, dtype=dtype)
        nn.init.normal_(self.norm.weight, 1.0, 0.2), nn.init.normal_(self.norm.bias, std=0.2)

    def forward(self, tokens):
        T = tokens.shape[-1]
        x = self.embedding(tokens) + self.table[:T]  # (B, T, D)
        future = nn.Transformer.generate_square_subsequent_mask(T, dtype=x.dtype)  # -inf above the diagonal
        for layer in self.layers:
            x = layer(x, src_mask=future, is_causal=True)
        return self.output(self.norm(x))  # (B, T, V)


@torch.no_grad()
def ours_from(reference, dropout=0.0):
    """Our DecoderOnlyTransformer with the reference's weights, block by block via EncoderBlock.from_torch."""
    dtype = reference.table.dtype
    ours = mt.DecoderOnlyTransformer(V, D, H, LAYERS, D_FF, MAX_LEN, dropout=dropout, dtype=dtype)
    ours.embedding.load_state_dict(reference.embedding.state_dict())
    ours.positions.table.copy_(reference.table)
    for block, layer in zip(ours.blocks, reference.layers):
        block.load_state_dict(mt.EncoderBlock.from_torch(layer).state_dict())
    ours.norm.load_state_dict(reference.norm.state_dict())
    ours.output.load_state_dict(reference.output.state_dict())
    return ours


def tokens_for(seed, B=3, T=MAX_LEN):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("T", [1, 5, MAX_LEN])
def test_equal_to_the_model_assembled_from_pytorch_layers(dtype, tol, T):
    torch.manual_seed(T)
    reference = PyTorchGPT(dtype=dtype).eval()
    ours = ours_from(reference).eval()
    tokens = tokens_for(T, T=T)
    with torch.no_grad():
        expected, got = reference(tokens), ours(tokens)
    assert got.shape == (3, T, V) and got.dtype == dtype
    assert (got - expected).abs().max() < tol * expected.abs().max()


def test_equal_with_dropout_under_the_same_random_numbers():
    """In training mode, with dropout 0.2 everywhere, both models draw their dropout masks in the same order
    (the attention weights inside scaled_dot_product_attention, the attention output, the feed-forward's
    hidden layer, its output), from the same stream. For one sequence they agree to rounding."""
    torch.manual_seed(0)
    reference = PyTorchGPT(dropout=0.2).train()
    ours = ours_from(reference, dropout=0.2).train()
    tokens = tokens_for(1, B=1)
    torch.manual_seed(7)
    expected = reference(tokens)
    torch.manual_seed(7)
    got = ours(tokens)
    torch.manual_seed(8)
    other_draw = ours(tokens)
    assert (got - expected).abs().max() < 1e-12
    assert (other_draw - got).abs().max() > 1e-3, "dropout is on: another seed gives other outputs"


def test_with_a_batch_only_the_dropout_after_attention_lands_elsewhere():
    """For a batch, the streams are the same numbers but one mask lands on other elements:
    nn.MultiheadAttention(batch_first=True) returns its output as a transposed view, laid out in memory
    as (T, B, d), and dropout (dropout1) draws its mask in memory order; our attention output is laid out
    (B, T, d). With that one dropout off in both models, they agree again, other dropouts on."""
    torch.manual_seed(0)
    reference = PyTorchGPT(dropout=0.2).train()
    ours = ours_from(reference, dropout=0.2).train()
    tokens = tokens_for(1)
    outputs = []
    for _ in range(2):
        torch.manual_seed(7)
        expected = reference(tokens)
        torch.manual_seed(7)
        outputs.append((ours(tokens) - expected).abs().max())
        for layer, block in zip(reference.layers, ours.blocks):
            layer.dropout1.p = block.dropout_attention.p = 0.0
    assert outputs[0] > 1e-3 and outputs[1] < 1e-12


def test_gradients_equal_the_pytorch_models():
    torch.manual_seed(3)
    reference = PyTorchGPT()
    ours = ours_from(reference)
    tokens = tokens_for(2)
    for model in (reference, ours):
        F.cross_entropy(model(tokens)[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1)).backward()
    assert (ours.embedding.weight.grad - reference.embedding.weight.grad).abs().max() < 1e-12
    assert (ours.positions.table.grad - reference.table.grad).abs().max() < 1e-12
    assert (ours.blocks[0].attention.W_q.weight.grad
            - reference.layers[0].self_attn.in_proj_weight.grad[:D]).abs().max() < 1e-12


@pytest.mark.parametrize("shape", [(MAX_LEN,), (2, 6), (2, 2, 4)])
def test_numpy_face_computes_the_same_logits_and_weights(shape):
    torch.manual_seed(sum(shape))
    model = mt.DecoderOnlyTransformer(V, D, H, LAYERS, D_FF, MAX_LEN, dtype=torch.float64)
    tokens = torch.randint(0, V, shape)
    head_mask = torch.tensor([[True, False, True], [True, True, True]])
    with torch.no_grad():
        logits, weights = model(tokens, return_weights=True)
        knocked = model(tokens, head_mask=head_mask)
    np_logits, np_weights = mnp.decoder_only_transformer(tokens.numpy(), **model.numpy_params())
    np_knocked, _ = mnp.decoder_only_transformer(tokens.numpy(), **model.numpy_params(), head_mask=head_mask.numpy())
    T = shape[-1]
    assert weights.shape == np_weights.shape == (LAYERS, *shape[:-1], H, T, T)
    assert np.abs(np_logits - logits.numpy()).max() < 1e-12
    assert np.abs(np_weights - weights.numpy()).max() < 1e-12
    assert np.abs(np_knocked - knocked.numpy()).max() < 1e-12
    assert np.abs(np_knocked - np_logits).max() > 1e-3, "a knocked-out head changes the logits"


def test_a_knocked_out_head_gives_zero_weights_and_the_model_is_causal():
    torch.manual_seed(0)
    params = mt.DecoderOnlyTransformer(V, D, H, LAYERS, D_FF, MAX_LEN, dtype=torch.float64).numpy_params()
    tokens = np.random.default_rng(0).integers(0, V, (2, 8))
    head_mask = np.ones((LAYERS, H), dtype=bool)
    head_mask[1, 2] = False
    _, weights = mnp.decoder_only_transformer(tokens, **params, head_mask=head_mask)
    assert np.all(weights[1, :, 2] == 0) and np.allclose(weights[0].sum(-1), 1)
    assert np.all(np.triu(weights, k=1) == 0), "no query reads a later key"
    edited = tokens.copy()
    edited[:, 5:] = (edited[:, 5:] + 1) % V
    before, _ = mnp.decoder_only_transformer(tokens, **params)
    after, _ = mnp.decoder_only_transformer(edited, **params)
    assert np.abs(after[:, :5] - before[:, :5]).max() == 0 and np.abs(after[:, 5:] - before[:, 5:]).max() > 1e-3


def test_the_model_runs_on_the_meta_device():
    """Nothing in the model names a device: on `meta`, every tensor it makes is on meta too."""
    model = mt.DecoderOnlyTransformer(V, D, H, LAYERS, D_FF, MAX_LEN, device="meta")
    logits, weights = model(torch.zeros(2, 5, dtype=torch.long, device="meta"), return_weights=True)
    assert logits.device.type == "meta" and logits.shape == (2, 5, V) and weights.shape == (LAYERS, 2, H, 5, 5)


# The loss ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7,), (4, 6), (2, 3, 5)])
def test_cross_entropy_equals_pytorchs(shape):
    gen = torch.Generator().manual_seed(len(shape))
    logits = 5 * torch.randn(*shape, V, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, V, shape, generator=gen)
    expected = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="none").reshape(shape)
    assert (mt.cross_entropy(logits, targets, reduction="none") - expected).abs().max() < 1e-12
    assert abs(mnp.cross_entropy(logits.numpy(), targets.numpy()) - expected.mean().item()) < 1e-12
    assert np.abs(mnp.cross_entropy(logits.numpy(), targets.numpy(), reduction="none") - expected.numpy()).max() < 1e-12


def test_cross_entropy_is_finite_for_huge_logits():
    logits = np.array([[1000.0, -1000.0, 0.0]])
    assert mnp.cross_entropy(logits, np.array([0])) == 0.0
    assert mnp.cross_entropy(logits, np.array([1])) == 2000.0
    assert np.allclose(mnp.log_softmax(logits), F.log_softmax(torch.tensor(logits), -1).numpy())


@pytest.mark.parametrize("shape", [(6,), (3, 8), (2, 2, 4)])
def test_causal_lm_loss_scores_position_t_against_token_t_plus_1(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    logits = torch.randn(*shape, V, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, V, shape, generator=gen)
    expected = F.cross_entropy(logits[..., :-1, :].reshape(-1, V), tokens[..., 1:].reshape(-1))
    assert abs(mt.causal_lm_loss(logits, tokens).item() - expected.item()) < 1e-12
    assert abs(mnp.causal_lm_loss(logits.numpy(), tokens.numpy()) - expected.item()) < 1e-12
    if len(shape) == 2:  # by hand: sequence b, position t, scored against token t + 1
        lp = F.log_softmax(logits, dim=-1).numpy()
        by_hand = -np.mean([lp[b, t, tokens[b, t + 1]] for b in range(shape[0]) for t in range(shape[1] - 1)])
        assert abs(by_hand - expected.item()) < 1e-12


def test_a_model_that_knows_the_next_token_has_zero_loss():
    tokens = np.array([[3, 1, 4, 1, 5]])
    logits = np.full((1, 5, V), -1e9)
    logits[0, np.arange(4), tokens[0, 1:]] = 0.0  # position t is sure of token t + 1
    assert mnp.causal_lm_loss(logits, tokens) == 0.0
    assert mnp.causal_lm_loss(logits[:, ::-1], tokens) > 1e8


# The warm-up ---------------------------------------------------------------------------------


def test_warmup_factor_rises_linearly_then_decays_like_vaswanis():
    w = 100
    assert mnp.warmup_factor(0, w) == 0.01 and mnp.warmup_factor(49, w) == 0.5 and mnp.warmup_factor(99, w) == 1.0
    assert mnp.warmup_factor(399, w) == 0.5 and mnp.warmup_factor(9999, w) == 0.1
    d_model = 512
    for step in range(0, 2000, 37):  # the paper's lrate = d^-0.5 min(s^-0.5, s w^-1.5), s = step + 1
        s = step + 1
        paper = d_model ** -0.5 * min(s ** -0.5, s * w ** -1.5)
        assert math.isclose(paper, (d_model * w) ** -0.5 * mnp.warmup_factor(step, w), rel_tol=1e-12)
        assert mt.warmup_factor(step, w) == mnp.warmup_factor(step, w)


def test_warmup_schedule_sets_the_optimizers_learning_rate():
    parameter = nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.AdamW([parameter], lr=0.003)
    schedule = mt.warmup_schedule(optimizer, 10)
    seen = []
    for _ in range(30):
        seen.append(optimizer.param_groups[0]["lr"])
        parameter.sum().backward()
        optimizer.step()
        schedule.step()
    assert all(math.isclose(lr, 0.003 * mnp.warmup_factor(k, 10)) for k, lr in enumerate(seen))
    assert max(seen) == seen[9] and seen[0] == pytest.approx(0.0003)


# Generation ----------------------------------------------------------------------------------


def test_generate_greedy_appends_the_argmax_of_the_last_position():
    torch.manual_seed(4)
    model = mt.DecoderOnlyTransformer(V, D, H, LAYERS, D_FF, MAX_LEN, dtype=torch.float64).eval()
    params = model.numpy_params()
    prompt = np.array([[1, 2, 3], [4, 5, 6]])

    def logits_fn(tokens):
        return mnp.decoder_only_transformer(tokens, **params)[0]

    out = mnp.generate_greedy(logits_fn, prompt, 10, max_len=MAX_LEN)
    assert out.shape == (2, 13) and np.array_equal(out[:, :3], prompt)
    tokens = prompt
    for _ in range(10):  # by hand: the whole context (its last MAX_LEN tokens), the last position's argmax
        next_token = logits_fn(tokens[:, -MAX_LEN:])[:, -1].argmax(-1)
        tokens = np.concatenate([tokens, next_token[:, None]], axis=1)
    assert np.array_equal(out, tokens)
    torch_out = mt.generate_greedy(model, torch.from_numpy(prompt), 10, max_len=MAX_LEN)
    assert np.array_equal(torch_out.numpy(), out)
    assert np.array_equal(mnp.generate_greedy(logits_fn, prompt, 0), prompt)
    with pytest.raises(ValueError, match="T=10 positions, but the model knows only max_len=9"):
        mnp.generate_greedy(logits_fn, prompt, 10)


# Bad input -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    model = mt.DecoderOnlyTransformer(V, D, H, LAYERS, D_FF, MAX_LEN)
    return model, model.numpy_params()


@pytest.mark.parametrize("tokens,error,message", [
    ([[0, 3, V]], ValueError, f"holds the id {V}, but the vocabulary has ids 0 .. {V - 1} only"),
    ([[0, -1, 2]], ValueError, "holds the id -1, but token ids start at 0"),
    ([list(range(MAX_LEN + 1))], ValueError, f"T={MAX_LEN + 1} positions, but the model knows only max_len={MAX_LEN}"),
    ([[0.0, 1.0]], TypeError, "must be integer token ids, got dtype"),
    ([[True, False]], TypeError, "must be integer token ids, got dtype"),
    (3, ValueError, "tokens must have at least 1 dimensions"),
])
def test_bad_tokens_are_refused_with_a_clear_message(small, tokens, error, message):
    model, params = small
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        model(torch.tensor(tokens))
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        mnp.decoder_only_transformer(np.array(tokens), **params)


def test_bad_head_masks_targets_and_losses_are_refused(small):
    model, params = small
    tokens = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"head_mask must be booleans of shape \(n_layers, n_heads\) = \(2, 3\)"):
        model(tokens, head_mask=torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"head_mask must be booleans of shape"):
        mnp.decoder_only_transformer(tokens.numpy(), **params, head_mask=np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"targets must have shape \(2, 4\)"):
        mnp.cross_entropy(np.zeros((2, 4, V)), np.zeros((2, 5), dtype=int))
    with pytest.raises(ValueError, match=f"holds the id {V}"):
        mt.cross_entropy(torch.zeros(2, V), torch.tensor([0, V]))
    with pytest.raises(ValueError, match=r"tokens must have shape \(\.\.\., T\) = \(1, 4\) with T >= 2"):
        mnp.causal_lm_loss(np.zeros((1, 4, V)), np.zeros((1, 3), dtype=int))
    with pytest.raises(ValueError, match="with T >= 2"):
        mt.causal_lm_loss(torch.zeros(1, 1, V), torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="warmup_steps must be at least 1"):
        mt.warmup_factor(3, 0)
    with pytest.raises(ValueError, match=r"logits_fn must return logits of shape \(\.\.\., T, V\)"):
        mnp.generate_greedy(lambda t: np.zeros((V,)), np.array([1, 2]), 1)



BAD_PROMPTS = [
    (np.array([[1.0, 2.0]]), TypeError, "prompt must be integer token ids, got dtype"),
    (np.zeros((2, 0), dtype=np.int64), ValueError, "prompt must hold at least one token per sequence"),
    (np.array(3), ValueError, "prompt must have at least 1 dimensions"),
    (np.array([[0, V]]), ValueError, f"tokens holds the id {V}, but the vocabulary has ids 0 .. {V - 1} only"),
    (np.array([[0, -1]]), ValueError, "tokens holds the id -1, but token ids start at 0"),
]


def generation(face, small):
    """generate_greedy of one face, the model as that face calls it, and a prompt converter."""
    model, params = small
    if face == "torch":
        return mt.generate_greedy, model, torch.from_numpy
    return mnp.generate_greedy, lambda tokens: mnp.decoder_only_transformer(tokens, **params)[0], np.asarray


@pytest.mark.parametrize("face", ["numpy", "torch"])
@pytest.mark.parametrize("prompt,error,message", BAD_PROMPTS, ids=["float", "empty", "0-d", "id V", "id -1"])
def test_generation_refuses_a_bad_prompt_its_form_there_its_ids_in_the_model(small, face, prompt, error, message):
    generate, logits_fn, convert = generation(face, small)
    with pytest.raises(error, match=re.escape(message)):
        generate(logits_fn, convert(prompt), 2)


@pytest.mark.parametrize("face", ["numpy", "torch"])
def test_generation_reads_the_ids_once_per_step_in_the_model(small, face, monkeypatch):
    """generate_greedy does not read the prompt's ids itself: the model does, once per call."""
    generate, logits_fn, convert = generation(face, small)
    module = numpy_model if face == "numpy" else torch_model
    reads, check_ids = [], module.check_ids
    monkeypatch.setattr(module, "check_ids", lambda name, ids, vocab: reads.append(name) or check_ids(name, ids, vocab))
    with torch.no_grad():
        out = generate(logits_fn, convert(np.array([[1, 2, 3]])), 4)
    assert tuple(out.shape) == (1, 7) and reads == ["tokens"] * 4
