"""Chapter 16's map of a real model's heads: one score per layer and head, as a grid.

`layer_head_maps` draws one panel per named score, layers down and heads across (both counted from 0,
as `mha.experiments.real_heads` names them), the mean over the draws as the colour, and outlines the
heads named in `marked` (say the strongest induction heads).
"""

import matplotlib.pyplot as plt
import numpy as np


def layer_head_maps(scores, *, marked=None, size=3.0, vmax=1.0):
    """One panel per score: scores = {name: array (n_layers, h)}, e.g. the mean over draws.

    marked: {name: [(layer, head), ...]}, heads outlined in red in that panel. Returns the figure.
    """
    if not scores:
        raise ValueError("scores is empty: give {name: array (n_layers, h)}")
    grids = {name: np.asarray(grid, dtype=float) for name, grid in scores.items()}
    for name, grid in grids.items():
        if grid.ndim != 2:
            raise ValueError(f"scores[{name!r}] must have shape (n_layers, h), got {grid.shape}")
    n_layers, h = next(iter(grids.values())).shape
    fig, axes = plt.subplots(1, len(grids), figsize=(size * len(grids) + 0.8, 0.16 * n_layers + 1.2),
                             squeeze=False, layout="constrained")
    for ax, (name, grid) in zip(axes.flat, grids.items()):
        image = ax.imshow(grid, cmap="Blues", vmin=0, vmax=vmax, aspect="auto")
        ax.set_xticks(range(grid.shape[1]))
        ax.set_yticks(range(0, grid.shape[0], 2))
        ax.tick_params(labelsize=7)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        for layer, head in (marked or {}).get(name, []):
            ax.add_patch(plt.Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.5))
        ax.set_title(f"{name} (largest {grid.max():.2f})", fontsize=10)
    fig.colorbar(image, ax=axes, shrink=0.7, label="mean score over the draws")
    return fig
