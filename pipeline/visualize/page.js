/* offload.html: draws the offload graph, the tables, the tabs and the details panel.
   The data is the JSON block #page-data (pipeline/visualize/page.py); the layout is
   dagre's (inlined above this script); this file only draws SVG and handles clicks.
   Nothing here loads anything: the page works from file:// without a network. */
(function () {
  "use strict";

  const DATA = JSON.parse(document.getElementById("page-data").textContent);
  const SVG = document.getElementById("graph");
  const NS = SVG.namespaceURI; // the SVG namespace, as the HTML parser set it
  const WRAP = document.getElementById("graph-wrap");
  const DARK_TEXT = { mmalib: true, io: true };
  const LINE = 16;

  const state = { build: DATA.order[0], tab: "graph", layer: null, node: null, zoom: null,
                  showProfile: true, layouts: {} };

  // ------------------------------------------------------------------ helpers

  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "onclick") e.addEventListener("click", v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      e.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    return e;
  }

  function s(tag, attrs) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }

  // search.json: held-out error (y) against estimated cycles (x) of every candidate tried,
  // the target as a dashed line, the chosen one ringed, the int8 and int16 ends labelled
  function searchPlot(sd) {
    const W = 300, H = 210, L = 52, R = 14, T = 24, B = 30;
    // an int8-only search measures no cycles (every recipe runs the same calls): the build's estimate
    const build0 = est() ? est().total_cycles : 0;
    const c = sd.candidates.map((d) => Object.assign({}, d, { cycles: d.cycles === null ? build0 : d.cycles }));
    const xs = c.map((d) => d.cycles), ys = c.map((d) => d.value).concat([sd.bound]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    const X = (v) => L + (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5) * (W - L - R);
    const Y = (v) => T + (y1 > y0 ? (y1 - v) / (y1 - y0) : 0.5) * (H - T - B);
    const svg = s("svg", { id: "search-plot", width: W, height: H, viewBox: "0 0 " + W + " " + H });
    const text = (x, y, t, anchor) => { const e = s("text", { x, y, "text-anchor": anchor || "start" }); e.textContent = t; return e; };
    svg.append(s("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }),
               s("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }),
               s("line", { class: "bound", x1: L, y1: Y(sd.bound), x2: W - R, y2: Y(sd.bound) }),
               text(W - R, H - 4, "est. C7x cycles (M)", "end"), text(2, 10, sd.metric + " (held out)"),
               text(L - 3, Y(y1) + 4, y1.toPrecision(3), "end"), text(L - 3, Y(y0), y0.toPrecision(3), "end"),
               text(L, H - B + 12, (x0 / 1e6).toPrecision(3)), text(W - R, H - B + 12, (x1 / 1e6).toPrecision(3), "end"),
               text(L + 3, Y(sd.bound) - 3, "target"));
    if (sd.max_cycles && sd.max_cycles > x0 && sd.max_cycles < x1) {   // the target's cycle cap
      svg.append(s("line", { class: "bound", x1: X(sd.max_cycles), y1: T, x2: X(sd.max_cycles), y2: H - B }),
                 text(X(sd.max_cycles) + 3, T + 8, "cap"));
    }
    for (const d of c) {
      const dot = s("circle", { cx: X(d.cycles), cy: Y(d.value), r: d.chosen ? 5 : 3.5,
                                fill: d.met ? "#2a8a3a" : "#999", stroke: d.chosen ? "#000" : "none", "stroke-width": 2 });
      const tip = s("title", {}); tip.textContent = d.name + ": " + d.value + ", " + (d.cycles / 1e6).toFixed(2) + "M cycles";
      dot.append(tip);
      svg.append(dot);
    }
    const int8 = c.filter((d) => !d.int16), int16 = c.filter((d) => d.int16);
    if (int8.length) svg.append(text(X(int8[0].cycles) + 8, Y(int8[0].value) + 4, "int8 recipes"));
    if (int16.length) { const e = int16[int16.length - 1]; svg.append(text(X(e.cycles) - 6, Y(e.value) - 6, "int16 " + e.name.split("int16 ")[1], "end")); }
    return svg;
  }

  const fmtInt = (n) => (n === null || n === undefined ? "" : Number(n).toLocaleString("en-US"));
  const fmtShape = (sh) => (sh ? sh.join("\u00d7") : "");
  // Memory levels of the C7x (codegen's memory plan: manifest call reads / writes)
  const LEVEL = { l2: "L2", msmc: "MSMC", ddr: "DDR" };
  const fmtBytes = (n) => (n >= 1e6 ? (n / 1e6).toFixed(2) + " MB" : n >= 1e3 ? (n / 1e3).toFixed(1) + " KB" : n + " B");
  const fmtPlace = (r) => r.tensor + " " + fmtBytes(r.bytes) + " in " + (LEVEL[r.level] || r.level) +
    (r.staged_from ? " (DMA from " + (LEVEL[r.staged_from] || r.staged_from) + ")" : "");
  const ddrBytes = (c) => [...(c.reads || []), ...(c.writes || [])].reduce(
    (sum, r) => sum + (r.level === "ddr" || r.staged_from === "ddr" ? r.bytes : 0), 0);
  const memoryOf = (c) => (c.reads ? h("span", { class: "memory" },
    "reads " + c.reads.map(fmtPlace).join(", "), h("br"), "writes " + c.writes.map(fmtPlace).join(", ")) : null);
  const fmtShare = (x) => (x === null || x === undefined ? "" : (100 * x).toFixed(1) + "%");
  const fmtNum = (x) => (x === null || x === undefined ? "" : typeof x === "number"
    ? (Number.isInteger(x) ? String(x) : Math.abs(x) >= 100 ? x.toFixed(1) : x.toPrecision(4)) : String(x));

  function fmtMetric(name, v) {
    if (v === null || v === undefined) return "\u2014"; // not measured, or (sqnr_db) identical
    if (typeof v !== "number") return String(v);
    if (/cos/.test(name)) return v.toFixed(6);
    if (/sqnr|db/.test(name)) return v.toFixed(2);
    return fmtNum(v);
  }

  function fmtTime(v, unit) {
    if (v === null || v === undefined) return "";
    if (unit === "ns") {
      if (v >= 1e6) return (v / 1e6).toFixed(2) + " ms";
      if (v >= 1e3) return (v / 1e3).toFixed(1) + " \u00b5s";
      return v.toFixed(0) + " ns";
    }
    if (unit === "cycles") {
      if (v >= 1e6) return (v / 1e6).toFixed(2) + "M cycles";
      if (v >= 1e3) return (v / 1e3).toFixed(1) + "k cycles";
      return v.toFixed(0) + " cycles";
    }
    return fmtNum(v) + " " + (unit || "");
  }

  function chip(kind) {
    return h("span", { class: "chip", style: "background:" + DATA.colours[kind] });
  }

  const build = () => DATA.builds[state.build];
  const prof = () => (DATA.profile && DATA.profile[state.build]) || null;
  const est = () => (DATA.estimate && DATA.estimate[state.build]) || null;
  const fmtMs = (x) => (x === null || x === undefined ? "" : x >= 100 ? x.toFixed(0) + " ms" : x.toPrecision(3) + " ms");
  const fmtRatio = (x) => (x === null || x === undefined ? "" : x.toFixed(2) + "\u00d7");
  const nums = () => (DATA.numerics && (DATA.numerics[state.build] || DATA.numerics["*"])) || null;
  const layerById = (id) => build().layers.find((l) => l.id === id) || null;
  const nodeById = (id) => build().nodes.find((n) => n.id === id) || null;
  const callKind = (backend) => (backend === "scalar" ? "tvm" : backend);
  const profileShown = () => Boolean(prof() && state.showProfile);

  function primaryNode(layerId) {
    const nodes = build().nodes.filter((n) => n.layer === layerId);
    return (nodes.find((n) => n.primary) || nodes[0] || { id: null }).id;
  }

  // ------------------------------------------------------------------ graph

  const measure = document.createElement("canvas").getContext("2d");
  function textWidth(text, bold) {
    measure.font = (bold ? "bold " : "") + "12px sans-serif";
    return measure.measureText(text).width;
  }

  function nodeLines(n) {
    const lines = n.label.slice();
    const p = prof();
    if (profileShown() && n.call !== null) {
      const t = p.calls[String(n.call)];
      if (t && t.timed_in !== undefined) lines.push("timed in call " + t.timed_in + " (fused)");
      else if (t && t.median !== null) lines.push(fmtTime(t.median, p.unit) + (t.share !== null ? " \u00b7 " + fmtShare(t.share) : ""));
    }
    const e = est();
    const c = e && n.call !== null ? e.calls[String(n.call)] : null;
    if (c) lines.push("est. " + fmtTime(c.cycles, "cycles") + " \u00b7 " + fmtShare(c.share));
    return lines;
  }

  function layout() {
    const key = state.build + (profileShown() ? ":profile" : "");
    if (state.layouts[key]) return state.layouts[key];
    const g = new dagre.graphlib.Graph({ multigraph: true });
    g.setGraph({ rankdir: "TB", nodesep: 30, ranksep: 26, edgesep: 16, marginx: 16, marginy: 16 });
    g.setDefaultEdgeLabel(() => ({}));
    for (const n of build().nodes) {
      const lines = nodeLines(n);
      const w = Math.max(...lines.map((t, i) => textWidth(t, i === 0))) + 22;
      g.setNode(n.id, { width: Math.max(84, Math.ceil(w)), height: LINE * lines.length + 10, lines, node: n });
    }
    build().edges.forEach((e, i) => g.setEdge(e.from, e.to, { edge: e }, "e" + i));
    dagre.layout(g);
    state.layouts[key] = g;
    return g;
  }

  function curve(pts) {
    const r = (v) => Math.round(v * 10) / 10;
    let d = "M" + r(pts[0].x) + "," + r(pts[0].y);
    for (let i = 1; i < pts.length - 1; i++) {
      const mx = (pts[i].x + pts[i + 1].x) / 2, my = (pts[i].y + pts[i + 1].y) / 2;
      d += " Q" + r(pts[i].x) + "," + r(pts[i].y) + " " + r(mx) + "," + r(my);
    }
    const last = pts[pts.length - 1];
    return d + " L" + r(last.x) + "," + r(last.y);
  }

  function drawGraph() {
    const g = layout();
    SVG.textContent = "";
    const defs = s("defs");
    for (const [id, fill] of [["arrow", "#9e9e9e"], ["arrow-hi", "#212121"]]) {
      const marker = s("marker", { id, viewBox: "0 0 10 10", refX: "9", refY: "5", markerUnits: "userSpaceOnUse",
                                   markerWidth: "8", markerHeight: "8", orient: "auto" });
      marker.appendChild(s("path", { d: "M0,0 L10,5 L0,10 z", fill }));
      defs.appendChild(marker);
    }
    SVG.appendChild(defs);
    const edges = s("g", { class: "edges" }), nodes = s("g", { class: "nodes" });
    SVG.appendChild(edges);
    SVG.appendChild(nodes);
    const p = profileShown() ? prof() : null;
    const maxShare = p ? Math.max(0, ...Object.values(p.calls).map((t) => t.share || 0)) : 0;
    for (const ed of g.edges()) {
      const e = g.edge(ed);
      const path = s("path", { class: "edge", d: curve(e.points), "marker-end": "url(#arrow)",
                               "data-from": ed.v, "data-to": ed.w });
      const title = s("title");
      title.textContent = e.edge.tensor;
      path.appendChild(title);
      edges.appendChild(path);
    }
    for (const id of g.nodes()) {
      const d = g.node(id), n = d.node;
      const grp = s("g", { class: "node", "data-id": id, "data-layer": n.layer || "", "data-kind": n.kind,
                           transform: "translate(" + Math.round(d.x - d.width / 2) + "," + Math.round(d.y - d.height / 2) + ")" });
      grp.appendChild(s("rect", { class: "box", width: d.width, height: d.height, rx: 5, fill: DATA.colours[n.kind] }));
      const t = p && n.call !== null ? p.calls[String(n.call)] : null;
      if (t && t.share && maxShare > 0) {
        grp.appendChild(s("rect", { class: "heat", x: 0, y: d.height + 1, height: 3,
                                    width: Math.max(2, d.width * t.share / maxShare) }));
      }
      d.lines.forEach((line, i) => {
        const text = s("text", { x: d.width / 2, y: 5 + LINE * (i + 1) - 3, "text-anchor": "middle",
                                 class: "l" + (i + 1), fill: DARK_TEXT[n.kind] ? "#212121" : "#ffffff" });
        text.textContent = line;
        grp.appendChild(text);
      });
      const title = s("title");
      const call = n.call !== null ? build().calls.find((c) => c.index === n.call) : null;
      title.textContent = call ? "#" + call.index + " " + call.func + (n.layer ? " (layer " + n.layer + ")" : "") : n.id;
      grp.appendChild(title);
      grp.addEventListener("click", (ev) => { ev.stopPropagation(); select(n.layer, id); });
      nodes.appendChild(grp);
    }
    if (state.zoom === null && WRAP.clientWidth > 0) state.zoom = fitWidth(); // hidden tab: fit when shown
    applyZoom();
    highlight();
  }

  function graphSize() {
    const gl = layout().graph();
    return { w: gl.width || 1, h: gl.height || 1 };
  }

  function fitWidth() {
    return Math.min(1, Math.max(0.1, (WRAP.clientWidth - 8) / graphSize().w));
  }

  function fitAll() {
    const { w, h: hh } = graphSize();
    return Math.min(1, Math.max(0.02, Math.min((WRAP.clientWidth - 8) / w, (WRAP.clientHeight - 8) / hh)));
  }

  function applyZoom() {
    const { w, h: hh } = graphSize();
    SVG.setAttribute("viewBox", "0 0 " + w + " " + hh);
    SVG.setAttribute("width", Math.round(w * (state.zoom || 1)));
    SVG.setAttribute("height", Math.round(hh * (state.zoom || 1)));
  }

  function zoomBy(f) {
    state.zoom = Math.min(4, Math.max(0.02, (state.zoom || 1) * f));
    applyZoom();
  }

  // ------------------------------------------------------------------ selection and details

  function select(layerId, nodeId) {
    state.layer = layerId || null;
    state.node = nodeId || (layerId ? primaryNode(layerId) : null);
    highlight();
    showDetails();
  }

  function highlight() {
    for (const e of SVG.querySelectorAll("g.node")) {
      const on = state.layer ? e.dataset.layer === state.layer : e.dataset.id === state.node;
      e.classList.toggle("sel", Boolean(on && (state.layer || state.node)));
    }
    const mine = new Set([...SVG.querySelectorAll("g.node.sel")].map((e) => e.dataset.id));
    for (const e of SVG.querySelectorAll("path.edge")) {
      const hi = mine.has(e.dataset.from) || mine.has(e.dataset.to);
      e.classList.toggle("hi", hi);
      e.setAttribute("marker-end", hi ? "url(#arrow-hi)" : "url(#arrow)");
    }
    for (const tr of document.querySelectorAll("table.sortable tbody tr")) {
      tr.classList.toggle("sel", Boolean(state.layer) && tr.dataset.layer === state.layer);
    }
  }

  function showInGraph(nodeId) {
    setTab("graph");
    const e = SVG.querySelector('g.node[data-id="' + nodeId + '"]');
    if (e) e.scrollIntoView({ block: "center", inline: "center" });
  }

  function rows(table, pairs) {
    for (const [k, v, cls] of pairs) {
      if (v === null || v === undefined || v === "") continue;
      table.appendChild(h("tr", {}, h("th", {}, k), h("td", { class: cls || null }, v)));
    }
    return table;
  }

  function showDetails() {
    const box = document.getElementById("details");
    box.textContent = "";
    const n = state.node ? nodeById(state.node) : null;
    const lay = state.layer ? layerById(state.layer) : null;
    if (!n && !lay) {
      box.appendChild(h("p", { class: "muted" }, "Click a node or a table row."));
      return;
    }
    const call = n && n.call !== null ? build().calls.find((c) => c.index === n.call) : null;
    if (lay) {
      box.appendChild(h("h3", {}, lay.op + " \u00b7 " + lay.id));
      const kind = callKind(lay.backend);
      rows(box.appendChild(h("table", { id: "layer-details" })), [
        ["Module", h("span", {}, h("code", { class: "module" }, lay.module || "(top level)"),
                     lay.module_type ? h("div", { class: "muted" }, lay.module_type) : null)],
        ["Source", lay.source ? h("span", {}, h("code", {}, lay.source),
                                  lay.code ? h("div", {}, h("code", {}, lay.code)) : null) : null],
        ["Op", lay.op],
        ["Backend", h("span", {}, chip(kind), " " + DATA.kinds[kind] + (lay.backend === "scalar" ? " (not offloaded)" : ""))],
        ["Kernel", lay.kernel || "none: TVM scalar C"],
        ["Function", lay.func ? h("code", {}, lay.func) : null],
        ["dtype", lay.dtype],
        ["Input shape", fmtShape(lay.input_shape)],
        ["Weight shape", fmtShape(lay.weight_shape)],
        ["Output shape", fmtShape(lay.output_shape)],
        ["MACs", fmtInt(lay.macs)],
        ["Fused activation", lay.activation || "none"],
        ["DDR bytes", lay.calls.length && build().calls[0].reads ? fmtBytes(lay.calls.reduce(
          (sum, i) => sum + ddrBytes(build().calls.find((x) => x.index === i)), 0)) + " per inference" : null, "ddr-bytes"],
        ["Why not offloaded", lay.backend === "scalar" ? lay.reason || "(no reason recorded)" : null, "reason"],
        ["Note", lay.note],
        ["Calls", h("ul", {}, lay.calls.map((i) => {
          const c = build().calls.find((x) => x.index === i);
          return h("li", {}, h("a", { onclick: () => select(lay.id, "c" + i) }, "#" + i + " " + c.kernel),
                   " (" + DATA.kinds[callKind(c.backend)] + ")");
        }))],
      ]);
      const p = prof();
      const t = p && p.layers[lay.id];
      if (t) {
        box.appendChild(h("h2", {}, "Profile"));
        rows(box.appendChild(h("table", {})), [
          ["Time", fmtTime(t.median, p.unit) + (t.share !== null ? " (" + fmtShare(t.share) + " of the build)" : "")],
          ["Measured", p.label + (p.statistic ? " (" + p.statistic + ")" : "")],
        ]);
      }
      const e = est();
      const el = e && e.layers[lay.id];
      if (el) {
        box.appendChild(h("h2", {}, "C7x estimate"));
        rows(box.appendChild(h("table", { id: "estimate-details" })), [
          ["Estimated", fmtTime(el.cycles, "cycles") + " = " + fmtMs(el.cycles / (e.clock_hz || 1e9) * 1e3) +
                        " (" + fmtShare(el.share) + " of the build) on " + e.target],
          ["Bound", el.reason],
          ["Measured", el.measured_cycles !== null && el.measured_cycles !== undefined
            ? fmtTime(el.measured_cycles, "cycles") + " on the board: " + fmtRatio(el.ratio) + " the estimate" : null],
          ["What it is", e.label],
        ]);
      }
      const q = nums();
      const row = q && q.layers.find((r) => r.id === lay.id);
      if (row) {
        box.appendChild(h("h2", {}, "Numerics"));
        const tbl = box.appendChild(h("table", { id: "numerics-details" }));
        for (const { name: g, metrics } of q.groups) {
          rows(tbl, [[g, metrics.map((m) => m + " " + fmtMetric(m, row[g][m])).join(", ")]]);
        }
        rows(tbl, [["Notes", row.notes && row.notes.length ? row.notes.join("; ") : null]]);
      }
    }
    if (call) {
      box.appendChild(h("h2", {}, lay ? "This call" : "Call (input quantize, no layer)"));
      const p = prof();
      const t = p && p.calls[String(call.index)];
      const ce = est() && est().calls[String(call.index)];
      rows(box.appendChild(h("table", {})), [
        ["Index", "#" + call.index],
        ["Function", h("code", {}, call.func)],
        ["Kernel", h("code", {}, call.kernel)],
        ["Backend", h("span", {}, chip(callKind(call.backend)), " " + DATA.kinds[callKind(call.backend)])],
        ["Reads", call.inputs.join(", ")],
        ["Writes", call.output],
        ["Memory", memoryOf(call), "memory"],
        ["DDR bytes", call.reads ? fmtBytes(ddrBytes(call)) : null],
        ["Shape", fmtShape(call.shape)],
        ["dtype", call.dtype],
        ["Time", t && t.timed_in !== undefined ? "computed tile by tile inside call " + t.timed_in +
          " (fused): timed there" : t ? fmtTime(t.median, p.unit) + (t.share !== null ? " (" + fmtShare(t.share) + ")" : "") : null],
        ["Estimated", ce ? fmtTime(ce.cycles, "cycles") + " (" + fmtShare(ce.share) + "), " + ce.reason : null],
        ["Measured", ce && ce.measured_cycles !== null && ce.measured_cycles !== undefined
          ? fmtTime(ce.measured_cycles, "cycles") + ", " + fmtRatio(ce.ratio) + " the estimate" : null],
      ]);
    } else if (n) {
      box.appendChild(h("h3", {}, n.id));
      rows(box.appendChild(h("table", {})), [["Shape", fmtShape(n.shape)], ["dtype", n.dtype]]);
    }
    if (n && state.tab !== "graph") {
      box.appendChild(h("p", {}, h("a", { onclick: () => showInGraph(n.id) }, "show in the graph")));
    }
  }

  // ------------------------------------------------------------------ sortable tables

  function sortable(table, columns, data, initial, rowClass) {
    const sig = columns.map((c) => c.key).join("|");
    const st = table._sort && table._sort.cols === sig ? table._sort : { key: initial.key, dir: initial.dir, cols: sig };
    table._sort = st;
    function draw() {
      const col = columns.find((c) => c.key === st.key) || columns[0];
      const val = (r) => (col.sort ? col.sort(r) : col.get(r));
      const sorted = data.map((r, i) => [r, i]).sort((a, b) => {
        const x = val(a[0]), y = val(b[0]);
        const xn = x === null || x === undefined || x === "", yn = y === null || y === undefined || y === "";
        if (xn || yn) return xn === yn ? a[1] - b[1] : xn ? 1 : -1; // empty cells last, either way
        const c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y), "en", { numeric: true });
        return (st.dir === "asc" ? c : -c) || a[1] - b[1];
      }).map((p) => p[0]);
      table.textContent = "";
      const head = h("tr", {}, columns.map((c) => h("th", {
        class: c.key === st.key ? st.dir : null, "data-key": c.key,
        title: (c.tip ? c.tip + "\n" : "") + "sort by " + [].concat(c.title).join(" "),
        onclick: () => { st.dir = st.key === c.key && st.dir === "asc" ? "desc" : st.key === c.key ? "asc" : c.num ? "desc" : "asc"; st.key = c.key; draw(); },
      }, Array.isArray(c.title) ? [h("span", { class: "group" }, c.title[0]), h("br"), c.title[1]] : c.title)));
      table.appendChild(h("thead", {}, head));
      const body = h("tbody", {});
      for (const r of sorted) {
        const tr = h("tr", { "data-layer": r.layer || null, class: rowClass ? rowClass(r) : null,
                             onclick: () => r.layer && select(r.layer) },
                     columns.map((c) => {
                       const v = c.fmt ? c.fmt(r) : c.get(r);
                       return h("td", { class: c.num ? "num" : c.wrap ? "wrap" : null, "data-key": c.key }, v === null || v === undefined ? "" : v);
                     }));
        body.appendChild(tr);
      }
      table.appendChild(body);
      highlight();
    }
    draw();
  }

  function layersTable() {
    const p = prof(), q = nums();
    const qrow = (id) => (q ? q.layers.find((r) => r.id === id) : null);
    const group = q ? q.groups.find((g) => g.name === "c_vs_qdq") || q.groups[0] : null;
    const main = group ? group.name : null;
    const cols = [
      { key: "pos", title: "#", num: true, get: (r) => r.pos },
      { key: "id", title: "layer", get: (r) => r.l.id },
      { key: "module", title: "module", get: (r) => r.l.module, fmt: (r) => r.l.module || "(top level)" },
      { key: "op", title: "op", get: (r) => r.l.op },
      { key: "backend", title: "backend", get: (r) => DATA.kinds[callKind(r.l.backend)],
        fmt: (r) => h("span", {}, chip(callKind(r.l.backend)), " " + DATA.kinds[callKind(r.l.backend)]) },
      { key: "kernel", title: "kernel", get: (r) => r.l.kernel },
      { key: "dtype", title: "dtype", get: (r) => r.l.dtype },
      { key: "out", title: "output", get: (r) => fmtShape(r.l.output_shape),
        sort: (r) => (r.l.output_shape || []).reduce((a, b) => a * b, 1) },
      { key: "macs", title: "MACs", num: true, get: (r) => r.l.macs, fmt: (r) => fmtInt(r.l.macs) },
      { key: "act", title: "activation", get: (r) => r.l.activation },
      { key: "calls", title: "calls", num: true, get: (r) => r.l.calls.length },
    ];
    if (p) {
      cols.push({ key: "time", title: "time", num: true, get: (r) => (p.layers[r.l.id] || {}).median,
                  fmt: (r) => fmtTime((p.layers[r.l.id] || {}).median, p.unit) });
      cols.push({ key: "share", title: "share", num: true, get: (r) => (p.layers[r.l.id] || {}).share,
                  fmt: (r) => fmtShare((p.layers[r.l.id] || {}).share) });
    }
    if (group && group.metrics.includes("sqnr_db")) {
      cols.push({ key: "sqnr", title: "SQNR dB (" + main + ")", num: true,
                  get: (r) => { const x = qrow(r.l.id); return x ? x[main].sqnr_db : null; },
                  fmt: (r) => { const x = qrow(r.l.id); return x ? fmtMetric("sqnr_db", x[main].sqnr_db) : ""; } });
    }
    cols.push({ key: "why", title: "reason / note", wrap: true, get: (r) => (r.l.backend === "scalar" ? r.l.reason : "") || r.l.note || "" });
    const data = build().layers.map((l, i) => ({ pos: i + 1, l, layer: l.id }));
    sortable(document.getElementById("layers-table"), cols, data, { key: "pos", dir: "asc" });
  }

  function profileTable() {
    const p = prof(), e = est(), label = document.getElementById("profile-label"), table = document.getElementById("profile-table");
    label.textContent = "";
    table.textContent = "";
    if (!p && !e) {
      label.appendChild(h("span", { class: "muted" }, "No profile or estimate for the " + state.build + " build."));
      return;
    }
    if (e) {
      label.append("Estimated on ", h("b", { id: "estimate-target" }, e.target), ": ",
                   h("b", { id: "estimate-total" }, fmtMs(e.ms) + " = " + (e.fps || 0).toFixed(1) + " FPS"),
                   " (" + fmtTime(e.total_cycles, "cycles") + "; ", h("i", {}, e.label), ")",
                   e.board ? "; board log: " + fmtTime(e.board.measured_cycles, "cycles") + ", error " +
                             (100 * e.board.error).toFixed(1) + "%" : "", ". ");
    }
    if (p) {
      const extra = [p.statistic, p.total !== null ? "total " + fmtTime(p.total, p.unit) : ""].filter(Boolean).join("; ");
      label.append("Per-layer time of the " + state.build + " build: ", h("b", { id: "profile-unit-label" }, p.label || p.unit),
                   extra ? " (" + extra + ")" : "");
    }
    const data = build().layers.map((l) => ({ l, layer: l.id, t: (p && p.layers[l.id]) || {}, e: (e && e.layers[l.id]) || {} }));
    for (const c of build().calls.filter((c) => c.layer === null)) { // the input quantize: a call of no layer
      const t = p && p.calls[String(c.index)], ce = e && e.calls[String(c.index)];
      if (t || ce) data.push({ l: { id: "(" + c.func + ")", module: "", op: c.kernel, backend: "tvm", calls: [c.index] }, layer: null, t: t || {}, e: ce || {} });
    }
    const maxShare = Math.max(0, ...data.map((r) => r.t.share || 0));
    const maxEst = Math.max(0, ...data.map((r) => r.e.share || 0));
    const bar = (x, max) => (x === null || x === undefined ? "" : h("span", {},
      h("span", { class: "bar", style: "width:" + Math.round(60 * x / (max || 1)) + "px" }), fmtShare(x)));
    const cols = [
      { key: "id", title: "layer", get: (r) => r.l.id },
      { key: "module", title: "module", get: (r) => r.l.module, fmt: (r) => r.l.module || (r.layer ? "(top level)" : "") },
      { key: "op", title: "op", get: (r) => r.l.op },
      { key: "backend", title: "backend", get: (r) => DATA.kinds[callKind(r.l.backend)],
        fmt: (r) => h("span", {}, chip(callKind(r.l.backend)), " " + DATA.kinds[callKind(r.l.backend)]) },
      { key: "calls", title: "calls", num: true, get: (r) => r.l.calls.length },
    ];
    if (e) {
      cols.push({ key: "est", title: "est. C7x cycles", num: true, get: (r) => r.e.cycles, fmt: (r) => fmtTime(r.e.cycles, "cycles") },
                { key: "estshare", title: "est. share", num: true, get: (r) => r.e.share, fmt: (r) => bar(r.e.share, maxEst) },
                { key: "bound", title: "bound", get: (r) => r.e.bound, tip: "what limits the estimate: compute, memory or the fixed call cost" });
      if (e.board) {
        cols.push({ key: "measured", title: "board cycles", num: true, get: (r) => r.e.measured_cycles, fmt: (r) => fmtTime(r.e.measured_cycles, "cycles") },
                  { key: "ratio", title: "board / est.", num: true, get: (r) => r.e.ratio, fmt: (r) => fmtRatio(r.e.ratio) });
      }
    }
    if (p) {
      cols.push({ key: "time", title: p.unit === "ns" ? "host time" : "time", num: true, get: (r) => r.t.median, fmt: (r) => fmtTime(r.t.median, p.unit) },
                { key: "share", title: p.unit === "ns" ? "host share" : "share", num: true, get: (r) => r.t.share, fmt: (r) => bar(r.t.share, maxShare) });
    }
    sortable(table, cols, data, { key: e ? "est" : "time", dir: "desc" });
  }

  function numericsTable() {
    const q = nums(), label = document.getElementById("numerics-label"), table = document.getElementById("numerics-table");
    label.textContent = "";
    table.textContent = "";
    if (!q) {
      label.appendChild(h("span", { class: "muted" }, "No numerics for the " + state.build + " build."));
      return;
    }
    label.append("Per-layer numerics of the " + state.build + " build, worst first (",
                 h("b", {}, "c_vs_qdq"), ": the C build against PyTorch's Q/DQ model; ",
                 h("b", {}, "qdq_vs_float"), ": Q/DQ against float; hover a header for its definition)",
                 DATA.numerics["*"] ? "; layers.json does not split them by build." : ".");
    const worst = new Set(q.worst);
    const cols = [
      { key: "rank", title: "rank", num: true, get: (r) => r.rank },
      { key: "id", title: "layer", get: (r) => r.id },
      { key: "module", title: "module", get: (r) => r.module, fmt: (r) => r.module || "(top level)" },
      { key: "op", title: "op", get: (r) => r.op },
    ];
    for (const { name: g, metrics } of q.groups) {
      for (const m of metrics) {
        cols.push({ key: g + "." + m, title: [g, m], num: true, tip: [q.measures[g], q.measures[m]].filter(Boolean).join("; "), get: (r) => r.row[g][m], fmt: (r) => fmtMetric(m, r.row[g][m]) });
      }
    }
    const data = q.layers.map((row, i) => ({ rank: i + 1, id: row.id, module: row.module, op: row.op, row,
                                             layer: layerById(row.id) ? row.id : null }));
    sortable(table, cols, data, { key: "rank", dir: "asc" }, (r) => (worst.has(r.id) ? "worst" : null));
  }

  // ------------------------------------------------------------------ sidebar, tabs, builds

  function sidebar() {
    const counts = {};
    for (const n of build().nodes) counts[n.kind] = (counts[n.kind] || 0) + 1;
    const legend = document.getElementById("legend");
    legend.textContent = "";
    for (const kind of DATA.kind_order) {
      legend.appendChild(h("li", { "data-kind": kind }, chip(kind), DATA.kinds[kind],
                           h("span", { class: "count" }, String(counts[kind] || 0))));
    }
    const sm = build().summary || {};
    const line = document.getElementById("offload-line");
    line.textContent = sm.layers !== undefined
      ? build().calls.length + " kernel calls; " + sm.layers_offloaded + "/" + sm.layers + " layers on MMALIB/C7x kernels" +
        (sm.macs_total ? ", " + (100 * sm.macs_offloaded / sm.macs_total).toFixed(1) + "% of " + (sm.macs_total / 1e6).toFixed(1) + "M MACs" : "")
      : "";
    const eLine = document.getElementById("estimate-line");
    eLine.textContent = "";
    const e = est();
    if (e) {
      eLine.append(h("b", {}, "Estimated on " + e.target + ": " + fmtMs(e.ms) + " = " + (e.fps || 0).toFixed(1) + " FPS"),
                   " (" + fmtTime(e.total_cycles, "cycles") + ", one core; an estimate, not a measurement)",
                   e.board ? "; board: " + fmtTime(e.board.measured_cycles, "cycles") + " (" + (e.board.error >= 0 ? "+" : "") + (100 * e.board.error).toFixed(1) + "% vs the estimate)" : "",
                   e.memory ? h("div", { id: "memory-line" }, e.memory.plan + " memory plan: DDR " +
                     fmtBytes(e.memory.ddr_traffic_bytes) + " per inference, peak L2 " + fmtBytes(e.memory.peak.l2 || 0) +
                     (e.memory.plan === "staged" ? "; " + e.memory.gain.toFixed(2) + "x faster than the flat plan (" +
                       fmtTime(e.memory.flat_cycles, "cycles") + ")" : "")) : "",
                   h("ol", { id: "estimate-top" }, e.top.map((r) => h("li", {},
                     h("a", { onclick: () => select(r.layer, primaryNode(r.layer)) }, r.module || r.layer || "input"),
                     " " + fmtShare(r.share) + ": " + r.reason))));
    }
    const fLine = document.getElementById("fidelity-line");
    fLine.textContent = "";
    if (DATA.fidelity && DATA.fidelity.length) {   // holdout.json: the deployed C build on unseen images
      fLine.append(h("b", {}, "Held-out fidelity"), " (" + DATA.fidelity[0] + ")",
                   h("ul", {}, DATA.fidelity.slice(1).map((t) => h("li", {}, t))));
    }
    const sLine = document.getElementById("search-line");
    sLine.textContent = "";
    if (DATA.search) sLine.append(h("div", {}, h("b", {}, "Recipe search"), " (" + DATA.search.target + ", held out)"),
                                  h("div", {}, searchPlot(DATA.search)), h("div", {}, DATA.search.summary));
    const ops = {};
    for (const l of build().layers) {
      const o = ops[l.op] || (ops[l.op] = { n: 0, off: 0 });
      o.n += 1;
      if (l.backend !== "scalar") o.off += 1;
    }
    const table = document.getElementById("ops");
    table.textContent = "";
    table.appendChild(h("tr", {}, h("th", {}, "op"), h("th", {}, "layers"), h("th", {}, "offloaded")));
    for (const op of Object.keys(ops).sort()) {
      table.appendChild(h("tr", {}, h("td", {}, h("code", {}, op)), h("td", { class: "num" }, String(ops[op].n)),
                          h("td", { class: "num" }, String(ops[op].off))));
    }
  }

  function setTab(tab) {
    state.tab = tab;
    for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("on", b.dataset.tab === tab);
    for (const v of document.querySelectorAll(".view")) v.classList.toggle("on", v.id === "view-" + tab);
    if (tab === "graph" && state.zoom === null) { state.zoom = fitWidth(); applyZoom(); }
    showDetails();
  }

  function setBuild(v) {
    state.build = v;
    state.zoom = null;
    if (state.layer && !layerById(state.layer)) state.layer = null;
    state.node = state.layer ? primaryNode(state.layer) : null;
    renderAll();
  }

  function renderAll() {
    document.getElementById("profile-toggle").hidden = !prof();
    drawGraph();
    sidebar();
    layersTable();
    if (DATA.profile || DATA.estimate) profileTable();
    if (DATA.numerics) numericsTable();
    showDetails();
  }

  function init() {
    const builds = document.getElementById("builds");
    for (const v of DATA.order) {
      const input = h("input", { type: "radio", name: "build", value: v, checked: v === state.build });
      input.addEventListener("change", () => setBuild(v));
      builds.appendChild(h("label", { title: DATA.builds[v].calls.length + " kernel calls" }, input, " " + v));
    }
    for (const b of document.querySelectorAll("#tabs button")) {
      if (b.dataset.tab === "profile") b.hidden = !DATA.profile && !DATA.estimate;
      if (b.dataset.tab === "numerics") b.hidden = !DATA.numerics;
      b.addEventListener("click", () => setTab(b.dataset.tab));
    }
    document.getElementById("zoom-in").addEventListener("click", () => zoomBy(1.25));
    document.getElementById("zoom-out").addEventListener("click", () => zoomBy(0.8));
    document.getElementById("zoom-fit").addEventListener("click", () => { state.zoom = fitAll(); applyZoom(); });
    document.getElementById("zoom-1").addEventListener("click", () => { state.zoom = 1; applyZoom(); });
    document.getElementById("show-profile").addEventListener("change", (e) => { state.showProfile = e.target.checked; drawGraph(); });
    WRAP.addEventListener("wheel", (e) => {
      if (!e.ctrlKey) return;
      e.preventDefault();
      zoomBy(e.deltaY < 0 ? 1.15 : 1 / 1.15);
    }, { passive: false });
    SVG.addEventListener("click", () => select(null, null));
    renderAll();
  }

  try {
    init();
  } catch (err) {
    document.getElementById("details").textContent = "The page failed to draw: " + err;
    throw err;
  }
})();
