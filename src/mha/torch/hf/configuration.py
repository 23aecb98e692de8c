"""A Hugging Face config and its layers read into the course's arguments, and what is refused.

Read and computed: q, k, v and o projections (with Qwen's biases); QK-norm per head (Qwen3,
Gemma 3) or over all heads (OLMo 2); the scores' scale (Gemma's query_pre_attn_scalar);
attention-logit soft-capping (Gemma 2); the layer's sliding window (Mistral, Qwen's
use_sliding_window, Gemma's sliding layers, OLMo 3's and gpt-oss's per-layer windows); gpt-oss's attention
sinks; Qwen3-Next's and Qwen3.5's output gate and partial RoPE (Qwen3.5's "mrope" reduced to plain RoPE: for
text its three rows of positions are equal); the hybrids' layer types and their linear layers (Gated DeltaNet,
read by `mha.torch.hf.linear`); the layer's RoPE: its base and scaling (linear,
dynamic NTK, YaRN, Llama 3), one per layer type where they differ (Gemma 3); the gated MLP's
activation; and the whole model's sizes, norms, tied embeddings and final soft-cap (`lm_arguments`).

Refused with a `ValueError` naming the feature, the config's `model_type` and the layer's class:
anything else that changes the answer (OLMo 1's clip_qkv, GLM's partial
rotary factor, a RoPE type we do not compute, an RMSNorm of a kind we do not know, an activation
other than SiLU or GELU's tanh form, the config fields of `REFUSED_FIELDS`, an lm_head with a bias).
Gemma 3's config keeps attn_logit_softcapping, which its attention never applies: the copy applies
none either. The copy computes without dropout: `dropouts` names the config's, and a copy of a model
that has some refuses train() (`TransformerLM.train`). Both config layouts of
the `pretrained` extra are read: transformers 5 (`rope_parameters`, one dict per layer type where the
types differ) and transformers 4.56 or newer (`rope_theta` and `rope_scaling`; Gemma 3's
`rope_local_base_freq` for its sliding layers).

Everything here returns plain arguments (dicts, strings, numbers): the modules are built by their
callers, once, and filled by `weights`.
"""

from mha import rope_scaling
from mha.torch.hf import families, weights

# RMSNorm classes by their formula: x / rms(x) * w (cast before the weight), or Gemma's * (1 + w) in float32.
PLAIN_NORMS = {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Olmo2RMSNorm", "RMSNorm",
               "Olmo3RMSNorm", "GptOssRMSNorm", "Qwen3MoeRMSNorm", "DeepseekV3RMSNorm", "DeepseekV32RMSNorm"}
UNIT_OFFSET_NORMS = {"GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm", "Qwen3NextRMSNorm", "Qwen3_5RMSNorm"}
# Hugging Face's names for the two gates (transformers.activations.ACT2FN); any other is refused.
HF_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
# Config fields that would change the answer, and the value that does not: anything else is refused.
REFUSED_FIELDS = {
    "add_cross_attention": False,  # GPT-2 as a decoder of an encoder-decoder
    "mlp_bias": False,  # Llama's optional biases in the MLP
    "pretraining_tp": 1,  # Llama 2's sliced matmuls (transformers ignores it in 5, refused to be safe)
    "use_bidirectional_attention": False,  # Gemma 3's encoder use
    "clip_qkv": None,  # OLMo 1
}
# Attention layers whose config holds attn_logit_softcapping that transformers never applies: Gemma 3 keeps
# the field, but Gemma3Attention passes no softcap to its attention function, so the copy applies none either.
IGNORED_SOFT_CAP = {"Gemma3Attention"}
IGNORED_SOFT_CAP_TYPES = {"gemma3", "gemma3_text"}
# Attention layers whose q_proj makes, per head, a query and an output gate ([query | gate], 2 * head_dim).
OUTPUT_GATED = {"Qwen3NextAttention", "Qwen3_5Attention"}
# Attention layers with a partial RoPE whose turned features are the first head_dim * partial_rotary_factor,
# rotated as halves (Llama's rotate_half on that part): computed (rotary_dim). Others' layouts are refused.
PARTIAL_ROTARY_HALVES = {"Qwen3NextAttention", "Qwen3_5Attention"}
# Attention layers whose RoPE is multimodal ("mrope": rows of temporal, height and width positions, their features
# interleaved by mrope_section): for text the three rows are the same positions, so it is the plain RoPE.
MROPE_TEXT = {"Qwen3_5Attention"}
MROPE_FIELDS = ("mrope_section", "mrope_interleaved")
# Dropout fields of the families' configs: the copy computes without dropout, so train() is refused where one is set.
DROPOUT_FIELDS = ("attn_pdrop", "resid_pdrop", "embd_pdrop", "attention_dropout")

# The refusal -------------------------------------------------------------------------------------------


def where(attention):
    """'model_type=... (ClassName)': the words every refusal ends with."""
    config = getattr(attention, "config", None)
    return f"model_type={getattr(config, 'model_type', None)!r} ({type(attention).__name__})"


def refuse(attention, features):
    raise ValueError(f"cannot compute {'; '.join(features)} of {where(attention)}: the copy would be silently "
                     f"wrong. Expected q, k, v and o projections, RMSNorms of the Llama or Gemma kind, and a RoPE "
                     f"of type {sorted(rope_scaling.ROPE_SCALINGS)} on every feature")


# Norms and gated MLPs ------------------------------------------------------------------------------------


def rms_norm_options(norm, owner=None):
    """{"eps", "unit_offset"} of a Hugging Face RMSNorm (Llama's kind or Gemma's (1 + w) kind)."""
    kind = type(norm).__name__
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if kind not in PLAIN_NORMS | UNIT_OFFSET_NORMS or eps is None:
        refuse(owner or norm, [f"a norm of class {kind} (known: {sorted(PLAIN_NORMS | UNIT_OFFSET_NORMS)})"])
    return {"eps": float(eps), "unit_offset": kind in UNIT_OFFSET_NORMS}


def hf_activation(mlp):
    """ "silu" or "gelu_tanh": the activation a Hugging Face MLP's config names (Gemma's
    hidden_activation, else hidden_act)."""
    config = getattr(mlp, "config", None)
    name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    if name not in HF_ACTIVATIONS:
        raise ValueError(f"{type(mlp).__name__}'s config names the activation {name!r}; only "
                         f"{sorted(HF_ACTIVATIONS)} are computed here (exact GELU is not GELU's tanh form)")
    return HF_ACTIVATIONS[name]


# RoPE ------------------------------------------------------------------------------------------------------


def rope_parameters(config):
    """A config's RoPE settings as a dict: transformers 5 keeps them in `config.rope_parameters`
    (one dict, or one per layer type); transformers 4 in `config.rope_theta` and `config.rope_scaling`."""
    rope = getattr(config, "rope_parameters", None)
    if rope:
        return dict(rope)
    scaling = dict(getattr(config, "rope_scaling", None) or {})
    kind = scaling.pop("type", scaling.get("rope_type", "default"))  # transformers 4 wrote "type" before 4.45
    rope = {**scaling, "rope_type": kind}
    if getattr(config, "rope_theta", None) is not None:
        rope["rope_theta"] = config.rope_theta
    return rope


def is_per_layer_type(rope):
    """transformers 5 writes {"sliding_attention": {...}, "full_attention": {...}} when layer types differ."""
    return any(isinstance(value, dict) for value in rope.values())


def layer_type(attention):
    """'sliding_attention' or 'full_attention' where the layer says (Qwen, Gemma), else None."""
    kind = getattr(attention, "layer_type", None) or getattr(attention, "attention_type", None)  # OLMo 3's name
    if kind is None and getattr(attention, "is_sliding", None) is not None:
        kind = "sliding_attention" if attention.is_sliding else "full_attention"
    return kind


def layer_rope(attention):
    """(theta, scaling) of this layer's RoPE: its base, and None or a `mha.rope_scaling` dict."""
    config = attention.config
    rope = rope_parameters(config)
    kind = layer_type(attention)
    if is_per_layer_type(rope):
        if kind not in rope:
            refuse(attention, [f"per-layer-type RoPE parameters {sorted(rope)} for a layer of type {kind!r}"])
        rope = dict(rope[kind])
    elif getattr(config, "rope_local_base_freq", None) is not None and kind == "sliding_attention":
        rope = {"rope_type": "default", "rope_theta": config.rope_local_base_freq}  # transformers 4's Gemma 3
    mrope_fields(attention, rope)  # Qwen3.5's sections checked, whatever the RoPE's type
    factor = partial_rotary_factor(attention)
    if factor != 1.0 and type(attention).__name__ not in PARTIAL_ROTARY_HALVES:
        refuse(attention, [f"partial_rotary_factor={factor} (RoPE on part of each head's features, in a layout "
                           f"not read here; read: {sorted(PARTIAL_ROTARY_HALVES)})"])
    return rope.get("rope_theta"), scaling_of(attention, rope)


def partial_rotary_factor(attention):
    """The share of each head's features that RoPE turns (1.0: all), from the layer's rope parameters or config."""
    config = attention.config
    rope = rope_parameters(config)
    if is_per_layer_type(rope):
        rope = dict(rope.get(layer_type(attention), {}))
    factor = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    return 1.0 if factor is None else factor


def scaling_of(attention, rope):
    """transformers' rope dict as `mha.rope_scaling` takes it (None for the default RoPE)."""
    config, kind = attention.config, rope.get("rope_type", "default")
    if kind not in rope_scaling.ROPE_SCALINGS:
        refuse(attention, [f"RoPE of type {kind!r} (computed here: {sorted(rope_scaling.ROPE_SCALINGS)})"])
    if kind == "default":
        return None
    required, optional = rope_scaling.ROPE_SCALINGS[kind]
    scaling = {key: rope[key] for key in (*required, *optional) if rope.get(key) is not None}
    if kind == "dynamic":
        scaling["max_position_embeddings"] = config.max_position_embeddings
    if kind == "yarn" and "factor" not in scaling:  # DeepSeek's way: the ratio of the two lengths
        scaling["factor"] = config.max_position_embeddings / rope["original_max_position_embeddings"]
    known = {"rope_type", "rope_theta", "partial_rotary_factor", *required, *optional, *mrope_fields(attention, rope)}
    unknown = sorted(set(rope) - known)
    if unknown:
        refuse(attention, [f"RoPE {kind!r} with {unknown}"])
    return {"rope_type": kind, **scaling}


def mrope_fields(attention, rope):
    """The mrope fields that a text-only layer of `MROPE_TEXT` reads as plain RoPE (its three rows of positions
    are one row); none elsewhere (refused as unknown), and mrope_section must be three sizes."""
    if type(attention).__name__ not in MROPE_TEXT:
        return ()
    section = rope.get("mrope_section")
    if section is not None and (len(section) != 3 or not all(isinstance(n, int) and n >= 0 for n in section)):
        refuse(attention, [f"mrope_section={section!r} (three sizes, temporal, height and width, are read)"])
    return MROPE_FIELDS


# Attention layers ------------------------------------------------------------------------------------------


def refused_features(attention):
    """The features of a layer that nothing here computes, in words (empty when there is none)."""
    config = getattr(attention, "config", None)
    found = []
    clip = getattr(config, "clip_qkv", None)
    if clip is not None:
        found.append(f"clip_qkv={clip} (queries, keys and values clamped to [-{clip}, {clip}])")
    return found


def sliding_window(attention):
    """The layer's window (Mistral's config.sliding_window, or the layer's own where windows differ
    per layer, as Qwen's and Gemma's), or None: past it a query sees only the last `window` keys."""
    if hasattr(attention, "sliding_window"):
        return attention.sliding_window
    return getattr(getattr(attention, "config", None), "sliding_window", None)


def attention_options(attention, rope_base):
    """The keyword arguments of `GroupedQueryAttention` (besides the sizes) that make it compute
    what `attention` computes; rope_base=None copies no RoPE. Refuses what it cannot compute."""
    found = refused_features(attention)
    if found:
        refuse(attention, found)
    config = getattr(attention, "config", None)
    options = {"sliding_window": sliding_window(attention), "scale": scale_of(attention, config),
               "logit_cap": logit_cap_of(attention, config)}
    if getattr(attention, "sinks", None) is not None:  # gpt-oss: a learned logit per head in the denominator
        options["sinks"] = True
    if has_output_gate(attention):  # Qwen3-Next: q_proj makes a query and a gate a head
        options["output_gate"] = True
    q_norm = getattr(attention, "q_norm", None)
    if q_norm is not None:
        norm = rms_norm_options(q_norm, attention)
        per_head = q_norm.weight.shape[-1] == attention.head_dim and attention.k_norm.weight.shape[-1] == \
            attention.head_dim
        options.update(qk_norm="head" if per_head else "all", norm_eps=norm["eps"],
                       norm_unit_offset=norm["unit_offset"])
    if rope_base is not None and config is not None:
        theta, options["rope_scaling"] = layer_rope(attention)
        factor = partial_rotary_factor(attention)
        if factor != 1.0:  # Qwen3-Next: the first head_dim * factor features turned, as halves
            options["rotary_dim"] = int(attention.head_dim * factor)
        if theta is not None and theta != rope_base:
            raise ValueError(f"the {type(attention).__name__} config has rope_theta={theta} for this layer but "
                             f"rope_base={rope_base}: pass rope_base={theta}")
    return options


def logit_cap_of(attention, config):
    """The cap on the scores that the layer applies (Gemma 2's attn_logit_softcapping), or None. Gemma 3's
    config keeps the field but its attention ignores it (IGNORED_SOFT_CAP): so does the copy."""
    if type(attention).__name__ in IGNORED_SOFT_CAP or getattr(config, "model_type", None) in IGNORED_SOFT_CAP_TYPES:
        return None
    return getattr(attention, "attn_logit_softcapping", getattr(config, "attn_logit_softcapping", None))


def scale_of(attention, config):
    """The scores' factor: the layer's `scaling`, else query_pre_attn_scalar ** -0.5; None = head_dim ** -0.5."""
    scaling = getattr(attention, "scaling", None)
    scalar = getattr(config, "query_pre_attn_scalar", None)
    if scaling is None and scalar is not None:
        scaling = scalar ** -0.5
    return None if scaling is None or scaling == attention.head_dim ** -0.5 else float(scaling)


def has_output_gate(attention):
    """Whether the layer gates its heads' outputs with sigmoid(a gate made by q_proj beside each query), as
    Qwen3-Next's attention does (`OUTPUT_GATED`): its q_proj then has 2 * n_heads * head_dim outputs."""
    return type(attention).__name__ in OUTPUT_GATED


def attention_arguments(attention, rope_base):
    """Every keyword argument of `GroupedQueryAttention` but d_model (the input width, q_proj.in_features):
    the sizes (n_heads, n_kv_heads, d_head, bias), rope_base and the features of `attention_options`.
    A TypeError for a layer without q_proj ... o_proj; a ValueError for what nothing here computes."""
    q_proj, k_proj, v_proj, o_proj = weights.attention_projections(attention)
    d_head = attention.head_dim
    per_head = d_head * (2 if has_output_gate(attention) else 1)  # Qwen3-Next: [query | gate] a head
    return dict(n_heads=q_proj.out_features // per_head, n_kv_heads=k_proj.out_features // d_head, d_head=d_head,
                bias=any(layer.bias is not None for layer in (q_proj, k_proj, v_proj, o_proj)), rope_base=rope_base,
                **attention_options(attention, rope_base))


# Whole models ------------------------------------------------------------------------------------------


def check_fields(model, config):
    """Refuses the config fields of REFUSED_FIELDS set to what changes the answer, and GPT-2 with another GELU."""
    found = [f"{name}={getattr(config, name)!r}" for name, fine in REFUSED_FIELDS.items()
             if getattr(config, name, None) not in (None, fine)]
    if getattr(config, "model_type", None) == "gpt2" and config.activation_function not in ("gelu_new",
                                                                                            "gelu_pytorch_tanh"):
        found.append(f"activation_function={config.activation_function!r} (GPT-2's MLP is computed with tanh GELU)")
    if getattr(getattr(model, "lm_head", None), "bias", None) is not None:
        found.append("an lm_head with a bias (the output layer here has none)")
    if found:
        refuse(model, found)


def dropouts(config):
    """The config's dropout fields that are set, as 'name=p' (empty when none is): the copy computes without
    dropout, so in train() mode it would differ from the model; `TransformerLM.train` refuses then."""
    return [f"{name}={getattr(config, name)!r}" for name in DROPOUT_FIELDS if getattr(config, name, None)]


def lm_arguments(model, kind):
    """The keyword arguments of `LMConfig` that make a TransformerLM compute what the Hugging Face causal
    LM `model` (of model_type `kind`, see `families`) computes. Refuses what nothing here computes."""
    config = model.config
    check_fields(model, config)
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    common = dict(vocab_size=config.vocab_size, tie_embeddings=tied,
                  padding_idx=model.get_input_embeddings().padding_idx,
                  norm_placement=families.FAMILIES[kind]["norm_placement"],
                  final_logit_cap=getattr(config, "final_logit_softcapping", None))
    return {**common, **(gpt2_arguments(model) if kind == "gpt2" else decoder_arguments(model, kind))}


def gpt2_arguments(model):
    """LMConfig's arguments for GPT-2: LayerNorm, learned positions, fused attention with biases, tanh GELU."""
    config, blocks = model.config, model.transformer.h
    return dict(d_model=config.n_embd, n_layers=config.n_layer, d_ff=blocks[0].mlp.c_fc.nf,
                attention={"n_heads": config.n_head, "bias": True},
                layer_attention=tuple({"scale": gpt2_scale(config, i)} for i in range(len(blocks))),
                norm="layer", norm_eps=config.layer_norm_epsilon, feed_forward="mlp_gelu_tanh",
                max_positions=config.n_positions)


def gpt2_scale(config, layer_idx):
    """GPT-2's factor on the scores: d_head ** -0.5 (scale_attn_weights), / (layer + 1) if asked."""
    scale = (config.n_embd // config.n_head) ** -0.5 if config.scale_attn_weights else 1.0
    return scale / (layer_idx + 1) if config.scale_attn_by_inverse_layer_idx else scale


def decoder_arguments(model, kind):
    """LMConfig's arguments for the Llama-like families: RMSNorm, a gated MLP or a mixture of experts per layer
    (`feed_forward_arguments`), and each layer's attention read as `GroupedQueryAttention.from_llama` reads it
    (its RoPE base from the config, per layer), or as `mha.torch.hf.latent` reads DeepSeek's."""
    config, body = model.config, model.model
    layers = body.layers
    norm = rms_norm_options(body.norm, model)
    return dict(d_model=config.hidden_size, n_layers=config.num_hidden_layers,
                **layer_attention_arguments(layers, families.attention_type(kind)), **feed_forward_arguments(layers),
                norm_eps=norm["eps"], norm_unit_offset=norm["unit_offset"],
                embedding_scale=config.hidden_size ** 0.5 if families.FAMILIES[kind]["scaled_embeddings"] else None)


def layer_attention_arguments(layers, attention_type):
    """attention_type, attention (the arguments every layer shares) and layer_attention (each layer's others);
    a hybrid's layer_types and linear_attention."""
    hybrid = linear_arguments(layers)
    if attention_type == "latent":
        from mha.torch.hf import latent  # imported here: it reads this module
        per_layer = [latent.latent_arguments(layer.self_attn) for layer in layers]
        shared = {key: value for key, value in per_layer[0].items()
                  if all(arguments[key] == value for arguments in per_layer)}
    else:  # a hybrid's linear layers have no self_attn: their GatedDeltaNet is read by `linear_arguments`
        per_layer = [{} if families.is_linear(layer) else
                     attention_arguments(layer.self_attn, layer_rope(layer.self_attn)[0]) for layer in layers]
        full = [arguments for arguments in per_layer if arguments]
        shared = {key: full[0][key] for key in ("n_heads", "n_kv_heads", "d_head")} if full else {}
    layer_attention = tuple({key: value for key, value in arguments.items() if key not in shared}
                            for arguments in per_layer)
    return dict(attention_type=attention_type, attention=shared,
                layer_attention=layer_attention, **hybrid)


def linear_arguments(layers):
    """A hybrid's layer_types ("full" or "linear" per layer) and linear_attention (its GatedDeltaNets'
    arguments, read by `mha.torch.hf.linear`, the same in every linear layer); nothing for other models."""
    if not any(families.is_linear(layer) for layer in layers):
        return {}
    from mha.torch.hf import linear  # imported here, as latent and experts
    kinds = [getattr(layer, "block_type", None) for layer in layers]
    owner = next((layer.self_attn for layer in layers if not families.is_linear(layer)), layers[0].mlp)  # named
    refused = sorted({str(kind) for kind in kinds if kind not in families.LAYER_TYPES})
    if refused:
        refuse(owner, [f"layers of type {refused} (read: {sorted(families.LAYER_TYPES)})"])
    per_layer = [linear.gated_delta_net_arguments(layer.linear_attn) for layer in layers if families.is_linear(layer)]
    if any(arguments != per_layer[0] for arguments in per_layer):
        refuse(owner, ["linear-attention layers that differ from layer to layer"])
    return dict(layer_types=tuple(families.LAYER_TYPES[kind] for kind in kinds), linear_attention=per_layer[0])


def feed_forward_arguments(layers):
    """d_ff and feed_forward of the dense layers' gated MLPs; experts and expert_layers where some layers' MLP
    is a mixture of experts (DeepSeek's first layers are dense, Qwen3-MoE's mlp_only_layers too). Every
    mixture must have the same arguments."""
    dense = [i for i, layer in enumerate(layers) if families.is_dense(layer.mlp)]
    mixtures = [i for i in range(len(layers)) if i not in dense]
    arguments = {}
    if mixtures:
        from mha.torch.hf import experts  # imported here: it reads this module
        per_layer = [experts.experts_arguments(layers[i].mlp) for i in mixtures]
        if any(options != per_layer[0] for options in per_layer):
            refuse(layers[mixtures[0]].mlp, ["mixtures of experts that differ from layer to layer"])
        arguments.update(experts=per_layer[0], expert_layers=None if not dense else tuple(mixtures))
    if dense:
        mlp = layers[dense[0]].mlp
        widths = {layers[i].mlp.gate_proj.out_features for i in dense}
        if len(widths) > 1:
            refuse(mlp, [f"dense MLPs of different widths {sorted(widths)}"])
        arguments.update(d_ff=widths.pop(), feed_forward=hf_activation(mlp))
    else:  # every layer is a mixture: d_ff is unused, the expert's width stands in
        arguments.update(d_ff=arguments["experts"]["d_expert"])
    return arguments
