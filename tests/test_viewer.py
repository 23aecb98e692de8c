"""mha.viewer: the head viewer's HTML holds exactly the weights it was given, is the same text on
every run, refuses what is not attention weights, and works in chromium with no network."""

import json
import re

import numpy as np
import pytest
import torch

from site_browser import chromium_browser
from viewer_browser import drive_keyboard, drive_viewer

import mha.torch as mt
from mha.viewer import HeadViewer, head_viewer

TOKENS = ["the", "cat", "sat", "on", "the", "mat", "</script>"]


def random_weights(shape, seed=0):
    """Rows of softmax weights, (..., T_q, T_k)."""
    scores = np.random.default_rng(seed).standard_normal(shape) * 3
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True)


def embedded_data(viewer):
    """The JSON that a viewer's HTML carries."""
    found = re.search(r'<script type="application/json" class="mha-viewer-data">(.*?)</script>', viewer.html, re.S)
    return json.loads(found[1])


def test_the_html_carries_every_weight_in_thousandths():
    weights = random_weights((2, 3, 7, 7))
    data = embedded_data(head_viewer(TOKENS, weights, layer_names=["first", "second"]))
    assert data["queries"] == data["keys"] == TOKENS and data["layers"] == ["first", "second"] and data["heads"] == 3
    np.testing.assert_array_equal(np.array(data["weights"]), np.rint(weights * 1000).astype(int))


def test_one_layer_and_cross_attention_and_a_tensor_are_accepted():
    weights = random_weights((4, 3, 5))
    viewer = head_viewer(["a", "b", "c"], torch.tensor(weights), key_tokens=list("vwxyz"))
    data = embedded_data(viewer)
    assert np.array(data["weights"]).shape == (1, 4, 3, 5) and data["layers"] == ["layer 0"]
    assert repr(viewer) == "HeadViewer: 1 layer x 4 heads, 3 queries x 5 keys (interactive in a browser)"


def test_a_module_s_weights_can_be_viewed():
    torch.manual_seed(0)
    layer = mt.MultiHeadAttention(8, 2)
    x = torch.randn(5, 8)
    _, weights = layer(x, return_weights=True)  # (2, 5, 5)
    data = embedded_data(head_viewer(list("abcde"), weights))
    np.testing.assert_array_equal(np.array(data["weights"])[0], np.rint(weights.detach().numpy() * 1000))


def test_the_same_weights_give_the_same_text_and_distinct_ids():
    weights = random_weights((1, 2, 7, 7))
    first, second = head_viewer(TOKENS, weights), head_viewer(TOKENS, weights)
    ids = [re.search(r'id="(mha-viewer-[0-9a-f]+-\d+)"', v.html)[1] for v in (first, second)]
    assert ids[0] != ids[1], "two viewers on one page need two ids"
    assert first.html.replace(ids[0], "ID") == second.html.replace(ids[1], "ID")


def test_nothing_is_loaded_from_the_network_and_no_token_escapes_its_script():
    html = head_viewer(TOKENS, random_weights((1, 1, 7, 7)), title="a <b>title</b>").html
    assert not re.search(r"https?://|src=|href=|@import", html), "the viewer must be self-contained"
    assert html.count("</script>") == 2 and "\\u003c/script>" in html  # the token "</script>" stays data
    assert "a &lt;b&gt;title&lt;/b&gt;" in html and isinstance(head_viewer(["x"], [[[[1.0]]]]), HeadViewer)


@pytest.mark.parametrize("args,kwargs,error,message", [
    (("the cat", np.ones((1, 1, 7, 7)) / 7), {}, TypeError, "tokens must be a list of strings"),
    ((TOKENS, np.ones((7, 7)) / 7), {}, ValueError, r"shape \(n_layers, n_heads, 7, 7\) .* got \(7, 7\)"),
    ((TOKENS, np.ones((1, 2, 7, 6)) / 6), {}, ValueError, "7 queries and 7 keys, got (1, 2, 7, 6)"),
    ((TOKENS, np.full((1, 1, 7, 7), 3.0)), {}, ValueError, "between 0 and 1: pass softmax weights, not scores"),
    ((TOKENS, np.full((1, 1, 7, 7), np.nan)), {}, ValueError, "must be finite"),
    ((TOKENS, np.full((1, 1, 7, 7), 0.5)), {}, ValueError, "sum to at most 1"),
    ((TOKENS, np.ones((2, 1, 7, 7)) / 7), {"layer_names": ["one"]}, ValueError, "1 names but weights have 2 layers"),
    ((TOKENS, np.array([[[["a"] * 7] * 7]])), {}, TypeError, "must be real numbers"),
])
def test_bad_input_is_refused_clearly(args, kwargs, error, message):
    with pytest.raises(error, match=message if "\\" in message or "*" in message else re.escape(message)):
        head_viewer(*args, **kwargs)


def test_a_fully_masked_query_is_shown_as_zeros():
    weights = random_weights((1, 1, 3, 3))
    weights[0, 0, 0] = 0.0  # a query with nothing to attend to
    assert embedded_data(head_viewer(["a", "b", "c"], weights))["weights"][0][0][0] == [0, 0, 0]


@pytest.fixture(scope="module")
def browser():
    yield from chromium_browser(needs_mathjax=False)


def test_the_viewer_works_in_a_browser_with_the_network_blocked(browser):
    weights = random_weights((3, 4, 7, 7), seed=1)
    tall = '<div style="height: 2000px">a long page: an arrow key not caught by the viewer scrolls it</div>'
    page_html = "<!doctype html><html><body><p>Two viewers:</p>" + tall + "".join(
        head_viewer(TOKENS, weights[:n], title=f"viewer {n}").html + tall for n in (3, 1)) + "</body></html>"
    context = browser.new_context(viewport={"width": 1000, "height": 800})
    requests, errors = [], []
    context.route("**/*", lambda route: (requests.append(route.request.url), route.abort()))
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.set_content(page_html, wait_until="load")
        roots = page.locator("[data-mha-viewer]")
        assert roots.count() == 2
        checked = [drive_viewer(page, roots.nth(i)) for i in range(2)]
        pressed = [drive_keyboard(page, roots.nth(i)) for i in range(2)]
    finally:
        context.close()
    assert checked == [3 * 3 * 3, 1 * 3 * 3], checked  # (layers) x (heads) x (queries) visited
    assert pressed == [7 + 3 + 3 + 4 + 3] * 2, pressed  # queries last to first, heads down and up, 4 ends, 3 more
    assert not errors and not requests, (errors, requests)
