// The attention head viewer of mha.viewer: no library, no network. Called once per viewer,
// with the viewer's root element, which holds the weights as JSON (whole thousandths).
// Mouse: choose a layer, click a head, point at a query (a tap keeps it). Keyboard: Tab to the
// viewer, then the left and right arrows move the query and the up and down arrows the head,
// stopping at the first and the last; a status line, read by screen readers, says what is shown.
window.mhaHeadViewer = function (root) {
  "use strict";
  if (!root || root.dataset.ready) return;
  root.dataset.ready = "1";
  var data = JSON.parse(root.querySelector(".mha-viewer-data").textContent);
  var state = {layer: 0, head: 0, query: null, pinned: null};

  function element(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function shade(node, weight) {  // weight in [0, 1]: the stronger, the bluer
    node.style.backgroundColor = "rgba(37, 99, 235, " + weight.toFixed(3) + ")";
    node.style.color = weight > 0.55 ? "#fff" : "";
  }
  function point(i) { state.query = i; render(""); }
  function release() { state.query = state.pinned; render(""); }
  function pin(i) { state.pinned = state.pinned === i ? null : i; state.query = state.pinned; render(""); }

  var controls = element("div", "mha-viewer-controls");
  var label = element("label", null, "Layer ");
  var layers = element("select", "mha-viewer-layer");
  data.layers.forEach(function (name, i) { var o = element("option", null, name); o.value = i; layers.appendChild(o); });
  layers.addEventListener("change", function () { state.layer = Number(layers.value); render(""); });
  label.appendChild(layers);
  var heads = element("span", "mha-viewer-heads");
  heads.setAttribute("role", "group");
  heads.setAttribute("aria-label", "Head");
  var headButtons = [];
  for (var h = 0; h < data.heads; h++) {
    var b = element("button", "mha-viewer-head", "head " + h);
    b.type = "button";
    b.dataset.head = h;
    b.addEventListener("click", function (e) { state.head = Number(e.currentTarget.dataset.head); render(""); });
    headButtons.push(b);
    heads.appendChild(b);
  }
  controls.appendChild(label);
  controls.appendChild(heads);

  function tokenRow(className, names, tag) {
    var row = element("div", className + "s");
    var nodes = names.map(function (name, i) {
      var node = element(tag, className, name);
      node.dataset.index = i;
      row.appendChild(node);
      return node;
    });
    return {row: row, nodes: nodes};
  }
  var queries = tokenRow("mha-viewer-query", data.queries, "button");
  queries.nodes.forEach(function (node, i) {
    node.type = "button";
    node.addEventListener("mouseenter", function () { point(i); });
    node.addEventListener("focus", function () { point(i); });
    node.addEventListener("mouseleave", release);
    node.addEventListener("blur", release);
    node.addEventListener("click", function () { pin(i); });
  });
  var keys = tokenRow("mha-viewer-key", data.keys, "span");
  var readout = element("p", "mha-viewer-readout");
  var status = element("p", "mha-viewer-hidden");  // what a screen reader announces (politely)
  status.setAttribute("role", "status");

  var grid = element("table", "mha-viewer-grid");
  var header = element("tr");
  header.appendChild(element("td"));  // the corner heads nothing: a <td>, as an empty <th> would mislead
  data.keys.forEach(function (key) { var th = element("th", "mha-viewer-column", key); th.scope = "col"; header.appendChild(th); });
  grid.appendChild(header);
  var rows = data.queries.map(function (name, i) {
    var tr = element("tr");
    var th = element("th", null, name);
    th.scope = "row";
    tr.appendChild(th);
    var cells = data.keys.map(function () {  // each cell's weight as text, hidden on screen, for a screen reader
      var td = element("td");
      td.appendChild(element("span", "mha-viewer-hidden"));
      tr.appendChild(td);
      return td;
    });
    tr.addEventListener("mouseenter", function () { point(i); });
    tr.addEventListener("mouseleave", release);
    grid.appendChild(tr);
    return {tr: tr, cells: cells};
  });
  var gridBox = element("div", "mha-viewer-gridbox");
  gridBox.appendChild(grid);
  // A grid wider than the page scrolls sideways: the keyboard must reach it too (WCAG 2.1.1).
  gridBox.tabIndex = 0;
  gridBox.setAttribute("aria-label", "The attention weights, scrollable sideways");

  // The keyboard. The viewer itself takes the focus; arrows inside it move the viewer, not the page.
  var hint = element("div", "mha-viewer-label",
    "Keyboard: Tab to the viewer, then \u2190 \u2192 move the query and \u2191 \u2193 the head.");
  hint.id = root.id + "-keys";
  root.tabIndex = 0;
  root.setAttribute("role", "group");
  root.setAttribute("aria-label", "Attention head viewer");
  root.setAttribute("aria-describedby", hint.id);
  root.setAttribute("aria-keyshortcuts", "ArrowLeft ArrowRight ArrowUp ArrowDown");
  var ARROWS = {ArrowLeft: ["query", -1], ArrowRight: ["query", 1], ArrowUp: ["head", -1], ArrowDown: ["head", 1]};
  root.addEventListener("keydown", function (e) {
    var arrow = ARROWS[e.key];
    if (!arrow || e.altKey || e.ctrlKey || e.metaKey || e.shiftKey || e.target.tagName === "SELECT") return;
    e.preventDefault();  // the page does not scroll
    e.stopPropagation();  // nor does Sphinx turn the page, where navigation_with_keys is on
    var moved = arrow[0] === "query" ? stepQuery(arrow[1]) : stepHead(arrow[1]);
    render(moved ? "" : "Already the " + (arrow[1] < 0 ? "first " : "last ") + arrow[0] + ". ");
    if (moved) followFocus(e.target, arrow[0]);
  });
  function clamp(i, n) { return Math.min(n - 1, Math.max(0, i)); }
  function stepQuery(step) {  // true if the query moved. With none shown, -> starts at the first, <- at the last.
    var from = state.query, n = data.queries.length;
    state.query = state.pinned = from === null ? (step > 0 ? 0 : n - 1) : clamp(from + step, n);
    return state.query !== from;  // kept like a tap: the pointer leaving does not undo a key
  }
  function stepHead(step) {
    var from = state.head;
    state.head = clamp(from + step, data.heads);
    return state.head !== from;
  }
  function followFocus(target, moved) {  // a focused query (or head) button hands the focus to the one now shown
    if (moved === "query" && target.classList.contains("mha-viewer-query")) queries.nodes[state.query].focus();
    if (moved === "head" && target.classList.contains("mha-viewer-head")) headButtons[state.head].focus();
  }

  [controls, hint, element("div", "mha-viewer-label", "Queries (point at one, or tap it to keep it):"), queries.row,
   element("div", "mha-viewer-label", "Keys, shaded by the query's attention:"), keys.row, readout, status,
   element("div", "mha-viewer-label", "The whole head: one row per query, one column per key; the darker, the more weight (0 to 1)."),
   gridBox].forEach(function (node) { root.appendChild(node); });

  function describe(W, q) {  // the status line: where the viewer stands, in words
    var where = (data.layers.length > 1 ? "Layer \u201c" + data.layers[state.layer] + "\u201d, " : "") +
      "head " + state.head + " (heads 0 to " + (data.heads - 1) + ")";
    if (q === null) return where + ", no query chosen: the left and right arrows choose one.";
    return where + ", query " + q + " (queries 0 to " + (data.queries.length - 1) + "): " + readout.textContent;
  }

  function render(announce) {  // announce: a prefix for the status line; null at the start (nothing said)
    var W = data.weights[state.layer][state.head];
    headButtons.forEach(function (b, h) { b.setAttribute("aria-pressed", String(h === state.head)); });
    root.dataset.layer = state.layer;
    root.dataset.head = state.head;
    rows.forEach(function (row, i) {
      row.cells.forEach(function (td, j) {
        shade(td, W[i][j] / 1000);
        td.title = td.firstChild.textContent = (W[i][j] / 1000).toFixed(3);
      });
      row.tr.classList.toggle("mha-viewer-active", i === state.query);
    });
    queries.nodes.forEach(function (node, i) {
      node.classList.toggle("mha-viewer-active", i === state.query);
      node.setAttribute("aria-pressed", String(i === state.pinned));
    });
    var q = state.query;
    root.dataset.query = q === null ? "" : q;
    keys.nodes.forEach(function (node, j) {
      if (q === null) { node.style.backgroundColor = ""; node.style.color = ""; node.dataset.weight = ""; node.title = ""; return; }
      shade(node, W[q][j] / 1000);
      node.dataset.weight = (W[q][j] / 1000).toFixed(3);
      node.title = node.dataset.weight;
    });
    if (q === null) {
      readout.textContent = "Point at a query token to see where it looks.";
    } else {
      var best = 0;
      W[q].forEach(function (w, j) { if (w > W[q][best]) best = j; });
      readout.textContent = "\u201c" + data.queries[q] + "\u201d (position " + q + ") attends most to \u201c" +
        data.keys[best] + "\u201d (position " + best + "): " + (W[q][best] / 1000).toFixed(3) + ".";
    }
    if (announce !== null) status.textContent = announce + describe(W, q);
  }
  render(null);
};
