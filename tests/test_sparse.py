"""DeepSeek Sparse Attention (DeepSeek-V3.2, chapter 17): top-k key selection as its definition says,
the lightning indexer's scores as the formula and as transformers computes them, and our latent
attention with the indexer equal to transformers' DeepseekV32Attention (random weights, tiny configs)."""

import numpy as np
import pytest
import torch
from transformers import DeepseekV32Config
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as deepseek

import mha.numpy as mnp
import mha.torch as mt
from mha.torch.hf.latent import copy_latent_attention, latent_arguments

D_MODEL, H, R, D_NOPE, D_ROPE, D_V, Q_LORA = 32, 4, 8, 6, 4, 5, 12
N_INDEX, D_INDEX, TOP_K = 16, 8, 3  # 16 indexer heads: a key scored 0 by every head (a tie) is rare


def top_k_by_definition(scores, k, mask):
    """Key s is chosen when fewer than k allowed keys beat it (higher score, or equal and earlier)."""
    T_k = scores.shape[-1]
    chosen = np.zeros(scores.shape, dtype=bool)
    for index in np.ndindex(scores.shape[:-1]):
        row, allowed = scores[index], np.broadcast_to(mask, scores.shape)[index]
        for s in range(T_k):
            beaten_by = [j for j in range(T_k) if allowed[j] and (row[j] > row[s] or (row[j] == row[s] and j < s))]
            chosen[index + (s,)] = allowed[s] and len(beaten_by) < k
    return chosen


@pytest.mark.parametrize("k", [1, 3, 6, 9])
def test_select_top_k_keys_is_its_definition_in_both_faces(k):
    rng = np.random.default_rng(k)
    scores = rng.integers(0, 4, size=(2, 5, 7)).astype(np.float64)  # few values: many ties
    mask = np.tril(np.ones((5, 7), dtype=bool), 2)  # row t may see keys up to t + 2
    expected = top_k_by_definition(scores, k, mask)
    np.testing.assert_array_equal(mnp.select_top_k_keys(scores, k, mask), expected)
    np.testing.assert_array_equal(mt.select_top_k_keys(torch.tensor(scores), k, torch.tensor(mask)).numpy(), expected)
    assert (expected.sum(-1) == np.minimum(k, mask.sum(-1))).all()  # k chosen, or every allowed key


def test_select_top_k_keys_ties_go_to_the_earlier_key_and_bad_input_is_named():
    scores = np.array([[0.0, 1.0, 1.0, 1.0, 0.0]])
    np.testing.assert_array_equal(mnp.select_top_k_keys(scores, 2), [[False, True, True, False, False]])
    np.testing.assert_array_equal(mt.select_top_k_keys(torch.tensor(scores), 2).numpy(), [[0, 1, 1, 0, 0]])
    with pytest.raises(ValueError, match="k"):
        mnp.select_top_k_keys(scores, 0)
    with pytest.raises(ValueError, match="mask"):
        mnp.select_top_k_keys(scores, 2, np.ones((1, 4), dtype=bool))


def test_lightning_indexer_scores_are_the_formula_in_both_faces():
    rng = np.random.default_rng(0)
    q, keys = rng.normal(size=(2, N_INDEX, 5, D_INDEX)), rng.normal(size=(2, 6, D_INDEX))
    w = rng.normal(size=(2, 5, N_INDEX))
    scores = mnp.lightning_indexer_scores(q, keys, w, 0.5)
    expected = np.zeros((2, 5, 6))
    for b, t, s, j in np.ndindex(2, 5, 6, N_INDEX):
        expected[b, t, s] += w[b, t, j] * max(0.5 * q[b, j, t] @ keys[b, s], 0.0)
    np.testing.assert_allclose(scores, expected, rtol=1e-12, atol=1e-14)
    torch_scores = mt.lightning_indexer_scores(*map(torch.tensor, (q, keys, w)), 0.5)
    np.testing.assert_allclose(torch_scores.numpy(), scores, rtol=1e-12, atol=1e-14)


def deepseek_v32_layer(dtype=torch.float32, seed=0):
    """A DeepseekV32Attention with its indexer, random weights (std 0.3), and its RoPE."""
    torch.manual_seed(seed)
    config = DeepseekV32Config(hidden_size=D_MODEL, num_attention_heads=H, num_key_value_heads=H, kv_lora_rank=R,
                               q_lora_rank=Q_LORA, qk_nope_head_dim=D_NOPE, qk_rope_head_dim=D_ROPE, v_head_dim=D_V,
                               max_position_embeddings=64, index_n_heads=N_INDEX, index_head_dim=D_INDEX,
                               index_topk=TOP_K, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    config._attn_implementation = "eager"
    attention = deepseek.DeepseekV32Attention(config, layer_idx=0).to(dtype).eval()
    with torch.no_grad():
        for p in attention.parameters():
            p.normal_(0, 0.3)
    return attention, deepseek.DeepseekV32RotaryEmbedding(config)


def their_forward(attention, rotary, x):
    """Their attention over x (B, T, d), causal."""
    B, T = x.shape[:2]
    positions = torch.arange(T)[None].expand(B, T)
    additive = torch.full((T, T), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None].expand(B, 1, T, T)
    with torch.no_grad():
        return attention(x, rotary(x, positions), additive, position_ids=positions)[0]


def our_copy(attention, **changes):
    ours = mt.MultiHeadLatentAttention(D_MODEL, **{**latent_arguments(attention), **changes},
                                       dtype=attention.o_proj.weight.dtype)
    return copy_latent_attention(ours, attention)


def indexer_scores(ours, x):
    """Our indexer's scores (B, T, T) over the prompt x, causal entries only, and the gap at each row's
    top-k boundary (the k-th best allowed score minus the next): the test inputs must be clear of ties."""
    with torch.no_grad():
        q_low = ours.queries(x)[2]
        keys = ours.indexer.keys(x, ours.rotary)
        scores = ours.indexer(x, q_low, keys, ours.rotary)  # (B, T, T)
    T = x.shape[1]
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    ordered = scores.sort(dim=-1, descending=True).values[:, TOP_K:, :]  # rows with more than k allowed keys
    return scores, (ordered[..., TOP_K - 1] - ordered[..., TOP_K]).min().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prompt_equals_deepseek_v32_attention_with_its_indexer(dtype):
    attention, rotary = deepseek_v32_layer(dtype)
    ours = our_copy(attention)
    x = torch.randn(2, 9, D_MODEL, dtype=dtype)
    _, gap = indexer_scores(ours, x)
    assert gap > 1e-5  # clear of ties: far beyond float32 rounding of scores about 1
    expected = their_forward(attention, rotary, x)
    with torch.no_grad():
        got, weights = ours(x, return_weights=True)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * expected.abs().max().item())
    assert ((weights > 0).sum(-1) <= TOP_K).all()  # each query attends to its top_k keys at most
    assert ((weights > 0).sum(-1)[..., TOP_K:] == TOP_K).all()


def test_our_choice_of_keys_is_their_indexers():
    attention, rotary = deepseek_v32_layer(torch.float64, seed=1)
    ours = our_copy(attention)
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    scores, gap = indexer_scores(ours, x)
    assert gap > 1e-5
    T = x.shape[1]
    positions = torch.arange(T)[None].expand(2, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None].expand(2, T, T)
    with torch.no_grad():
        q_resid = attention.q_a_layernorm(attention.q_a_proj(x))
        chosen = attention.indexer(x, q_resid, rotary(x, positions), causal, positions)  # (B, T, top_k)
    theirs = torch.zeros(2, T, T, dtype=torch.bool).scatter(-1, chosen.long(), True) & causal
    ours_chosen = mt.select_top_k_keys(scores, TOP_K, causal)
    assert torch.equal(ours_chosen, theirs)


def test_the_indexer_changes_the_answer():
    attention, _ = deepseek_v32_layer(torch.float64)
    sparse = our_copy(attention)
    x = torch.randn(1, 9, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        got = sparse(x)[0]
        sparse.indexer.top_k = 9  # every key chosen: dense latent attention
        dense = sparse(x)[0]
    torch.testing.assert_close(got[:, :TOP_K], dense[:, :TOP_K], rtol=0, atol=1e-12)  # fewer than k keys: all
    assert (got[:, TOP_K:] - dense[:, TOP_K:]).abs().amax(-1).min() > 1e-3


@pytest.mark.parametrize("absorbed", [True, False])
def test_decoding_with_the_indexer_equals_their_prompt_and_caches_its_keys(absorbed):
    attention, rotary = deepseek_v32_layer(torch.float64)
    ours = our_copy(attention, absorbed=absorbed)
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    assert indexer_scores(ours, x)[1] > 1e-5
    expected = their_forward(attention, rotary, x)
    cache = ours.new_cache()
    with torch.no_grad():
        prompt = ours(x[:, :3], cache=cache)[0]
        got = torch.cat([prompt, *(ours(x[:, t:t + 1], cache=cache)[0] for t in range(3, 9))], dim=1)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * expected.abs().max().item())
    assert cache.indexer_keys.shape == (2, 9, D_INDEX)
    assert cache.nbytes == mt.latent_cache_bytes(1, R, D_ROPE, 9, batch=2, bytes_per_value=8, indexer_head_dim=D_INDEX)
    assert mnp.latent_cache_bytes(1, R, D_ROPE, 9, batch=2, bytes_per_value=8, indexer_head_dim=D_INDEX) == cache.nbytes


def test_the_indexer_needs_the_compressed_query():
    with pytest.raises(ValueError, match="q_lora_rank"):
        mt.MultiHeadLatentAttention(D_MODEL, H, kv_lora_rank=R, qk_nope_head_dim=D_NOPE, qk_rope_head_dim=D_ROPE,
                                    v_head_dim=D_V, indexer=dict(n_heads=2, head_dim=8, top_k=2))
    with pytest.raises(ValueError, match="indexer must be"):
        mt.MultiHeadLatentAttention(D_MODEL, H, kv_lora_rank=R, qk_nope_head_dim=D_NOPE, qk_rope_head_dim=D_ROPE,
                                    v_head_dim=D_V, q_lora_rank=Q_LORA, indexer=dict(n_heads=2, top_k=2))
