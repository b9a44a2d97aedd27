"""The app's page (GET /): draw a digit, see the prediction, correct it, personalize.

One self-contained HTML document with its own stylesheet and script (no external
resources: it works offline on a phone). The layout is one column on a phone and two on
a wider screen. The 256x256 canvas is downsampled to 8x8 the way the digits dataset was
made: each cell's value is the inked share of its 32x32 block, times 16. Each control
shows its own errors beside it; the federated state is told in words.
"""

FAVICON = """<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64">
<rect width="64" height="64" rx="14" fill="#2f6f5e"/>
<circle cx="32" cy="32" r="17" fill="none" stroke="#fff" stroke-width="7"/>
<circle cx="32" cy="32" r="5" fill="#ffd166"/>
</svg>
"""

STYLE = """
:root {
  --ink: #1d2a26; --muted: #5b6b66; --line: #d6e0dc; --card: #ffffff; --page: #eef3f1;
  --accent: #2f6f5e; --accent-soft: #d8ebe4; --warn: #a33a21; --warn-soft: #fbe6df;
  --good: #2c7a3f; --radius: 14px;
}
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; }
body {
  margin: 0; background: var(--page); color: var(--ink);
  font: 16px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
}
header {
  background: var(--accent); color: #fff; padding: 14px 18px;
  display: flex; align-items: center; gap: 12px; flex-wrap: wrap;
}
header h1 { font-size: 1.25rem; margin: 0; font-weight: 650; }
header .badge {
  margin-left: auto; font-size: .8rem; background: rgba(255,255,255,.18);
  padding: 3px 10px; border-radius: 999px; white-space: nowrap;
}
main {
  display: grid; gap: 14px; padding: 14px; max-width: 980px; margin: 0 auto;
  grid-template-columns: minmax(0, 1fr);
}
@media (min-width: 760px) {
  main { grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); padding: 20px; gap: 18px; }
  #fleet-card, #about { grid-column: 1 / -1; }
}
section {
  background: var(--card); border: 1px solid var(--line); border-radius: var(--radius);
  padding: 16px; min-width: 0;
}
h2 { font-size: 1.05rem; margin: 0 0 6px; display: flex; align-items: center; gap: 8px; }
h2 .step {
  display: inline-grid; place-items: center; width: 1.6em; height: 1.6em; border-radius: 50%;
  background: var(--accent-soft); color: var(--accent); font-size: .85rem;
}
.hint { color: var(--muted); margin: 0 0 12px; font-size: .93rem; }
.pad-wrap { display: flex; gap: 14px; align-items: flex-start; flex-wrap: wrap; }
#pad {
  width: min(100%, 280px); aspect-ratio: 1 / 1; height: auto; display: block;
  border: 2px dashed #9db5ad; border-radius: 12px; background: #fff;
  touch-action: none; cursor: crosshair;
}
.seen { font-size: .8rem; color: var(--muted); }
#preview {
  display: grid; grid-template-columns: repeat(8, 10px); gap: 1px; margin-top: 4px;
  padding: 2px; background: var(--line); width: max-content; border-radius: 3px;
}
#preview div { width: 10px; height: 10px; background: #fff; }
.row { display: flex; gap: 10px; align-items: center; flex-wrap: wrap; margin-top: 12px; }
button {
  font: inherit; font-weight: 600; border-radius: 10px; border: 1px solid var(--accent);
  background: var(--accent); color: #fff; padding: 9px 16px; min-height: 44px; cursor: pointer;
}
button.secondary { background: #fff; color: var(--accent); }
button:disabled { opacity: .55; cursor: default; }
select, input[type=number] {
  font: inherit; padding: 8px 10px; min-height: 44px; border-radius: 10px;
  border: 1px solid var(--line); background: #fff; color: var(--ink);
}
input[type=number] { width: 5.5em; }
label { display: inline-flex; align-items: center; gap: 8px; }
.error {
  color: var(--warn); background: var(--warn-soft); border-radius: 8px; padding: 8px 10px;
  margin-top: 10px; font-size: .92rem;
}
.error:empty { display: none; }
.result-top { display: flex; align-items: baseline; gap: 14px; min-height: 4.2rem; }
#prediction { font-size: 3.6rem; font-weight: 750; line-height: 1; color: var(--accent); }
#confidence { font-size: 1.1rem; font-weight: 600; }
.empty { color: var(--muted); font-style: italic; }
#bars { display: grid; gap: 3px; margin-top: 10px; }
.bar { display: grid; grid-template-columns: 1.4em minmax(0, 1fr) 3.6em; gap: 8px;
  align-items: center; font-size: .85rem; }
.bar .track { display: block; background: #edf1ef; border-radius: 999px; height: 10px;
  overflow: hidden; }
.bar .fill { display: block; background: #9db5ad; height: 100%; width: 0; transition: width .2s; }
.bar.top .fill { background: var(--accent); }
.bar .pct { text-align: right; color: var(--muted); font-variant-numeric: tabular-nums; }
#latency { font-size: .8rem; color: var(--muted); margin-top: 8px; }
.count { color: var(--muted); font-size: .93rem; }
progress { width: 100%; height: 12px; accent-color: var(--accent); margin-top: 12px; }
#progress-text { font-size: .85rem; color: var(--muted); min-height: 1.2em; }
.outcome {
  margin-top: 12px; padding: 10px 12px; border-radius: 10px; background: var(--accent-soft);
}
.outcome:empty { display: none; }
.outcome b { font-variant-numeric: tabular-nums; }
.note { background: #fff6dc; border-radius: 8px; padding: 8px 10px; font-size: .92rem; }
.note:empty { display: none; }
#fleet-state { font-size: 1rem; margin: 0; }
#fleet-detail { color: var(--muted); margin: 6px 0 0; font-size: .92rem; }
.dot { display: inline-block; width: .7em; height: .7em; border-radius: 50%;
  background: #9aa; margin-right: 6px; }
.dot.ok { background: var(--good); } .dot.bad { background: var(--warn); }
.dot.wait { background: #d9a400; }
#about { font-size: .85rem; color: var(--muted); }
#about dl { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 2px 12px;
  margin: 0; }
#about dd { margin: 0; overflow-wrap: anywhere; }
"""

BODY = """
<header>
  <h1>sporenet digits</h1>
  <span class="badge" id="version">model -</span>
</header>
<main>
<section id="draw-card">
  <h2><span class="step">1</span>Draw a digit</h2>
  <p class="hint">Draw one digit (0-9) in the white box with your finger or the mouse, as
    large as the box. Lift to see what the model reads.</p>
  <div class="pad-wrap">
    <canvas id="pad" width="256" height="256" aria-label="drawing pad"></canvas>
    <div><div class="seen">what the model sees (8x8)</div><div id="preview"></div></div>
  </div>
  <div class="row"><button id="clear" class="secondary">Clear</button></div>
  <div id="draw-error" class="error" role="alert"></div>
</section>
<section id="result-card">
  <h2>Prediction</h2>
  <div class="result-top">
    <span id="prediction"></span>
    <span id="confidence" class="empty">Draw a digit to see the prediction.</span>
  </div>
  <div id="bars" aria-label="confidence per digit"></div>
  <div id="latency"></div>
</section>
<section id="teach-card">
  <h2><span class="step">2</span>Teach it your handwriting</h2>
  <p class="hint">Wrong, or right? Pick the digit you meant and save it. Your samples stay
    on this device.</p>
  <div class="row">
    <label>I meant <select id="label"></select></label>
    <button id="save">Save sample</button>
  </div>
  <div id="save-error" class="error" role="alert"></div>
  <p class="count" id="stored-text"><span id="stored">0</span> samples saved</p>
</section>
<section id="personalize-card">
  <h2><span class="step">3</span>Personalize</h2>
  <p class="hint">Train the model's last layer on your samples. Every 5th sample is kept
    aside to measure the model before and after.</p>
  <div id="personalize-note" class="note"></div>
  <div class="row">
    <label>epochs <input id="epochs" type="number" min="1" max="200" value="20"></label>
    <button id="personalize">Personalize</button>
  </div>
  <div id="personalize-error" class="error" role="alert"></div>
  <progress id="progress" max="1" value="0"></progress>
  <div id="progress-text"></div>
  <div id="outcome" class="outcome"></div>
</section>
<section id="fleet-card">
  <h2><span class="step">4</span>Help the fleet</h2>
  <p id="fleet-state"><span class="dot" id="fleet-dot"></span><span id="fleet-text">-</span></p>
  <p id="fleet-detail"></p>
  <div id="status-error" class="error" role="alert"></div>
</section>
<section id="about">
  <dl id="model-facts"></dl>
</section>
</main>
"""

SCRIPT = """
"use strict";
const pad = document.getElementById("pad");
const ctx = pad.getContext("2d");
const $ = (id) => document.getElementById(id);
let drawing = false, last = null, pixels = null, classes = 10, busy = false;

function pct(v) { return (100 * v).toFixed(1) + "%"; }
function setError(id, e) { $(id).textContent = e ? String(e.message || e) : ""; }

function buildBars(n) {
  const bars = $("bars"); bars.textContent = "";
  for (let k = 0; k < n; k++) {
    const row = document.createElement("div"); row.className = "bar";
    row.innerHTML = `<span>${k}</span><span class="track"><span class="fill"></span></span>` +
      `<span class="pct">-</span>`;
    bars.appendChild(row);
  }
  const select = $("label"); select.textContent = "";
  for (let k = 0; k < n; k++) {
    const o = document.createElement("option"); o.value = k; o.textContent = k;
    select.appendChild(o);
  }
}
for (let k = 0; k < 64; k++) $("preview").appendChild(document.createElement("div"));

function clearPad() {
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, pad.width, pad.height);
  pixels = null; $("prediction").textContent = "";
  $("confidence").textContent = "Draw a digit to see the prediction.";
  $("confidence").className = "empty"; $("latency").textContent = "";
  for (const row of $("bars").children) {
    row.className = "bar"; row.querySelector(".fill").style.width = "0";
    row.querySelector(".pct").textContent = "-";
  }
  showPreview(new Array(64).fill(0)); setError("draw-error", null);
}
function point(e) {
  const r = pad.getBoundingClientRect();
  return [(e.clientX - r.left) * pad.width / r.width, (e.clientY - r.top) * pad.height / r.height];
}
pad.addEventListener("pointerdown", (e) => {
  drawing = true; last = point(e); stroke(last); pad.setPointerCapture(e.pointerId);
});
pad.addEventListener("pointermove", (e) => { if (drawing) stroke(point(e)); });
window.addEventListener("pointerup", () => { if (drawing) { drawing = false; predict(); } });
function stroke(p) {
  ctx.strokeStyle = "#000"; ctx.lineWidth = 26; ctx.lineCap = "round";
  ctx.beginPath(); ctx.moveTo(last[0], last[1]); ctx.lineTo(p[0], p[1]); ctx.stroke();
  last = p;
}
function downsample() {
  const data = ctx.getImageData(0, 0, pad.width, pad.height).data;
  const cell = pad.width / 8, out = [];
  for (let r = 0; r < 8; r++) for (let c = 0; c < 8; c++) {
    let ink = 0;
    for (let y = r * cell; y < (r + 1) * cell; y++) for (let x = c * cell; x < (c + 1) * cell; x++)
      ink += 255 - data[(y * pad.width + x) * 4];
    out.push(Math.min(16, Math.round(16 * ink / (255 * cell * cell))));
  }
  return out;
}
function showPreview(values) {
  const cells = $("preview").children;
  values.forEach((v, k) => { const g = 255 - Math.round(v * 255 / 16);
    cells[k].style.background = `rgb(${g},${g},${g})`; });
}
async function call(method, path, body) {
  let response;
  try {
    response = await fetch(path, {method, headers: {"Content-Type": "application/json"},
      body: body === undefined ? undefined : JSON.stringify(body)});
  } catch (e) { throw new Error("the app does not answer (is it still running?)"); }
  let value = {};
  try { value = await response.json(); } catch (e) { /* an empty or non-JSON answer */ }
  if (!response.ok) throw new Error(value.error || `${response.status} ${response.statusText}`);
  return value;
}
function showPrediction(out) {
  $("prediction").textContent = out.label;
  $("confidence").className = "";
  $("confidence").textContent = pct(out.probabilities[out.label]) + " sure";
  const rows = $("bars").children;
  out.probabilities.forEach((p, k) => {
    if (!rows[k]) return;
    rows[k].className = k === out.label ? "bar top" : "bar";
    rows[k].querySelector(".fill").style.width = (100 * p).toFixed(1) + "%";
    rows[k].querySelector(".pct").textContent = pct(p);
  });
}
async function predict() {
  pixels = downsample(); showPreview(pixels);
  try {
    const started = performance.now();
    const out = await call("POST", "/api/predict", {pixels});
    showPrediction(out);
    $("latency").textContent = `model ${out.latency_ms.toFixed(2)} ms, round trip ` +
      `${(performance.now() - started).toFixed(1)} ms`;
    $("label").value = out.label; setError("draw-error", null);
  } catch (e) { setError("draw-error", e); }
}
async function save() {
  if (!pixels) { setError("save-error", "Draw a digit first, then save it."); return; }
  try {
    const out = await call("POST", "/api/samples", {pixels, label: Number($("label").value)});
    $("stored").textContent = out.stored; setError("save-error", null); clearPad();
    refresh();
  } catch (e) { setError("save-error", e); }
}
function showProgress(p) {
  if (p.running && p.epochs) {
    $("progress").value = p.epoch / p.epochs;
    $("progress-text").textContent = `epoch ${p.epoch} of ${p.epochs}` +
      (p.loss === null ? "" : `, loss ${p.loss.toFixed(3)}`);
  }
}
function showOutcome(r) {
  if (!r) return;
  const n = r.held_out, right = (v) => Math.round(v * n);
  $("outcome").innerHTML = `On your <b>${n}</b> held-out sample${n === 1 ? "" : "s"}: ` +
    `before <b>${pct(r.before)}</b> (${right(r.before)} of ${n}), after ` +
    `<b>${pct(r.after)}</b> (${right(r.after)} of ${n}). Trained on ${r.samples}.` +
    (n < 5 ? " Save more samples for a steadier measure." : "");
}
async function personalize() {
  $("personalize").disabled = true; busy = true; setError("personalize-error", null);
  $("progress").value = 0; $("progress-text").textContent = "starting...";
  const poll = setInterval(refresh, 250);
  try {
    const out = await call("POST", "/api/personalize", {epochs: Number($("epochs").value)});
    $("progress").value = 1; $("progress-text").textContent = "done";
    showOutcome(out);
  } catch (e) { setError("personalize-error", e); $("progress-text").textContent = ""; }
  clearInterval(poll); busy = false; $("personalize").disabled = false; refresh();
}
const FLEET = {
  off: ["", "Not taking part.", "Start the app with --server HOST:PORT to help train the " +
    "shared model; your own model is never replaced by it."],
  unavailable: ["bad", "Cannot take part with this model.", ""],
  unreachable: ["bad", "Cannot reach the fleet's server.", ""],
  connecting: ["wait", "Connecting to the fleet's server...", ""],
  waiting_for_policy: ["wait", "Waiting for a good moment.", ""],
  waiting_for_samples: ["wait", "Waiting for more samples.", "Save a few more samples: the " +
    "device trains for the fleet on them."],
  connected: ["ok", "Connected, waiting for the next round.", ""],
  training: ["ok", "Training a round for the fleet now.", ""],
  done: ["ok", "The fleet's job is done.", ""],
  failed: ["bad", "Taking part failed.", ""],
};
function showFleet(f) {
  const [dot, text, detail] = FLEET[f.state] || ["", f.state, ""];
  $("fleet-dot").className = "dot " + dot; $("fleet-text").textContent = text;
  let more = detail;
  if (f.enabled) {
    const rounds = `${f.rounds_trained} round${f.rounds_trained === 1 ? "" : "s"} trained`;
    more = `Server ${f.server}; ${rounds}. ` + more;
    if (f.error) more += " " + f.error + (f.retry_in !== null && f.retry_in !== undefined ?
      `; trying again in ${Math.ceil(f.retry_in)} s.` : ".");
    if (f.state === "waiting_for_policy" && f.device.blockers.length)
      more += " It trains only while charging, idle, on Wi-Fi and with enough battery; " +
        "now: " + f.device.blockers.join(", ") + ".";
  }
  $("fleet-detail").textContent = more.trim();
}
function showModel(s) {
  const m = s.model;
  $("version").textContent = "model " + m.version + (m.personalized ? " (yours)" : "");
  const facts = [["input", `${m.input} ${JSON.stringify(m.input_shape)} ${m.input_dtype}`],
    ["output", `${m.output}, ${m.classes} classes`],
    ["trains", m.personalizable ? m.trainable.join(", ") : "nothing (see above)"]];
  $("model-facts").innerHTML = "";
  for (const [k, v] of facts) {
    const dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = k; dd.textContent = v; $("model-facts").append(dt, dd);
  }
  $("personalize-note").textContent = m.personalizable ? "" :
    "This model cannot be personalized here: " + m.why_not + ".";
  $("personalize").disabled = busy || !m.personalizable;
}
async function refresh() {
  try {
    const s = await call("GET", "/api/status");
    if (s.model.classes !== classes || !$("bars").children.length) {
      classes = s.model.classes; buildBars(classes); clearPad();
    }
    $("stored").textContent = s.samples;
    $("stored-text").lastChild.textContent = ` sample${s.samples === 1 ? "" : "s"} saved` +
      (s.samples < 5 ? ` (personalizing needs 5)` : "");
    showModel(s);
    showProgress(s.personalization);
    if (!busy) showOutcome(s.personalization.last);
    showFleet(s.federated);
    setError("status-error", null);
  } catch (e) { setError("status-error", e); }
}
$("clear").addEventListener("click", clearPad);
$("save").addEventListener("click", save);
$("personalize").addEventListener("click", personalize);
buildBars(classes); clearPad(); refresh(); setInterval(refresh, 3000);
"""

PAGE = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="theme-color" content="#2f6f5e">
<title>sporenet digits</title>
<link rel="icon" href="/favicon.svg" type="image/svg+xml">
<style>{STYLE}</style>
</head>
<body>{BODY}<script>{SCRIPT}</script>
</body>
</html>
"""
