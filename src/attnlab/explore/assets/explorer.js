/* attnlab explorer: one self-contained attention viewer (no libraries, no network).
   The page's data sits in <script id="attnlab-data">; arrays are base64 float32 (row-major
   L x H x Tq x Tk). Every view draws on canvases, so "Save PNG" exports exactly what is shown. */
"use strict";
(function () {
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a"];
const MAX_LINKS = 3000;     // head view: strongest links drawn when nothing is hovered
const MIN_LINK = 0.005;     // weights below this are never drawn as links
const FONT = '12px system-ui, "WenQuanYi Micro Hei", "Noto Sans CJK SC", sans-serif';
let DATA = JSON.parse(document.getElementById("attnlab-data").textContent);
const S = { ex: 0, group: 0, layer: 0, heads: null, view: null, mask: false, step: 0, temp: 1,
  cell: null, scaleFrac: null, thumb: null };
const $ = (id) => document.getElementById(id);
const el = (tag, attrs, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "on") for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else if (k === "class") e.className = v; else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const kid of kids) e.append(kid);
  return e;
};

// ------------------------------------------------------------------ data access
function bytes(b64) {
  const bin = atob(b64), out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
function f32(b64) { return b64 ? new Float32Array(bytes(b64).buffer) : null; }
function arrays(g) {  // decoded lazily, once per group
  if (!g._w) { g._w = f32(g.weights); g._s = f32(g.scores); g._b = f32(g.bias); g._m = bytes(g.mask); }
  return g;
}
const example = () => DATA.examples[S.ex];
const group = () => arrays(example().groups[S.group]);
function weight(g, l, h, i, j) { return g._w[((l * g.heads + h) * g.tq + i) * g.tk + j]; }
// (Tq, Tk) weights of one layer averaged over the given heads
function headMean(g, l, heads) {
  const n = g.tq * g.tk, out = new Float32Array(n);
  for (const h of heads) {
    const off = (l * g.heads + h) * n;
    for (let k = 0; k < n; k++) out[k] += g._w[off + k] / heads.length;
  }
  return out;
}
function blockedKind(g, i, j) {  // 0 = may attend, 1 = causal, 2 = padding (or other mask)
  if (g._m[i * g.tk + j]) return 0;
  return g.causal && j > i + g.tk - g.tq ? 1 : 2;
}
function selectedHeads(g) {
  const hs = [...S.heads].filter((h) => h < g.heads).sort((a, b) => a - b);
  return hs.length ? hs : [0];
}

// ------------------------------------------------------------------ drawing helpers
function canvas(w, h, parent) {
  const dpr = Math.max(1, Math.min(window.devicePixelRatio || 1, 30000 / Math.max(w, h)));
  const c = el("canvas");
  c.width = Math.round(w * dpr); c.height = Math.round(h * dpr);
  c.style.width = w + "px"; c.style.height = h + "px";
  const ctx = c.getContext("2d");
  ctx.scale(dpr, dpr); ctx.font = FONT; ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, w, h);
  ctx.fillStyle = "#1d2330";
  if (parent) parent.append(c);
  return [c, ctx];
}
function ramp(v) {  // 0..1 -> white .. deep blue
  const t = Math.max(0, Math.min(1, v));
  return [Math.round(255 - 227 * t), Math.round(255 - 176 * t), Math.round(255 - 90 * t)];
}
function heatRamp(v) {  // 0..1 -> transparent .. yellow .. red, for image overlays
  const t = Math.max(0, Math.min(1, v));
  return [255, Math.round(230 - 200 * t), Math.round(60 - 60 * t), Math.round(255 * t)];
}
function clip(s, n) { s = String(s); return s.length > n ? s.slice(0, n - 1) + "…" : s; }
function short(tok, n) { tok = String(tok).replace(/\n/g, "⏎").replace(/ /g, "␣"); return tok.length > n ? tok.slice(0, n - 1) + "…" : tok; }
// A (rows, cols) matrix as an image, drawn scaled with smoothing off. Large matrices are
// max-pooled to at most `limit` pixels a side first (thumbnails of 1,000-token inputs).
function matrixImage(values, rows, cols, max, g, limit) {
  const fr = limit ? Math.max(1, Math.ceil(rows / limit)) : 1, fc = limit ? Math.max(1, Math.ceil(cols / limit)) : 1;
  const h = Math.ceil(rows / fr), w = Math.ceil(cols / fc);
  const pooled = fr * fc > 1 ? new Float32Array(h * w) : null;
  if (pooled) {
    for (let i = 0; i < rows; i++) {
      const base = Math.floor(i / fr) * w;
      for (let j = 0; j < cols; j++) { const k = base + Math.floor(j / fc), v = values[i * cols + j]; if (v > pooled[k]) pooled[k] = v; }
    }
  }
  const off = document.createElement("canvas"); off.width = w; off.height = h;
  const ctx = off.getContext("2d"), img = ctx.createImageData(w, h), d = img.data;
  const src = pooled || values, inv = 1 / max;
  for (let k = 0; k < h * w; k++) {
    let t = src[k] * inv; t = t < 0 ? 0 : t > 1 ? 1 : t;
    let r = 255 - 227 * t, gg = 255 - 176 * t, b = 255 - 90 * t;
    if (S.mask && g && !pooled) {
      const kind = blockedKind(g, Math.floor(k / cols), k % cols);
      if (kind === 1) { r = 214; gg = 228; b = 255; } else if (kind === 2) { r = 222; gg = 222; b = 222; }
    }
    d[4 * k] = r; d[4 * k + 1] = gg; d[4 * k + 2] = b; d[4 * k + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
  return off;
}
function maxOf(a) { let m = 1e-12; for (const v of a) if (v > m) m = v; return m; }

// ------------------------------------------------------------------ summary panel
function barList(probs, best) {
  const box = el("div", { class: "bars" });
  const items = Object.entries(probs).sort((a, b) => b[1] - a[1]).slice(0, 10);
  for (const [k, v] of items) {
    const bar = el("div", { class: "bar" }); bar.style.width = (100 * v).toFixed(1) + "%";
    box.append(el("span", { class: k === best ? "best" : "", text: clip(k, 24) }),
      el("div", {}, bar), el("span", { text: v.toFixed(3) }));
  }
  return box;
}
function renderSummary() {
  const ex = example(), box = $("summary");
  box.replaceChildren();
  const wrap = el("div", { class: "pred" });
  if (ex.prediction) {
    const p = ex.prediction;
    wrap.append(el("div", {}, el("div", { class: "kv", text: "prediction" }),
      el("div", { class: "big", id: "pred-label", text: `${p.label}  ${p.probs[p.label].toFixed(3)}` })),
    barList(p.probs, p.label));
    if (p.unknown_share !== undefined) {
      const share = `unknown tokens ${(100 * p.unknown_share).toFixed(0)}%`;
      wrap.append(p.out_of_reach
        ? el("div", { class: "warn", id: "pred-warning", text: `⚠ out of reach: ${p.warning}` })
        : el("div", { class: "kv", id: "pred-unknown", text: share }));
    }
  }
  if (ex.translation) {
    wrap.append(el("div", {}, el("div", { class: "kv", text: "source" }), el("div", { text: ex.input })),
      el("div", {}, el("div", { class: "kv", text: `translation (${ex.translation.decoder})` }),
        el("div", { class: "big", id: "translation", text: ex.translation.text })));
  }
  if (ex.generation) {
    const gen = ex.generation;
    const t = gen.temperature === 0 ? "greedy" : `temperature ${gen.temperature}`;
    wrap.append(el("div", {}, el("div", { class: "kv", text: `prompt + generated (${gen.steps.length} tokens, ${t})` }),
      el("div", {}, el("span", { class: "kv", text: ex.input }), el("b", { id: "generated", text: gen.text }))));
  }
  if (ex.similarity) {
    const box2 = el("div", {}, el("div", { class: "kv", text: "cosine similarity of sentence vectors" }));
    for (const s of ex.similarity) box2.append(el("div", { text: `${s.cosine.toFixed(3)}  ${s.text}` }));
    wrap.append(box2);
  }
  box.append(wrap);
}

// ------------------------------------------------------------------ tabs and controls
const VIEWS = {
  steps: ["Generation steps", renderSteps], image: ["Image", renderImage],
  gates: ["Channel / spatial gates", renderGates], head: ["Head view", renderHead],
  matrix: ["Matrix view", renderMatrix], scale: ["√d_k lesson", renderScale],
  tokens: ["Attention rollout", renderTokens],
  pieces: ["Which pieces moved the decision", renderPieces],
};
function viewsOf() {
  const k = DATA.kind;
  if (k === "cnn") return ["gates"];
  if (k === "gpt") return ["steps", "head", "matrix", "scale"];
  if (k === "translate") return ["matrix", "head", "scale"];
  if (k === "vit") return ["image", "matrix", "head", "scale"];
  if (DATA.examples.some((e) => e.attribution)) return ["pieces", "tokens", "head", "matrix", "scale"];
  return ["head", "matrix", "scale", "tokens"];
}
function renderTabs() {
  const nav = $("tabs"); nav.replaceChildren();
  for (const v of viewsOf()) {
    nav.append(el("button", { class: v === S.view ? "on" : "", "data-view": v, text: VIEWS[v][0],
      on: { click: () => { S.view = v; renderAll(); } } }));
  }
}
function renderControls() {
  const box = $("controls"); box.replaceChildren();
  const ex = example();
  if (ex.groups.length > 1) {
    const sel = el("select", { id: "group", on: { change: (e) => { S.group = +e.target.value; S.layer = 0; S.heads = null; S.cell = null; renderAll(); } } });
    ex.groups.forEach((g, i) => sel.append(el("option", { value: i, text: g.name })));
    sel.value = S.group;
    box.append(el("label", { text: "attention " }), sel);
  }
  if (ex.groups.length && S.view !== "pieces") {  // the pieces' scores span every layer and head
    const g = group();
    if (!S.heads) S.heads = new Set(Array.from({ length: g.heads }, (_, h) => h));
    const lay = el("select", { id: "layer", on: { change: (e) => { S.layer = +e.target.value; S.cell = null; renderView(); } } });
    for (let l = 0; l < g.layers; l++) lay.append(el("option", { value: l, text: `layer ${l + 1}` }));
    lay.value = S.layer;
    box.append(el("label", { text: "layer " }), lay);
    const heads = el("span", { class: "heads", id: "heads" });
    for (let h = 0; h < g.heads; h++) {
      const b = el("button", { "data-head": h, class: S.heads.has(h) ? "sel" : "", text: h + 1,
        title: "click: only this head; shift-click: add or remove it",
        on: { click: (e) => {
          if (e.shiftKey) { if (S.heads.has(h) && S.heads.size > 1) S.heads.delete(h); else S.heads.add(h); }
          else S.heads = new Set([h]);
          renderControls(); renderView();
        } } });
      b.style.borderColor = COLORS[h % COLORS.length]; b.style.color = S.heads.has(h) ? "#fff" : COLORS[h % COLORS.length];
      if (S.heads.has(h)) b.style.background = COLORS[h % COLORS.length];
      heads.append(b);
    }
    heads.append(el("button", { id: "all-heads", text: "all", on: { click: () => {
      S.heads = new Set(Array.from({ length: g.heads }, (_, h) => h)); renderControls(); renderView(); } } }));
    box.append(el("label", { text: "heads " }), heads);
    const mask = el("input", { type: "checkbox", id: "mask-toggle" });
    mask.checked = S.mask;
    mask.addEventListener("change", () => { S.mask = mask.checked; renderView(); });
    box.append(el("label", {}, mask, " show masks"));
  }
  box.append(el("button", { id: "save-png", text: "Save PNG", on: { click: savePng } }));
}
function savePng() {
  const shots = [...$("view").querySelectorAll("canvas")].filter((c) => c.offsetParent !== null && !c.dataset.noexport);
  if (!shots.length) return;
  const title = `${DATA.title} — ${VIEWS[S.view][0]}${example().groups.length ? " — " + describeSelection() : ""}`;
  const width = Math.max(600, ...shots.map((c) => c.width));
  const height = 30 + shots.reduce((s, c) => s + c.height + 10, 0);
  const out = document.createElement("canvas"); out.width = width; out.height = height;
  const ctx = out.getContext("2d");
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, width, height);
  ctx.fillStyle = "#1d2330"; ctx.font = "bold 15px system-ui, sans-serif"; ctx.fillText(title, 8, 20);
  let y = 30;
  for (const c of shots) { ctx.drawImage(c, 0, y); y += c.height + 10; }
  const a = el("a", { download: `attnlab-${DATA.kind}-${S.view}.png`, href: out.toDataURL("image/png") });
  document.body.append(a); a.click(); a.remove();
  window.lastPng = out.toDataURL("image/png").length;
}
function describeSelection() {
  const g = group();
  return `${g.name}, layer ${S.layer + 1}, heads ${selectedHeads(g).map((h) => h + 1).join(",")}`;
}

// ------------------------------------------------------------------ head view (bertviz-style)
function renderHead(view) {
  const g = group(), heads = selectedHeads(g);
  view.append(el("div", { class: "note", text: `${g.name}: each line joins a query token (left) to a key token (right); its opacity is the attention weight, its colour the head. Hover a token to isolate its links. ${g.note || ""}` }));
  const rows = Math.max(g.tq, g.tk), rowH = Math.max(4, Math.min(18, Math.floor(28000 / rows)));
  const W = 560, H = rows * rowH + 16, xl = 200, xr = 360;
  const scroll = el("div", { class: "scroll" }); view.append(scroll);
  const [c, ctx] = canvas(W, H, scroll);
  c.id = "head-canvas";
  const status = el("div", { id: "status" }); view.append(status);
  const y = (i) => 8 + i * rowH + rowH / 2;
  let focus = null;
  function links() {
    const out = [];
    for (const h of heads) {
      for (let i = 0; i < g.tq; i++) {
        if (focus && focus.side === "q" && focus.i !== i) continue;
        for (let j = 0; j < g.tk; j++) {
          if (focus && focus.side === "k" && focus.i !== j) continue;
          const w = weight(g, S.layer, h, i, j);
          if (w >= MIN_LINK) out.push([i, j, h, w]);
        }
      }
    }
    if (!focus && out.length > MAX_LINKS) { out.sort((a, b) => b[3] - a[3]); out.length = MAX_LINKS; }
    return out;
  }
  function draw() {
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    const ls = links();
    ctx.lineWidth = Math.max(1, Math.min(2, rowH / 8));
    let sig = 0;
    const queries = new Set();
    for (const [i, j, h, w] of ls) {
      ctx.strokeStyle = COLORS[h % COLORS.length]; ctx.globalAlpha = Math.min(1, w * (focus ? 1.2 : 0.9) + 0.02);
      ctx.beginPath(); ctx.moveTo(xl + 4, y(i)); ctx.lineTo(xr - 4, y(j)); ctx.stroke();
      sig += w * (1 + i * 31 + j * 17 + h * 7); queries.add(i);
    }
    ctx.globalAlpha = 1;
    if (rowH >= 8) {
      ctx.font = FONT; ctx.textBaseline = "middle";
      const qLabels = g.query_tokens, kLabels = g.key_tokens;
      for (let i = 0; i < g.tq; i++) {
        const on = focus && focus.side === "q" && focus.i === i;
        ctx.fillStyle = on ? "#1f6feb" : (qLabels[i] === "<pad>" ? "#aaa" : "#1d2330");
        ctx.textAlign = "right"; ctx.fillText(short(qLabels[i], 22), xl - 2, y(i));
      }
      for (let j = 0; j < g.tk; j++) {
        const on = focus && focus.side === "k" && focus.i === j;
        ctx.fillStyle = on ? "#1f6feb" : (kLabels[j] === "<pad>" ? "#aaa" : "#1d2330");
        ctx.textAlign = "left"; ctx.fillText(short(kLabels[j], 22), xr + 2, y(j));
      }
    }
    c.dataset.links = ls.length; c.dataset.queries = queries.size;
    c.dataset.signature = sig.toFixed(6); c.dataset.focus = focus ? `${focus.side}${focus.i}` : "";
  }
  c.addEventListener("mousemove", (e) => {
    const r = c.getBoundingClientRect(), x = e.clientX - r.left, i = Math.floor((e.clientY - r.top - 8) / rowH);
    const side = x < (xl + xr) / 2 ? "q" : "k", n = side === "q" ? g.tq : g.tk;
    const f = i >= 0 && i < n ? { side, i } : null;
    if (JSON.stringify(f) === JSON.stringify(focus)) return;
    focus = f; draw();
    status.textContent = f ? `${side === "q" ? "query" : "key"} ${f.i}: ${short((side === "q" ? g.query_tokens : g.key_tokens)[f.i], 40)}` : "";
  });
  c.addEventListener("mouseleave", () => { focus = null; draw(); status.textContent = ""; });
  draw();
}

// ------------------------------------------------------------------ matrix view (small multiples)
function renderMatrix(view) {
  const g = group();
  view.append(el("div", { class: "note", text: `${g.name}: every layer (row) × head (column), the last column the mean of the heads; rows = queries (${g.tq}), columns = keys (${g.tk}). Click a square to enlarge it. ${g.note || ""}` }));
  const size = Math.max(48, Math.min(110, Math.floor(760 / (g.heads + 1))));
  const grid = el("div", { class: "thumbs", id: "thumbs" });
  grid.style.gridTemplateColumns = `max-content repeat(${g.heads + 1}, ${size}px)`;
  grid.append(el("span"));
  for (let h = 0; h < g.heads; h++) grid.append(el("div", { class: "lab", text: `head ${h + 1}` }));
  grid.append(el("div", { class: "lab", text: "mean" }));
  if (!S.thumb || S.thumb.l >= g.layers) S.thumb = { l: g.layers - 1, h: g.heads };  // last layer, mean
  const all = Array.from({ length: g.heads }, (_, h) => h);
  for (let l = 0; l < g.layers; l++) {
    grid.append(el("div", { class: "lab", text: `layer ${l + 1}` }));
    for (let h = 0; h <= g.heads; h++) {
      const vals = h < g.heads ? g._w.subarray((l * g.heads + h) * g.tq * g.tk, (l * g.heads + h + 1) * g.tq * g.tk) : headMean(g, l, all);
      const [c, ctx] = canvas(size, Math.max(12, Math.round(size * Math.min(1, g.tq / g.tk))));
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(matrixImage(vals, g.tq, g.tk, maxOf(vals), g, 2 * size), 0, 0, size, Math.max(12, Math.round(size * Math.min(1, g.tq / g.tk))));
      c.dataset.layer = l; c.dataset.head = h < g.heads ? h : "mean"; c.dataset.noexport = "1";
      if (S.thumb.l === l && S.thumb.h === h) c.classList.add("sel");
      c.addEventListener("click", () => { S.thumb = { l, h }; S.layer = l; if (h < g.heads) S.heads = new Set([h]); renderControls(); renderView(); });
      grid.append(c);
    }
  }
  view.append(grid);
  const { l, h } = S.thumb;
  const vals = h < g.heads ? g._w.subarray((l * g.heads + h) * g.tq * g.tk, (l * g.heads + h + 1) * g.tq * g.tk) : headMean(g, l, all);
  view.append(el("h3", { text: `layer ${l + 1}, ${h < g.heads ? "head " + (h + 1) : "mean of heads"}` }));
  bigMatrix(view, g, vals, (i, j) => {
    const raw = g._s && h < g.heads ? `  raw q·k ${g._s[((l * g.heads + h) * g.tq + i) * g.tk + j].toFixed(3)}` : "";
    return raw;
  });
}
function maskLegend(view, g) {
  if (!S.mask) return;
  let causal = 0, pad = 0;
  for (let i = 0; i < g.tq; i++) for (let j = 0; j < g.tk; j++) { const k = blockedKind(g, i, j); if (k === 1) causal++; else if (k === 2) pad++; }
  const t = `masks shown: ${causal} cells blocked by the causal mask (pale blue: a query may not see later keys), ${pad} by the padding mask (grey: <pad> keys, or keys outside a local-attention window). Blocked weights are exactly 0.`;
  view.append(el("div", { class: "note", id: "mask-legend", text: causal + pad ? t : "no cell is masked in this input" + (g.causal ? "" : " (no causal mask, and each input is shown at its own length: no padding)") }));
}
// One enlarged (Tq, Tk) matrix with token labels, hover read-out; returns its canvas.
function bigMatrix(view, g, vals, extra, id) {
  maskLegend(view, g);
  const cell = Math.max(1, Math.min(26, Math.floor(640 / Math.max(g.tq, g.tk))));
  const labels = cell >= 9, padL = labels ? 110 : 4, padT = labels ? 90 : 4;
  const W = padL + g.tk * cell + 4, H = padT + g.tq * cell + 4;
  const scroll = el("div", { class: "scroll" }); view.append(scroll);
  const [c, ctx] = canvas(W, H, scroll);
  c.id = id || "matrix-canvas";
  const max = maxOf(vals);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(matrixImage(vals, g.tq, g.tk, max, g), padL, padT, g.tk * cell, g.tq * cell);
  if (labels) {
    ctx.font = FONT; ctx.fillStyle = "#1d2330"; ctx.textBaseline = "middle"; ctx.textAlign = "right";
    for (let i = 0; i < g.tq; i++) ctx.fillText(short(g.query_tokens[i], 14), padL - 4, padT + (i + 0.5) * cell);
    for (let j = 0; j < g.tk; j++) {
      ctx.save(); ctx.translate(padL + (j + 0.5) * cell, padT - 4); ctx.rotate(-Math.PI / 3);
      ctx.textAlign = "left"; ctx.fillText(short(g.key_tokens[j], 14), 0, 0); ctx.restore();
    }
  }
  const status = el("div", { id: "status", text: `colour: 0 (white) to ${max.toFixed(3)} (blue), the matrix's largest weight` });
  view.append(status);
  c.addEventListener("mousemove", (e) => {
    const r = c.getBoundingClientRect();
    const j = Math.floor((e.clientX - r.left - padL) / cell), i = Math.floor((e.clientY - r.top - padT) / cell);
    if (i < 0 || j < 0 || i >= g.tq || j >= g.tk) return;
    const kind = ["", "  [causal mask]", "  [padding mask]"][blockedKind(g, i, j)];
    status.textContent = `query ${i} ${short(g.query_tokens[i], 16)} → key ${j} ${short(g.key_tokens[j], 16)}: ${vals[i * g.tk + j].toFixed(4)}${extra ? extra(i, j) : ""}${kind}`;
  });
  return c;
}

// ------------------------------------------------------------------ the √d_k lesson
function renderScale(view) {
  const g = group(), h = selectedHeads(g)[0], l = S.layer;
  view.append(el("div", { class: "note", text: `Attention(Q,K,V) = softmax(QKᵀ·s + bias)V. The page keeps the raw scores q·k (before any scaling) of every head and recomputes the softmax of head ${h + 1}, layer ${l + 1} for the scale s you choose, from 1/d_k to 1 (d_k = ${g.d_k}). The model uses s = 1/√d_k = ${g.scale.toFixed(4)}. Without the scaling (s = 1) the scores' spread grows with d_k and softmax saturates: rows collapse onto one key and their entropy drops toward 0.` }));
  if (!g._s) { view.append(el("div", { class: "note", id: "no-scores", text: g.scores_note })); return; }
  const n = g.tq * g.tk, off = (l * g.heads + h) * n;
  const lo = Math.log(1 / g.d_k), hi = 0;
  if (S.scaleFrac === null) S.scaleFrac = (Math.log(g.scale) - lo) / (hi - lo);
  const box = el("div", { class: "lesson" }); view.append(box);
  const left = el("div"); box.append(left);
  const slider = el("input", { type: "range", id: "scale-slider", min: 0, max: 1000, step: 1 });
  slider.value = Math.round(S.scaleFrac * 1000);
  const label = el("div", { class: "big", id: "scale-label" });
  const summary = el("div", { id: "entropy-summary" });
  left.append(el("div", {}, el("span", { class: "kv", text: `1/d_k ` }), slider, el("span", { class: "kv", text: " 1" })), label, summary,
    el("button", { text: "model's scale 1/√d_k", id: "scale-reset", on: { click: () => { S.scaleFrac = (Math.log(g.scale) - lo) / (hi - lo); renderView(); } } }));
  const area = el("div"); box.append(area);
  const probs = new Float32Array(n), ent = new Float64Array(g.tq);
  function recompute(s) {
    let diff = 0;
    for (let i = 0; i < g.tq; i++) {
      let m = -Infinity;
      const z = new Float64Array(g.tk);
      for (let j = 0; j < g.tk; j++) {
        if (!g._m[i * g.tk + j]) { z[j] = -Infinity; continue; }
        z[j] = g._s[off + i * g.tk + j] * s + (g._b ? g._b[off + i * g.tk + j] : 0);
        if (z[j] > m) m = z[j];
      }
      let sum = 0;
      for (let j = 0; j < g.tk; j++) { z[j] = z[j] === -Infinity ? 0 : Math.exp(z[j] - m); sum += z[j]; }
      let H = 0;
      for (let j = 0; j < g.tk; j++) {
        const p = sum > 0 ? z[j] / sum : 0; probs[i * g.tk + j] = p;
        if (p > 0) H -= p * Math.log2(p);
        if (Math.abs(s - g.scale) < 1e-12) diff = Math.max(diff, Math.abs(p - g._w[off + i * g.tk + j]));
      }
      ent[i] = m === -Infinity ? 0 : H;
    }
    return diff;
  }
  function draw() {
    const s = Math.exp(lo + S.scaleFrac * (hi - lo));
    const diff = recompute(s);
    area.replaceChildren();
    const c = bigMatrix(area, g, probs, null, "scale-canvas");
    // entropy bars beside the rows
    const cell = Math.max(1, Math.min(26, Math.floor(640 / Math.max(g.tq, g.tk))));
    const padT = cell >= 9 ? 90 : 4;
    const [e, ectx] = canvas(170, parseFloat(c.style.height), null);
    e.id = "entropy-canvas";
    const maxH = Math.log2(Math.max(2, g.tk));
    ectx.fillStyle = "#6b7280"; ectx.fillText("row entropy (bits)", 4, padT > 20 ? padT - 10 : 10);
    for (let i = 0; i < g.tq; i++) {
      ectx.fillStyle = "#e8590c";
      ectx.fillRect(4, padT + i * cell + 0.1 * cell, 120 * ent[i] / maxH, Math.max(1, 0.8 * cell));
      if (cell >= 9) { ectx.fillStyle = "#1d2330"; ectx.fillText(ent[i].toFixed(2), 128, padT + (i + 0.7) * cell); }
    }
    const scroll = area.querySelector(".scroll");
    const pair = el("div", { class: "row" }); pair.style.alignItems = "flex-start";
    scroll.replaceWith(pair); pair.append(scroll, e);
    let mean = 0, rowMax = 0;
    for (let i = 0; i < g.tq; i++) {
      mean += ent[i] / g.tq;
      let m = 0; for (let j = 0; j < g.tk; j++) m = Math.max(m, probs[i * g.tk + j]); rowMax += m / g.tq;
    }
    label.textContent = `s = ${s.toPrecision(4)} = ${(s * Math.sqrt(g.d_k)).toPrecision(3)} / √d_k`;
    summary.textContent = `mean row entropy ${mean.toFixed(3)} bits (uniform over ${g.tk} keys: ${Math.log2(g.tk).toFixed(2)}), mean largest weight ${rowMax.toFixed(3)}` +
      (Math.abs(s - g.scale) < 1e-12 ? `; at the model's scale the recomputed weights match the model's: max |Δ| = ${diff.toExponential(1)}` : "");
    summary.dataset.meanEntropy = mean.toFixed(6);
    summary.dataset.entropies = Array.from(ent).map((v) => v.toFixed(4)).join(",");
  }
  slider.addEventListener("input", () => { S.scaleFrac = slider.value / 1000; draw(); });
  draw();
}

// ------------------------------------------------------------------ token attribution (rollout)
function chipsCanvas(view, tokens, values, title, highlight, id) {
  const W = 860, lineH = 26;
  const probe = document.createElement("canvas").getContext("2d"); probe.font = FONT;
  let x = 6, y = 34; const pos = [];
  for (const t of tokens) {
    const w = probe.measureText(short(t, 20)).width + 8;
    if (x + w > W - 6) { x = 6; y += lineH; }
    pos.push([x, y, w]); x += w + 3;
  }
  const [c, ctx] = canvas(W, y + lineH + 6, view);
  c.id = id;
  ctx.fillStyle = "#6b7280"; ctx.fillText(title, 6, 14);
  let lo = Infinity, hi = -Infinity;  // min-max, so near-uniform shares still differ
  for (const v of values) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  const scaled = (v) => (v - lo) / Math.max(hi - lo, 1e-12);
  tokens.forEach((t, k) => {
    const [px, py, w] = pos[k];
    const rgb = ramp(scaled(values[k]));
    ctx.fillStyle = `rgb(${rgb})`; ctx.fillRect(px, py - 2, w, lineH - 6);
    if (k === highlight) { ctx.strokeStyle = "#e8590c"; ctx.lineWidth = 2; ctx.strokeRect(px, py - 2, w, lineH - 6); }
    ctx.fillStyle = scaled(values[k]) > 0.55 ? "#fff" : "#1d2330"; ctx.textBaseline = "middle";
    ctx.fillText(short(t, 20), px + 4, py + (lineH - 6) / 2 - 2);
  });
  return c;
}
function renderTokens(view) {
  const ex = example();
  if (!ex.token_share) { view.append(el("div", { class: "note", text: "no attribution for this input" })); return; }
  const g = group(), n = ex.token_share.length, toks = g.query_tokens.slice(0, n);
  view.append(el("div", { class: "note", text: ex.share_note }));
  chipsCanvas(view, toks, ex.token_share, "token attribution (rollout): white = the smallest share, blue = the largest", -1, "tokens-canvas");
  const order = ex.token_share.map((v, i) => [v, i]).sort((a, b) => b[0] - a[0]).slice(0, 15);
  const [c, ctx] = canvas(520, 22 * order.length + 10, view);
  c.id = "share-bars";
  order.forEach(([v, i], r) => {
    ctx.fillStyle = "#1d2330"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
    ctx.fillText(`${i}: ${short(toks[i], 14)}`, 150, 12 + 22 * r);
    ctx.fillStyle = "#1f6feb"; ctx.fillRect(156, 5 + 22 * r, 300 * v / order[0][0], 14);
    ctx.fillStyle = "#1d2330"; ctx.textAlign = "left"; ctx.fillText(v.toFixed(3), 462, 12 + 22 * r);
  });
}

// ------------------------------------------------------------------ pieces (integrated gradients)
function renderPieces(view) {
  const a = example().attribution;
  if (!a) { view.append(el("div", { class: "note", text: "no piece attribution for this input" })); return; }
  view.append(el("div", { class: "note", text: `${a.note} Method: ${a.method}.` }));
  view.append(attnlabPieces(a, "en"));  // assets/pieces.js
}

// ------------------------------------------------------------------ GPT: generation steps
function renderSteps(view) {
  const ex = example(), gen = ex.generation, g = group(), heads = selectedHeads(g);
  if (S.step >= gen.steps.length) S.step = 0;
  view.append(el("div", { class: "note", text: `Click a generated token (or use ← →) to see, for that step, what the last token attended to when the model chose it (layer ${S.layer + 1}, mean of heads ${heads.map((h) => h + 1).join(",")}) and the model's top-10 next-token probabilities: softmax(logits / T), with T on the slider (T = 1: the model's own distribution).` }));
  const chips = el("div", { class: "chips", id: "step-chips" });
  gen.steps.forEach((st, k) => {
    const b = el("span", { "data-step": k, text: short(st.token, 16), on: { click: () => { S.step = k; renderView(); } } });
    b.style.background = k === S.step ? "#1f6feb" : "#eef2f7"; b.style.color = k === S.step ? "#fff" : "#1d2330";
    chips.append(b);
  });
  view.append(chips);
  const st = gen.steps[S.step], q = st.position - 1;
  const mean = headMean(g, S.layer, heads), row = Array.from(mean.subarray(q * g.tk, q * g.tk + st.position));
  const c = chipsCanvas(view, g.key_tokens.slice(0, st.position), row,
    `(white = least, blue = most attention) step ${S.step + 1}: choosing token ${st.position} "${short(st.token, 20)}" (p = ${st.prob.toFixed(3)}); query = token ${q} "${short(g.key_tokens[q], 16)}" (outlined)`, q, "step-canvas");
  c.dataset.step = S.step;
  // Temperature: softmax(logits / T) over the stored logits (Transformer Explainer's slider).
  const slider = el("input", { type: "range", id: "temp-slider", min: 5, max: 300, step: 5 });
  slider.value = Math.round(100 * S.temp);
  const tlabel = el("span", { id: "temp-label" });
  view.append(el("div", { class: "row" }, el("span", { class: "kv", text: "temperature" }), slider, tlabel));
  const [b, ctx] = canvas(620, 22 * 10 + 30, view);
  b.id = "topk-canvas";
  function draw() {
    const T = S.temp, m = Math.max(...st.logits);
    const e = st.logits.map((l) => Math.exp((l - m) / T)), z = e.reduce((a, v) => a + v, 0);
    const probs = e.map((v) => v / z);
    let H = 0; for (const p of probs) if (p > 0) H -= p * Math.log2(p);
    const order = probs.map((p, i) => [p, i]).sort((x, y) => y[0] - x[0]).slice(0, 10);
    tlabel.textContent = ` T = ${T.toFixed(2)}; entropy ${H.toFixed(2)} bits` + (gen.whole_vocab ? "" : ` (renormalised over the ${st.logits.length} most likely tokens)`);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, 620, 250);
    ctx.fillStyle = "#6b7280"; ctx.textAlign = "left"; ctx.fillText(`top-10 next tokens at temperature ${T.toFixed(2)}`, 6, 14);
    order.forEach(([p, i], r) => {
      const tok = st.candidates[i], chosen = tok === st.token;
      ctx.fillStyle = "#1d2330"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
      ctx.fillText(short(tok, 16), 150, 32 + 22 * r);
      ctx.fillStyle = chosen ? "#e8590c" : "#1f6feb"; ctx.fillRect(156, 25 + 22 * r, 300 * p / order[0][0], 14);
      ctx.fillStyle = "#1d2330"; ctx.textAlign = "left"; ctx.fillText(p.toFixed(3) + (chosen ? "  ← chosen" : ""), 462, 32 + 22 * r);
    });
    b.dataset.probs = order.map(([p]) => p.toFixed(6)).join(",");
  }
  slider.addEventListener("input", () => { S.temp = slider.value / 100; draw(); });
  draw();
}

// ------------------------------------------------------------------ ViT: attention over the image
function imageCanvas(ex, size, heat, alpha) {  // heat: Float32Array (grid*grid or h*w) or null
  const im = ex.image, px = bytes(im.pixels);
  const off = document.createElement("canvas"); off.width = im.width; off.height = im.height;
  const octx = off.getContext("2d"), img = octx.createImageData(im.width, im.height);
  for (let k = 0; k < im.width * im.height; k++) {
    const r = px[k * im.channels], gg = im.channels === 3 ? px[k * 3 + 1] : r, b = im.channels === 3 ? px[k * 3 + 2] : r;
    img.data.set([r, gg, b, 255], 4 * k);
  }
  octx.putImageData(img, 0, 0);
  const [c, ctx] = canvas(size, size);
  ctx.imageSmoothingEnabled = false; ctx.drawImage(off, 0, 0, size, size);
  if (heat) {
    const gsz = Math.round(Math.sqrt(heat.values.length));  // a square patch grid unless w, h given
    const hw = heat.w || gsz, hh = heat.h || gsz;
    const hc = document.createElement("canvas"); hc.width = hw; hc.height = hh;
    const hctx = hc.getContext("2d"), himg = hctx.createImageData(hw, hh);
    let lo = Infinity, hi = -Infinity;  // min-max: near-uniform maps still show their shape
    for (const v of heat.values) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    for (let k = 0; k < hw * hh; k++) himg.data.set(heatRamp((heat.values[k] - lo) / Math.max(hi - lo, 1e-12)), 4 * k);
    hctx.putImageData(himg, 0, 0);
    ctx.imageSmoothingEnabled = true; ctx.globalAlpha = alpha; ctx.drawImage(hc, 0, 0, size, size); ctx.globalAlpha = 1;
    c.dataset.overlay = "1";
  }
  return c;
}
function patchRow(g, ex, l, heads) {  // the class token's attention over the patches (or the mean row)
  const p = ex.patches, n = p.grid * p.grid, out = new Float32Array(n), mean = headMean(g, l, heads);
  if (p.cls) { for (let k = 0; k < n; k++) out[k] = mean[k + 1]; }
  else { for (let i = 0; i < g.tq; i++) for (let k = 0; k < n; k++) out[k] += mean[i * g.tk + k] / g.tq; }
  return out;
}
function labelled(text, c) { return el("div", {}, el("div", { class: "lab kv", text }), c); }
function renderImage(view) {
  const ex = example(), g = group(), heads = selectedHeads(g), p = ex.patches;
  view.append(el("div", { class: "note", text: `${p.note}, drawn over the image (${p.grid}×${p.grid} patches). Rollout: (A + I)/2 multiplied over all layers.` }));
  const row = el("div", { class: "row", id: "overlays" }); view.append(row);
  row.append(labelled("image", imageCanvas(ex, 224, null, 0)));
  row.append(labelled(`layer ${S.layer + 1}, heads ${heads.map((h) => h + 1).join(",")}`, imageCanvas(ex, 224, { values: patchRow(g, ex, S.layer, heads) }, 0.6)));
  row.append(labelled("rollout", imageCanvas(ex, 224, { values: f32(p.rollout) }, 0.6)));
  view.append(el("h3", { text: `every head of layer ${S.layer + 1}` }));
  const strip = el("div", { class: "row" }); view.append(strip);
  for (let h = 0; h < g.heads; h++) strip.append(labelled(`head ${h + 1}`, imageCanvas(ex, 112, { values: patchRow(g, ex, S.layer, [h]) }, 0.6)));
}

// ------------------------------------------------------------------ CNN: gates
function renderGates(view) {
  const ex = example();
  view.append(el("div", { class: "note", text: "What each residual block's attention module multiplies its features by: channel gates as bars (one per channel, 0..1), spatial gates drawn over the image (CBAM's map; for coordinate attention the channel-mean of g_h ⊗ g_w), with coordinate attention's row and column gates beside it." }));
  for (const gt of ex.gates) {
    view.append(el("h3", { text: `${gt.block}: ${gt.kind} (${gt.channels} channels, ${gt.h}×${gt.w})` }));
    const row = el("div", { class: "row" }); row.style.alignItems = "flex-start"; view.append(row);
    if (gt.channel) {
      const W = Math.max(200, Math.min(760, gt.channel.length * 6)), bw = W / gt.channel.length;
      const [c, ctx] = canvas(W, 110, row);
      c.className = "gate-bars";
      ctx.fillStyle = "#6b7280"; ctx.fillText("channel gate", 2, 10);
      gt.channel.forEach((v, k) => { ctx.fillStyle = "#1f6feb"; ctx.fillRect(k * bw, 105 - 90 * v, Math.max(1, bw - 1), 90 * v); });
    }
    if (gt.spatial) {
      const c = imageCanvas(ex, 168, { values: f32(gt.spatial), w: gt.w, h: gt.h }, 0.6);
      c.className = "gate-map"; row.append(labelled("spatial gate", c));
    }
    if (gt.rows) {
      for (const [name, vals] of [["row gate g_h", gt.rows], ["column gate g_w", gt.cols]]) {
        const [c, ctx] = canvas(170, 110, null);
        ctx.fillStyle = "#6b7280"; ctx.fillText(name, 2, 10);
        const bw = 168 / vals.length;
        vals.forEach((v, k) => { ctx.fillStyle = "#2ca02c"; ctx.fillRect(1 + k * bw, 105 - 90 * v, Math.max(1, bw - 1), 90 * v); });
        row.append(c);
      }
    }
  }
}

// ------------------------------------------------------------------ live mode
function renderLive() {
  const form = $("live"), live = DATA.live;
  if (!live) { form.hidden = true; return; }
  form.hidden = false; form.replaceChildren();
  const input = live.accepts === "image" ? el("input", { type: "file", accept: "image/*", id: "live-input" })
    : el("textarea", { id: "live-input", maxlength: live.max_chars, placeholder: live.placeholder || "type a text" });
  const err = el("span", { class: "err", id: "live-error" });
  form.append(el("div", { class: "kv", text: `live: ${live.hint}` }), input, " ", el("button", { type: "submit", id: "live-go", text: "Explore" }), " ", err);
  form.onsubmit = async (e) => {
    e.preventDefault(); err.textContent = "working…";
    let body;
    if (live.accepts === "image") {
      const file = input.files[0];
      if (!file) { err.textContent = "choose an image file first"; return; }
      body = { image: await new Promise((ok) => { const r = new FileReader(); r.onload = () => ok(r.result); r.readAsDataURL(file); }) };
    } else body = { inputs: [input.value] };
    try {
      const res = await fetch("api/explore", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      const out = await res.json();
      if (!res.ok) { err.textContent = out.error || `error ${res.status}`; return; }
      DATA = out; S.ex = 0; S.group = 0; S.layer = 0; S.heads = null; S.step = 0; S.scaleFrac = null; S.thumb = null;
      err.textContent = ""; renderAll();
    } catch (x) { err.textContent = "the server did not answer: " + x; }
  };
}

// ------------------------------------------------------------------ main
function renderView() {
  const view = $("view"); view.replaceChildren();
  const t0 = performance.now();
  VIEWS[S.view][1](view);
  view.dataset.view = S.view; view.dataset.renderMs = (performance.now() - t0).toFixed(1);
}
function renderAll() {
  $("title").textContent = DATA.title;
  $("subtitle").textContent = DATA.subtitle || "";
  const sel = $("example"); sel.replaceChildren();
  DATA.examples.forEach((ex, i) => sel.append(el("option", { value: i, text: ex.input.length > 80 ? ex.input.slice(0, 79) + "…" : ex.input })));
  sel.value = S.ex;
  sel.onchange = () => { S.ex = +sel.value; S.group = 0; S.step = 0; S.scaleFrac = null; S.thumb = null; renderAll(); };
  if (!viewsOf().includes(S.view)) S.view = viewsOf()[0];
  if (S.group >= example().groups.length) S.group = 0;
  renderLive(); renderSummary(); renderTabs(); renderControls(); renderView();
  document.body.dataset.ready = "1";
}
document.addEventListener("keydown", (e) => {
  if (S.view !== "steps" || e.target.tagName === "TEXTAREA") return;
  const n = example().generation.steps.length;
  if (e.key === "ArrowRight") { S.step = Math.min(n - 1, S.step + 1); renderView(); }
  if (e.key === "ArrowLeft") { S.step = Math.max(0, S.step - 1); renderView(); }
});
window.attnlab = { state: S, render: renderAll, setView: (v) => { S.view = v; renderAll(); } };
renderAll();
})();
