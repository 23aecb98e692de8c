"""mha.plot_sampling: chapter 14's drawing of one distribution at three temperatures, with top-p's cut."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import mha.numpy as mnp  # noqa: E402
from mha.plot_sampling import CUT, KEPT, sampling_panels  # noqa: E402


def test_each_panel_draws_the_tempered_probabilities_and_colours_what_top_p_keeps():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.04, 0.01]))
    axes = sampling_panels(logits, list("abcde"), temperatures=(0.5, 1.0, 2.0), top_p=0.9, shown=3)
    for ax, tau in zip(axes, (0.5, 1.0, 2.0)):
        bars = ax.patches
        probs = mnp.softmax(logits / tau)
        kept = np.isfinite(mnp.filter_logits(logits, temperature=tau, top_p=0.9))
        assert [b.get_height() for b in bars] == pytest.approx(list(probs[:3]) + [probs[3:].sum()])
        colours = [matplotlib.colors.to_hex(b.get_facecolor()) for b in bars[:3]]
        assert colours == [matplotlib.colors.to_hex(KEPT if k else CUT) for k in kept[:3]]
        assert f"keeps {kept.sum()}" in ax.get_title()
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["a", "b", "c", "the rest"]
    plt.close("all")


def test_logits_and_labels_must_match():
    with pytest.raises(ValueError, match="V labels"):
        sampling_panels(np.zeros(4), ["a", "b"])
