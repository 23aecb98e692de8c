"""What a Hugging Face causal LM's modules say about its family (chapter 13): the final norm and its unit
offset, where each block's norms sit around its sublayers (seen by running the model once), the feed-forward,
the positions, QK-norm, caps, windows, tied embeddings and biases. The chapter's table is checked against it."""

import torch

SUBLAYERS = {"attn": "attention", "self_attn": "attention", "mlp": "feed-forward"}  # the blocks' names for them


def norm_places(model, block):
    """Where the norms of `block` sit, seen by running the model once: "before" a sublayer if a norm's output
    is the sublayer's input, "after" it if a norm's input is the sublayer's output; unplaced: the other norms."""
    seen = {}  # child's name: (its input, its output)

    def keep(name):
        def hook(module, args, kwargs, output):
            seen[name] = (args[0] if args else kwargs["hidden_states"], output[0] if isinstance(output, tuple) else output)
        return hook

    handles = [child.register_forward_hook(keep(name), with_kwargs=True) for name, child in block.named_children()]
    with torch.no_grad():
        model.eval()(torch.arange(8)[None])  # (1, 8) tokens
    for handle in handles:
        handle.remove()
    norms = [name for name, m in block.named_children() if "norm" in type(m).__name__.lower()]
    places, placed = {}, set()
    for name, sublayer in SUBLAYERS.items():
        if name in seen:
            sides = [side for side, fits in (("before", lambda n: seen[n][1] is seen[name][0]),
                                             ("after", lambda n: seen[n][0] is seen[name][1]))
                     if any(fits(n) for n in norms)]
            placed |= {n for n in norms if seen[n][1] is seen[name][0] or seen[n][0] is seen[name][1]}
            places[sublayer] = " and ".join(sides)
    unplaced = sorted(set(norms) - placed)
    return (places["attention"] if len(set(places.values())) == 1 else places), unplaced


def read_family(model):
    """The facts of the table, read from a Hugging Face model's modules and configuration."""
    config, inner = model.config, model.base_model
    block = inner.layers[0] if hasattr(inner, "layers") else inner.h[0]
    attention = getattr(block, "self_attn", None) or block.attn
    final_norm = getattr(inner, "norm", None) or inner.ln_f
    with torch.no_grad():  # a weight of zeros: a plain scale gives 0, Gemma's 1 + weight passes the normed input
        saved = final_norm.weight.clone()
        final_norm.weight.zero_()
        unit_offset = bool(final_norm(torch.ones(1, saved.shape[-1])).abs().max() > 0)
        final_norm.weight.copy_(saved)
    q_norm = getattr(attention, "q_norm", None)
    kinds = getattr(config, "layer_types", None) or ["sliding_attention"] * config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    windowed = "".join("W" if kind == "sliding_attention" and window else "-" for kind in kinds)
    places, unplaced = norm_places(model, block)
    layers = sorted(name for name, m in block.named_modules() if isinstance(getattr(m, "weight", None), torch.nn.Parameter))
    biased = sorted(name for name, m in block.named_modules() if isinstance(getattr(m, "bias", None), torch.nn.Parameter))
    return {
        "norm": type(final_norm).__name__ + (" with 1 + weight" if unit_offset else ""),
        "norms": places, "norms on the residual sum": unplaced,
        "feed-forward": ("gated, " if hasattr(block.mlp, "gate_proj") else "")
        + (getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None) or config.activation_function),
        "positions": "learned" if hasattr(inner, "wpe") else "RoPE" if hasattr(inner, "rotary_emb") else None,
        "QK-norm": None if q_norm is None else ("per head" if len(q_norm.weight) == config.head_dim else "all heads"),
        "caps": (getattr(config, "attn_logit_softcapping", None), getattr(config, "final_logit_softcapping", None)),
        "windows": windowed if "W" in windowed else None,
        "tied": model.lm_head.weight is model.get_input_embeddings().weight,
        "biases": "every layer" if biased == layers else ", ".join(biased) or "none",
        "output bias": model.lm_head.bias is not None,
    }
