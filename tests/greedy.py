"""Greedy decoding as transformers' generate() does it, for the tests that copy whole models (tests/test_lm.py,
test_lm_remembering.py, test_lm_hybrid.py): the margin between each step's two best logits, and greedy decoding
that runs the whole sequence again at every step, as generate(use_cache=False) does."""

import torch

import mha.torch as mt


def margins(scores):
    """The gap between the two best logits of each step: scores, a list of (B, V), one per step -> (steps, B)."""
    top2 = torch.stack(scores).topk(2, dim=-1).values  # (steps, B, 2)
    return top2[..., 0] - top2[..., 1]


def greedy_without_cache(ours, tokens, mask, n_new, eos_token_id=2, pad_token_id=0):
    """Greedy decoding that runs the whole sequence at every step (no cache), positions from the mask, a finished
    sequence continued with padding: what generate(use_cache=False) does."""
    done = torch.zeros(len(tokens), dtype=torch.bool)
    for _ in range(n_new):
        with torch.no_grad():
            logits = ours(tokens, mask, position_ids=mt.positions_from_mask(mask))[:, -1]  # (B, V)
        new = logits.argmax(-1, keepdim=True).masked_fill(done[:, None], pad_token_id)  # (B, 1)
        tokens, mask = torch.cat([tokens, new], -1), torch.cat([mask, torch.ones_like(new)], -1)
        done = done | (new[:, 0] == eos_token_id)
        if bool(done.all()):
            break
    return tokens


def assert_greedy_matches_generate(model, ours, batches, *, needed=2, n_new=8, their_cache=True):
    """On the first `needed` left-padded batches (tokens, mask) whose every greedy step is clear of ties (the top two
    logits more than 1e-3 apart): our cached generate equals model.generate(do_sample=False) (with its cache, or
    without where their_cache=False), and our greedy decoding without a cache equals generate(use_cache=False)."""
    compared = 0
    for tokens, mask in batches:
        options = dict(attention_mask=mask, max_new_tokens=n_new, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            theirs = model.generate(tokens, output_scores=True, return_dict_in_generate=True, use_cache=their_cache,
                                    **options)
        if margins(theirs.scores).min() <= 1e-3:
            continue
        assert torch.equal(ours.generate(tokens, n_new, attention_mask=mask, eos_token_id=2, pad_token_id=0),
                           theirs.sequences)
        with torch.no_grad():
            uncached = model.generate(tokens, use_cache=False, **options)
        assert torch.equal(greedy_without_cache(ours, tokens, mask, n_new), uncached)
        compared += 1
        if compared == needed:
            return
    raise AssertionError(f"only {compared} of the batches were clear of ties, {needed} needed")
