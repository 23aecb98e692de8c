"""Chapter 18's recall models: one layer whose token mixer is softmax attention, linear attention,
DeltaNet or Gated DeltaNet, everything else the same (see `mha.experiments.recall` for the task).

The block: token embedding, x + mixer(RMSNorm(x)), RMSNorm, a linear head to the vocabulary. No
feed-forward, no positions. Inside the mixer every kind reads the same projections: the query and the
value from the token itself, the key from the token before it (a fixed shift by one; Gated DeltaNet's
short causal convolution can learn such a shift, Zoology's models learn it with a convolution too). So
at a value token the key is its key token, and a query (a key token again) finds it: one layer suffices,
and what differs is only how the mixer stores the pairs it has seen.

- "softmax": causal softmax attention over every earlier token (its cache grows with T);
- "linear": linear attention (Katharopoulos et al. 2020), elu + 1 features, no normaliser, a state
  of d_k x d_v numbers per head (`mha.torch.linear_attention_chunked`);
- "delta": DeltaNet (Schlag et al. 2021; Yang et al. 2024): the delta rule with a write strength
  beta = sigmoid(x W_b) per head and token, queries and keys L2-normalised, no decay
  (`mha.torch.gated_delta_rule_chunked` with g = None);
- "gated": Gated DeltaNet (Yang et al. 2025): the same with a decay g = -exp(A_log) softplus(x W_a + b_dt),
  started almost open (exp(g) about 0.999 a token), so that it starts where DeltaNet is.

The three linear kinds hold the same state, n_heads x d_k x d_v numbers. Every kind's output is
RMS-normalised per head (today's linear attentions norm their output instead of dividing by a
normaliser; softmax gets the same norm, so that only the mixing differs), then W_o.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import mha.torch as mt

MIXERS = ("softmax", "linear", "delta", "gated")
GATE_START = 1e-3  # softplus(b_dt) at the start: the gated kind's decay exp(-0.001) a token


class RecallMixer(nn.Module):
    """One token mixer of kind `kind` (one of MIXERS): (B, T, d_model) -> (B, T, d_model).
    W_q, W_k, W_v (nn.Linear, no bias) make n_heads heads of d_k (queries, keys) and d_v (values)."""

    def __init__(self, kind, d_model, *, n_heads, d_k, d_v, chunk_size=48):
        super().__init__()
        if kind not in MIXERS:
            raise ValueError(f"kind must be one of {MIXERS}, got {kind!r}")
        self.kind, self.n_heads, self.d_k, self.d_v, self.chunk_size = kind, n_heads, d_k, d_v, chunk_size
        self.W_q = nn.Linear(d_model, n_heads * d_k, bias=False)
        self.W_k = nn.Linear(d_model, n_heads * d_k, bias=False)
        self.W_v = nn.Linear(d_model, n_heads * d_v, bias=False)
        if kind in ("delta", "gated"):
            self.W_b = nn.Linear(d_model, n_heads, bias=False)
        if kind == "gated":
            self.W_a = nn.Linear(d_model, n_heads, bias=False)
            self.A_log = nn.Parameter(torch.zeros(n_heads))
            self.dt_bias = nn.Parameter(torch.full((n_heads,), math.log(math.expm1(GATE_START))))
        self.norm = mt.RMSNorm(d_v)
        self.W_o = nn.Linear(n_heads * d_v, d_model, bias=False)

    def heads(self, x, width):
        """(B, T, n_heads * width) -> (B, n_heads, T, width)."""
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, width).transpose(1, 2)  # (B, h, T, width)

    def mix(self, x, q, k, v):
        """The kind's mixing of q, k (B, h, T, d_k) and v (B, h, T, d_v): (B, h, T, d_v)."""
        if self.kind == "softmax":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        chunk = min(self.chunk_size, q.shape[-2])
        if self.kind == "linear":
            return mt.linear_attention_chunked(mt.elu_feature_map(q), mt.elu_feature_map(k), v, chunk_size=chunk)[0]
        beta = torch.sigmoid(self.W_b(x)).transpose(1, 2)  # (B, h, T)
        g = None
        if self.kind == "gated":
            g = (-self.A_log.exp() * F.softplus(self.W_a(x) + self.dt_bias)).transpose(1, 2)  # (B, h, T)
        q, k = mt.l2_normalize(q), mt.l2_normalize(k)
        return mt.gated_delta_rule_chunked(q, k, v, g, beta, chunk_size=chunk)[0]

    def forward(self, x):
        B, T, _ = x.shape
        previous = F.pad(x, (0, 0, 1, 0))[:, :-1]  # (B, T, d_model): token t - 1, zeros before the first
        q = self.heads(self.W_q(x), self.d_k)  # (B, h, T, d_k)
        k = self.heads(self.W_k(previous), self.d_k)  # (B, h, T, d_k)
        v = self.heads(self.W_v(x), self.d_v)  # (B, h, T, d_v)
        out = self.norm(self.mix(x, q, k, v))  # (B, h, T, d_v)
        return self.W_o(out.transpose(1, 2).reshape(B, T, self.n_heads * self.d_v))  # (B, T, d_model)

    def state_numbers(self, T):
        """The numbers this layer holds after T tokens: n_heads x d_k x d_v for the linear kinds (whatever T),
        the keys and values of T tokens for softmax attention."""
        if self.kind == "softmax":
            return self.n_heads * (self.d_k + self.d_v) * T
        return self.n_heads * self.d_k * self.d_v


class RecallModel(nn.Module):
    """Token ids (B, T) -> logits (B, T, vocab_size): embedding, one (or n_layers) pre-norm mixer
    layer(s) with residuals, a final RMSNorm and a linear head."""

    def __init__(self, kind, *, vocab_size, d_model, n_heads, d_k, d_v, n_layers=1):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.norms = nn.ModuleList(mt.RMSNorm(d_model) for _ in range(n_layers))
        self.mixers = nn.ModuleList(RecallMixer(kind, d_model, n_heads=n_heads, d_k=d_k, d_v=d_v)
                                    for _ in range(n_layers))
        self.final_norm = mt.RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, ids):
        x = self.embedding(ids)  # (B, T, d_model)
        for norm, mixer in zip(self.norms, self.mixers):
            x = x + mixer(norm(x))
        return self.head(self.final_norm(x))  # (B, T, vocab_size)

    def state_numbers(self, T):
        """The numbers every layer's mixer holds after T tokens, summed."""
        return sum(mixer.state_numbers(T) for mixer in self.mixers)
