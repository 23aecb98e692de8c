"""Chapter 14's drawing of one next-token distribution at several temperatures, with top-p's cut.

`sampling_panels` draws one panel per temperature: the probability of the most likely tokens (the same
tokens, in the same order, in every panel), the tokens that top-p keeps in one colour and those it cuts in
another, and the mass of all the other tokens as a last bar. It computes with mha.numpy's own
`filter_logits` and `softmax`, so the figure shows what the sampler does.
"""

import matplotlib.pyplot as plt
import numpy as np

import mha.numpy as mnp

KEPT, CUT = "tab:blue", "tab:gray"


def sampling_panels(logits, labels, *, temperatures=(0.5, 1.0, 2.0), top_p=0.9, shown=8, size=3.2):
    """One panel per temperature: softmax(logits / tau) of the `shown` most likely tokens and the rest.

    logits: (V,) one position's logits; labels: V strings, one per token. A bar is coloured when top-p
    (at that temperature, as mnp.filter_logits applies it) keeps its token. Returns the axes.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 1 or len(labels) != len(logits):
        raise ValueError(f"logits must be (V,) with V labels, got {logits.shape} and {len(labels)} labels")
    order = np.argsort(-logits)[:shown]  # the most likely tokens, the same at every temperature
    names = [repr(labels[j])[1:-1] or "''" for j in order] + ["the rest"]
    fig, axes = plt.subplots(1, len(temperatures), figsize=(size * len(temperatures), size * 0.85),
                             sharey=True, layout="constrained")
    for ax, tau in zip(np.atleast_1d(axes), temperatures):
        probs = mnp.softmax(mnp.filter_logits(logits, temperature=tau))  # (V,)
        kept = np.isfinite(mnp.filter_logits(logits, temperature=tau, top_p=top_p))  # (V,)
        heights = np.append(probs[order], 1 - probs[order].sum())
        colours = [KEPT if kept[j] else CUT for j in order] + [KEPT if kept.sum() > shown else CUT]
        ax.bar(range(len(heights)), heights, color=colours)
        ax.set_xticks(range(len(heights)), names, rotation=60, fontsize=8)
        ax.set_title(f"temperature {tau:g}: top-p {top_p:g} keeps {kept.sum()}", fontsize=9)
        ax.set_ylim(0, 1)
        ax.grid(axis="y", alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("probability")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (KEPT, CUT)]
    np.atleast_1d(axes)[-1].legend(handles, [f"kept by top-p {top_p:g}", "cut"], fontsize=8)
    return axes
