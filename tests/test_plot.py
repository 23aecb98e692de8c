"""The book's figures: multi-panel heatmaps share one colour scale and one colorbar; masks
are drawn at full contrast."""

import matplotlib
import numpy as np
import pytest

from mha import plot

matplotlib.use("Agg")


def colorbars(fig):
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def test_head_heatmaps_share_one_scale_and_one_colorbar():
    weights = np.random.default_rng(0).dirichlet(np.ones(4), size=(3, 4))  # (h, T, T)
    weights[1] *= 0.5  # a head with smaller weights keeps the same scale
    fig = plot.head_heatmaps(weights, list("abcd"))
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 3 and len(colorbars(fig)) == 1
    assert {image.get_clim() for image in images} == {(0, weights.max())}


def test_heatmap_panels_take_their_own_labels_and_refuse_nothing():
    fig = plot.heatmap_panels([(np.eye(2), ["a", "b"]), (np.ones((2, 3)) / 3, ["a", "b"], ["x", "y", "z"])],
                              titles=["self", "cross"], vmax=1.0)
    assert len(colorbars(fig)) == 1
    assert [ax.get_title() for ax in fig.axes[:2]] == ["self", "cross"]
    with pytest.raises(ValueError, match="at least one"):
        plot.heatmap_panels([])


def test_masks_are_white_where_blocked_and_dark_where_allowed():
    ax = plot.mask_image(np.tril(np.ones((3, 3), bool)))
    rgba = ax.images[0].to_rgba(ax.images[0].get_array())
    assert np.allclose(rgba[0, 1, :3], 1.0)  # blocked: white
    assert rgba[0, 0, :3].max() < 0.45  # allowed: dark


def test_chapter_15s_drawings_are_mha_plot_names_too():
    """They live in mha.plot_ranks; chapter 15 calls them as mha.plot.<name>."""
    from mha import plot_ranks
    for name in ("rank_bars", "rank_colours", "rank_grids", "rank_legend", "tensor_parallel_weights"):
        assert getattr(plot, name) is getattr(plot_ranks, name)
    with pytest.raises(ValueError, match="up to 10 ranks, got world_size=11"):
        plot.rank_colours(11)
