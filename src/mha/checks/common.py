"""What several chapters' checks share: softmaxes written by hand, in the attentions of chapters 1 to 12, for
their catalogued mistakes; and the toy language model that chapter 11's cases hand to `generate_greedy`, a
function given as an input, which crosses the grader's wire as data (its table).

No chapter's module imports another's: each takes what it shares with others from here (or from `inputs`,
`compare` and `routes`).
"""

import math

import numpy as np

from mha.checks.reference import NUMPY as mn

# Softmaxes written by hand ----------------------------------------------------------------------------------


def naive_softmax(scores, mask=None, *, shift=None, zero_when_empty=False):
    """A softmax over the last axis as learners write it by hand, right for a row with nothing to attend to
    (zero weights), for the attention checks' mistakes: with shift=None exp overflows above 709; with
    shift="global" the maximum of ALL the scores is subtracted, so a row far below it underflows to 0 / 0 (to
    zeros with zero_when_empty, as when a learner guards the rows that sum to 0). A masked entry is -inf."""
    scores = np.asarray(scores)
    keep = np.ones(scores.shape, dtype=bool) if mask is None else np.broadcast_to(mask, scores.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        scores = np.where(keep, scores, -np.inf)
        if shift == "global":
            finite = scores[np.isfinite(scores)]
            scores = scores - (finite.max() if finite.size else 0.0)
        e = np.exp(scores)
        total = e.sum(axis=-1, keepdims=True)
        w = np.divide(e, total, out=np.zeros_like(e), where=total > 0) if zero_when_empty else e / total
        return np.where(keep.any(axis=-1, keepdims=True), w, 0.0)


def sdpa_with_own_softmax(Q, K, V, mask, shift):
    """Scaled dot-product attention, right but for a softmax written by hand (see naive_softmax).
    Q: (..., T_q, d), K: (..., T_k, d), V: (..., T_k, d_v) -> out (..., T_q, d_v), weights (..., T_q, T_k)."""
    w = naive_softmax(Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1]), mask, shift=shift)
    return w @ V, w


def head_with_own_softmax(X, W_q, W_k, W_v, context, mask, shift):
    """One head (chapter 3's head_attention), right but for a softmax written by hand (see naive_softmax);
    W_v=None keeps the values as they are."""
    source = X if context is None else context
    V = source if W_v is None else source @ W_v
    return sdpa_with_own_softmax(X @ W_q, source @ W_k, V, mask, shift)


def multihead_with_own_softmax(X, W_q, W_k, W_v, W_o, n_heads, *, shift, zero_when_empty=False, context=None,
                               mask=None, b_q=None, b_k=None, b_v=None, b_o=None):
    """mha.numpy.multihead_attention (chapter 5), right but for a softmax written by hand (see naive_softmax).
    Returns out (..., T_q, d_out) and weights (..., h, T_q, T_k)."""
    source = X if context is None else context
    Q, K, V = (mn.split_heads(a @ W + (0 if b is None else b), n_heads)
               for a, W, b in ((X, W_q, b_q), (source, W_k, b_k), (source, W_v, b_v)))  # each (..., h, T, d_head)
    w = naive_softmax(Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1]), mask, shift=shift,
                      zero_when_empty=zero_when_empty)
    return mn.merge_heads(w @ V) @ W_o + (0 if b_o is None else b_o), w


def multihead_softmax_without_max(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    """Multi-head attention whose softmax overflows above 709 (no maximum subtracted), called as
    mha.numpy.multihead_attention is: the attention inside chapters 6 and 9's wrong blocks."""
    return multihead_with_own_softmax(X, W_q, W_k, W_v, W_o, n_heads, shift=None, **kw)


def multihead_softmax_global_max(X, W_q, W_k, W_v, W_o, n_heads, **kw):
    """Multi-head attention whose softmax subtracts the maximum of all the scores (a row far below it
    underflows to 0 / 0), called as mha.numpy.multihead_attention is."""
    return multihead_with_own_softmax(X, W_q, W_k, W_v, W_o, n_heads, shift="global", **kw)


# A function given as an input ---------------------------------------------------------------------------------


class ToyLanguageModel:
    """A stand-in for a language model: tokens (..., T) -> logits (..., T, V). The logits at position t
    depend on every token up to t and on its position in the context it is given, through a fixed random
    table, so that a loop that feeds too little (or too much, or the wrong) context gets other answers.
    Any integer id is taken (ids are read modulo V), so that a wrong loop gets a wrong answer, not a crash.

    It crosses the grader's wire as its table (tools/grading/cases.py), and the worker rebuilds the same
    rule from it (tools/grading/wire.py's TableModel)."""

    def __init__(self, r, vocab_size):
        self.vocab_size = vocab_size
        self.table = r.standard_normal((vocab_size, vocab_size))  # row h: the logits after context summary h

    def __call__(self, tokens):
        tokens = np.asarray(tokens)
        if tokens.dtype == bool or not np.issubdtype(tokens.dtype, np.integer):
            raise TypeError(f"the model takes integer token ids, got dtype {tokens.dtype}")
        weighted = tokens * (np.arange(tokens.shape[-1]) + 2)  # (..., T): token s counts s + 2 times
        summary = np.cumsum(weighted, axis=-1) % self.vocab_size  # (..., T): depends on tokens 0 .. t
        return self.table[summary]  # (..., T, V)

    def __eq__(self, other):  # the same model: the same table (a copy of a case's model equals it)
        return isinstance(other, ToyLanguageModel) and np.array_equal(self.table, other.table)

    __hash__ = None

    def __repr__(self):
        return f"a toy model over {self.vocab_size} tokens"
