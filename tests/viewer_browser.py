"""Driving mha.viewer's head viewer in chromium, as a reader would: choose a layer, click a
head, point at a query token, and read what the keys show. Used on a bare page
(tests/test_viewer.py) and on the built chapters (tests/test_site.py)."""

import json


def ends(n):
    """The first and the last of range(n), and one in the middle: the indices worth visiting."""
    return sorted({0, n // 2, n - 1})


def shown_weights(root):
    """The weights the key tokens show now, as the strings of their data-weight attribute."""
    return root.locator(".mha-viewer-key").evaluate_all("keys => keys.map(k => k.dataset.weight)")


def point_at(root, data, layer, head, query):
    """Point at one query and check that the keys show that head's row of weights."""
    root.locator(".mha-viewer-query").nth(query).hover()
    expected = [f"{w / 1000:.3f}" for w in data["weights"][layer][head][query]]
    assert shown_weights(root) == expected, f"layer {layer}, head {head}, query {query}: keys show the wrong weights"
    row = data["weights"][layer][head][query]
    best = row.index(max(row))
    readout = root.locator(".mha-viewer-readout").inner_text()
    assert f"(position {query}) attends most to" in readout and f"(position {best})" in readout, readout


def drive_viewer(page, root):
    """Click through one viewer: its first, middle and last layers, heads and queries.

    Returns how many (layer, head, query) views were checked."""
    data = json.loads(root.locator(".mha-viewer-data").text_content())
    n_layers, n_heads, n_queries = len(data["layers"]), data["heads"], len(data["queries"])
    assert root.locator(".mha-viewer-head").count() == n_heads
    assert root.locator(".mha-viewer-query").count() == n_queries
    assert root.locator(".mha-viewer-key").count() == len(data["keys"])
    checked = 0
    for layer in ends(n_layers):
        root.locator("select.mha-viewer-layer").select_option(str(layer))
        for head in ends(n_heads):
            button = root.locator(f".mha-viewer-head[data-head='{head}']")
            button.click()
            assert button.get_attribute("aria-pressed") == "true"
            assert root.get_attribute("data-layer") == str(layer) and root.get_attribute("data-head") == str(head)
            for query in ends(n_queries):
                point_at(root, data, layer, head, query)
                checked += 1
    pin_and_release(page, root, data)
    return checked


def pin_and_release(page, root, data):
    """A tap keeps a query shown after the pointer leaves; a second tap lets it go."""
    layer, head = int(root.get_attribute("data-layer")), int(root.get_attribute("data-head"))
    query = root.locator(".mha-viewer-query").nth(0)
    query.click()
    page.mouse.move(0, 0)
    assert shown_weights(root) == [f"{w / 1000:.3f}" for w in data["weights"][layer][head][0]]
    query.click()
    page.mouse.move(0, 0)
    assert set(shown_weights(root)) == {""}, "a second tap should release the query"
