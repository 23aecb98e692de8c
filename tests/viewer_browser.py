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


def status(root):
    """The status line that a screen reader announces."""
    return root.locator("[role=status]").text_content()


def press(page, root, data, key, expect_query, expect_head, clamped=""):
    """Press an arrow key; the viewer then shows (expect_query, expect_head), and says so."""
    scrolled = page.evaluate("() => window.scrollY")
    page.keyboard.press(key)
    layer = int(root.get_attribute("data-layer"))
    where = f"after {key}: layer {layer}"
    shown = root.get_attribute("data-query"), root.get_attribute("data-head")
    assert shown == (str(expect_query), str(expect_head)), f"{where}: (query, head) shown {shown}"
    assert page.evaluate("() => window.scrollY") == scrolled, f"{where}: the arrow scrolled the page"
    row = data["weights"][layer][expect_head][expect_query]
    assert shown_weights(root) == [f"{w / 1000:.3f}" for w in row], f"{where}: keys show the wrong weights"
    token = data["queries"][expect_query]
    said = (f"head {expect_head} (heads 0 to {data['heads'] - 1}), query {expect_query} "
            f"(queries 0 to {len(data['queries']) - 1}): \u201c{token}\u201d (position {expect_query}) attends most to "
            f"\u201c{data['keys'][row.index(max(row))]}\u201d")
    assert status(root).startswith(clamped) and said in status(root), f"{where}: the status says {status(root)!r}"
    assert root.locator(f".mha-viewer-head[data-head='{expect_head}']").get_attribute("aria-pressed") == "true"


def drive_keyboard(page, root):
    """Focus the viewer from the keyboard and drive it with the arrows: <- -> move the query and
    up/down the head, both stopping at the ends; a focused query button passes the focus on; the
    mouse still works after. Starts from a viewer with no query shown.

    Returns how many key presses were checked."""
    data = json.loads(root.locator(".mha-viewer-data").text_content())
    last_query, last_head = len(data["queries"]) - 1, data["heads"] - 1
    focus_from_keyboard(page, root)
    head = int(root.get_attribute("data-head"))
    assert root.get_attribute("data-query") == "", "drive the keys from a viewer with no query chosen"
    presses = [("ArrowLeft", last_query, head, "")] + arrow_tour(last_query, last_head, head)
    for key, query, head_now, clamped in presses:
        press(page, root, data, key, query, head_now, clamped)
    query = 1 if last_query else 0
    if last_query > 1:  # a focused query button hands the focus to the query the arrow chose
        root.locator(".mha-viewer-query").nth(1).focus()
        press(page, root, data, "ArrowRight", 2, last_head)
        assert page.evaluate("(b) => document.activeElement === b",
                             root.locator(".mha-viewer-query").nth(2).element_handle()), "the focus follows the query"
        presses.append("the focus follows")
        query = 2
    mouse_after_keys(page, root, query)
    press(page, root, data, "ArrowRight", 0, last_head)  # from no query: -> starts at the first
    return len(presses) + 1


def focus_from_keyboard(page, root):
    """Shift+Tab from the viewer's first control: the viewer, just before it, takes a visible focus."""
    root.locator("select.mha-viewer-layer").focus()
    page.keyboard.press("Shift+Tab")
    assert page.evaluate("""(root) => document.activeElement === root && root.matches(':focus-visible')
        && getComputedStyle(root).outlineStyle === 'solid' && parseFloat(getComputedStyle(root).outlineWidth) >= 2""",
                         root.element_handle()), "the viewer takes the focus from the keyboard, with a visible outline"


def arrow_tour(last_query, last_head, head):
    """From the last query of `head`: (key, query then shown, head then shown, how the status begins),
    each way to its end and once more (it stays there, and says so)."""
    presses = [("ArrowRight", last_query, head, "Already the last query. ")]
    presses += [("ArrowLeft", q, head, "") for q in range(last_query - 1, -1, -1)]
    presses += [("ArrowLeft", 0, head, "Already the first query. ")]
    presses += [("ArrowUp", 0, h, "") for h in range(head - 1, -1, -1)]
    presses += [("ArrowUp", 0, 0, "Already the first head. ")]
    presses += [("ArrowDown", 0, h, "") for h in range(1, last_head + 1)]
    presses += [("ArrowDown", 0, last_head, "Already the last head. ")]
    return presses + ([("ArrowRight", 1, last_head, "")] if last_query else [])


def mouse_after_keys(page, root, query):
    """The keys kept `query`: pointing elsewhere shows that token until the pointer leaves, and a tap
    on `query` lets it go, as a tap always did. Leaves the viewer focused, with no query shown."""
    root.locator(".mha-viewer-query").nth(0).hover()
    assert root.get_attribute("data-query") == "0", "the mouse still points at a query"
    page.mouse.move(0, 0)
    assert root.get_attribute("data-query") == str(query), "the query chosen by the keys stays after the pointer leaves"
    root.locator(".mha-viewer-query").nth(query).click()
    page.mouse.move(0, 0)
    assert root.get_attribute("data-query") == "", "a tap on the kept query lets it go"
    root.focus()
