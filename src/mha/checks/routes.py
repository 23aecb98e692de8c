"""What each exercise may not call: the library functions (public names of `mha.numpy`, or the dotted name of a
function of another module of mha) that compute the exercise's result or its core, audited exercise by exercise.
Each check's `forbids` is one tuple below.

The notebook's check refuses a call of any of them (or of its `mha.torch` twin) from the learner's code while
the learner's function runs (`mha.checks.own_work`); the grader's student edition of mha has them switched off
(tools/grading/student_edition.py), and holds no module of mha but mha.numpy's and what it imports. Never forbid
what an exercise's text permits, nor what a permitted function calls inside (the student edition switches a name
off everywhere): tests/test_grading_agreement.py grades the book's answers in the student edition.

Audited against the texts once more for #38. Functions of mha outside its two faces that import torch
(mha.distributed.ring.merge_partials, mha.text.training.mean_loss through a model that returns the given logits,
mha.experiments.writing.nats_to_bits) are routes as torch itself is: the notebook's kernel has torch, the grader's
worker has neither torch nor those modules, so none is forbidden here. A pure-Python one that computes an answer
(mha.text.bits_per_character) is forbidden by its dotted name.
"""

# Building blocks ------------------------------------------------------------------------------------------

# A softmax of values the caller chooses: the log-softmax gives it, the losses give one of its logarithms per
# call, and merge_partials merges one-hot "outputs" with lse = the values, one merge per value (the online
# softmax). Chapter 17's: sink_softmax with a sink far below the values is their softmax; route_tokens (and
# route_tokens_in_groups with one group) with top_k = every expert returns the softmax, sorted, with the order;
# mixture_of_experts with experts that answer constants (zero matrices, biases) adds up those weights.
SOFTMAX_FAMILY = ("softmax", "masked_softmax", "masked_softmax_", "log_softmax", "cross_entropy", "causal_lm_loss",
                  "merge_partials", "sink_softmax", "route_tokens", "route_tokens_in_groups", "mixture_of_experts")

# Attention with queries, keys and values (or projections) the caller chooses: the weights, or the output with
# identity values, are a softmax of any scores; attention_partial also returns the log-sum-exp.
ATTENTION = ("self_attention", "symmetric_attention", "scaled_dot_product_attention", "head_attention",
             "multihead_attention_loop", "multihead_attention", "chunked_attention", "attend_with_cache",
             "grouped_query_attention", "tensor_parallel_attention", "ulysses_attention", "attention_partial",
             "ring_attention", "absorbed_latent_decode", "expanded_latent_decode")

BLOCK_ROUTES = ("encoder_block", "encoder", "decoder_block", "decoder")  # they return multihead_attention's weights
MODELS = ("decoder_only_transformer", "transformer_lm")  # blocks, norms and feed-forwards, weights on request

# The causal pattern: built by the masks, and read off the weights (> 0) of every attention with `causal=True`.
CAUSAL_ROUTES = ("causal_mask", "causal_mask_after", "sliding_window_mask", "encoder_block", "encoder",
                 "decoder_block", "decoder", "attend_with_cache", "grouped_query_attention", "ulysses_attention",
                 "ring_attention") + MODELS

ATTENTION_ROUTES = ATTENTION + BLOCK_ROUTES + MODELS
SOFTMAX_ROUTES = SOFTMAX_FAMILY + ATTENTION_ROUTES

# Special cases of scaled dot-product attention only (Q = K, or values X): they do not do sdpa's or a head's work.
ONLY_SELF_ATTENTION = ("self_attention", "symmetric_attention")


def routes_but(routes, *allowed):
    """`routes` without the names in `allowed` (the exercise's own name, what its text permits), in order."""
    return tuple(name for name in routes if name not in allowed)


def joined(*groups):
    """The names of `groups`, each once, in order of first appearance."""
    return tuple(dict.fromkeys(name for group in groups for name in group))


# Chapter 1 ------------------------------------------------------------------------------------------------

SOFTMAX_FORBIDS = routes_but(SOFTMAX_ROUTES, "softmax")  # NumPy only
SELF_ATTENTION_FORBIDS = routes_but(ATTENTION_ROUTES, "self_attention")  # permits softmax, masked_softmax

# Chapter 2 ------------------------------------------------------------------------------------------------

SYMMETRIC_ATTENTION_FORBIDS = routes_but(ATTENTION_ROUTES, "symmetric_attention")  # permits softmax

# Chapter 3 (both permit masked_softmax) ------------------------------------------------------------------

SDPA_FORBIDS = routes_but(ATTENTION_ROUTES, "scaled_dot_product_attention", *ONLY_SELF_ATTENTION)
HEAD_ATTENTION_FORBIDS = routes_but(ATTENTION_ROUTES, "head_attention", *ONLY_SELF_ATTENTION)

# Chapter 4 ------------------------------------------------------------------------------------------------

# The library functions that do the loop's work, all heads and W_o. Not scaled_dot_product_attention, chunked,
# Ulysses, ring or partial attention: they attend one head (or a stack of heads) as the permitted mnp.head_attention
# does, and head_attention calls scaled_dot_product_attention inside.
LOOP_ROUTES = joined(("multihead_attention", "attend_with_cache", "grouped_query_attention",
                      "tensor_parallel_attention"), BLOCK_ROUTES, MODELS)

# Chapter 5 ------------------------------------------------------------------------------------------------

# shard_by_heads(X, h, h) is the list of the h column blocks that split_heads stacks.
SPLIT_HEADS_FORBIDS = ("heads_from_fused", "shard_by_heads")
# The loop concatenates its heads' outputs: with X = I, W_v of head i = H_i and a diagonal mask, it merges H.
MERGE_HEADS_FORBIDS = ("multihead_attention_loop",)
CAUSAL_MASK_FORBIDS = routes_but(CAUSAL_ROUTES, "causal_mask")  # NumPy, comparing positions
PADDING_MASK_FORBIDS = ()  # no other function of mha turns lengths into a mask (the masks it takes are given)
# Every step of multi-head attention (the text allows nothing of mha): the softmax, the heads' split and merge, the
# projections, the attention of one or all heads, and the layers built on them.
MULTIHEAD_ROUTES = routes_but(joined(SOFTMAX_ROUTES, ("split_heads", "merge_heads", "heads_from_fused", "project",
                                                      "shard_by_heads")), "multihead_attention")

# Chapter 6 ------------------------------------------------------------------------------------------------

# The library functions built on LayerNorm, the feed-forward network and the encoder block: each computes them
# with the right parameters (a block with zero attention weights, a model with no layer), so the exercises forbid
# them. LayerNorm is also RMSNorm of the centred vectors (rms_norm, rms_norm_per_head with one head, and
# grouped_query_attention's q_norm).
LAYERS = BLOCK_ROUTES + MODELS
LAYER_NORM_FORBIDS = joined(LAYERS, ("rms_norm", "rms_norm_per_head", "grouped_query_attention"))
FEED_FORWARD_FORBIDS = joined(("relu", "gelu", "gelu_tanh"), LAYERS)
ENCODER_BLOCK_FORBIDS = routes_but(LAYERS, "encoder_block")  # permits multihead_attention, layer_norm, feed_forward

# Chapter 7 ------------------------------------------------------------------------------------------------

ATTENTION_AT_OFFSET_FORBIDS = ()  # no other function of mha reads the weights at an offset

# Chapter 8 ------------------------------------------------------------------------------------------------

CHUNKED_ATTENTION_FORBIDS = routes_but(SOFTMAX_ROUTES, "chunked_attention")  # NumPy, nothing from mha

# Chapter 9 ------------------------------------------------------------------------------------------------

# A stack of one block is the block; the causal pattern is the part the text asks to build (permits
# multihead_attention, layer_norm and feed_forward, which use none of these).
DECODER_BLOCK_FORBIDS = routes_but(CAUSAL_ROUTES, "decoder_block")

# Chapter 10 -----------------------------------------------------------------------------------------------

# The library functions that hand back the angles t * theta_i or their sines and cosines: sinusoidal_frequencies
# and rotary_frequencies give theta_i, rotary_embedding(T, d, base, offset) and rotary_at the angles' sines and
# cosines (pairs side by side), sinusoidal_shift(t, d) moves PE[0] = (0, 1, 0, 1, ...) to PE[t], and
# attend_with_cache and grouped_query_attention (its cache) return keys turned by those angles.
SINUSOID_ROUTES = ("sinusoidal_frequencies", "sinusoidal_shift", "rotary_embedding", "rotary_frequencies",
                   "rotary_at", "attend_with_cache", "grouped_query_attention")
ALIBI_BIAS_FORBIDS = ()  # no other function of mha computes the bias (alibi_slopes gives the slopes it takes)

# Chapter 11 -----------------------------------------------------------------------------------------------

CAUSAL_LM_LOSS_FORBIDS = routes_but(SOFTMAX_ROUTES, "causal_lm_loss")  # the log-softmax is the exercise's work
GENERATE_GREEDY_FORBIDS = ("generate",)  # generate(..., top_k=1) is greedy; a wrapped logits_fn crops the window

# Chapter 12 -----------------------------------------------------------------------------------------------

# The library functions that repeat key/value heads on the way (an empty cache and no RoPE hand back the keys,
# the weights of chosen queries pick them): they do repeat_kv's work, and apply_rotary's too with RoPE.
GROUPED_ROUTES = ("attend_with_cache", "grouped_query_attention")
APPLY_ROTARY_FORBIDS = ("rotate_half",) + GROUPED_ROUTES  # the text says "without rotate_half"
# The library's other routes to the step: grouped_query_attention (and transformer_lm) run it, and the causal
# pattern with its offset (causal_mask_after; the rows T_past.. of any causal mask) is the exercise. It permits
# repeat_kv, rotary_embedding, apply_rotary and scaled_dot_product_attention (which use none of these).
CACHE_ROUTES = routes_but(CAUSAL_ROUTES, "attend_with_cache")
KV_CACHE_BYTES_FORBIDS = ()  # no other function of mha counts the bytes of a cache

# Chapter 13 -----------------------------------------------------------------------------------------------

# mnp.layer_norm computes RMSNorm too: the vector next to its own negative has mean 0 and variance mean(x^2), and so
# does the final LayerNorm of decoder_only_transformer; grouped_query_attention applies RMSNorm to the queries and
# keys (q_norm, k_norm); transformer_lm with no layer, an RMS final norm and an identity output layer is RMSNorm;
# rms_norm_per_head with one head is RMSNorm (the library's call to rms_norm inside would go through).
NORM_ROUTES = ("layer_norm", "rms_norm_per_head", "grouped_query_attention", "transformer_lm",
               "decoder_only_transformer")
# gated_feed_forward(..., activation="silu") is swiglu itself, and mnp.silu is the gate's activation that the
# exercise asks for; transformer_lm's blocks add one to the residual stream. Chapter 17's expert_feed_forward is
# SwiGLU, and mixture_of_experts with one expert (top_k = 1, normalised: weight 1) is that expert.
GATED_ROUTES = ("gated_feed_forward", "silu", "transformer_lm", "expert_feed_forward", "mixture_of_experts")
# The attention functions cap their scores (logit_cap), and their weights give the capped scores back: with
# keys 1 and 0, the log-ratio of the two weights is soft_cap(x); transformer_lm caps its logits (final_logit_cap).
CAP_ROUTES = ("scaled_dot_product_attention", "grouped_query_attention", "transformer_lm")
# causal_mask_after(T, 0, window=window) is the whole answer, and every causal pattern is its causal part; the
# weights of grouped_query_attention(..., causal=True, sliding_window=window) are above 0 exactly on the mask.
WINDOW_ROUTES = routes_but(CAUSAL_ROUTES, "sliding_window_mask")
# QK-norm per head: mnp.rms_norm of the split heads is the answer (the split is permitted: mnp.split_heads), and
# the NORM_ROUTES compute RMSNorm too (grouped_query_attention's q_norm of width d_head is this very norm).
QK_NORM_FORBIDS = ("rms_norm",) + routes_but(NORM_ROUTES, "rms_norm_per_head")
# Dynamic NTK: rotary_frequencies(d_head, base, {"rope_type": "dynamic", ...}, seq_len=...) is the answer, the
# SINUSOID_ROUTES give RoPE's frequencies (or their angles) for any base, the rest of the exercise once the base is
# known, and transformer_lm turns its queries and keys by a scaled RoPE (rope_scaling).
NTK_FORBIDS = joined(SINUSOID_ROUTES, ("transformer_lm",))

# Chapter 14 -----------------------------------------------------------------------------------------------

# filter_logits(logits, temperature=t, top_k=k, top_p=p) gives each of the three answers with the other two
# options left off; the sampler mnp.generate returns tokens, not logits, and is no route.
FILTER_ROUTES = ("filter_logits",)
# mha.numpy has no route to bits per character; mha.text.bits_per_character(mean_loss * n_tokens, n_characters) is
# the answer. The notebook's check refuses it by its dotted name; the student edition that grades holds mha.numpy
# alone (tools/grading/student_edition.py, COPIED), so there its import fails.
BITS_FORBIDS = ("mha.text.bits_per_character",)
# No other function of mha.numpy merges a BPE pair, computes a learning rate or clips gradients:
# mha.text.training.learning_rate calls warmup_cosine itself (and is refused with it); torch's clip_grad_norm_ and
# the tokenizers library are absent from the worker that grades (the checks permit no package).
TRAINING_FORBIDS = ()

# Chapter 15 -----------------------------------------------------------------------------------------------

# heads_from_fused hands back each head's column block of W_Q, W_K, W_V, and split_heads(W, h) stacks them: the
# exercise's split by heads.
SHARD_ROUTES = ("heads_from_fused", "split_heads")
# attention_partial does the whole merge (one query, two keys with scores lse_a and lse_b, values out_a and
# out_b), and so does any attention, or a softmax of the two lse: the text permits nothing from mha.
MERGE_PARTIALS_FORBIDS = routes_but(SOFTMAX_ROUTES, "merge_partials")
# mha.numpy.wire_bytes turns a payload ({pass: {"all_reduce": n}}) into the same bytes: the exercise's answer.
BYTES_ROUTES = ("wire_bytes",)
# mnp.all_to_all is the exchange's core (who sends what to whom, transposed), and ulysses_attention makes the exchange
# inside (the text permits slicing, np.split and np.concatenate).
ULYSSES_EXCHANGE_FORBIDS = ("all_to_all", "ulysses_attention")
# The ring loop: ring_attention is the loop itself, and any attention or softmax of the whole sequence gives the
# answer in one call. The text permits attention_partial and merge_partials: the loop and the merge are the point.
RING_LOOP_FORBIDS = routes_but(SOFTMAX_ROUTES, "attention_partial", "merge_partials")
# tensor_parallel_attention returns every rank's partial output: the answer (the text permits shard_by_heads and
# multihead_attention, which call none of it).
RANK_PARTIAL_FORBIDS = ("tensor_parallel_attention",)

# Chapter 16 -----------------------------------------------------------------------------------------------

# No other function of mha turns Q4_1 blocks into weights: mnp.dequantize_q4_1 is the exercise (refused with its
# mha.torch twin), and mha.experiments.smollm2 reaches it only through mha.numpy's, refused from outside the library.
# The gguf package's own dequantization (gguf.quants) is outside mha: the exercise's rule (mha.checks.rules) refuses
# it in the learner's code, and the grader's worker goes without gguf (tools/grading/sandbox.py, ALWAYS_HIDDEN).
DEQUANTIZE_Q4_1_FORBIDS = ()

# Chapter 17 -----------------------------------------------------------------------------------------------

# The expanded decode gives the absorbed one's answer (equal to float64 rounding), and any attention or softmax of
# mha does the step's scores and weighted sum: the text permits nothing from mha (the folding of W_uk into the query
# and of W_uv into the output is the exercise; forming the keys is refused by the memory case).
ABSORBED_FORBIDS = routes_but(SOFTMAX_ROUTES, "absorbed_latent_decode")
# The sink softmax is a softmax: the text permits nothing from mha (routes_but: its own name is always refused).
SINK_SOFTMAX_FORBIDS = routes_but(SOFTMAX_ROUTES, "sink_softmax")
# top_k_filter (filter_logits) keeps each row's k largest (and its ties); route_tokens (route_tokens_in_groups with
# one group, mixture_of_experts through it) picks each row's top_k best, ties to the lower index: the exercise's
# choice, once masked scores are -inf. The text names them.
TOP_K_KEYS_FORBIDS = ("top_k_filter", "filter_logits", "route_tokens", "route_tokens_in_groups", "mixture_of_experts")
# route_tokens_in_groups with n_groups = top_groups = 1 is route_tokens, and mixture_of_experts routes through it (both
# in SOFTMAX_ROUTES); select_top_k_keys chooses each row's top_k, ties to the lower index, the exercise's core; any
# softmax of mha gives the scores: the text permits nothing from mha.
ROUTER_FORBIDS = joined(routes_but(SOFTMAX_ROUTES, "route_tokens"), ("select_top_k_keys",))

# Chapter 18 -----------------------------------------------------------------------------------------------

# Every function of linear attention and of the delta rule computes the step, the update or the chunk: the recurrent
# and chunked forms from an initial state (one token, or C), the parallel form (q k^T masked, times v: a step's new
# part), gated_delta_update with v + k S and beta = 1 (the linear write k^T v), gated_delta_step (the update and the
# read). The texts permit nothing from mha. Not mnp.gated_delta_net (nor transformer_lm through it): the layer wraps the
# rule in a convolution, L2 norms of q and k and a gated RMSNorm of each output, which no parameters undo. transformers'
# and fla's functions are refused by the rules (mha.checks.rules) and absent from the grader's worker.
LINEAR_ROUTES = ("linear_attention_step", "linear_attention_recurrent", "linear_attention_parallel",
                 "linear_attention_chunked", "gated_delta_update", "gated_delta_step", "gated_delta_rule_recurrent",
                 "gated_delta_chunk", "gated_delta_rule_chunked")
LINEAR_STEP_FORBIDS = routes_but(LINEAR_ROUTES, "linear_attention_step")
GATED_DELTA_UPDATE_FORBIDS = routes_but(LINEAR_ROUTES, "gated_delta_update")
GATED_DELTA_CHUNK_FORBIDS = routes_but(LINEAR_ROUTES, "gated_delta_chunk")
