"""The chapters' experiments, built on the two faces (which never import them).

- `tasks`: the toy sentence and the small training tasks of chapters 1 to 4;
- `counting`: parameters and multiply-adds of attention layers and blocks (chapters 4, 5, 8);
- `stacks`: random encoder stacks, and what residual sums and the LayerNorm's place do to
  them (chapter 6);
- `heads`: why heads end up different: the two-relation task and the trainings over seeds
  (chapter 7); `summed_heads`: its model, heads that own their block of W_o, identical
  heads, knock-outs;
- `pretrained`: all-MiniLM-L6-v2 loaded into `mha.torch.Encoder`, and hand-labelled
  sentences to find its syntactic heads (chapter 7);
- `sharing`: what sharing keys and values costs, grouped-query attention trained on
  chapter 7's two-relation task (chapter 12).
- `positions`: a task where order decides (the last assignment wins), and one small model
  per way of adding positions, trained and tested at other lengths (chapter 10).
- `induction`: repeated segments of letters, a small decoder-only Transformer trained on them,
  and the scores, knock-outs and shipped weights that find its induction heads (chapter 11).
- `model_facts`: what a Hugging Face causal LM's modules say about its family, where its norms sit
  (chapter 13's table).
- `writing`: chapter 14's language models of real code, measured (bits per character,
  induction heads).
- `parallel`: chapter 15's one launch (every scheme of `mha.distributed` against one process),
  and `parallel_costs`: its cost model of compute against communication for Llama-2 7B and 70B
  on NVLink and InfiniBand, with the sources of its constants.
- `smollm2`: SmolLM2-135M-Instruct read from its GGUF file into `mha.torch.TransformerLM`, and
  transformers' load of the same file to compare with (chapter 16).
- `real_heads`: chapter 16's reading of SmolLM2-135M-Instruct: previous-token and induction scores of
  its 270 heads on repeated random tokens, knock-outs, bits per character on chapter 14's test text.
- `seeds`: claims over seeds: sweeps (an experiment run on many seeds), their tables stored in
  `seed_tables/` by tools/data/seed_sweeps.py, read by the chapters and re-derived by the tests.
  Each chapter's sweeps live beside its experiment (`tasks`: ch02_*, `stacks`: ch06_*, `heads`: ch07_*,
  `positions`: ch10_*, `induction`: ch11_*, `sharing`: ch12_*, `real_heads`: ch16_*, `remembering`: ch17_*,
  `recall`: ch18_*).
- `recall`: chapter 18's multi-query associative recall, learned by one layer of softmax attention, linear
  attention, DeltaNet or Gated DeltaNet at one state size (`recall_model`: the models).

Import them as `from mha.experiments import tasks` or
`from mha.experiments.heads import AttentionReadout`.
"""
