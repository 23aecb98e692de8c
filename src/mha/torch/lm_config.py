"""What makes a `TransformerLM` one model family or another: its `LMConfig` (chapters 13 and 17).

The sizes, the attention's arguments (shared and per layer), the norms and where they sit, the feed-forward,
the embeddings' scale and the final soft-cap (chapter 13); the attention's kind, the mixture of experts and the
layers that share keys and values (chapter 17). Checked when made: a bad configuration is a ValueError naming it.
"""

from dataclasses import dataclass, field

from mha import validate

NORM_PLACEMENTS = ("pre", "sandwich", "post")
ATTENTION_TYPES = ("grouped", "latent")  # GroupedQueryAttention, MultiHeadLatentAttention (DeepSeek)
FEED_FORWARDS = ("silu", "gelu_tanh", "mlp_gelu_tanh")  # SwiGLU, GeGLU, GPT-2's two layers with biases
LAYER_TYPES = ("full", "linear")  # the attention of the config's kind, or a GatedDeltaNet (chapter 18)
LINEAR_REQUIRED = ("n_key_heads", "n_value_heads", "key_head_dim", "value_head_dim")
LINEAR_OPTIONAL = ("conv_kernel", "norm_eps", "chunk_size")  # GatedDeltaNet's other arguments but d_model


@dataclass(frozen=True)
class LMConfig:
    """What makes a `TransformerLM` one model family or another.

    attention: keyword arguments of `GroupedQueryAttention` shared by every layer (n_heads,
    n_kv_heads, d_head, bias, rope_base, qk_norm, scale, logit_cap, ...); layer_attention: one
    dict per layer that overrides them (a layer's sliding_window, rope_base, rope_scaling), or ().
    norm: "rms" or "layer" (LayerNorm with a bias: GPT-2); norm_unit_offset: Gemma's (1 + w).
    norm_placement: "pre", "sandwich" (pre and post, Gemma 2 and 3) or "post" (OLMo 2).
    feed_forward: "silu" (SwiGLU), "gelu_tanh" (GeGLU) or "mlp_gelu_tanh" (GPT-2's MLP).
    max_positions: rows of a learned position table (GPT-2), or None (RoPE carries positions).
    embedding_scale: None, or the factor on the embeddings (Gemma: sqrt(d_model)).
    final_logit_cap: None, or Gemma 2's soft cap on the logits.
    padding_idx: None, or the token id whose embedding row gets no gradient (nn.Embedding's padding_idx).
    attention_type: "grouped" (`GroupedQueryAttention`, its kwargs in `attention`) or "latent"
    (`MultiHeadLatentAttention`, DeepSeek-V2/V3's, its kwargs in `attention`).
    experts: None, or the keyword arguments of `MixtureOfExperts` but d_model; expert_layers: the indices
    of the layers whose feed-forward is that mixture (None: every layer); the others keep the dense
    feed-forward of width d_ff.
    kv_sharing: () or one int per layer: the layer whose keys and values it attends to. Itself: it makes its
    own; an earlier layer (which makes its own): it has no W_k, W_v and reuses that layer's, rotated keys
    included (cross-layer KV sharing: Brandon et al., 2024; Gemma 3n). A sharing layer's window may not be
    wider than its source's (the source's cache keeps only its own window).
    layer_types: () (every layer "full") or one of "full" / "linear" per layer (chapter 18: the hybrids,
    Qwen3-Next and Qwen3.5); a "linear" layer's attention is a `GatedDeltaNet` built with linear_attention
    (a dict of its arguments but d_model: n_key_heads, n_value_heads, key_head_dim, value_head_dim, and
    optionally conv_kernel, norm_eps, chunk_size) and its cache a StateCache of fixed size. Linear layers
    neither share keys nor lend theirs (kv_sharing), and take attention_type="grouped" for their full layers.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    d_ff: int
    attention: dict = field(default_factory=dict)
    layer_attention: tuple = ()
    norm: str = "rms"
    norm_eps: float = 1e-6
    norm_unit_offset: bool = False
    norm_placement: str = "pre"
    feed_forward: str = "silu"
    max_positions: int = None
    tie_embeddings: bool = True
    embedding_scale: float = None
    final_logit_cap: float = None
    padding_idx: int = None
    attention_type: str = "grouped"
    experts: dict = None
    expert_layers: tuple = None
    kv_sharing: tuple = ()
    layer_types: tuple = ()
    linear_attention: dict = None

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "d_ff"):
            validate.check_int(name, getattr(self, name))
        for name, value, allowed in (("norm", self.norm, ("rms", "layer")),
                                     ("norm_placement", self.norm_placement, NORM_PLACEMENTS),
                                     ("feed_forward", self.feed_forward, FEED_FORWARDS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.layer_attention and len(self.layer_attention) != self.n_layers:
            raise ValueError(f"layer_attention needs one dict per layer (n_layers={self.n_layers}), "
                             f"got {len(self.layer_attention)}")
        if self.attention_type not in ATTENTION_TYPES:
            raise ValueError(f"attention_type must be one of {ATTENTION_TYPES}, got {self.attention_type!r}")
        self.check_layer_types()
        module = "GroupedQueryAttention" if self.attention_type == "grouped" else "MultiHeadLatentAttention"
        needs_heads = not self.layer_types or "full" in self.layer_types  # an all-linear stack has no full layer
        if not isinstance(self.attention, dict) or (needs_heads and "n_heads" not in self.attention):
            raise ValueError(f"attention must be a dict of {module} arguments with n_heads, got {self.attention!r}")
        self.check_experts()
        self.check_kv_sharing()

    def check_layer_types(self):
        if not isinstance(self.layer_types, (tuple, list)):
            raise TypeError(f"layer_types must be a tuple of {LAYER_TYPES} per layer, got "
                            f"{type(self.layer_types).__name__}")
        if self.layer_types and (len(self.layer_types) != self.n_layers or
                                 any(kind not in LAYER_TYPES for kind in self.layer_types)):
            raise ValueError(f"layer_types needs one of {LAYER_TYPES} per layer (n_layers={self.n_layers}), "
                             f"got {tuple(self.layer_types)!r}")
        linear = "linear" in self.layer_types
        if not linear:
            if self.linear_attention is not None:
                raise ValueError("linear_attention holds the arguments of the 'linear' layers, but layer_types "
                                 "names none: give layer_types too")
            return
        if not isinstance(self.linear_attention, dict):
            raise TypeError(f"linear_attention must be a dict of GatedDeltaNet arguments but d_model "
                            f"{LINEAR_REQUIRED + LINEAR_OPTIONAL}, got {type(self.linear_attention).__name__}")
        missing = [name for name in LINEAR_REQUIRED if name not in self.linear_attention]
        unknown = sorted(set(self.linear_attention) - set(LINEAR_REQUIRED + LINEAR_OPTIONAL))
        if missing or unknown:
            raise ValueError(f"linear_attention must hold {LINEAR_REQUIRED} (and may hold {LINEAR_OPTIONAL}): "
                             f"missing {missing}, unknown {unknown}")
        if self.attention_type != "grouped":
            raise ValueError(f"linear layers are mixed with attention_type='grouped' layers only, got "
                             f"{self.attention_type!r}")

    def check_experts(self):
        if self.experts is not None and not isinstance(self.experts, dict):
            raise TypeError(f"experts must be None or a dict of MixtureOfExperts arguments, "
                            f"got {type(self.experts).__name__}")
        if self.expert_layers is None:
            return
        if self.experts is None:
            raise ValueError("expert_layers names the layers whose feed-forward is the mixture: give experts too")
        layers = tuple(self.expert_layers)
        if not all(isinstance(i, int) and 0 <= i < self.n_layers for i in layers) or len(set(layers)) != len(layers):
            raise ValueError(f"expert_layers must be distinct layer indices 0 .. {self.n_layers - 1}, "
                             f"got {self.expert_layers!r}")

    def check_kv_sharing(self):
        if not self.kv_sharing:
            return
        sources = tuple(self.kv_sharing)
        if len(sources) != self.n_layers:
            raise ValueError(f"kv_sharing needs one layer index per layer (n_layers={self.n_layers}), "
                             f"got {len(sources)}")
        for i, j in enumerate(sources):
            if not isinstance(j, int) or not 0 <= j <= i or sources[j] != j:
                raise ValueError(f"kv_sharing[{i}] must be {i} (its own keys) or an earlier layer that makes its "
                                 f"own, got {j!r} (kv_sharing={sources})")
            if j != i and (self.is_linear(i) or self.is_linear(j)):
                raise ValueError(f"kv_sharing[{i}] = {j}: a linear layer has no keys to share or to reuse (layer "
                                 f"{i if self.is_linear(i) else j} is 'linear' in layer_types)")
        if self.attention_type != "grouped" and sources != tuple(range(self.n_layers)):
            raise ValueError(f"kv_sharing is computed for attention_type='grouped' only, got "
                             f"{self.attention_type!r}")
        for i, j in enumerate(sources):
            window, source_window = self.layer(i).get("sliding_window"), self.layer(j).get("sliding_window")
            if source_window is not None and (window is None or window > source_window):
                raise ValueError(f"layer {i} shares layer {j}'s keys, whose cache keeps only a window of "
                                 f"{source_window}: layer {i}'s window ({window}) must not be wider")

    def kv_source(self, i):
        """The layer whose keys and values layer i attends to (i itself without sharing)."""
        return self.kv_sharing[i] if self.kv_sharing else i

    def is_linear(self, i):
        """Whether layer i's attention is linear (a GatedDeltaNet), not the attention of attention_type."""
        return bool(self.layer_types) and self.layer_types[i] == "linear"

    def has_experts(self, i):
        """Whether layer i's feed-forward is the mixture of experts."""
        return self.experts is not None and (self.expert_layers is None or i in tuple(self.expert_layers))

    def layer(self, i):
        """The attention arguments of layer i (GroupedQueryAttention's, or MultiHeadLatentAttention's)."""
        options = dict(self.attention) if self.attention_type == "latent" else \
            {"n_kv_heads": self.attention["n_heads"], **self.attention}
        return {**options, **(self.layer_attention[i] if self.layer_attention else {})}
