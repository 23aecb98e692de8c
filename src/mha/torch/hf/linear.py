"""transformers' Gated DeltaNet layers read into `mha.torch.GatedDeltaNet` (chapter 18): Qwen3_5GatedDeltaNet
(Qwen3.5) and Qwen3NextGatedDeltaNet (Qwen3-Next).

Where transformers keeps them: Qwen3.5 projects with in_proj_qkv ([q heads | k heads | v heads], our W_qkv's
layout), in_proj_z, in_proj_b and in_proj_a; Qwen3-Next with two projections whose rows are grouped by key
head: in_proj_qkvz holds, for each key head, its query, its key, then the values and the gates z of the
value heads it serves; in_proj_ba, for each key head, those value heads' b then a. They are de-interleaved
here into our layout. Both: conv1d (depthwise, its weight (C, 1, K)), A_log, dt_bias, norm (an RMSNormGated
of head_v_dim) and out_proj.
"""

import torch

GATED_DELTA_CLASSES = {"Qwen3_5GatedDeltaNet": "separate", "Qwen3NextGatedDeltaNet": "interleaved"}
PROJECTIONS = {"separate": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
               "interleaved": ("in_proj_qkvz", "in_proj_ba")}


def check_gated_delta_net(layer):
    """`layer` itself, if transformers' Qwen3_5GatedDeltaNet or Qwen3NextGatedDeltaNet; else a TypeError."""
    kind = type(layer).__name__
    if kind not in GATED_DELTA_CLASSES:
        raise TypeError(f"expected a transformers Qwen3_5GatedDeltaNet or Qwen3NextGatedDeltaNet, got {kind}")
    return layer


def refused_features(layer):
    """What the layer does that GatedDeltaNet does not compute, in words (empty when there is none)."""
    found = []
    if layer.conv1d.bias is not None:
        found.append("a bias in the causal convolution")
    if layer.activation not in ("silu", "swish"):
        found.append(f"the activation {layer.activation!r} after the convolution (GatedDeltaNet applies silu)")
    if getattr(layer.norm, "activation", "silu") not in ("silu", "swish"):
        found.append(f"the gated norm's activation {layer.norm.activation!r} (GatedDeltaNet's gate is silu)")
    if layer.num_v_heads % layer.num_k_heads:
        found.append(f"{layer.num_v_heads} value heads over {layer.num_k_heads} key heads (not a multiple)")
    names = PROJECTIONS[GATED_DELTA_CLASSES[type(layer).__name__]] + ("out_proj",)
    found += [f"a bias in {name}" for name in names if getattr(layer, name).bias is not None]
    return found


def gated_delta_net_arguments(layer):
    """Every keyword argument of `GatedDeltaNet` but d_model (layer.hidden_size) and chunk_size, read from a
    Qwen3_5GatedDeltaNet or Qwen3NextGatedDeltaNet. A ValueError naming what nothing here computes."""
    check_gated_delta_net(layer)
    found = refused_features(layer)
    if found:
        raise ValueError(f"cannot compute {'; '.join(found)} of {type(layer).__name__} (layer {layer.layer_idx}): "
                         f"the copy would be silently wrong")
    return dict(n_key_heads=layer.num_k_heads, n_value_heads=layer.num_v_heads, key_head_dim=layer.head_k_dim,
                value_head_dim=layer.head_v_dim, conv_kernel=layer.conv_kernel_size,
                norm_eps=float(layer.norm.variance_epsilon))


def projection_weights(layer):
    """(W_qkv, W_z, W_b, W_a) weights in nn.Linear's (d_out, d_in) layout and our channel order."""
    if GATED_DELTA_CLASSES[type(layer).__name__] == "separate":
        return tuple(getattr(layer, name).weight for name in PROJECTIONS["separate"])
    d_k, d_v, share = layer.head_k_dim, layer.head_v_dim, layer.num_v_heads // layer.num_k_heads
    qkvz = layer.in_proj_qkvz.weight.view(layer.num_k_heads, -1, layer.hidden_size)  # (H_k, 2 d_k + 2 r d_v, d)
    q, k, v, z = qkvz.split([d_k, d_k, share * d_v, share * d_v], dim=1)  # each (H_k, width, d)
    ba = layer.in_proj_ba.weight.view(layer.num_k_heads, 2 * share, layer.hidden_size)  # (H_k, 2 r, d)
    b, a = ba.split([share, share], dim=1)  # (H_k, r, d): value head i * r + j is row j of group i
    flat = [t.reshape(-1, layer.hidden_size) for t in (q, k, v, z, b, a)]  # (heads * width, d)
    return torch.cat(flat[:3]), flat[3], flat[4], flat[5]


@torch.no_grad()
def copy_gated_delta_net(ours, layer):
    """A Qwen3_5GatedDeltaNet's or Qwen3NextGatedDeltaNet's weights into `ours`, a GatedDeltaNet built with
    `gated_delta_net_arguments(layer)` (cast to ours' dtype and device). Returns ours."""
    arguments = gated_delta_net_arguments(layer)
    mine = {name: getattr(ours, name) for name in arguments}
    if mine != arguments or ours.d_model != layer.hidden_size:
        raise ValueError(f"ours was built with {mine} and d_model={ours.d_model}, the layer has {arguments} and "
                         f"hidden_size={layer.hidden_size}: build ours with gated_delta_net_arguments(layer)")
    W_qkv, W_z, W_b, W_a = projection_weights(layer)
    pairs = [(ours.W_qkv.weight, W_qkv), (ours.W_z.weight, W_z), (ours.W_b.weight, W_b), (ours.W_a.weight, W_a),
             (ours.conv_weight, layer.conv1d.weight.squeeze(1)), (ours.A_log, layer.A_log),
             (ours.dt_bias, layer.dt_bias), (ours.norm_weight, layer.norm.weight),
             (ours.W_o.weight, layer.out_proj.weight)]
    for target, source in pairs:
        target.copy_(source)
    return ours
