/* attnlab serve's page: a text box, the label and probabilities (POST /explain), and which of
   the text's pieces moved the decision (assets/pieces.js). No libraries, no network but this
   server; every text is set through textContent. */
"use strict";
(function () {
const DATA = JSON.parse(document.getElementById("attnlab-data").textContent);
const $ = (id) => document.getElementById(id);
const T = {
  zh: {
    title: (d) => `试用分类器 · ${d.encoder ? d.encoder + "（微调）" : "字符模型"}`,
    subtitle: (d) => `运行 ${d.run} · 类别：${d.labels.join("、")}`,
    prefix: (p, d) => `${d.encoder} 读到的每条文本前都有“${p}”：它预训练时用这个角色词标记输入（分类、比较用 “query: ”），微调保留了它；这些片段和 <s>、</s> 一样每条输入都有，单独列出，不计分。`,
    go: "分类", working: "计算中…", label: "预测", placeholder: "输入一段评论",
    pieces: "哪些片段左右了判断",
    note: (a) => `归因方法：${a.method}。参照输入把文本的每个片段换成 <pad>，得分是每个片段对“${a.label}”对数几率变化的贡献，合起来等于这个变化。`,
    none: "这个运行是字符模型：片段归因只对微调的预训练编码器（e5、MiniLM）提供。",
    unreach: (p) => `⚠ ${(100 * p.unknown_share).toFixed(0)}% 的片段模型不认识：${p.warning}`,
    truncated: (p) => `⚠ 文本有 ${p.tokens} 个片段，超出模型能读的长度，只读了前面部分`,
    failed: "服务器没有回答：",
  },
  en: {
    title: (d) => `Try the classifier · ${d.encoder ? d.encoder + ", fine-tuned" : "character model"}`,
    subtitle: (d) => `run ${d.run} · labels: ${d.labels.join(", ")}`,
    prefix: (p, d) => `${d.encoder} reads every text after "${p}": it was pretrained to mark each input with a role word ("query: " to classify or compare) and the fine-tune keeps it; those pieces, like <s> and </s>, are in every input: shown apart, not scored.`,
    go: "Classify", working: "working…", label: "prediction", placeholder: "type a review",
    pieces: "Which pieces moved the decision",
    note: (a) => `Method: ${a.method}. The reference turns every piece of the text into <pad>; each piece's score is its share of the change in the log-odds of “${a.label}”, and the scores add up to that change.`,
    none: "This run is the character model: piece attribution is given for fine-tuned pretrained encoders (e5, MiniLM).",
    unreach: (p) => `⚠ ${(100 * p.unknown_share).toFixed(0)}% of the pieces are unknown to the model: ${p.warning}`,
    truncated: (p) => `⚠ the text has ${p.tokens} pieces, more than the model reads: only its start was read`,
    failed: "the server did not answer: ",
  },
};
const S = { lang: (navigator.language || "").toLowerCase().startsWith("zh") ? "zh" : "en", answer: null };

function bars(probs, best) {
  const box = document.createElement("div"); box.className = "bars";
  for (const [k, v] of Object.entries(probs).sort((a, b) => b[1] - a[1])) {
    const name = document.createElement("span"); name.textContent = k; if (k === best) name.className = "best";
    const wrap = document.createElement("div"), bar = document.createElement("div");
    bar.className = "bar"; bar.style.width = (100 * v).toFixed(1) + "%"; wrap.append(bar);
    const num = document.createElement("span"); num.textContent = v.toFixed(3);
    box.append(name, wrap, num);
  }
  return box;
}
function render() {
  const t = T[S.lang];
  document.documentElement.lang = S.lang;
  for (const b of document.querySelectorAll(".langs button")) b.className = b.dataset.lang === S.lang ? "on" : "";
  $("title").textContent = t.title(DATA);
  $("subtitle").textContent = t.subtitle(DATA);
  $("prefix-note").textContent = DATA.prefix ? t.prefix(DATA.prefix, DATA) : "";
  $("go").textContent = t.go;
  $("text").placeholder = t.placeholder;
  $("label-caption").textContent = t.label;
  $("pieces-title").textContent = t.pieces;
  const out = S.answer;
  $("result").hidden = !out;
  if (!out) return;
  const p = out.prediction;
  $("label").textContent = `${p.label}  ${p.probs[p.label].toFixed(3)}`;
  $("probs").replaceChildren(bars(p.probs, p.label));
  $("warning").textContent = p.out_of_reach ? t.unreach(p) : p.truncated ? t.truncated(p) : "";
  const a = out.attribution;
  $("pieces-note").textContent = a ? t.note(a) : t.none;
  $("attribution").replaceChildren(...(a ? [attnlabPieces(a, S.lang)] : []));  // assets/pieces.js
}
async function send(e) {
  if (e) e.preventDefault();
  const t = T[S.lang], err = $("error");
  err.textContent = t.working;
  try {
    const res = await fetch("explain", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ text: $("text").value }) });
    const out = await res.json();
    if (!res.ok) { err.textContent = out.error || `error ${res.status}`; return; }
    S.answer = out; err.textContent = ""; render();
    document.body.dataset.answered = String(Number(document.body.dataset.answered || 0) + 1);
  } catch (x) { err.textContent = t.failed + x; }
}
$("text").maxLength = DATA.max_chars;
$("text").value = DATA.example;
$("try").addEventListener("submit", send);
for (const b of document.querySelectorAll(".langs button")) b.addEventListener("click", () => { S.lang = b.dataset.lang; render(); });
render();
document.body.dataset.ready = "1";
send();
})();
