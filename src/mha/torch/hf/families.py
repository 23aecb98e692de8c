"""The Hugging Face causal LMs that `from_transformers` copies, by their config's `model_type`, and the
`TransformerLM` each becomes: where its norms sit (pre-norm, Gemma's sandwich, OLMo 2's post-norm), what
transformers calls them, and whether the embeddings are scaled (Gemma: by sqrt(d_model)).

Adding a family: a row here, then whatever its layers hold that `configuration` does not read yet (each read
and each refusal beside its kind), then a test against transformers in tests/test_lm.py.
"""

# model_type -> where its norms sit, its feed-forward, whether it scales the embeddings (Gemma: sqrt(d)),
# and its attention where it is not grouped-query attention ("latent": DeepSeek's MultiHeadLatentAttention).
# feed_forward: GPT-2's two layers with tanh GELU; the others' gated MLP takes the activation its config names;
# a layer whose MLP is a mixture of experts (read by `mha.torch.hf.experts`) becomes a MixtureOfExperts.
# The hybrids (chapter 18) mix full-attention layers (self_attn) with linear ones (linear_attn: a Gated DeltaNet,
# read by `mha.torch.hf.linear`), as their config's layer_types says (`LAYER_TYPES`).
FAMILIES = {
    "gpt2": dict(norm_placement="pre", feed_forward="mlp_gelu_tanh", scaled_embeddings=False),
    "llama": dict(norm_placement="pre", scaled_embeddings=False),
    "mistral": dict(norm_placement="pre", scaled_embeddings=False),
    "qwen2": dict(norm_placement="pre", scaled_embeddings=False),
    "qwen3": dict(norm_placement="pre", scaled_embeddings=False),
    "gemma": dict(norm_placement="pre", scaled_embeddings=True),
    "gemma2": dict(norm_placement="sandwich", scaled_embeddings=True),
    "gemma3_text": dict(norm_placement="sandwich", scaled_embeddings=True),
    "olmo2": dict(norm_placement="post", scaled_embeddings=False),
    "olmo3": dict(norm_placement="post", scaled_embeddings=False),  # OLMo 2's, with sliding layers
    "gpt_oss": dict(norm_placement="pre", scaled_embeddings=False),  # sinks, sliding layers, experts
    "qwen3_moe": dict(norm_placement="pre", scaled_embeddings=False),  # Qwen3's attention, experts
    "deepseek_v3": dict(norm_placement="pre", scaled_embeddings=False, attention="latent"),  # MLA, experts
    "deepseek_v32": dict(norm_placement="pre", scaled_embeddings=False, attention="latent"),  # + lightning indexer
    "qwen3_next": dict(norm_placement="pre", scaled_embeddings=False),  # Gated DeltaNet + gated attention, experts
    "qwen3_5_text": dict(norm_placement="pre", scaled_embeddings=False),  # Qwen3.5's text model: the same, dense
}
# transformers' layer_types of the hybrids -> LMConfig's
LAYER_TYPES = {"full_attention": "full", "linear_attention": "linear"}

# Where each placement keeps a decoder layer's norms in transformers: (attention in, attention out,
# feed-forward in, feed-forward out), None where there is none; OUR_NORMS: the LMBlock's names for the same.
NORM_NAMES = {
    "pre": ("input_layernorm", None, "post_attention_layernorm", None),
    "sandwich": ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"),
    "post": (None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
}
OUR_NORMS = ("attention_norm_in", "attention_norm_out", "feed_forward_norm_in", "feed_forward_norm_out")


def family_of(model):
    """The `model_type` of a Hugging Face causal LM that is copied here ("gpt2", "llama", ...), or a ValueError."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES or not hasattr(model, "lm_head"):
        raise ValueError(f"from_transformers copies the causal LMs of model_type {sorted(FAMILIES)}, got "
                         f"{type(model).__name__} with model_type={kind!r}")
    return kind


def norm_names(kind):
    """Pairs (our LMBlock's norm, transformers' name for it) of a family's decoder layers, where both exist."""
    theirs = NORM_NAMES[FAMILIES[kind]["norm_placement"]]
    return [(ours, their_name) for ours, their_name in zip(OUR_NORMS, theirs) if their_name is not None]


def attention_type(kind):
    """ "grouped" (GroupedQueryAttention) or "latent" (MultiHeadLatentAttention): the attention of a family."""
    return FAMILIES[kind].get("attention", "grouped")


def is_dense(mlp):
    """Whether a decoder layer's MLP is a gated MLP (gate_proj, up_proj, down_proj), not a mixture of experts."""
    return hasattr(mlp, "gate_proj") and not hasattr(mlp, "experts")


def is_linear(layer):
    """Whether a decoder layer's token mixer is linear attention (a hybrid's linear_attn), not self_attn."""
    return getattr(layer, "linear_attn", None) is not None and getattr(layer, "self_attn", None) is None
