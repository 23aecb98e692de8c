"""Hugging Face's layouts, read in one room: what the course's modules copy from `transformers`.

    families       which causal LMs are copied (by config.model_type), and the TransformerLM each becomes:
                   where its norms sit and what they are called, its feed-forward, its embedding scale
    configuration  a Hugging Face config and its layers read into the course's arguments (LMConfig's,
                   GroupedQueryAttention's, GatedFeedForward's), and the refusals: anything that changes
                   the answer and that nothing here computes is a ValueError naming it
    weights        a layer's tensors copied into the course's module, built once with those arguments
    experts        a mixture-of-experts block (DeepSeek-V3/V3.2, Qwen3-MoE, Qwen3-Next, gpt-oss) read into
                   MixtureOfExperts' arguments (experts_arguments) and its tensors copied (copy_experts)
    linear         a Gated DeltaNet layer (Qwen3.5, Qwen3-Next) read into GatedDeltaNet's arguments
                   (gated_delta_net_arguments) and its tensors copied, de-interleaved (copy_gated_delta_net)

The entry points live with the modules they build, and read through this package: a layer with
`GroupedQueryAttention.from_llama` (mha.torch.grouped), a gated MLP with `GatedFeedForward.from_hf`
(mha.torch.parts), a whole causal LM with `from_transformers` (mha.torch.lm, also `mha.torch.from_transformers`).
This package sits below them all, so it re-exports nothing: import the module you need
(`from mha.torch.hf import configuration`).
"""
