"""The app's page (GET /): draw a digit, see the prediction, correct it, personalize.

One self-contained HTML document (no external resources: it works offline on a phone).
The 256x256 canvas is downsampled to 8x8 the way the digits dataset was made: each cell's
value is the inked share of its 32x32 block, times 16.
"""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>sporenet digits</title>
<style>
  body { font-family: sans-serif; margin: 1em; max-width: 40em; }
  #pad { border: 2px solid #333; touch-action: none; background: #fff; cursor: crosshair; }
  #preview { display: grid; grid-template-columns: repeat(8, 12px); gap: 1px; }
  #preview div { width: 12px; height: 12px; }
  .row { display: flex; gap: 1em; align-items: center; margin: .5em 0; flex-wrap: wrap; }
  #prediction { font-size: 3em; font-weight: bold; min-width: 1em; }
  .error { color: #b00; }
  progress { width: 12em; }
</style>
</head>
<body>
<h1>Draw a digit</h1>
<div class="row">
  <canvas id="pad" width="256" height="256"></canvas>
  <div>
    <div id="prediction"></div>
    <div>confidence <span id="confidence">-</span></div>
    <div>latency <span id="latency">-</span></div>
    <div id="preview"></div>
  </div>
</div>
<div class="row">
  <button id="clear">Clear</button>
  <label>label <select id="label"></select></label>
  <button id="save">Save sample</button>
  <span>stored: <span id="stored">0</span></span>
</div>
<h2>Personalize</h2>
<div class="row">
  <label>epochs <input id="epochs" type="number" min="1" max="200" value="20"></label>
  <button id="personalize">Personalize</button>
  <progress id="progress" max="1" value="0"></progress>
</div>
<div>accuracy on your held-out samples: before <span id="before">-</span>,
  after <span id="after">-</span></div>
<h2>Status</h2>
<pre id="status"></pre>
<div id="error" class="error"></div>
<script>
"use strict";
const pad = document.getElementById("pad");
const ctx = pad.getContext("2d");
const $ = (id) => document.getElementById(id);
let drawing = false, last = null, pixels = null;

for (let k = 0; k < 10; k++) {
  const o = document.createElement("option"); o.value = k; o.textContent = k;
  $("label").appendChild(o);
}
for (let k = 0; k < 64; k++) $("preview").appendChild(document.createElement("div"));

function clearPad() {
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, pad.width, pad.height);
  pixels = null; $("prediction").textContent = "";
  $("confidence").textContent = "-"; $("latency").textContent = "-";
  showPreview(new Array(64).fill(0));
}
function point(e) {
  const r = pad.getBoundingClientRect();
  return [(e.clientX - r.left) * pad.width / r.width, (e.clientY - r.top) * pad.height / r.height];
}
pad.addEventListener("pointerdown", (e) => { drawing = true; last = point(e); stroke(last); });
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
  const response = await fetch(path, {method, headers: {"Content-Type": "application/json"},
    body: body === undefined ? undefined : JSON.stringify(body)});
  const value = await response.json();
  if (!response.ok) throw new Error(value.error || response.statusText);
  return value;
}
function report(e) { $("error").textContent = e ? String(e.message || e) : ""; }
async function predict() {
  pixels = downsample(); showPreview(pixels);
  try {
    const started = performance.now();
    const out = await call("POST", "/api/predict", {pixels});
    $("prediction").textContent = out.label;
    $("confidence").textContent = (100 * out.probabilities[out.label]).toFixed(1) + "%";
    $("latency").textContent = out.latency_ms.toFixed(2) + " ms model, " +
      (performance.now() - started).toFixed(1) + " ms round trip";
    $("label").value = out.label; report(null);
  } catch (e) { report(e); }
}
async function save() {
  if (!pixels) { report("draw a digit first"); return; }
  try {
    const out = await call("POST", "/api/samples", {pixels, label: Number($("label").value)});
    $("stored").textContent = out.stored; report(null); clearPad();
  } catch (e) { report(e); }
}
async function personalize() {
  $("personalize").disabled = true;
  const poll = setInterval(refresh, 200);
  try {
    const out = await call("POST", "/api/personalize", {epochs: Number($("epochs").value)});
    $("before").textContent = (100 * out.before).toFixed(1) + "%";
    $("after").textContent = (100 * out.after).toFixed(1) + "%";
    $("progress").value = 1; report(null);
  } catch (e) { report(e); }
  clearInterval(poll); $("personalize").disabled = false; refresh();
}
async function refresh() {
  try {
    const s = await call("GET", "/api/status");
    $("stored").textContent = s.samples;
    const p = s.personalization;
    if (p.running && p.epochs) $("progress").value = p.epoch / p.epochs;
    $("status").textContent = JSON.stringify(s, null, 2);
  } catch (e) { report(e); }
}
$("clear").addEventListener("click", clearPad);
$("save").addEventListener("click", save);
$("personalize").addEventListener("click", personalize);
clearPad(); refresh(); setInterval(refresh, 5000);
</script>
</body>
</html>
"""
