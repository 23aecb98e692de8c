"""Hugging Face's tensors copied into the course's modules, each module already built, once, with the sizes
and features that `configuration` read.

Where transformers keeps them: an attention layer's q_proj, k_proj, v_proj and o_proj (nn.Linear, with
Qwen's biases on q, k and v only) and its q_norm, k_norm; a gated MLP's gate_proj, up_proj and down_proj
(bias-free nn.Linear); the norms of each decoder layer (`families.NORM_NAMES`); and GPT-2's Conv1D layers,
which store (d_in, d_out), the transpose of nn.Linear's, with c_attn holding q, k and v side by side.
The copies run without autograd and cast to the module's dtype and device.
"""

import torch
from torch import nn

from mha.torch.hf import families

ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
GATED_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def attention_projections(attention):
    """q_proj, k_proj, v_proj, o_proj of a Hugging Face attention layer; a TypeError if one is not an nn.Linear."""
    layers = [getattr(attention, name, None) for name in ATTENTION_PROJECTIONS]
    if not all(isinstance(layer, nn.Linear) for layer in layers):
        raise TypeError(f"expected a transformers LlamaAttention with q_proj, k_proj, v_proj and o_proj, "
                        f"got {type(attention).__name__}")
    return layers


def gated_projections(mlp):
    """gate_proj, up_proj, down_proj of a Hugging Face gated MLP; a ValueError if one is not a bias-free nn.Linear."""
    for name in GATED_PROJECTIONS:
        layer = getattr(mlp, name, None)
        if not isinstance(layer, nn.Linear) or layer.bias is not None:
            raise ValueError(f"{type(mlp).__name__} has no bias-free nn.Linear {name}: "
                             f"only gated MLPs like LlamaMLP and GemmaMLP can be copied")
    return [getattr(mlp, name) for name in GATED_PROJECTIONS]


@torch.no_grad()
def copy_linear(mine, theirs):
    """An nn.Linear into an nn.Linear of the same shape; a bias they lack is zero (Qwen's o_proj)."""
    mine.weight.copy_(theirs.weight)
    if theirs.bias is not None:
        mine.bias.copy_(theirs.bias)
    elif mine.bias is not None:  # Qwen-style: biases on q, k, v only, none on o
        mine.bias.zero_()


@torch.no_grad()
def copy_attention(ours, attention):
    """A Hugging Face attention layer's projections (and q_norm, k_norm) into a GroupedQueryAttention."""
    for mine, theirs in zip((ours.W_q, ours.W_k, ours.W_v, ours.W_o), attention_projections(attention)):
        copy_linear(mine, theirs)
    if ours.qk_norm is not None:
        ours.q_norm.weight.copy_(attention.q_norm.weight)
        ours.k_norm.weight.copy_(attention.k_norm.weight)
    if ours.sinks is not None:
        ours.sinks.copy_(attention.sinks)  # gpt-oss: (h,), one logit per head


@torch.no_grad()
def copy_gated_feed_forward(ours, mlp):
    """A Hugging Face gated MLP's three matrices into a GatedFeedForward (W_gate, W_up, W_down)."""
    for mine, theirs in zip((ours.W_gate, ours.W_up, ours.W_down), gated_projections(mlp)):
        mine.weight.copy_(theirs.weight)


@torch.no_grad()
def copy_norm(mine, theirs):
    """A LayerNorm (weight and bias) or an RMSNorm (weight, as stored: Gemma's around 0)."""
    mine.weight.copy_(theirs.weight)
    if isinstance(mine, nn.LayerNorm):
        mine.bias.copy_(theirs.bias)


@torch.no_grad()
def copy_gpt2_block(block, theirs):
    """A GPT2Block into an LMBlock: c_attn split into W_q, W_k, W_v, each Conv1D transposed."""
    d = block.attention.d_model
    attention, mlp = block.attention, block.feed_forward
    W, b = theirs.attn.c_attn.weight, theirs.attn.c_attn.bias  # (d, 3d), (3d,)
    for i, layer in enumerate((attention.W_q, attention.W_k, attention.W_v)):
        layer.weight.copy_(W[:, i * d:(i + 1) * d].T)  # (d, d) as nn.Linear stores it: (d_out, d_in)
        layer.bias.copy_(b[i * d:(i + 1) * d])
    for mine, conv in ((attention.W_o, theirs.attn.c_proj), (mlp.linear_1, theirs.mlp.c_fc),
                       (mlp.linear_2, theirs.mlp.c_proj)):
        mine.weight.copy_(conv.weight.T)
        mine.bias.copy_(conv.bias)
    copy_norm(block.attention_norm_in, theirs.ln_1)
    copy_norm(block.feed_forward_norm_in, theirs.ln_2)


@torch.no_grad()
def copy_decoder_layer(block, theirs, kind):
    """A Llama-like decoder layer (self_attn, mlp, its family's norms) into an LMBlock: DeepSeek's latent
    attention through `mha.torch.hf.latent`, a hybrid's linear_attn (Gated DeltaNet) through `mha.torch.hf.linear`,
    a mixture of experts through `mha.torch.hf.experts`."""
    if families.is_linear(theirs):  # a hybrid's Gated DeltaNet (chapter 18)
        from mha.torch.hf import linear
        linear.copy_gated_delta_net(block.attention, theirs.linear_attn)
    elif families.attention_type(kind) == "latent":
        from mha.torch.hf import latent  # imported here: it reads configuration, which reads this module
        latent.copy_latent_attention(block.attention, theirs.self_attn)
    else:
        copy_attention(block.attention, theirs.self_attn)
    if families.is_dense(theirs.mlp):
        copy_gated_feed_forward(block.feed_forward, theirs.mlp)
    else:
        from mha.torch.hf import experts
        experts.copy_experts(block.feed_forward, theirs.mlp)
    for ours_name, their_name in families.norm_names(kind):
        copy_norm(getattr(block, ours_name), getattr(theirs, their_name))


@torch.no_grad()
def copy_model(ours, model, kind):
    """A Hugging Face causal LM of model_type `kind` into a TransformerLM built from its configuration:
    embeddings, output layer (where untied), GPT-2's positions, every block, the final norm."""
    ours.embedding.weight.copy_(model.get_input_embeddings().weight)
    if ours.output is not None:
        ours.output.weight.copy_(model.lm_head.weight)
    if kind == "gpt2":
        body = model.transformer
        ours.positions.weight.copy_(body.wpe.weight)
        copy_norm(ours.norm, body.ln_f)
        for block, theirs in zip(ours.blocks, body.h):
            copy_gpt2_block(block, theirs)
        return
    body = model.model
    copy_norm(ours.norm, body.norm)
    for block, theirs in zip(ours.blocks, body.layers):
        copy_decoder_layer(block, theirs, kind)
