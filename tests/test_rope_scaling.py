"""RoPE scaling (linear, dynamic NTK, YaRN, Llama 3's), proven equal to transformers' own.

The frequencies are compared with transformers' ROPE_INIT_FUNCTIONS, the tables with
LlamaRotaryEmbedding's forward (YaRN's attention factor included, dynamic NTK beyond the
trained length included), bit for bit in float32; the NumPy face with the PyTorch face in
float64; and each scaling with the property that defines it.
"""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import mha.numpy as mnp
import mha.torch as mt
from mha.numpy.rotary import rotary_frequencies as numpy_frequencies
from mha.torch.rotary import rotary_frequencies

MAX_POSITIONS = 512  # the model's max_position_embeddings
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256},
    "yarn with mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                         "beta_fast": 16, "beta_slow": 2, "mscale": 0.8, "mscale_all_dim": 0.5},
    "yarn untruncated": {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 200,
                         "truncate": False, "attention_factor": 1.3},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256},
}


def ours(scaling):
    """The course's dict: transformers' keys, and the model's length for dynamic NTK."""
    mine = {key: value for key, value in scaling.items()}
    if scaling["rope_type"] == "dynamic":
        mine["max_position_embeddings"] = MAX_POSITIONS
    return mine


def llama_config(scaling, d_head, base):
    return LlamaConfig(hidden_size=4 * d_head, num_attention_heads=4, max_position_embeddings=MAX_POSITIONS,
                       rope_parameters={**scaling, "rope_theta": base})


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", SCALINGS)
@pytest.mark.parametrize("d_head,base", [(64, 10000.0), (128, 500000.0), (32, 1e6)])
@pytest.mark.parametrize("seq_len", [None, 300, 2048])
def test_float32_frequencies_equal_transformers_bit_for_bit(name, d_head, base, seq_len):
    config = llama_config(SCALINGS[name], d_head, base)
    theirs, their_factor = ROPE_INIT_FUNCTIONS[SCALINGS[name]["rope_type"]](config, None, seq_len=seq_len)
    mine, my_factor = rotary_frequencies(d_head, base, ours(SCALINGS[name]), seq_len=seq_len, dtype=torch.float32)
    assert mine.dtype == torch.float32 and torch.equal(mine, theirs)
    assert my_factor == pytest.approx(their_factor, rel=1e-15)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", SCALINGS)
def test_tables_equal_llamas_rotary_embedding_beyond_the_trained_length(name):
    """cos and sin of every position of a sequence longer than max_position_embeddings."""
    d_head, T = 64, 3 * MAX_POSITIONS // 2
    rotary = LlamaRotaryEmbedding(llama_config(SCALINGS[name], d_head, 10000.0))
    x = torch.zeros(1, T, 4 * d_head)
    their_cos, their_sin = rotary(x, torch.arange(T)[None])  # (1, T, d_head)
    cos, sin = mt.rotary_embedding(T, d_head, 10000.0, scaling=ours(SCALINGS[name]), dtype=torch.float32)
    assert torch.equal(cos, their_cos[0]) and torch.equal(sin, their_sin[0])
    if name.startswith("yarn"):  # the attention factor scales both tables
        assert cos.abs().max() > 1.01


@pytest.mark.parametrize("name", SCALINGS)
@pytest.mark.parametrize("offset,T", [(0, 40), (700, 9)])
def test_numpy_tables_equal_the_torch_tables_in_float64(name, offset, T):
    expected = mt.rotary_embedding(T, 32, 10000.0, offset, scaling=ours(SCALINGS[name]), dtype=torch.float64)
    got = mnp.rotary_embedding(T, 32, 10000.0, offset, scaling=ours(SCALINGS[name]))
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-12, atol=1e-12)
    frequencies, factor = numpy_frequencies(32, 10000.0, ours(SCALINGS[name]), seq_len=offset + T)
    np.testing.assert_allclose(frequencies, rotary_frequencies(32, 10000.0, ours(SCALINGS[name]), seq_len=offset + T,
                                                               dtype=torch.float64)[0].numpy(), rtol=1e-15)
    assert frequencies.shape == (16,) and factor > 0


# What each scaling means ------------------------------------------------------------------

def plain(d_head=32, **options):
    return numpy_frequencies(d_head, 10000.0, None, **options)[0]


def test_linear_scaling_is_positions_divided_by_the_factor():
    cos_scaled, sin_scaled = mnp.rotary_embedding(64, 32, scaling={"rope_type": "linear", "factor": 4.0})
    cos_plain, sin_plain = mnp.rotary_embedding(16, 32)
    np.testing.assert_allclose(cos_scaled[::4], cos_plain, atol=1e-12)  # position 4p scaled = p plain
    np.testing.assert_allclose(sin_scaled[::4], sin_plain, atol=1e-12)
    assert np.abs(cos_scaled[1] - cos_plain[1]).max() > 0.01


def test_dynamic_ntk_changes_nothing_up_to_the_trained_length_then_raises_the_base():
    dynamic = ours(SCALINGS["dynamic"])
    at_max = numpy_frequencies(32, 10000.0, dynamic, seq_len=MAX_POSITIONS)[0]
    np.testing.assert_array_equal(at_max, plain())
    beyond = numpy_frequencies(32, 10000.0, dynamic, seq_len=MAX_POSITIONS + 1)[0]
    assert beyond[0] == plain()[0] and np.all(beyond[1:] < plain()[1:])  # a larger base: slower turns


def test_llama3_keeps_short_wavelengths_and_divides_long_ones_by_the_factor():
    scaling = SCALINGS["llama3"]
    base_freq, scaled = plain(128), numpy_frequencies(128, 10000.0, scaling)[0]
    wavelength = 2 * np.pi / base_freq
    short = wavelength < scaling["original_max_position_embeddings"] / scaling["high_freq_factor"]
    long = wavelength > scaling["original_max_position_embeddings"] / scaling["low_freq_factor"]
    assert short.sum() > 5 and long.sum() > 5 and (~short & ~long).sum() > 0
    np.testing.assert_array_equal(scaled[short], base_freq[short])
    np.testing.assert_allclose(scaled[long], base_freq[long] / 8.0, rtol=1e-15)
    between = ~short & ~long
    assert np.all((scaled[between] < base_freq[between]) & (scaled[between] > base_freq[between] / 8.0))


def test_yarn_keeps_fast_frequencies_divides_slow_ones_and_scales_the_tables():
    scaling = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096}  # ramp from dim 10 to 23
    scaled, factor = numpy_frequencies(64, 10000.0, scaling)
    np.testing.assert_allclose(scaled[:11], plain(64)[:11], rtol=1e-15)
    np.testing.assert_allclose(scaled[23:], plain(64)[23:] / 8.0, rtol=1e-15)
    assert np.all((scaled[11:23] < plain(64)[11:23]) & (scaled[11:23] > plain(64)[11:23] / 8.0))
    assert factor == pytest.approx(0.1 * np.log(8.0) + 1)


# Refused, never ignored ------------------------------------------------------------------------

@pytest.mark.parametrize("scaling,message", [
    ({"rope_type": "longrope", "factor": 2.0}, "rope_type must be one of"),
    ({"rope_type": "linear"}, r"missing: \['factor'\]"),
    ({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}, r"not computed here: \['low_freq_factor'\]"),
    ({"rope_type": "dynamic", "factor": 2.0}, r"missing: \['max_position_embeddings'\]"),
    ({"rope_type": "yarn", "factor": 0.0, "original_max_position_embeddings": 64}, "factor must be > 0"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 2.0,
      "original_max_position_embeddings": 64}, "must differ"),
])
@pytest.mark.parametrize("face", ["numpy", "torch"])
def test_a_scaling_that_is_not_computed_is_refused(scaling, message, face):
    with pytest.raises(ValueError, match=message):
        if face == "numpy":
            mnp.rotary_embedding(8, 16, scaling=scaling)
        else:
            mt.rotary_embedding(8, 16, scaling=scaling)


def test_a_scaling_that_is_not_a_dict_is_a_type_error():
    with pytest.raises(TypeError, match="scaling must be None or a dict with a 'rope_type'"):
        mt.rotary_embedding(8, 16, scaling="linear")
