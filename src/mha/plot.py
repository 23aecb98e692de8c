"""Figures for the book: attention weights and masks as labelled heatmaps.

Each function draws on a Matplotlib axis (a new figure when none is given) and
returns what it drew on, so a chapter needs one line per figure. Chapter 15's
drawings of which rank holds what live in mha.plot_ranks, and are importable
from here as well.
"""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from mha.plot_ranks import (  # noqa: F401 (chapter 15 draws who holds what as mha.plot.<name>)
    rank_bars, rank_colours, rank_grids, rank_legend, tensor_parallel_weights,
)


def as_numpy(a):
    """NumPy array from a NumPy array or a (possibly grad-tracking) torch tensor."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def attention_heatmap(weights, queries, keys=None, *, ax=None, title=None, annotate=None,
                      cmap="Blues", vmax=None, colorbar=False):
    """Draw a (T_q, T_k) weight matrix; rows are queries, columns keys.

    queries, keys: token labels (keys defaults to queries). `annotate` writes
    each weight in its cell; by default only when the matrix is small.
    `colorbar=True` adds the scale beside it (panels share one: `heatmap_panels`).
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
    if colorbar:
        ax.figure.colorbar(image, ax=ax, shrink=0.8, label="attention weight")
    return ax


def head_heatmaps(weights, queries, keys=None, *, titles=None, ncols=None, size=3.2, vmax=None):
    """One heatmap per head for weights of shape (h, T_q, T_k), on one colour scale with one
    shared colorbar; returns the figure. `vmax` tops the scale (default: the largest weight)."""
    weights = as_numpy(weights)
    if weights.ndim != 3:
        raise ValueError(f"weights must have shape (h, T_q, T_k), got {weights.shape}")
    titles = titles or [f"head {i}" for i in range(weights.shape[0])]
    return heatmap_panels([(w, queries, keys) for w in weights], titles=titles, ncols=ncols, size=size,
                          vmax=vmax)


def heatmap_panels(panels, *, titles=None, ncols=None, size=3.2, vmax=None, annotate=False):
    """Several attention heatmaps side by side, on one colour scale with one shared colorbar.

    panels: a list of (weights, queries) or (weights, queries, keys), weights (T_q, T_k).
    `vmax` tops the scale (default: the largest weight of all panels). Returns the figure.
    """
    panels = [(as_numpy(p[0]), *p[1:]) for p in panels]
    if not panels:
        raise ValueError("panels must hold at least one (weights, queries) pair")
    vmax = max(max(float(p[0].max()) for p in panels), 1e-9) if vmax is None else vmax
    ncols = min(len(panels), 4) if ncols is None else ncols
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols + 1.2, size * nrows + 0.5),
                             squeeze=False, layout="constrained")
    for i, ax in enumerate(axes.flat):
        if i >= len(panels):
            ax.axis("off")
            continue
        weights, queries, *keys = panels[i]
        attention_heatmap(weights, queries, keys[0] if keys else None, ax=ax, annotate=annotate, vmax=vmax,
                          title=titles[i] if titles else None)
        if i % ncols:
            ax.set_ylabel("")
    fig.colorbar(axes.flat[0].images[0], ax=axes, shrink=0.8, label="attention weight")
    return fig


MASK_COLOURS = ListedColormap(["#ffffff", "#08306b"])  # False (blocked), True (may attend)


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
    ax.imshow(mask, cmap=MASK_COLOURS, vmin=0, vmax=1)  # blocked white, allowed dark: full contrast
    ax.set_xticks(np.arange(-0.5, T_k), minor=True)
    ax.set_yticks(np.arange(-0.5, T_q), minor=True)
    ax.grid(which="minor", color="#888888", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
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


def kv_head_groups(n_heads, n_kv_heads, *, titles=None, size=3.4):
    """Which key/value head each query head reads: one panel per entry of `n_kv_heads`.

    Query head j reads key/value head j // (n_heads / n_kv_heads), as in Llama's
    grouped-query attention; heads that share a key/value head share a colour.
    Returns the figure.
    """
    counts = [n_kv_heads] if isinstance(n_kv_heads, int) else list(n_kv_heads)
    for h_kv in counts:
        if n_heads % h_kv:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={h_kv}")
    fig, axes = plt.subplots(1, len(counts), figsize=(size * len(counts), 2.4), squeeze=False, layout="constrained")
    colours = plt.get_cmap("tab10").colors
    for panel, (ax, h_kv) in enumerate(zip(axes.flat, counts)):
        group = n_heads // h_kv
        kv_x = [(g + 0.5) * group - 0.5 for g in range(h_kv)]  # each key/value head under its group
        for j in range(n_heads):
            colour = colours[(j // group) % len(colours)]
            ax.plot([j, kv_x[j // group]], [1, 0], color=colour, lw=1.5, zorder=1)
            ax.scatter([j], [1], s=260, marker="s", color=colour, zorder=2)
            ax.text(j, 1, str(j), ha="center", va="center", color="white", fontsize=8, zorder=3)
        for g, x in enumerate(kv_x):
            ax.scatter([x], [0], s=420, marker="o", color=colours[g % len(colours)], edgecolor="black", zorder=2)
            ax.text(x, 0, str(g), ha="center", va="center", color="white", fontsize=8, zorder=3)
        ax.set_xlim(-0.8, n_heads - 0.2)
        ax.set_ylim(-0.45, 1.45)
        ax.set_yticks([0, 1], labels=["key/value\nheads", "query\nheads"] if panel == 0 else ["", ""])
        ax.set_xticks([])
        ax.tick_params(left=False)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        ax.set_title(titles[panel] if titles else f"h = {n_heads}, h_kv = {h_kv}", fontsize=10)
    return fig


def cache_steps(T, *, size=3.6):
    """The key and value rows each generation step computes, without and with a key-value cache.

    Row t is the step that has t + 1 tokens; column s is position s. Without a cache
    every step computes the rows of all its positions again; with one it computes only
    the newest row and reads the others from the cache. Returns the figure.
    """
    steps = np.arange(T)[:, None]  # (T, 1): the newest position of each step
    positions = np.arange(T)[None, :]  # (1, T)
    new = positions == steps
    earlier = positions < steps
    names = ["not there yet", "computed again", "computed (new token)", "read from the cache"]
    colours = ["#ffffff", "#f4a261", "#1d3557", "#a8dadc"]
    fig, axes = plt.subplots(1, 2, figsize=(2 * size + 0.4, size + 0.6), layout="constrained")
    for ax, again, title in ((axes[0], 1, "without a cache"), (axes[1], 3, "with a cache")):
        codes = np.where(new, 2, np.where(earlier, again, 0))  # (T, T)
        computed = int((codes == 1).sum() + (codes == 2).sum())
        ax.imshow(codes, cmap=ListedColormap(colours), vmin=-0.5, vmax=3.5)
        ax.set_xticks(range(T))
        ax.set_yticks(range(T), labels=[f"{t + 1} tokens" for t in range(T)])
        ax.set_xticks(np.arange(T + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(T + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="#bbbbbb", lw=0.5)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel("position of the key and value row")
        ax.set_title(f"{title}: {computed} rows computed")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="#888888") for c in colours[1:]]
    fig.legend(handles, names[1:], loc="outside lower center", ncols=3, frameon=False)
    return fig


def bar_chart(values, *, ylabel, ax=None, title=None, fmt="{:.3g}", logy=False):
    """Named bars, each labelled with its value: values = {label: number}."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.5))
    labels, heights = list(values), [float(v) for v in values.values()]
    bars = ax.bar(labels, heights, color=plt.get_cmap("tab10").colors[: len(labels)])
    ax.bar_label(bars, labels=[fmt.format(v) for v in heights], padding=2)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.margins(y=0.15)
    if title:
        ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return ax


def score_grid(scores, *, ax=None, title=None, xlabel="key position n", ylabel="query position m"):
    """A (T_q, T_k) matrix of scores on a diverging colour scale centred at 0 (blue < 0 < red)."""
    scores = as_numpy(scores)
    if scores.ndim != 2:
        raise ValueError(f"scores must be 2-D (T_q, T_k), got shape {scores.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 3.6))
    limit = max(float(np.abs(scores).max()), 1e-9)
    ax.imshow(scores, cmap="RdBu_r", vmin=-limit, vmax=limit)
    step = max(1, max(scores.shape) // 8)  # about 8 ticks on each axis, at whole positions
    ax.set_xticks(range(0, scores.shape[1], step))
    ax.set_yticks(range(0, scores.shape[0], step))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def comm_compute_ratio(rows, *, size=3.8, link_styles=None):
    """Communication time / compute time per layer against the number of devices P.

    rows: records with fields model, scheme, link, P and ratio (attributes or dict keys),
    e.g. `mha.experiments.parallel_costs.cost_table()`. One panel per model, one colour per
    scheme, one line style per link (solid for the first, dashed for the second, ...), both
    axes logarithmic, and a horizontal line at 1, where communication costs as much as the
    compute. Returns the figure.
    """
    def field(row, name):
        return row[name] if isinstance(row, dict) else getattr(row, name)

    rows = list(rows)
    if not rows:
        raise ValueError("rows must hold at least one record (model, scheme, link, P, ratio)")
    models, schemes, links = ({field(r, k): None for r in rows} for k in ("model", "scheme", "link"))
    styles = dict(zip(links, ["-", "--", ":", "-."])) | (link_styles or {})
    colours = dict(zip(schemes, plt.get_cmap("tab10").colors))
    fig, axes = plt.subplots(1, len(models), figsize=(size * len(models) + 0.6, size * 0.85 + 0.9),
                             sharey=True, squeeze=False, layout="constrained")
    for ax, model in zip(axes.flat, models):
        every_P = set()
        for link in links:
            for scheme in schemes:
                points = sorted((field(r, "P"), field(r, "ratio")) for r in rows
                                if (field(r, "model"), field(r, "scheme"), field(r, "link")) == (model, scheme, link))
                if points:
                    P, ratio = zip(*points)
                    every_P.update(P)
                    ax.plot(P, ratio, marker="o", ms=3.5, color=colours[scheme], ls=styles[link],
                            label=f"{scheme}, {link}")
        ax.axhline(1.0, color="black", lw=1, ls=(0, (1, 2)))
        ax.text(min(every_P), 1.08, "communication = compute", fontsize=8, va="bottom", zorder=1.5,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted(every_P), labels=[str(p) for p in sorted(every_P)])
        ax.minorticks_off()
        ax.set_xlabel("number of GPUs P (log scale)")
        ax.set_title(model, fontsize=10)
        ax.grid(alpha=0.3)
    axes.flat[0].set_ylabel("communication time / compute time\n(one layer, forward; log scale)")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(links), frameon=False, fontsize=9)
    fig.suptitle("Communication time over compute time in one layer, against the number of GPUs P",
                 fontsize=11)
    return fig
