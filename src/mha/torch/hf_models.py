"""`from_transformers(model)`: a Hugging Face causal LM copied into a `TransformerLM`.

One path for every family, dispatching on `config.model_type`: the config says where the norms
sit and which feed-forward, embedding scale and final cap the family uses (`FAMILIES`); each
attention layer is copied by `GroupedQueryAttention.from_llama` (GPT-2's fused c_attn by
`gpt2_attention`), which reads its own features (QK-norm, scale, soft-cap, window, RoPE) from
`mha.torch.hf_config`. A config field that changes the answer and that nothing here computes is
refused with a ValueError naming it (`REFUSED_FIELDS`), never copied into a silently different model.
"""

import torch
from torch import nn

from mha.torch.grouped import GroupedQueryAttention
from mha.torch.hf_config import layer_rope, refuse, rms_norm_options
from mha.torch.lm import LMConfig, TransformerLM
from mha.torch.parts import hf_activation

# model_type -> where its norms sit, its feed-forward, whether it scales the embeddings (Gemma: sqrt(d)).
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
}
# Config fields that would change the answer, and the value that does not: anything else is refused.
REFUSED_FIELDS = {
    "add_cross_attention": False,  # GPT-2 as a decoder of an encoder-decoder
    "mlp_bias": False,  # Llama's optional biases in the MLP
    "pretraining_tp": 1,  # Llama 2's sliced matmuls (transformers ignores it in 5, refused to be safe)
    "use_bidirectional_attention": False,  # Gemma 3's encoder use
    "clip_qkv": None,  # OLMo 1
}
# Where each family keeps its sublayers' norms: (attention in, attention out, feed-forward in, out).
NORM_NAMES = {
    "pre": ("input_layernorm", None, "post_attention_layernorm", None),
    "sandwich": ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"),
    "post": (None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
}
OUR_NORMS = ("attention_norm_in", "attention_norm_out", "feed_forward_norm_in", "feed_forward_norm_out")


def from_transformers(model):
    """A `TransformerLM` computing what the Hugging Face causal LM `model` computes (same device and
    dtype): GPT2LMHeadModel, LlamaForCausalLM, and the Mistral, Qwen2, Qwen3, Gemma, Gemma 2,
    Gemma 3 (text) and OLMo 2 causal LMs. Its logits equal the model's (tests/test_lm.py)."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES or not hasattr(model, "lm_head"):
        raise ValueError(f"from_transformers copies the causal LMs of model_type {sorted(FAMILIES)}, got "
                         f"{type(model).__name__} with model_type={kind!r}")
    check_fields(model, config)
    body = model.transformer if kind == "gpt2" else model.model
    copies = [] if kind == "gpt2" else [GroupedQueryAttention.from_llama(layer.self_attn, layer_rope(layer.self_attn)[0])
                                        for layer in body.layers]  # each layer's attention, features and all
    ours = TransformerLM(lm_config(model, body, config, kind, copies), device=model.lm_head.weight.device,
                         dtype=model.lm_head.weight.dtype)
    with torch.no_grad():
        copy_weights(ours, model, body, kind, copies)
    return ours.train(model.training)


def check_fields(model, config):
    found = [f"{name}={getattr(config, name)!r}" for name, fine in REFUSED_FIELDS.items()
             if getattr(config, name, None) not in (None, fine)]
    if getattr(config, "model_type", None) == "gpt2" and config.activation_function not in ("gelu_new",
                                                                                            "gelu_pytorch_tanh"):
        found.append(f"activation_function={config.activation_function!r} (GPT-2's MLP is computed with tanh GELU)")
    if found:
        refuse(model, found)


def lm_config(model, body, config, kind, copies):
    family = FAMILIES[kind]
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    common = dict(vocab_size=config.vocab_size, d_model=config.hidden_size if kind != "gpt2" else config.n_embd,
                  n_layers=config.num_hidden_layers if kind != "gpt2" else config.n_layer,
                  norm_placement=family["norm_placement"], tie_embeddings=tied,
                  final_logit_cap=getattr(config, "final_logit_softcapping", None))
    if kind == "gpt2":
        blocks = body.h
        return LMConfig(**common, d_ff=blocks[0].mlp.c_fc.nf, attention={"n_heads": config.n_head, "bias": True},
                        layer_attention=tuple({"scale": gpt2_scale(config, i)} for i in range(len(blocks))),
                        norm="layer", norm_eps=config.layer_norm_epsilon, feed_forward="mlp_gelu_tanh",
                        max_positions=config.n_positions)
    layers = body.layers
    norm = rms_norm_options(body.norm, model)
    first = copies[0]
    return LMConfig(**common, d_ff=layers[0].mlp.gate_proj.out_features,
                    attention={"n_heads": first.n_heads, "n_kv_heads": first.n_kv_heads, "d_head": first.d_head},
                    layer_attention=tuple(attention_arguments(copy) for copy in copies),
                    norm_eps=norm["eps"], norm_unit_offset=norm["unit_offset"],
                    feed_forward=hf_activation(layers[0].mlp),
                    embedding_scale=config.hidden_size ** 0.5 if family["scaled_embeddings"] else None)


def gpt2_scale(config, layer_idx):
    """GPT-2's factor on the scores: d_head ** -0.5 (scale_attn_weights), / (layer + 1) if asked."""
    scale = (config.n_embd // config.n_head) ** -0.5 if config.scale_attn_weights else 1.0
    return scale / (layer_idx + 1) if config.scale_attn_by_inverse_layer_idx else scale


def attention_arguments(layer):
    """The GroupedQueryAttention arguments that rebuild `layer` (a copy made by from_llama)."""
    arguments = dict(bias=layer.W_q.bias is not None, rope_base=layer.rope_base, rope_scaling=layer.rope_scaling,
                     scale=layer.scale, logit_cap=layer.logit_cap, sliding_window=layer.sliding_window)
    if layer.qk_norm is not None:
        arguments.update(qk_norm=layer.qk_norm, norm_eps=layer.q_norm.eps, norm_unit_offset=layer.q_norm.unit_offset)
    return arguments


def copy_weights(ours, model, body, kind, copies):
    ours.embedding.weight.copy_(model.get_input_embeddings().weight)
    if ours.output is not None:
        ours.output.weight.copy_(model.lm_head.weight)
    if kind == "gpt2":
        ours.positions.weight.copy_(body.wpe.weight)
        copy_norm(ours.norm, body.ln_f)
        for block, theirs in zip(ours.blocks, body.h):
            copy_gpt2_block(block, theirs)
        return
    copy_norm(ours.norm, body.norm)
    names = NORM_NAMES[FAMILIES[kind]["norm_placement"]]
    for block, theirs, attention in zip(ours.blocks, body.layers, copies):
        block.attention.load_state_dict(attention.state_dict())
        block.feed_forward.load_state_dict(type(block.feed_forward).from_hf(theirs.mlp).state_dict())
        for ours_name, their_name in zip(OUR_NORMS, names):
            if their_name is not None:
                copy_norm(getattr(block, ours_name), getattr(theirs, their_name))


def copy_norm(mine, theirs):
    mine.weight.copy_(theirs.weight)
    if isinstance(mine, nn.LayerNorm):
        mine.bias.copy_(theirs.bias)


def copy_gpt2_block(block, theirs):
    """GPT-2's Conv1D layers store (d_in, d_out), the transpose of nn.Linear's; c_attn holds q, k, v side by side."""
    d = block.attention.d_model
    attention, mlp = block.attention, block.feed_forward
    W, b = theirs.attn.c_attn.weight, theirs.attn.c_attn.bias  # (d, 3d), (3d,)
    for i, layer in enumerate((attention.W_q, attention.W_k, attention.W_v)):
        layer.weight.copy_(W[:, i * d:(i + 1) * d].T)
        layer.bias.copy_(b[i * d:(i + 1) * d])
    for mine, conv in ((attention.W_o, theirs.attn.c_proj), (mlp.linear_1, theirs.mlp.c_fc),
                       (mlp.linear_2, theirs.mlp.c_proj)):
        mine.weight.copy_(conv.weight.T)
        mine.bias.copy_(conv.bias)
    copy_norm(block.attention_norm_in, theirs.ln_1)
    copy_norm(block.feed_forward_norm_in, theirs.ln_2)
