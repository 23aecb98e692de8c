"""Cross-layer KV sharing in `TransformerLM` (LMConfig.kv_sharing): a later layer attends to an earlier layer's
keys and values and has no W_k, W_v of its own (Brandon et al., 2024, cross-layer attention; Gemma 3n's shared
layers). Proven against a hand computation from the model's own weights (float64, a left-padded batch, windows
smaller than the prompt); decoding with the cache equals the whole sequence; the cache holds only the layers
that make keys, so its bytes are `kv_cache_bytes` of those layers alone; bad configurations are refused by name."""

import dataclasses

import pytest
import torch

import mha.torch as mt

V, T, D, H, H_KV, D_HEAD = 40, 12, 32, 4, 2, 8
WINDOWS = (dict(sliding_window=5), dict(sliding_window=3), {}, {})  # layer 1 (window 3) shares layer 0's (5)


def config(kv_sharing=(0, 0, 2, 2), layer_attention=(), **changes):
    return mt.LMConfig(vocab_size=V, d_model=D, n_layers=4, d_ff=48, tie_embeddings=False,
                       attention=dict(n_heads=H, n_kv_heads=H_KV, rope_base=10000.0), layer_attention=layer_attention,
                       kv_sharing=kv_sharing, **changes)


def model(seed=0, dtype=torch.float64, **options):
    torch.manual_seed(seed)
    lm = mt.TransformerLM(config(**options), dtype=dtype)
    with torch.no_grad():
        for parameter in lm.parameters():
            parameter.normal_(0.0, 0.3)
    return lm.eval()


def padded_batch(seed=0, pads=3):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, V, (2, T), generator=generator)
    mask = torch.ones_like(tokens)
    mask[0, :pads] = 0
    tokens[0, :pads] = 0
    return tokens, mask


def by_hand(lm, tokens, mask):
    """The logits written out from the model's weights: each layer that makes keys projects and rotates them
    from its own input; a sharing layer's queries attend to its source's keys and values, under its own window."""
    x = lm.embedding(tokens)  # (B, T, d)
    cos, sin = mt.rotary_embedding(T, D_HEAD, 10000.0, dtype=x.dtype)  # (T, d_head)
    keys_values = {}
    for i, block in enumerate(lm.blocks):
        attention, source = block.attention, lm.config.kv_source(i)
        a = block.attention_norm_in(x)
        q = mt.apply_rotary(mt.split_heads(attention.W_q(a), H), cos, sin)  # (B, h, T, d_head)
        if source == i:
            k = mt.apply_rotary(mt.split_heads(attention.W_k(a), H_KV), cos, sin)  # (B, h_kv, T, d_head)
            keys_values[i] = (k, mt.split_heads(attention.W_v(a), H_KV))
        k, v = keys_values[source]
        allowed = mt.causal_mask(T) if attention.sliding_window is None else \
            mt.sliding_window_mask(T, attention.sliding_window)  # (T, T)
        allowed = allowed & mask.bool()[:, None, None, :]  # (B, 1, T, T): no padding key
        out, _ = mt.scaled_dot_product_attention(q, mt.repeat_kv(k, H // H_KV), mt.repeat_kv(v, H // H_KV), allowed)
        x = x + attention.W_o(mt.merge_heads(out))
        x = x + block.feed_forward(block.feed_forward_norm_in(x))
    return lm.logits(lm.norm(x))


@pytest.mark.parametrize("layer_attention", [(), WINDOWS], ids=["full", "windows 5 and 3 < T"])
def test_sharing_layers_attend_to_their_sources_keys_and_values(layer_attention):
    lm = model(layer_attention=layer_attention)
    tokens, mask = padded_batch()
    with torch.no_grad():
        got, expected = lm(tokens, mask), by_hand(lm, tokens, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-12, atol=1e-12)
    unshared = mt.TransformerLM(dataclasses.replace(lm.config, kv_sharing=()), dtype=torch.float64).eval()
    unshared.load_state_dict(lm.state_dict(), strict=False)  # the sharers' own W_k, W_v stay random
    with torch.no_grad():
        assert (unshared(tokens, mask) - got)[real].abs().max() > 1e-2  # sharing changes the answer


def test_sharing_with_itself_is_the_model_without_sharing():
    lm = model(kv_sharing=(0, 1, 2, 3))
    plain = mt.TransformerLM(dataclasses.replace(lm.config, kv_sharing=()), dtype=torch.float64).eval()
    plain.load_state_dict(lm.state_dict())
    tokens, mask = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(lm(tokens, mask), plain(tokens, mask), rtol=0, atol=0)


def test_sharing_layers_have_no_key_or_value_projections():
    shared, plain = model(), model(kv_sharing=())
    assert [b.attention.W_k is None for b in shared.blocks] == [False, True, False, True]
    saved = sum(p.numel() for p in plain.parameters()) - sum(p.numel() for p in shared.parameters())
    assert saved == 2 * 2 * D * H_KV * D_HEAD  # two sharing layers, W_k and W_v each


@pytest.mark.parametrize("layer_attention", [(), WINDOWS], ids=["full", "windows 5 and 3 < T"])
def test_the_cache_holds_the_layers_that_make_keys_and_decoding_equals_the_whole_sequence(layer_attention):
    lm = model(layer_attention=layer_attention, dtype=torch.float32)
    tokens, mask = padded_batch()
    cache = lm.new_cache()
    assert cache[1] is cache[0] and cache[3] is cache[2] and cache[0] is not cache[2]
    with torch.no_grad():
        steps = [lm(tokens[:, :5], mask[:, :5], cache=cache)]
        steps += [lm(tokens[:, t:t + 1], mask[:, :t + 1], cache=cache) for t in range(5, T)]
        whole = lm(tokens, mask)
    real = mask.bool()
    stepped = torch.cat(steps, dim=1)
    assert (stepped - whole)[real].abs().max() <= 1e-5 * whole[real].abs().max()
    held = [len(cache[0]), len(cache[2])]
    assert held == ([T, T] if not layer_attention else [5 - 1, T])
    expected = sum(mt.kv_cache_bytes(1, H_KV, D_HEAD, n, batch=2, bytes_per_value=4) for n in held)
    assert mt.cache_bytes(cache) == lm.cache_bytes(cache) == expected
    unshared_bytes = mt.kv_cache_bytes(4, H_KV, D_HEAD, T, batch=2, bytes_per_value=4)
    assert mt.cache_bytes(cache) <= unshared_bytes // 2  # half the layers make keys


def test_greedy_generation_with_the_cache_equals_it_without():
    lm = model(layer_attention=WINDOWS, dtype=torch.float32)
    tokens, mask = padded_batch(seed=1)
    got = lm.generate(tokens, 8, attention_mask=mask)
    expected = tokens
    with torch.no_grad():
        for _ in range(8):
            full_mask = torch.cat([mask, torch.ones(2, expected.shape[1] - T, dtype=mask.dtype)], -1)
            logits = lm(expected, full_mask, position_ids=mt.positions_from_mask(full_mask))[:, -1]
            expected = torch.cat([expected, logits.argmax(-1, keepdim=True)], -1)
    assert torch.equal(got, expected)


def test_gradients_reach_the_source_through_its_sharers():
    lm = model(dtype=torch.float32).train()
    tokens, _ = padded_batch()
    lm(tokens).square().mean().backward()
    grad_through_all = lm.blocks[0].attention.W_k.weight.grad.clone()
    lm.zero_grad()
    cut = model(dtype=torch.float32, kv_sharing=(0, 1, 2, 3)).train()
    cut.load_state_dict(lm.state_dict(), strict=False)
    cut(tokens).square().mean().backward()
    assert (grad_through_all - cut.blocks[0].attention.W_k.weight.grad).abs().max() > 1e-6


@pytest.mark.parametrize("changes,message", [
    (dict(kv_sharing=(1, 1, 2, 3)), r"kv_sharing\[0\] must be 0 \(its own keys\) or an earlier layer"),
    (dict(kv_sharing=(0, 0, 1, 3)), r"kv_sharing\[2\] must be 2 .* got 1"),
    (dict(kv_sharing=(0, 0, 2)), r"kv_sharing needs one layer index per layer \(n_layers=4\), got 3"),
    (dict(kv_sharing=(0, 0, 2, 2), layer_attention=(dict(sliding_window=3), dict(sliding_window=5), {}, {})),
     r"layer 1's window \(5\) must not be wider"),
    (dict(kv_sharing=(0, 0, 2, 2), layer_attention=(dict(sliding_window=3), {}, {}, {})),
     r"layer 1's window \(None\) must not be wider"),
], ids=["a later source", "a sharer's sharer", "too few", "a wider window", "no window over a window"])
def test_bad_sharing_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config(**changes)


def test_latent_attention_with_sharing_is_refused_and_a_sharer_needs_its_keys():
    with pytest.raises(ValueError, match="kv_sharing is computed for attention_type='grouped' only"):
        mt.LMConfig(vocab_size=V, d_model=D, n_layers=2, d_ff=8, attention_type="latent",
                    attention=dict(n_heads=2, kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4),
                    kv_sharing=(0, 0))
    sharer = mt.GroupedQueryAttention(D, H, H_KV, own_kv=False)
    assert sharer.new_cache() is None
    with pytest.raises(ValueError, match=r"give shared_kv=\(keys, values, start\)"):
        sharer(torch.randn(1, 3, D))
