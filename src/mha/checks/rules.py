"""The route each exercise of chapters 1 to 12, 16 and 18 asks for, as rules on the learner's code (mha.checks.syntax).

Each tuple below is one check's `rules`, audited against its exercise's text: a rule forbids what the text
forbids (`np.tril`, `@`, `reshape`) and requires what it asks for (a loop, `np.einsum`, `np.repeat`), never
more. The library's own function takes another route in each case (shown beside the rule), so that its code,
pasted as the answer, fails. Exercises whose text asks for no route of their own have none: the forbidden library
functions (mha.checks.routes) are all that they refuse.
"""

from mha.checks.syntax import TRIANGLES, TRANSPOSES, Rule, a_loop, einsum_products

# Chapter 1 ------------------------------------------------------------------------------------------------

# The library divides by the sum of the exponentials; the text goes through the log-sum-exp.
SOFTMAX_RULES = (Rule("go through logarithms: the softmax is exp(x - lse(x)), with the log-sum-exp "
                      "lse(x) = m + log(sum(exp(x - m))) computed with np.log", requires=("log", "logaddexp")),)
SELF_ATTENTION_RULES = (a_loop("the query positions i = 0, ..., T-1"),)  # the library: one product for all

# Chapters 2 and 3 ------------------------------------------------------------------------------------------

SYMMETRIC_ATTENTION_RULES = (einsum_products(),)  # the library: X @ W
SDPA_RULES = (a_loop("the queries, one row of weights at a time"),)  # the library: Q @ K^T for all queries
HEAD_ATTENTION_RULES = (einsum_products(),)  # the library: X @ W_q

# Chapter 4 ------------------------------------------------------------------------------------------------

# The library concatenates the heads' outputs. np.stack stays: the weights are stacked on a new axis.
LOOP_RULES = (Rule("never concatenate: add up, head after head, the product of its output with its own slice of "
                   "W_O (no np.concatenate, np.hstack, np.block or mnp.merge_heads)",
                   forbids=("concatenate", "concat", "hstack", "column_stack", "dstack", "block", "merge_heads")),)

# Chapter 5 ------------------------------------------------------------------------------------------------

HEADS_RULES = (Rule("head i is column block i: without reshape, transpose or swapaxes (nor np.moveaxis, "
                    "np.rollaxis, `.T` or an assignment to `.shape`)", forbids=TRANSPOSES),)  # the library reshapes
CAUSAL_MASK_RULES = (Rule("compare a column of query positions with a row of key positions: without np.tril, np.triu "
                          "(or another triangle function, such as np.tri) and without a loop",
                          forbids=TRIANGLES + ("loop", "comprehension")),)  # the library: np.tril
PADDING_MASK_RULES = (Rule("write a loop over the sentences: start from an array that blocks everything and switch "
                           "on the first lengths[b] keys of each sentence b", requires=("loop", "comprehension")),)  # the library compares

# Chapter 6 ------------------------------------------------------------------------------------------------

LAYER_NORM_RULES = (Rule("compute the mean and the variance from sums divided by d: without np.mean, np.var or np.std "
                         "(nor the methods .mean(), .var(), .std(), np.average or their nan- versions)",
                         forbids=("mean", "var", "std", "average", "nanmean", "nanvar", "nanstd")),)  # the library: .mean

# Chapters 7 and 8 -----------------------------------------------------------------------------------------

ATTENTION_AT_OFFSET_RULES = (Rule("write a loop over the queries (a for loop or a comprehension) instead of np.diagonal "
                                  "(nor np.diag or np.trace)", forbids=("diagonal", "diag", "trace", "diagflat",
                                  "diag_indices", "diag_indices_from"), requires=("loop", "comprehension")),)  # the library: np.diagonal
CHUNKED_ATTENTION_RULES = (einsum_products("the two products (the scores, and the values mixed by the weights)"),)

# Chapters 9 and 10 ----------------------------------------------------------------------------------------

# The library's decoder_block hands `causal` to a helper of the library, which calls causal_mask (np.tril).
DECODER_BLOCK_RULES = (Rule("build the causal pattern yourself, by comparing position indices (not with "
                            "mnp.causal_mask, nor a triangle function such as np.tril)", forbids=TRIANGLES,
                            requires=("<",)),)
SINUSOIDAL_RULES = (Rule("fill the even and the odd columns of the table by assigning to slices "
                         "(table[:, 0::2] = ...), without a loop", forbids=("loop", "comprehension"), requires=("[] =",)),)
ALIBI_BIAS_RULES = (Rule("use broadcasting, without loops", forbids=("loop", "comprehension")),)  # the library's route too

# Chapter 12 -----------------------------------------------------------------------------------------------

REPEAT_KV_RULES = (Rule("write it with np.repeat (the library broadcasts and reshapes)", requires=("repeat",)),)
APPLY_ROTARY_RULES = (Rule("write it straight from the rotation formula, without rotate_half",
                           forbids=("rotate_half",)),)  # the library: x * cos + rotate_half(x) * sin
ATTEND_WITH_CACHE_RULES = (Rule("build the causal mask yourself, by comparing positions (not with "
                                "mnp.causal_mask_after, nor a triangle function such as np.tri)",
                                forbids=("causal_mask_after",) + TRIANGLES, requires=("<",)),)

# Chapter 16 -----------------------------------------------------------------------------------------------

# The gguf package dequantizes a Q4_1 block (gguf.quants.dequantize, its class Q4_1, what GGUFReader's users call),
# and so does transformers' GGUF loader through it: the exercise reads the bytes with NumPy. (The library's own
# function uses none of these: the rule refuses a route outside mha, which `forbids` cannot name.)
DEQUANTIZE_Q4_1_RULES = (Rule("read the bytes yourself, with NumPy: not with the gguf package (gguf.quants.dequantize, "
                              "its Q4_1 class, GGUFReader), transformers or llama_cpp",
                              forbids=("gguf", "quants", "dequantize", "dequantize_blocks", "dequantize_rows", "Q4_1",
                                       "GGUFReader", "GGMLQuantizationType", "transformers", "load_dequant_gguf_tensor",
                                       "llama_cpp", "ggml")),)

# Chapter 18 -----------------------------------------------------------------------------------------------

# transformers' qwen3_next file and the fla package compute the gated delta rule (torch_recurrent_gated_delta_rule,
# torch_chunk_gated_delta_rule, fla's chunk_ and fused_recurrent_ kernels) and fla linear attention: the exercises
# write the recurrence with NumPy. (The library's functions use none of these: `forbids` cannot name a route outside
# mha.)
OUTSIDE_LINEAR = ("transformers", "qwen3_next", "modeling_qwen3_next", "qwen3_5", "torch_recurrent_gated_delta_rule",
                  "torch_chunk_gated_delta_rule", "fla", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule",
                  "chunk_linear_attn", "fused_recurrent_linear_attn")
NUMPY_ONLY_RULE = Rule("write it with NumPy: not with transformers' gated delta rule (torch_recurrent_gated_delta_rule, "
                       "torch_chunk_gated_delta_rule) nor the fla package", forbids=OUTSIDE_LINEAR)
LINEAR_STEP_RULES = (NUMPY_ONLY_RULE,)
GATED_DELTA_UPDATE_RULES = (NUMPY_ONLY_RULE,)
LOOPS_IN_DISGUISE = ("reduce", "map", "accumulate", "starmap", "vectorize", "frompyfunc", "apply_along_axis")
# The chunk is the parallel form: every token of the chunk at once, with matrix products and one triangular solve
# (np.linalg.solve or np.linalg.inv of I + A), never a loop over the tokens (the library's reference has none either:
# the rule tells the chunk from C steps of the recurrence, whose answers are the same).
GATED_DELTA_CHUNK_RULES = (NUMPY_ONLY_RULE,
                           Rule("handle the chunk's tokens all at once: matrix products and one triangular solve "
                                "(np.linalg.solve), no loop over the tokens (no for or while, no comprehension, "
                                "no reduce, map or accumulate over them)",
                                forbids=("loop", "comprehension") + LOOPS_IN_DISGUISE),)
