"""Figures for the book: attention weights and masks as labelled heatmaps.

Each function draws on a Matplotlib axis (a new figure when none is given) and
returns what it drew on, so a chapter needs one line per figure.
"""

import matplotlib.pyplot as plt
import numpy as np


def as_numpy(a):
    """NumPy array from a NumPy array or a (possibly grad-tracking) torch tensor."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def attention_heatmap(weights, queries, keys=None, *, ax=None, title=None, annotate=None,
                      cmap="Blues", vmax=None):
    """Draw a (T_q, T_k) weight matrix; rows are queries, columns keys.

    queries, keys: token labels (keys defaults to queries). `annotate` writes
    each weight in its cell; by default only when the matrix is small.
    """
    weights = as_numpy(weights)
    keys = queries if keys is None else keys
    if weights.ndim != 2 or weights.shape != (len(queries), len(keys)):
        raise ValueError(
            f"weights must have shape (len(queries), len(keys)) = ({len(queries)}, {len(keys)}), "
            f"got {weights.shape}"
        )
    if ax is None:
        _, ax = plt.subplots(figsize=(0.45 * len(keys) + 2, 0.45 * len(queries) + 1.2))
    image = ax.imshow(weights, cmap=cmap, vmin=0, vmax=vmax if vmax is not None else max(weights.max(), 1e-9))
    ax.set_xticks(range(len(keys)), labels=keys, rotation=60, ha="right")
    ax.set_yticks(range(len(queries)), labels=queries)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    if annotate is None:
        annotate = weights.size <= 64
    if annotate:
        for (i, j), w in np.ndenumerate(weights):
            color = "white" if w > 0.6 * image.get_clim()[1] else "black"
            ax.text(j, i, f"{w:.2f}", ha="center", va="center", fontsize=7, color=color)
    return ax


def head_heatmaps(weights, queries, keys=None, *, titles=None, ncols=None, size=3.2, vmax=None):
    """One heatmap per head for weights of shape (h, T_q, T_k); returns the figure.

    `vmax` sets one colour scale for every panel (default: each panel its own).
    """
    weights = as_numpy(weights)
    if weights.ndim != 3:
        raise ValueError(f"weights must have shape (h, T_q, T_k), got {weights.shape}")
    h = weights.shape[0]
    ncols = min(h, 4) if ncols is None else ncols
    nrows = -(-h // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols + 0.5, size * nrows + 0.5),
                             squeeze=False, layout="constrained")
    for i, ax in enumerate(axes.flat):
        if i >= h:
            ax.axis("off")
            continue
        title = titles[i] if titles else f"head {i}"
        attention_heatmap(weights[i], queries, keys, ax=ax, title=title, annotate=False, vmax=vmax)
        if i % ncols:
            ax.set_ylabel("")
    return fig


def mask_image(mask, queries=None, keys=None, *, ax=None, title=None):
    """Draw a boolean (T_q, T_k) mask: dark = may attend, light = blocked."""
    mask = as_numpy(mask).astype(bool)
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2-D (T_q, T_k), got shape {mask.shape}")
    T_q, T_k = mask.shape
    queries = list(range(T_q)) if queries is None else queries
    keys = list(range(T_k)) if keys is None else keys
    if ax is None:
        _, ax = plt.subplots(figsize=(0.4 * T_k + 1.5, 0.4 * T_q + 1))
    ax.imshow(mask, cmap="Greys", vmin=-0.3, vmax=1.2)
    ax.set_xticks(range(T_k), labels=keys, rotation=60, ha="right")
    ax.set_yticks(range(T_q), labels=queries)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    for (i, j), m in np.ndenumerate(mask):
        ax.text(j, i, "T" if m else "F", ha="center", va="center", fontsize=7,
                color="white" if m else "black")
    if title:
        ax.set_title(title)
    return ax


def trend_plot(x, curves, *, xlabel, ylabel, ax=None, title=None, logx=False, logy=False,
               marker="o"):
    """Several named curves over the same x values: curves = {label: ys}."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.5))
    for label, ys in curves.items():
        ax.plot(x, as_numpy(ys), marker=marker, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    if curves:
        ax.legend()
    return ax


def loss_curves(curves, *, ax=None, title="Training loss", logy=False):
    """Training losses per step for several models: curves = {label: losses}."""
    steps = range(1, 1 + max(len(v) for v in curves.values()))
    ax = trend_plot(steps, {}, xlabel="training step", ylabel="loss", ax=ax, title=title,
                    logy=logy, marker="")
    for label, losses in curves.items():
        ax.plot(steps[: len(losses)], as_numpy(losses), label=label)
    ax.legend()
    return ax


def head_score_grids(scores, *, ncols=3, size=3.6, vmax=1.0):
    """One panel per named score of the heads of a model: scores = {name: array (S, h)}.

    Rows are the S blocks (numbered from 1), columns the h heads (numbered
    from 0); the best head of each panel is outlined in red. Returns the figure.
    """
    names = list(scores)
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, 0.62 * size * nrows + 0.4),
                             squeeze=False, layout="constrained")
    for ax, name in zip(axes.flat, names):
        grid = as_numpy(scores[name])
        if grid.ndim != 2:
            raise ValueError(f"scores[{name!r}] must have shape (S, h), got {grid.shape}")
        image = ax.imshow(grid, cmap="Blues", vmin=0, vmax=vmax)
        S, h = grid.shape
        ax.set_xticks(range(h))
        ax.set_yticks(range(S), labels=range(1, S + 1))
        ax.tick_params(labelsize=7)
        ax.set_xlabel("head")
        ax.set_ylabel("block")
        block, head = np.unravel_index(np.argmax(grid), grid.shape)
        ax.add_patch(plt.Rectangle((head - 0.5, block - 0.5), 1, 1, fill=False, edgecolor="red", lw=2))
        ax.set_title(f"{name} (best {grid.max():.2f})", fontsize=10)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.colorbar(image, ax=axes, shrink=0.6, label="score")
    return fig
