/*
 * attnviz HTML report, the image panel (inspect --html with --image): the picture the model saw, and over
 * it one query's attention over the patches of the overlay's layer. Hovering a patch shows that patch's
 * own row (its attention over the other patches); hovering a token outside the image (CLS, registers, a
 * vision-language model's text token) shows its row; leaving shows the --query row again.
 *
 * The data (attnviz/render/html.py, image_panel): image = {src (a data: URI of the PNG, or null), size
 * [H, W], grid [gh, gw], start, count (the patches are key positions start .. start + count - 1, row
 * major), layer, choices (["mean of heads", "head 0", ...]), rows (the query positions held), query,
 * patchRows (whether the patches' own rows are held), tokens [{pos, label}], describe, notes,
 * data (base64 of little-endian float32 [choices, rows, count])}.
 *
 * Labels reach the page through textContent only. Colours: the page's colour table, each row from 0 to
 * its own largest weight (the panel says so). The map canvas lies over the picture at half opacity.
 */
"use strict";

(function () {
  const data = JSON.parse(document.getElementById("attnviz-data").textContent);
  const image = data.image;
  const app = document.getElementById("app");
  if (!image) return;
  const GH = image.grid[0], GW = image.grid[1], N = image.count;
  const raw = atob(image.data);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  const view = new DataView(bytes.buffer);
  const rowIndex = new Map();
  image.rows.forEach(function (p, i) { rowIndex.set(p, i); });
  const lutRaw = atob(data.scale.lut);
  const LEVELS = lutRaw.length / 3;

  function el(tag, props, children) {
    const node = document.createElement(tag);
    for (const key of Object.keys(props || {})) {
      const value = props[key];
      if (value === undefined || value === null) continue;
      if (key === "text") node.textContent = value;
      else if (key === "className") node.className = value;
      else node.setAttribute(key, value);
    }
    for (const child of children || []) if (child) node.appendChild(child);
    return node;
  }

  function fmt(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    return a >= 1e-3 && a < 1e5 ? v.toPrecision(4) : v.toExponential(3);
  }

  /** The row of query position ``pos`` over the patches, for choice ``c``, or null when not held. */
  function row(c, pos) {
    const r = rowIndex.get(pos);
    if (r === undefined) return null;
    const out = new Float32Array(N);
    const base = 4 * (c * image.rows.length + r) * N;
    for (let j = 0; j < N; j++) out[j] = view.getFloat32(base + 4 * j, true);
    return out;
  }

  // the panel
  const section = el("section", { className: "card image-panel", id: "image-panel" }, [
    el("h2", { text: "Image: attention over the patches, layer " + image.layer }),
    el("p", { className: "hint", text: "Hover a patch to see its attention over the other patches; hover a token " +
      "outside the image to see its attention over the image. Colours: each row from 0 to its own largest weight." }),
    el("p", { className: "note", text: image.describe }),
  ]);
  for (const note of image.notes) section.appendChild(el("p", { className: "note", text: note }));
  const choice = el("select", { id: "image-head", "aria-label": "heads of the image panel" });
  image.choices.forEach(function (name, c) { choice.appendChild(el("option", { value: String(c), text: name })); });
  section.appendChild(el("label", { className: "image-choice", text: "Heads: " }, [choice]));

  const H = image.size ? image.size[0] : GH * 16, W = image.size ? image.size[1] : GW * 16;
  const factor = 448 / Math.max(H, W);  // the longer side 448 pixels on the page
  const width = Math.max(1, Math.round(W * factor)), height = Math.max(1, Math.round(H * factor));
  const stack = el("div", { className: "image-stack" });
  stack.style.width = width + "px";
  stack.style.height = height + "px";
  const pictureCanvas = el("canvas", { id: "image-picture", width: String(width), height: String(height) });
  const mapCanvas = el("canvas", { id: "image-map", width: String(width), height: String(height) });
  const markCanvas = el("canvas", { id: "image-mark", width: String(width), height: String(height) });
  stack.appendChild(pictureCanvas);
  stack.appendChild(mapCanvas);
  stack.appendChild(markCanvas);
  const readout = el("p", { className: "image-readout", id: "image-readout", "aria-live": "polite" });
  section.appendChild(el("div", { className: "image-body" }, [stack, readout]));
  const tokenList = el("div", { className: "image-tokens", id: "image-tokens" });
  for (const t of image.tokens) {
    const name = t.label === null ? String(t.pos) : t.label;
    const button = el("button", { type: "button", className: "image-token", "data-pos": String(t.pos),
      title: "position " + t.pos, text: name });
    button.addEventListener("mouseenter", function () { show(t.pos, null); });
    button.addEventListener("focus", function () { show(t.pos, null); });
    button.addEventListener("mouseleave", function () { show(image.query, null); });
    tokenList.appendChild(button);
  }
  if (image.tokens.length) {
    section.appendChild(el("p", { className: "hint", text: "Tokens outside the image:" }));
    section.appendChild(tokenList);
  }
  const footer = app.querySelector("footer");
  app.insertBefore(section, footer);

  const cellW = width / GW, cellH = height / GH;
  mapCanvas.dataset.cellw = String(cellW);
  mapCanvas.dataset.cellh = String(cellH);

  function patchName(k) {
    return "patch (" + Math.floor(k / GW) + ", " + (k % GW) + "), position " + (image.start + k);
  }

  function show(pos, hovered) {
    const c = Number(choice.value);
    const values = row(c, pos);
    const ctx = mapCanvas.getContext("2d");
    const mark = markCanvas.getContext("2d");
    ctx.clearRect(0, 0, width, height);
    mark.clearRect(0, 0, width, height);
    if (values === null) {
      readout.textContent = "position " + pos + ": not held in this page";
      return;
    }
    let top = 0, best = 0;
    for (let k = 0; k < N; k++) if (values[k] > top) { top = values[k]; best = k; }
    for (let k = 0; k < N; k++) {
      const t = top > 0 ? Math.min(1, Math.max(0, values[k] / top)) : 0;
      const li = 3 * Math.floor(t * (LEVELS - 1) + 0.5);
      ctx.fillStyle = "rgb(" + lutRaw.charCodeAt(li) + "," + lutRaw.charCodeAt(li + 1) + "," +
        lutRaw.charCodeAt(li + 2) + ")";
      const x0 = Math.round((k % GW) * cellW), y0 = Math.round(Math.floor(k / GW) * cellH);
      const x1 = Math.round((k % GW + 1) * cellW), y1 = Math.round((Math.floor(k / GW) + 1) * cellH);
      ctx.fillRect(x0, y0, x1 - x0, y1 - y0);
    }
    if (hovered !== null) {
      mark.strokeStyle = "#ffffff";
      mark.lineWidth = 2;
      mark.strokeRect((hovered % GW) * cellW + 1, Math.floor(hovered / GW) * cellH + 1, cellW - 2, cellH - 2);
    }
    const labels = data.qLabels;
    const who = hovered !== null ? patchName(hovered)
      : "position " + pos + (labels && labels[pos] !== undefined ? " " + labels[pos] : "");
    readout.textContent = "";
    readout.appendChild(el("span", { className: "image-query", id: "image-query", text: "query: " + who }));
    readout.appendChild(el("br"));
    readout.appendChild(el("span", { id: "image-best", "data-patch": String(best),
      text: "largest: " + patchName(best) + ", weight " + fmt(top) }));
    mapCanvas.dataset.query = String(pos);
    mapCanvas.dataset.best = String(best);
  }

  markCanvas.addEventListener("mousemove", function (event) {
    if (!image.patchRows) return;
    const rect = markCanvas.getBoundingClientRect();
    const j = Math.min(GW - 1, Math.max(0, Math.floor((event.clientX - rect.left) / rect.width * GW)));
    const i = Math.min(GH - 1, Math.max(0, Math.floor((event.clientY - rect.top) / rect.height * GH)));
    const k = i * GW + j;
    if (markCanvas.dataset.hovered !== String(k)) {
      markCanvas.dataset.hovered = String(k);
      show(image.start + k, k);
    }
  });
  markCanvas.addEventListener("mouseleave", function () {
    delete markCanvas.dataset.hovered;
    show(image.query, null);
  });
  choice.addEventListener("change", function () { show(image.query, null); });

  function done() {
    show(image.query, null);
    document.body.dataset.imageReady = "true";
  }
  if (image.src) {
    const picture = new Image();
    picture.onload = function () {
      const ctx = pictureCanvas.getContext("2d");
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(picture, 0, 0, width, height);
      done();
    };
    picture.onerror = function () { readout.textContent = "the picture could not be drawn"; done(); };
    picture.src = image.src;
  } else {
    done();
  }
})();
