"""The figure of chapter 13's norm placements (mha.plot_norms) draws what the library's LMBlock computes."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import mha.torch as mt  # noqa: E402
from mha import plot_norms  # noqa: E402


@pytest.mark.parametrize("placement", [p for p in plot_norms.PLACEMENTS if p.lm_placement],
                         ids=lambda p: p.lm_placement)
def test_todays_placements_are_drawn_as_lm_block_places_its_norms(placement):
    config = mt.LMConfig(vocab_size=4, d_model=8, n_layers=1, d_ff=8, attention={"n_heads": 2},
                         norm_placement=placement.lm_placement)
    block = mt.LMBlock(config, 0)
    assert (block.attention_norm_in is not None, block.attention_norm_out is not None) == \
        (placement.before, placement.after)
    assert not placement.on_stream  # today's models never normalise the stream inside a block


def test_the_figure_has_one_panel_per_placement_with_its_norms():
    fig = plot_norms.norm_placements()
    axes = fig.get_axes()
    assert [ax.get_title().split("\n")[0] for ax in axes] == [p.title for p in plot_norms.PLACEMENTS]
    for ax, placement in zip(axes, plot_norms.PLACEMENTS):
        words = [text.get_text() for text in ax.texts]
        assert words.count("Norm") == placement.before + placement.after + placement.on_stream
        assert words.count("Sublayer") == 1 and "+" in words
    assert [p.on_stream for p in plot_norms.PLACEMENTS] == [True, False, False, False]  # only the original
    plt.close(fig)
