/*
 * attnviz HTML report: draws the page from the JSON in <script id="attnviz-data">.
 *
 * Plain JavaScript, no library, no network: everything it needs is in this file and that JSON.
 * Text from users' files (token labels, titles, file names) only ever reaches the page through
 * textContent, attribute values or canvas fillText, never as markup.
 *
 * The data (written by attnviz/render/html.py):
 *   maps[n] = {row, col, name, thumb (base64 of thumbCells[0] x thumbCells[1] colour indices, 255 =
 *             masked), data (base64 of little-endian float32,
 *             cells[0] x cells[1], NaN = masked)}
 *   shape = [Lq, Lk] of the maps; blocks = [fr, fc]: cell (i, j) of a map covers query positions
 *   i*fr .. min((i+1)*fr, Lq)-1 and key positions j*fc .. ; scale = {vmin, vmax, diverging, label,
 *   lut (base64 of the scale's RGB triples, 255 of them)}; stats = {columns, rows, maps, precision} or null.
 */
"use strict";

(function () {
  const data = JSON.parse(document.getElementById("attnviz-data").textContent);
  const app = document.getElementById("app");
  const FONT = '11px system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
  const R = data.cells[0], C = data.cells[1];
  const FR = data.blocks[0], FC = data.blocks[1];
  const LQ = data.shape[0], LK = data.shape[1];
  const aggregated = FR > 1 || FC > 1;
  const scale = data.scale;

  // ------------------------------------------------------------------------------------------
  // small helpers

  function el(tag, props, children) {
    const node = document.createElement(tag);
    if (props) {
      for (const key of Object.keys(props)) {
        const value = props[key];
        if (value === undefined || value === null) continue;
        if (key === "text") node.textContent = value;
        else if (key === "className") node.className = value;
        else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
        else node.setAttribute(key, value);
      }
    }
    for (const child of children || []) {
      if (child) node.appendChild(child);
    }
    return node;
  }

  function bytes(b64) {
    const bin = atob(b64);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  const decoded = new Map();
  function values(n) {
    if (!decoded.has(n)) {
      const raw = bytes(data.maps[n].data);
      const view = new DataView(raw.buffer);
      const out = new Float32Array(raw.length / 4);
      for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
      decoded.set(n, out);
    }
    return decoded.get(n);
  }

  const lut = bytes(scale.lut);
  const LEVELS = lut.length / 3;
  const BAD = [0xd9, 0xd9, 0xd9];
  function colourIndex(v) {
    const span = scale.vmax > scale.vmin ? scale.vmax - scale.vmin : 1;
    const t = Math.min(1, Math.max(0, (v - scale.vmin) / span));
    return Math.floor(t * (LEVELS - 1) + 0.5);
  }
  function rgb(v) {
    if (Number.isNaN(v)) return BAD;
    const k = 3 * colourIndex(v);
    return [lut[k], lut[k + 1], lut[k + 2]];
  }

  /** A value as the page shows it: four significant digits. */
  function fmt(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "masked";
    if (v === 0) return "0";
    const a = Math.abs(v);
    return a >= 1e-3 && a < 1e5 ? v.toPrecision(4) : v.toExponential(3);
  }

  function shorten(text, width) {
    return text.length > width ? text.slice(0, width - 1) + "\u2026" : text;
  }

  /** Positions a cell covers along an axis (0: queries, 1: keys): [first, last]. */
  function span(axis, i) {
    const f = axis === 0 ? FR : FC;
    const n = axis === 0 ? LQ : LK;
    return [i * f, Math.min(n, (i + 1) * f) - 1];
  }

  /** The labels of an axis (0: queries, 1: keys) of the map shown: its grid row's own (a batch entry's
   * tokens) where the page has labels per row, else the page's. */
  function labelsOf(axis) {
    const rows = axis === 0 ? data.qLabelRows : data.kLabelRows;
    const m = typeof current === "number" && current >= 0 ? data.maps[current] : data.maps[0];
    if (rows && m && rows[m.row]) return rows[m.row];
    return axis === 0 ? data.qLabels : data.kLabels;
  }

  function label(axis, pos) {
    const labels = labelsOf(axis);
    return labels ? labels[pos] : null;
  }

  // ------------------------------------------------------------------------------------------
  // header

  const header = el("header", { className: "head" }, [
    el("h1", { text: data.title }),
    data.subtitle ? el("p", { className: "subtitle", text: data.subtitle }) : null,
  ]);
  for (const note of data.notes) header.appendChild(el("p", { className: "note", text: note }));
  app.appendChild(header);

  if (!data.maps.length) {
    app.appendChild(el("p", { className: "note", text: "No maps to show." }));
    return;
  }

  // ------------------------------------------------------------------------------------------
  // the grid of thumbnails

  const gridTitle = data.rowName && data.colName ? data.rowName + " \u00d7 " + data.colName
    : (data.colName || data.rowName || "maps");
  const overview = el("section", { className: "card overview", id: "overview" }, [
    el("h2", { text: "Maps: " + gridTitle }),
    el("p", { className: "hint", text: "Click a thumbnail to open its map." }),
  ]);
  overview.appendChild(colourBar());
  const grid = el("div", { className: "grid", id: "grid", role: "grid" });
  grid.style.gridTemplateColumns = "auto repeat(" + data.cols + ", var(--thumb-w))";
  grid.appendChild(el("div", { className: "corner", text: data.rowName ? data.rowName + " \\ " + data.colName : data.colName }));
  for (const name of data.colLabels) grid.appendChild(el("div", { className: "collabel", text: name }));
  const slots = new Map();
  data.maps.forEach(function (m, n) { slots.set(m.row + "," + m.col, n); });
  const thumbs = [];
  for (let r = 0; r < data.rows; r++) {
    grid.appendChild(el("div", { className: "rowlabel", text: data.rowLabels[r] }));
    for (let c = 0; c < data.cols; c++) {
      const n = slots.get(r + "," + c);
      if (n === undefined) {
        grid.appendChild(el("div", { className: "empty" }));
        continue;
      }
      const button = el("button", {
        type: "button", className: "thumb", "data-map": String(n), title: data.maps[n].name,
        "aria-label": data.maps[n].name, onclick: function () { select(n); },
      }, [thumbnail(data.maps[n].thumb)]);
      thumbs[n] = button;
      grid.appendChild(button);
    }
  }
  overview.appendChild(el("div", { className: "gridwrap" }, [grid]));

  /** A thumbnail: a canvas of one pixel a cell, coloured from its colour indices. */
  function thumbnail(b64) {
    const index = bytes(b64);
    const h = data.thumbCells[0], w = data.thumbCells[1];
    const canvas = el("canvas", { width: String(w), height: String(h), "aria-hidden": "true" });
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(w, h);
    for (let i = 0; i < w * h; i++) {
      const k = index[i];
      const col = k >= LEVELS ? BAD : [lut[3 * k], lut[3 * k + 1], lut[3 * k + 2]];
      img.data[4 * i] = col[0];
      img.data[4 * i + 1] = col[1];
      img.data[4 * i + 2] = col[2];
      img.data[4 * i + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    return canvas;
  }

  function sizeThumbs() {
    const labels = grid.querySelector(".rowlabel");
    const avail = Math.max(200, overview.clientWidth - 34 - (labels ? labels.offsetWidth : 40));
    const w = Math.max(36, Math.min(112, Math.floor(avail / data.cols) - 4));  // 4: the gap
    const ratio = data.thumbCells[0] / Math.max(1, data.thumbCells[1]);
    const h = Math.max(24, Math.min(3 * w, Math.round(w * ratio)));
    grid.style.setProperty("--thumb-w", w + "px");
    grid.style.setProperty("--thumb-h", h + "px");
    grid.classList.toggle("upscaled", w >= data.thumbCells[1]);
  }

  function colourBar() {
    const bar = el("canvas", { className: "colourbar", width: String(LEVELS), height: "1", "aria-hidden": "true" });
    const ctx = bar.getContext("2d");
    const img = ctx.createImageData(LEVELS, 1);
    for (let i = 0; i < LEVELS; i++) {
      img.data.set([lut[3 * i], lut[3 * i + 1], lut[3 * i + 2], 255], 4 * i);
    }
    ctx.putImageData(img, 0, 0);
    const mid = (scale.vmin + scale.vmax) / 2;
    return el("div", { className: "legend" }, [
      el("span", { className: "legend-label", text: scale.label }),
      el("span", { className: "num", text: fmt(scale.vmin) }),
      bar,
      el("span", { className: "num", text: fmt(scale.vmax) }),
      el("span", { className: "legend-mid", text: "(middle " + fmt(mid) + "), one scale for every map" }),
      scale.masked ? el("span", { className: "swatch" }) : null,
      scale.masked ? el("span", { className: "legend-mid", text: "masked" }) : null,
    ]);
  }

  // ------------------------------------------------------------------------------------------
  // one map, large, with labels and hover

  const detailTitle = el("h2", { id: "detail-title" });
  const detailNote = el("p", { className: "note", hidden: aggregated ? null : "" });
  if (aggregated) {
    detailNote.textContent = "[" + LQ + ", " + LK + "] aggregated in blocks of " + FR + "\u00d7" + FC +
      " positions (" + data.reduce + " of each block); hover a cell for the positions it covers.";
  }
  const canvas = el("canvas", { id: "map", "aria-label": "attention map; hover a cell to read it" });
  const overlay = el("canvas", { id: "map-overlay", "aria-hidden": "true" });
  const canvasWrap = el("div", { className: "canvaswrap" }, [canvas, overlay]);
  const what = data.scale.diverging ? data.scale.label : (aggregated ? "block " + data.reduce : data.scale.label);
  const readout = el("div", { className: "readout", id: "readout", "aria-live": "polite" }, [
    el("span", { className: "k", text: data.qName }),
    el("span", { id: "readout-query" }, [el("span", { className: "pos" }), el("span", { className: "tok" })]),
    el("span", { className: "arrow", text: "\u2192" }),
    el("span", { className: "k", text: data.kName }),
    el("span", { id: "readout-key" }, [el("span", { className: "pos" }), el("span", { className: "tok" })]),
    el("span", { className: "k", id: "readout-what", text: what }),
    el("span", { className: "value num", id: "readout-weight", text: "\u2013" }),
  ]);
  const tooltip = el("div", { className: "tooltip", id: "tooltip", role: "tooltip" });
  const axes = el("p", { className: "hint", text: "rows: " + data.qName + " \u00b7 columns: " + data.kName +
    " \u00b7 hover a cell to read it" });
  const detail = el("section", { className: "card detail", id: "detail" },
    [detailTitle, detailNote, axes, canvasWrap, readout]);
  const top = el("div", { className: "top" }, [overview, detail]);
  app.appendChild(top);
  document.body.appendChild(tooltip);

  let current = -1;
  let geometry = null;

  /** Tick labels of an axis: which cells get one and what it says. */
  function ticks(axis, count, cell) {
    const step = Math.max(1, Math.ceil(13 / cell));
    const out = [];
    for (let i = 0; i < count; i += step) {
      const first = span(axis, i)[0];
      const token = label(axis, first);
      let text;
      if ((axis === 0 ? FR : FC) > 1 || token === null) text = String(first);
      else text = step > 1 ? first + ":" + token : token;
      out.push([i, shorten(text, 20)]);
    }
    return out;
  }

  function drawDetail() {
    const n = current;
    const v = values(n);
    const ctx = canvas.getContext("2d");
    ctx.font = FONT;
    const avail = Math.max(240, detail.clientWidth - 40);
    let cell = Math.min(44, Math.max(1, Math.floor(avail / (C + 8))));
    const rowTicks0 = ticks(0, R, cell), colTicks0 = ticks(1, C, cell);
    const widest = function (list) {
      let w = 0;
      for (const t of list) w = Math.max(w, ctx.measureText(t[1]).width);
      return Math.ceil(w);
    };
    const left = Math.min(150, widest(rowTicks0)) + 10;
    const topMargin = Math.min(150, widest(colTicks0)) + 10;
    cell = Math.min(44, Math.max(1, Math.floor((avail - left) / C)));
    if (R * cell > 720) cell = Math.max(1, Math.min(cell, Math.floor(720 / R)));
    const rowTicks = ticks(0, R, cell), colTicks = ticks(1, C, cell);
    const width = left + C * cell + 8, height = topMargin + R * cell + 8;
    const dpr = window.devicePixelRatio || 1;
    for (const c of [canvas, overlay]) {
      c.width = Math.round(width * dpr);
      c.height = Math.round(height * dpr);
      c.style.width = width + "px";
      c.style.height = height + "px";
    }
    geometry = { left: left, top: topMargin, cell: cell, dpr: dpr };
    canvas.dataset.left = String(left);
    canvas.dataset.top = String(topMargin);
    canvas.dataset.cell = String(cell);
    canvas.dataset.rows = String(R);
    canvas.dataset.cols = String(C);

    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const off = document.createElement("canvas");
    off.width = C;
    off.height = R;
    const octx = off.getContext("2d");
    const img = octx.createImageData(C, R);
    for (let i = 0; i < R * C; i++) {
      const col = rgb(v[i]);
      img.data[4 * i] = col[0];
      img.data[4 * i + 1] = col[1];
      img.data[4 * i + 2] = col[2];
      img.data[4 * i + 3] = 255;
    }
    octx.putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, left, topMargin, C * cell, R * cell);
    ctx.strokeStyle = "#9aa0a6";
    ctx.lineWidth = 1;
    ctx.strokeRect(left - 0.5, topMargin - 0.5, C * cell + 1, R * cell + 1);

    ctx.font = FONT;
    ctx.fillStyle = "#333";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const t of rowTicks) ctx.fillText(t[1], left - 5, topMargin + (t[0] + 0.5) * cell);
    for (const t of colTicks) {
      ctx.save();
      ctx.translate(left + (t[0] + 0.5) * cell, topMargin - 5);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(t[1], 0, 0);
      ctx.restore();
    }
    if (cell >= 34 && !aggregated) { // small maps: the values in the cells
      ctx.textAlign = "center";
      ctx.font = "10px " + FONT.split("px ")[1];
      for (let i = 0; i < R; i++) {
        for (let j = 0; j < C; j++) {
          const x = v[i * C + j];
          if (Number.isNaN(x)) continue;
          const col = rgb(x);
          const light = 0.299 * col[0] + 0.587 * col[1] + 0.114 * col[2] > 140;
          ctx.fillStyle = light ? "#111" : "#fff";
          ctx.fillText(x.toFixed(2), left + (j + 0.5) * cell, topMargin + (i + 0.5) * cell);
        }
      }
    }
    clearHover();
  }

  function setAxis(id, axis, i) {
    const node = document.getElementById(id);
    const s = span(axis, i);
    const token = s[0] === s[1] ? label(axis, s[0]) : null;
    node.querySelector(".pos").textContent = s[0] === s[1] ? String(s[0]) : s[0] + "\u2013" + s[1];
    node.querySelector(".tok").textContent = token === null ? "" : token;
    return (s[0] === s[1] ? String(s[0]) : s[0] + "\u2013" + s[1]) + (token === null ? "" : " " + token);
  }

  function showHover(i, j, event) {
    const v = values(current)[i * C + j];
    const q = setAxis("readout-query", 0, i);
    const k = setAxis("readout-key", 1, j);
    document.getElementById("readout-weight").textContent = fmt(v);
    readout.classList.add("active");
    tooltip.replaceChildren(
      el("div", null, [el("span", { className: "k", text: data.qName + " " }), el("span", { text: q })]),
      el("div", null, [el("span", { className: "k", text: data.kName + " " }), el("span", { text: k })]),
      el("div", { className: "num big", text: (aggregated && !scale.diverging ? data.reduce + " " : "") + fmt(v) }));
    tooltip.style.display = "block";
    const x = Math.min(event.clientX + 14, window.innerWidth - tooltip.offsetWidth - 6);
    const y = Math.min(event.clientY + 14, window.innerHeight - tooltip.offsetHeight - 6);
    tooltip.style.left = x + "px";
    tooltip.style.top = y + "px";
    const g = geometry;
    const ctx = overlay.getContext("2d");
    ctx.setTransform(g.dpr, 0, 0, g.dpr, 0, 0);
    ctx.clearRect(0, 0, overlay.width, overlay.height);
    ctx.fillStyle = "rgba(255, 255, 255, 0.18)";
    ctx.fillRect(g.left, g.top + i * g.cell, C * g.cell, g.cell);
    ctx.fillRect(g.left + j * g.cell, g.top, g.cell, R * g.cell);
    const s = Math.max(g.cell, 3);
    const x0 = g.left + j * g.cell - (s - g.cell) / 2, y0 = g.top + i * g.cell - (s - g.cell) / 2;
    ctx.lineWidth = 2;
    ctx.strokeStyle = "#000";
    ctx.strokeRect(x0 - 1, y0 - 1, s + 2, s + 2);
    ctx.lineWidth = 1;
    ctx.strokeStyle = "#fff";
    ctx.strokeRect(x0 - 2.5, y0 - 2.5, s + 5, s + 5);
  }

  function clearHover() {
    tooltip.style.display = "none";
    readout.classList.remove("active");
    if (geometry) {
      const ctx = overlay.getContext("2d");
      ctx.setTransform(1, 0, 0, 1, 0, 0);
      ctx.clearRect(0, 0, overlay.width, overlay.height);
    }
  }

  canvas.addEventListener("mousemove", function (event) {
    if (!geometry) return;
    const rect = canvas.getBoundingClientRect();
    const x = event.clientX - rect.left - geometry.left;
    const y = event.clientY - rect.top - geometry.top;
    const j = Math.floor(x / geometry.cell), i = Math.floor(y / geometry.cell);
    if (x < 0 || y < 0 || i >= R || j >= C) {
      clearHover();
      return;
    }
    showHover(i, j, event);
  });
  canvas.addEventListener("mouseleave", clearHover);

  // ------------------------------------------------------------------------------------------
  // the head view: tokens in two columns, lines from a query token to the keys it attends to

  const ROW = 18;
  const headSelect = el("select", { id: "head-select", "aria-label": "map of the head view" });
  data.maps.forEach(function (m, n) { headSelect.appendChild(el("option", { value: String(n), text: m.name })); });
  headSelect.addEventListener("change", function () { select(Number(headSelect.value)); });
  const hvCanvas = el("canvas", { className: "hv-lines", id: "hv-lines", "aria-hidden": "true" });
  const hvLeft = el("div", { className: "hv-col hv-left" });
  const hvRight = el("div", { className: "hv-col hv-right" });
  const hvInfo = el("p", { className: "hint", id: "hv-info" });
  const headView = el("section", { className: "card", id: "headview" }, [
    el("h2", { text: "Head view" }),
  ]);
  let pinned = null, hovered = null;
  if (data.headView.enabled) {
    headView.appendChild(el("div", { className: "controls" }, [el("label", { for: "head-select", text: "map " }), headSelect]));
    headView.appendChild(el("p", { className: "hint", text: "Hover a " + data.qName + " token on the left to see the " +
      data.kName + " tokens it attends to; click to keep it. " + (scale.diverging
      ? "Line opacity is |" + scale.label + "| over the largest, red above 0, blue below."
      : "Line opacity is the weight.") }));
    const leftTokens = [], rightTokens = [];
    for (let i = 0; i < LQ; i++) {
      const t = el("div", { className: "hv-token", title: data.qName + " " + i, "data-pos": String(i),
        text: label(0, i) === null ? String(i) : label(0, i) });
      t.addEventListener("mouseenter", function () { hovered = i; drawHeadView(); });
      t.addEventListener("mouseleave", function () { hovered = null; drawHeadView(); });
      t.addEventListener("click", function () { pinned = pinned === i ? null : i; drawHeadView(); });
      leftTokens.push(t);
      hvLeft.appendChild(t);
    }
    for (let j = 0; j < LK; j++) {
      const t = el("div", { className: "hv-token", title: data.kName + " " + j, "data-pos": String(j),
        text: label(1, j) === null ? String(j) : label(1, j) });
      rightTokens.push(t);
      hvRight.appendChild(t);
    }
    headView.appendChild(hvInfo);
    headView.appendChild(el("div", { className: "hv" }, [hvLeft, hvCanvas, hvRight]));
    headView.leftTokens = leftTokens;
    headView.rightTokens = rightTokens;
  } else {
    headView.appendChild(el("p", { className: "note", text: "The head view is drawn for maps of at most " +
      data.headView.max + " tokens a side at full resolution; these are [" + LQ + ", " + LK + "]" +
      (aggregated ? ", aggregated" : "") + ". The map above reads every cell." }));
  }
  app.appendChild(headView);

  function drawHeadView() {
    if (!data.headView.enabled || current < 0) return;
    const v = values(current);
    const chosen = hovered !== null ? hovered : pinned;
    const width = 240, height = Math.max(LQ, LK) * ROW;
    const dpr = window.devicePixelRatio || 1;
    hvCanvas.width = Math.round(width * dpr);
    hvCanvas.height = Math.round(height * dpr);
    hvCanvas.style.width = width + "px";
    hvCanvas.style.height = height + "px";
    const ctx = hvCanvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.lineWidth = chosen === null ? 1.2 : 2;
    const top = scale.diverging ? Math.max(Math.abs(scale.vmin), Math.abs(scale.vmax)) || 1 : 1;
    const rows = chosen === null ? [...Array(LQ).keys()] : [chosen];
    for (const i of rows) {
      for (let j = 0; j < LK; j++) {
        const w = v[i * LK + j];
        if (Number.isNaN(w)) continue;
        const alpha = Math.min(1, Math.abs(w) / top);
        if (alpha < 0.01) continue;
        const colour = scale.diverging ? (w > 0 ? "178, 24, 43" : "33, 102, 172") : "59, 91, 219";
        ctx.strokeStyle = "rgba(" + colour + ", " + alpha.toFixed(3) + ")";
        ctx.beginPath();
        ctx.moveTo(0, (i + 0.5) * ROW);
        ctx.lineTo(width, (j + 0.5) * ROW);
        ctx.stroke();
      }
    }
    headView.leftTokens.forEach(function (t, i) {
      t.classList.toggle("chosen", i === chosen);
      t.classList.toggle("pinned", i === pinned);
    });
    headView.rightTokens.forEach(function (t, j) {
      if (chosen === null) {
        t.style.backgroundColor = "";
        return;
      }
      const w = v[chosen * LK + j];
      const alpha = Number.isNaN(w) ? 0 : Math.min(1, Math.abs(w) / top);
      const colour = scale.diverging ? (w > 0 ? "178, 24, 43" : "33, 102, 172") : "59, 91, 219";
      t.style.backgroundColor = "rgba(" + colour + ", " + (0.6 * alpha).toFixed(3) + ")";
    });
    if (chosen === null) {
      hvInfo.textContent = data.maps[current].name + ": every " + data.qName + " token's lines.";
    } else {
      let best = 0;
      for (let j = 1; j < LK; j++) if (v[chosen * LK + j] > v[chosen * LK + best]) best = j;
      const token = label(0, chosen), bestToken = label(1, best);
      hvInfo.textContent = data.maps[current].name + ": " + data.qName + " " + chosen +
        (token === null ? "" : " " + token) + "; largest " + fmt(v[chosen * LK + best]) + " on " + data.kName +
        " " + best + (bestToken === null ? "" : " " + bestToken) + (pinned !== null ? " (click it again to let go)" : "");
    }
  }

  // ------------------------------------------------------------------------------------------
  // the statistics table, sortable

  let statRows = [];
  if (data.stats) {
    const s = data.stats;
    const table = el("table", { id: "stats-table", className: "stats" });
    const headRow = el("tr");
    const heads = [];
    s.columns.forEach(function (col, k) {
      const button = el("button", { type: "button", title: col.description ? "sort by " + col.description : "sort" },
        [el("span", { text: col.name }), el("span", { className: "arrow" })]);
      const th = el("th", { scope: "col", className: col.kind === "text" ? "text" : "numeric", "aria-sort": "none" }, [button]);
      button.addEventListener("click", function () { sortBy(k); });
      heads.push(th);
      headRow.appendChild(th);
    });
    table.appendChild(el("thead", null, [headRow]));
    const body = el("tbody");
    statRows = s.rows.map(function (row, r) {
      const tr = el("tr", { "data-map": s.maps[r] === null ? null : String(s.maps[r]) });
      row.forEach(function (value, k) {
        const kind = s.columns[k].kind;
        let text;
        if (value === null) text = "\u2013";
        else if (kind === "num") text = value.toFixed(s.precision);
        else text = String(value);
        tr.appendChild(el("td", { className: kind === "text" ? "text" : "numeric", text: text }));
      });
      if (s.maps[r] !== null) {
        tr.classList.add("link");
        tr.addEventListener("click", function () { select(s.maps[r]); });
      }
      body.appendChild(tr);
      return { tr: tr, row: row, order: r, map: s.maps[r] };
    });
    table.appendChild(body);
    let sortState = { col: -1, dir: 1 };
    function sortBy(k) {
      const kind = s.columns[k].kind;
      const dir = sortState.col === k ? -sortState.dir : (kind === "num" ? -1 : 1);
      sortState = { col: k, dir: dir };
      statRows.sort(function (a, b) {
        const x = a.row[k], y = b.row[k];
        if (x === null && y === null) return a.order - b.order;
        if (x === null) return 1;
        if (y === null) return -1;
        const c = kind === "text" ? String(x).localeCompare(String(y), undefined, { numeric: true }) : x - y;
        return c !== 0 ? dir * c : a.order - b.order;
      });
      for (const item of statRows) body.appendChild(item.tr);
      heads.forEach(function (th, i) {
        th.setAttribute("aria-sort", i === k ? (dir > 0 ? "ascending" : "descending") : "none");
        th.querySelector(".arrow").textContent = i === k ? (dir > 0 ? " \u25b2" : " \u25bc") : "";
      });
    }
    if (s.sort !== null && s.sort !== undefined) sortBy(s.sort);  // e.g. compare: the largest difference first
    const section = el("section", { className: "card", id: "stats" }, [
      el("h2", { text: s.title }),
      el("p", { className: "hint", text: "Click a column header to sort (again to reverse); click a row to open its map." }),
      el("div", { className: "tablewrap" }, [table]),
      s.caption ? el("p", { className: "caption", text: s.caption }) : null,
    ]);
    app.appendChild(section);
  }

  app.appendChild(el("footer", { text: "attnviz " + data.attnviz + " \u00b7 a self-contained page: no network, " +
    "every number is in this file." }));

  // ------------------------------------------------------------------------------------------
  // choosing a map

  function select(n) {
    if (n < 0 || n >= data.maps.length) return;
    if (thumbs[current]) thumbs[current].classList.remove("selected");
    current = n;
    if (thumbs[n]) {
      thumbs[n].classList.add("selected");
      thumbs[n].setAttribute("aria-pressed", "true");
    }
    thumbs.forEach(function (t, k) { if (t && k !== n) t.setAttribute("aria-pressed", "false"); });
    detailTitle.textContent = data.maps[n].name;
    headSelect.value = String(n);
    if (headView.leftTokens) {  // a batch entry's own tokens, where the rows have their own
      headView.leftTokens.forEach(function (t, i) { t.textContent = label(0, i) === null ? String(i) : label(0, i); });
      headView.rightTokens.forEach(function (t, j) { t.textContent = label(1, j) === null ? String(j) : label(1, j); });
    }
    for (const item of statRows) item.tr.classList.toggle("selected", item.map === n);
    drawDetail();
    drawHeadView();
    document.body.dataset.selected = String(n);
  }

  let resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { sizeThumbs(); drawDetail(); }, 100);
  });
  sizeThumbs();
  select(data.selected || 0);
  document.body.dataset.ready = "true";
})();
