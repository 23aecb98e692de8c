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
