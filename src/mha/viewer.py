"""An interactive view of attention heads: choose a layer and a head, point at a token, see its attention.

    from mha.viewer import head_viewer
    head_viewer(tokens, weights)    # weights: (n_layers, n_heads, T, T), rows are queries

The viewer is one self-contained piece of HTML: the weights as JSON, a style sheet
and a small script (head_viewer.js and head_viewer.css, next to this file), with
nothing loaded from the network. A notebook shows it as the cell's output, and the
static site of the book embeds that output, so it works with no kernel and offline.

Weights are stored in thousandths (0 to 1000), so the same weights always give the
same HTML, and a notebook's stored output can be compared as text.
"""

import collections
import hashlib
import html
import json
from importlib import resources

import numpy as np

SCALE = 1000  # weights are written as whole thousandths
_made = collections.Counter()  # viewers made so far with the same contents: ids stay unique on a page


class HeadViewer:
    """The HTML of one viewer. Jupyter displays it through `_repr_html_`; `html` is the text."""

    def __init__(self, html_text, summary):
        self.html, self.summary = html_text, summary

    def _repr_html_(self):
        return self.html

    def __repr__(self):
        return self.summary


def head_viewer(tokens, weights, *, key_tokens=None, layer_names=None, title=None):
    """An interactive viewer of attention weights.

    tokens: the T_q query tokens (strings). weights: (n_layers, n_heads, T_q, T_k), or
    (n_heads, T_q, T_k) for one layer; rows are queries and each sums to 1 (or 0 for a
    query with nothing to attend to). key_tokens: the T_k keys when they differ from the
    queries (cross-attention). layer_names: one name per layer (default "layer 0", ...).
    Returns a HeadViewer, which a notebook displays as the viewer.
    """
    tokens = check_tokens(tokens, "tokens")
    keys = tokens if key_tokens is None else check_tokens(key_tokens, "key_tokens")
    weights = check_weights(weights, len(tokens), len(keys))
    n_layers, n_heads = weights.shape[:2]
    if layer_names is None:
        layer_names = [f"layer {i}" for i in range(n_layers)]
    layer_names = check_tokens(layer_names, "layer_names")
    if len(layer_names) != n_layers:
        raise ValueError(f"layer_names has {len(layer_names)} names but weights have {n_layers} layers")
    data = {"queries": tokens, "keys": keys, "layers": layer_names, "heads": n_heads,
            "weights": np.rint(weights * SCALE).astype(int).tolist()}
    summary = (f"HeadViewer: {n_layers} layer{'s' * (n_layers != 1)} x {n_heads} head{'s' * (n_heads != 1)}, "
               f"{len(tokens)} queries x {len(keys)} keys (interactive in a browser)")
    return HeadViewer(viewer_html(data, title), summary)


def check_tokens(tokens, name):
    """A list of strings, or a clear TypeError."""
    if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens):
        raise TypeError(f"{name} must be a list of strings, got {tokens!r:.80}")
    return list(tokens)


def check_weights(weights, T_q, T_k):
    """Attention weights as float64 (n_layers, n_heads, T_q, T_k), rows of probabilities."""
    if hasattr(weights, "detach"):  # a torch tensor, on any device
        weights = weights.detach().cpu().numpy()
    weights = np.asarray(weights)
    if weights.dtype.kind not in "fiu":
        raise TypeError(f"weights must be real numbers, got dtype {weights.dtype}")
    weights = weights.astype(np.float64)
    if weights.ndim == 3:
        weights = weights[None]  # (1, n_heads, T_q, T_k): one layer
    expected = f"(n_layers, n_heads, {T_q}, {T_k}) or (n_heads, {T_q}, {T_k})"
    if weights.ndim != 4 or weights.shape[2:] != (T_q, T_k) or 0 in weights.shape[:2]:
        raise ValueError(f"weights must have shape {expected} for {T_q} queries and {T_k} keys, "
                         f"got {weights.shape}")
    if not np.isfinite(weights).all() or weights.min() < -1e-6 or weights.max() > 1 + 1e-6:
        raise ValueError("weights must be finite and between 0 and 1: pass softmax weights, not scores")
    if (weights.sum(-1) > 1 + 1e-4).any():
        raise ValueError("each query's weights must sum to at most 1: is the last axis the keys?")
    return weights.clip(0, 1)


def viewer_html(data, title):
    """The viewer's HTML: a root element, the data as JSON, the style and the script."""
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")  # no "</script>" inside
    digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
    _made[digest] += 1
    root_id = f"mha-viewer-{digest}-{_made[digest]}"
    heading = f'<p class="mha-viewer-title">{html.escape(title)}</p>' if title else ""
    style = resources.files("mha").joinpath("head_viewer.css").read_text()
    script = resources.files("mha").joinpath("head_viewer.js").read_text()
    return (f'<div class="mha-viewer" id="{root_id}" data-mha-viewer="1">{heading}'
            f'<noscript>The attention viewer needs JavaScript.</noscript>'
            f'<script type="application/json" class="mha-viewer-data">{payload}</script></div>\n'
            f"<style>{style}</style>\n"
            f'<script>{script}\nmhaHeadViewer(document.getElementById("{root_id}"));</script>')
