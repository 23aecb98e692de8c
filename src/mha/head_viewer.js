// The attention head viewer of mha.viewer: no library, no network. Called once per viewer,
// with the viewer's root element, which holds the weights as JSON (whole thousandths).
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
  function point(i) { state.query = i; render(); }
  function release() { state.query = state.pinned; render(); }
  function pin(i) { state.pinned = state.pinned === i ? null : i; state.query = state.pinned; render(); }

  var controls = element("div", "mha-viewer-controls");
  var label = element("label", null, "Layer ");
  var layers = element("select", "mha-viewer-layer");
  data.layers.forEach(function (name, i) { var o = element("option", null, name); o.value = i; layers.appendChild(o); });
  layers.addEventListener("change", function () { state.layer = Number(layers.value); render(); });
  label.appendChild(layers);
  var heads = element("span", "mha-viewer-heads");
  heads.setAttribute("role", "group");
  heads.setAttribute("aria-label", "Head");
  var headButtons = [];
  for (var h = 0; h < data.heads; h++) {
    var b = element("button", "mha-viewer-head", "head " + h);
    b.type = "button";
    b.dataset.head = h;
    b.addEventListener("click", function (e) { state.head = Number(e.currentTarget.dataset.head); render(); });
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
  readout.setAttribute("aria-live", "polite");

  var grid = element("table", "mha-viewer-grid");
  var header = element("tr");
  header.appendChild(element("th"));
  data.keys.forEach(function (key) { var th = element("th", "mha-viewer-column", key); th.scope = "col"; header.appendChild(th); });
  grid.appendChild(header);
  var rows = data.queries.map(function (name, i) {
    var tr = element("tr");
    var th = element("th", null, name);
    th.scope = "row";
    tr.appendChild(th);
    var cells = data.keys.map(function (key) { var td = element("td"); tr.appendChild(td); return td; });
    tr.addEventListener("mouseenter", function () { point(i); });
    tr.addEventListener("mouseleave", release);
    grid.appendChild(tr);
    return {tr: tr, cells: cells};
  });
  var gridBox = element("div", "mha-viewer-gridbox");
  gridBox.appendChild(grid);

  [controls, element("div", "mha-viewer-label", "Queries (point at one, or tap it to keep it):"), queries.row,
   element("div", "mha-viewer-label", "Keys, shaded by the query's attention:"), keys.row, readout,
   element("div", "mha-viewer-label", "The whole head: one row per query, one column per key; the darker, the more weight (0 to 1)."),
   gridBox].forEach(function (node) { root.appendChild(node); });

  function render() {
    var W = data.weights[state.layer][state.head];
    headButtons.forEach(function (b, h) { b.setAttribute("aria-pressed", String(h === state.head)); });
    root.dataset.layer = state.layer;
    root.dataset.head = state.head;
    rows.forEach(function (row, i) {
      row.cells.forEach(function (td, j) { shade(td, W[i][j] / 1000); td.title = (W[i][j] / 1000).toFixed(3); });
      row.tr.classList.toggle("mha-viewer-active", i === state.query);
    });
    queries.nodes.forEach(function (node, i) {
      node.classList.toggle("mha-viewer-active", i === state.query);
      node.setAttribute("aria-pressed", String(i === state.pinned));
    });
    var q = state.query;
    keys.nodes.forEach(function (node, j) {
      if (q === null) { node.style.backgroundColor = ""; node.style.color = ""; node.dataset.weight = ""; node.title = ""; return; }
      shade(node, W[q][j] / 1000);
      node.dataset.weight = (W[q][j] / 1000).toFixed(3);
      node.title = node.dataset.weight;
    });
    if (q === null) {
      readout.textContent = "Point at a query token to see where it looks.";
      return;
    }
    var best = 0;
    W[q].forEach(function (w, j) { if (w > W[q][best]) best = j; });
    readout.textContent = "\u201c" + data.queries[q] + "\u201d (position " + q + ") attends most to \u201c" +
      data.keys[best] + "\u201d (position " + best + "): " + (W[q][best] / 1000).toFixed(3) + ".";
  }
  render();
};
