/* attnlab: which of a text's own pieces moved a classifier's decision (integrated gradients),
   as coloured chips, the pieces every input has (<s>, </s>, the prompt prefix) apart, and a
   table of the strongest. Shared by the explorer page and `attnlab serve`'s page; every text
   goes in through textContent, never as markup. */
"use strict";
const PIECES_TEXT = {
  en: {
    legend: (label) => `the text's pieces: orange pushed towards “${label}”, blue against (hover for the score)`,
    apart: "the same in every input, not scored:",
    sum: (a, total) => `log-odds of “${a.label}”: ${a.log_odds.toFixed(2)} for the text, ` +
      `${a.reference_log_odds.toFixed(2)} for the reference (its pieces all <pad>: p ${a.reference_prob.toFixed(3)}); ` +
      `the pieces' scores add up to ${total.toFixed(2)} (quadrature gap ${a.gap.toExponential(1)})`,
    head: ["piece", "score", "share"],
    top: "strongest pieces",
  },
  zh: {
    legend: (label) => `文本自身的片段：橙色把判断推向“${label}”，蓝色反向（悬停看得分）`,
    apart: "每个输入都有，不计分：",
    sum: (a, total) => `“${a.label}”的对数几率：本文本 ${a.log_odds.toFixed(2)}，参照输入 ` +
      `${a.reference_log_odds.toFixed(2)}（片段全换成 <pad>：p ${a.reference_prob.toFixed(3)}）；` +
      `各片段得分之和 ${total.toFixed(2)}（积分误差 ${a.gap.toExponential(1)}）`,
    head: ["片段", "得分", "占比"],
    top: "影响最大的片段",
  },
};
function piecesColor(v) {  // -1..1 -> blue .. white .. orange
  const [r, g, b] = v >= 0 ? [232, 89, 12] : [31, 111, 235], s = Math.min(1, Math.abs(v));
  return `rgb(${Math.round(255 + (r - 255) * s)},${Math.round(255 + (g - 255) * s)},${Math.round(255 + (b - 255) * s)})`;
}
function attnlabPieces(a, lang) {
  const t = PIECES_TEXT[lang] || PIECES_TEXT.en;
  const make = (tag, cls, text) => { const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text; return e; };
  const box = make("div", "attribution");
  const text = [], apart = [];
  a.tokens.forEach((_, i) => (a.roles[i] === "text" ? text : apart).push(i));
  const total = text.reduce((s, i) => s + a.scores[i], 0);
  const mass = text.reduce((s, i) => s + Math.abs(a.scores[i]), 0) || 1;
  const peak = Math.max(1e-12, ...text.map((i) => Math.abs(a.scores[i])));
  const share = (i) => `${(100 * Math.abs(a.scores[i]) / mass).toFixed(1)}%`;
  const signed = (v) => (v >= 0 ? "+" : "") + v.toFixed(3);
  box.append(make("div", "kv", t.legend(a.label)));
  const row = make("div", "pieces"); row.id = "pieces";
  for (const i of text) {
    const chip = make("span", "piece", a.tokens[i]);
    chip.style.background = piecesColor(a.scores[i] / peak);
    chip.title = `${signed(a.scores[i])} (${share(i)})`;
    chip.dataset.score = a.scores[i];
    row.append(chip);
  }
  box.append(row);
  const fixed = make("div", "pieces apart"); fixed.id = "pieces-apart";
  fixed.append(make("span", "kv", t.apart + " "));
  for (const i of apart) { const c = make("span", "piece fixed", a.tokens[i]); c.dataset.role = a.roles[i]; fixed.append(c); }
  box.append(fixed);
  const sum = make("div", "note", t.sum(a, total)); sum.id = "pieces-sum";
  box.append(sum);
  const order = text.slice().sort((x, y) => Math.abs(a.scores[y]) - Math.abs(a.scores[x])).slice(0, 10);
  const table = make("table", "top"); table.id = "pieces-table";
  const cap = make("caption", "", t.top); table.append(cap);
  const head = make("tr"); for (const h of t.head) head.append(make("th", "", h)); table.append(head);
  for (const i of order) {
    const tr = make("tr");
    const cell = make("td"); const chip = make("span", "piece", a.tokens[i]); chip.style.background = piecesColor(a.scores[i] / peak); cell.append(chip);
    tr.append(cell, make("td", "num", signed(a.scores[i])), make("td", "num", share(i)));
    table.append(tr);
  }
  box.append(table);
  return box;
}
