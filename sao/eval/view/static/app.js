// sao view: the page. Reads /api (sao.eval.view.server); charts with uPlot (vendored). No build step.
"use strict";
const $ = (s) => document.querySelector(s);
const S = { source: ".", offset: 0, next: null, episode: null, run: null };
const esc = (x) => String(x ?? "").replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
const num = (x, d = 3) => (x === null || x === undefined ? "" : typeof x !== "number" ? esc(x) : Number.isInteger(x) ? String(x)
  : x !== 0 && Math.abs(x) < 0.001 ? x.toExponential(2) : x.toFixed(d));

async function api(path, params = {}) {
  const q = new URLSearchParams({ source: S.source, ...params });
  const r = await fetch(`/api/${path}?${q}`);
  const body = await r.json();
  if (!r.ok) throw new Error(body.detail || r.statusText);
  return body;
}
function say(msg) { $("#status").textContent = msg || ""; }
function show(tab) {
  for (const b of document.querySelectorAll("button.tab")) b.classList.toggle("on", b.dataset.tab === tab);
  for (const id of ["overview", "episodes", "episode"]) $("#" + id).hidden = id !== tab;
}

// -- run and overview -------------------------------------------------------------------------------------------
async function loadRun() {
  const run = (S.run = await api("run"));
  $("#run-name").textContent = run.name;
  const sel = $("#source");
  const names = run.sources.map((s) => s.name);
  if (!names.includes(S.source)) S.source = names.find((n) => run.sources.find((s) => s.name === n).episodes) || names[0] || ".";
  sel.innerHTML = run.sources.map((s) => `<option value="${esc(s.name)}">${esc(s.name)} (${s.episodes} episodes${s.steps ? `, ${s.steps} steps` : ""})</option>`).join("");
  sel.value = S.source;
  if (run.tokenizer_error) say(`token text unavailable: ${run.tokenizer_error}`);
  $("#run-tables").innerHTML = runTables(run);
}

function table(rows, cols, cls = "") {
  const head = cols.map((c) => `<th class="l">${esc(c)}</th>`).join("");
  const body = rows.map((r) => "<tr>" + cols.map((c) => `<td>${num(r[c])}</td>`).join("") + "</tr>").join("");
  return `<table class="${cls}"><tr>${head}</tr>${body}</table>`;
}
function runTables(run) {
  let html = "";
  const stages = run.sources.filter((s) => s.done);
  if (stages.length) {
    const rows = stages.map((s) => ({ ...Object.fromEntries(Object.entries(s.done).filter(([, v]) => typeof v !== "object")), stage: s.name }));
    const cols = ["stage", ...new Set(rows.flatMap((r) => Object.keys(r)).filter((k) => k !== "stage" && k !== "model" && k !== "critic"))];
    html += "<h3>Stages</h3>" + table(rows, cols);
  }
  for (const r of run.runs) {
    const title = run.runs.length > 1 ? ` of ${esc(r.name)}` : "";
    const evals = r.summary && r.summary.evals;
    if (evals && evals.length) {
      const cols = ["label", ...new Set(evals.flatMap((e) => Object.keys(e)).filter((k) => k !== "label" && typeof evals[0][k] !== "object"))];
      html += `<h3>Evals${title}</h3>` + table(evals, cols);
    }
    if (r.report) {
      const flat = Object.entries(r.report).filter(([, v]) => typeof v !== "object");
      html += `<h3>Report${title}</h3>` + table(flat.map(([k, v]) => ({ key: k, value: v })), ["key", "value"], "kv");
    }
  }
  const withEpisodes = run.sources.filter((s) => s.episodes).map((s) => s.name);
  if (withEpisodes.length > 1) {
    const opts = (sel) => withEpisodes.map((n) => `<option value="${esc(n)}"${n === sel ? " selected" : ""}>${esc(n)}</option>`).join("");
    html += `<h3>Compare task by task</h3><select id="cmp-a">${opts(withEpisodes[withEpisodes.length - 2])}</select> vs
      <select id="cmp-b">${opts(withEpisodes[withEpisodes.length - 1])}</select> <button id="cmp-go">compare</button><div id="cmp-out"></div>`;
  }
  return html;
}

async function compare() {
  const c = await api("compare", { a: $("#cmp-a").value, b: $("#cmp-b").value });
  const diff = c.mean === null ? "no task in common" : `paired difference ${num(c.mean)}${c.se === null ? "" : " ± " + num(c.se)} over ${c.n} tasks`;
  $("#cmp-out").innerHTML = `<p>solved ${c.solved_a} → ${c.solved_b} of the ${c.n} tasks both ran; ${diff};
    gained ${c.gained.length}, lost ${c.lost.length}${c.only_a || c.only_b ? ` (${c.only_a} tasks only in the first, ${c.only_b} only in the second)` : ""}</p>
    <p>gained: ${c.gained.map(esc).join(", ") || "none"}<br>lost: ${c.lost.map(esc).join(", ") || "none"}</p>`;
}

const CHARTS = [
  ["batch success and reward", ["success_rate", "reward_mean"]],
  ["critic explained variance", ["explained_variance"]],
  ["policy lag", ["policy_lag_mean", "policy_lag_max"]],
  ["DIS-masked fraction", ["mask_frac_low", "mask_frac_high"]],
  ["entropy", ["entropy"]],
  ["gradient norms", ["actor_grad_norm", "critic_grad_norm"]],
  ["episodes per second", ["trajectories_per_s"]],
  ["step seconds", ["step_s"]],
];
const COLORS = ["#36c", "#c33", "#393", "#c93"];
const STEP_COLS = ["step", "success_rate", "reward_mean", "explained_variance", "policy_lag_mean", "mask_frac_low",
  "mask_frac_high", "entropy", "actor_grad_norm", "critic_grad_norm", "trajectories_per_s", "skipped_steps"];

async function loadOverview() {
  const { metrics } = await api("metrics");
  const box = $("#charts");
  box.innerHTML = "";
  if (!metrics.length) { $("#steps").innerHTML = "<p>No training steps in this source (pick a train source above).</p>"; return; }
  const x = metrics.map((m) => m.step);
  const numeric = [...new Set(metrics.flatMap((m) => Object.keys(m).filter((k) => k !== "step" && typeof m[k] === "number")))];
  const rl = numeric.includes("success_rate");
  const charted = new Set(CHARTS.flatMap(([, keys]) => keys));
  const charts = CHARTS.filter(([, keys]) => keys.some((k) => numeric.includes(k)));
  if (!rl) charts.unshift(...numeric.filter((k) => !charted.has(k)).slice(0, 6).map((k) => [k, [k]])); // e.g. an SFT stage
  const cols = rl ? STEP_COLS : ["step", ...numeric.slice(0, 10)];
  for (const [title, keys] of charts) {
    const have = keys.filter((k) => metrics.some((m) => typeof m[k] === "number"));
    if (!have.length) continue;
    const div = document.createElement("div");
    div.className = "chart";
    box.appendChild(div);
    const series = [{ label: "step" }, ...have.map((k, i) => ({ label: k, stroke: COLORS[i], width: 1.5, points: { show: x.length < 60 } }))];
    const data = [x, ...have.map((k) => metrics.map((m) => (typeof m[k] === "number" ? m[k] : null)))];
    new uPlot({ title, width: 300, height: 150, series, scales: { x: { time: false } } }, data, div);
  }
  const rows = metrics.map((m, i) => ({ ...m, fell: i > 0 && m.success_rate < metrics[i - 1].success_rate }));
  const head = cols.map((c) => `<th>${c.replace(/_/g, " ")}</th>`).join("");
  const body = rows.map((r) => `<tr class="click${r.fell ? " fell" : ""}" data-step="${r.step}">` + cols.map((c) => `<td>${num(r[c])}</td>`).join("") + "</tr>").join("");
  $("#steps").innerHTML = `<table id="step-table"><tr>${head}</tr>${body}</table>`;
}

// -- episode list -----------------------------------------------------------------------------------------------
function filters() {
  const v = (id) => $(id).value.trim();
  const p = { ending: v("#f-ending"), fate: v("#f-fate"), task: v("#f-task"), step: v("#f-step"), q: v("#f-q"),
    sort: v("#f-sort"), desc: $("#f-desc").checked, recorded: $("#f-recorded").checked, offset: S.offset, limit: 50 };
  if (v("#f-rmin")) p.reward_min = v("#f-rmin");
  if (v("#f-rmax")) p.reward_max = v("#f-rmax");
  return p;
}
async function loadEpisodes() {
  say("");
  const asked = filters(), ticket = (S.ticket = (S.ticket || 0) + 1);
  let page;
  try { page = await api("episodes", asked); } catch (e) { say(e.message); return; }
  if (ticket !== S.ticket) return; // a later request owns the table
  $("#ep-count").dataset.query = JSON.stringify(asked);
  S.next = page.next;
  const searched = page.searched === null ? "" : ` (text search read ${page.searched} of them from here)`;
  $("#ep-count").textContent = `${page.total} episodes match${searched}; showing ${page.items.length} from ${S.offset + 1}`;
  $("#ep-table tbody").innerHTML = page.items.map((e) => `<tr class="click" data-line="${e.line}">
    <td title="episode ${esc(e.episode)}, row ${e.row + 1} of ${e.rows}">${e.line}</td><td>${num(e.step)}</td><td class="l">${esc(e.task_id)}</td><td>${num(e.reward)}</td>
    <td class="l ending">${esc(e.ending)}</td><td class="l">${esc(e.fate)}</td><td>${e.turns}</td><td>${e.tokens}</td>
    <td>${e.action_tokens}</td><td>${e.rows}</td><td>${e.prefix_breaks}</td><td>${num(e.lag)}</td>
    <td>${e.oldest_version === null ? "" : e.oldest_version === e.newest_version ? e.oldest_version : e.oldest_version + "-" + e.newest_version}</td>
    <td>${e.recorded ? "yes" : ""}</td></tr>`).join("");
  $("#prev").disabled = S.offset === 0;
  $("#next").disabled = S.next === null;
}

// -- one episode ------------------------------------------------------------------------------------------------
async function openEpisode(line) {
  show("episode");
  $("#tab-episode").disabled = false;
  const ep = (S.episode = await api("episode", { line }));
  const s = ep.summary || {};
  $("#ep-head").innerHTML = `<h3>${esc(s.task_id)} <small>line ${line} of ${esc(S.source)}</small></h3>
    reward <b>${num(ep.reward)}</b> · ${esc(s.ending)} ${s.fate ? "· " + esc(s.fate) : ""} ${s.step != null ? "at step " + s.step : ""}
    ${s.lag != null ? "· lag " + s.lag : ""} · ${s.turns} turns · ${s.tokens} tokens`;
  const recs = ep.token_records;
  $("#rec-step").innerHTML = recs.length ? recs.map((r, i) => `<option value="${i}">${r.step}</option>`).join("") : "<option>none</option>";
  $("#ep-info").innerHTML = infoHtml(ep);
  drawTokens();
}

// info as nested tables (a SWE grader's report: its patch and test lists readable, not one JSON string)
function valueHtml(v, depth) {
  if (v && typeof v === "object" && !Array.isArray(v) && depth < 2) return kvTable(v, depth + 1);
  if (Array.isArray(v) && v.every((x) => typeof x !== "object")) return v.length ? esc(v.join(", ")) : "[]";
  const text = typeof v === "string" ? v : JSON.stringify(v, null, 1);
  return text.length > 80 || text.includes("\n") ? `<pre>${esc(text)}</pre>` : esc(text);
}
function kvTable(obj, depth = 0) {
  return `<table class="kv">${Object.entries(obj).map(([k, v]) => `<tr><td><b>${esc(k)}</b></td><td>${valueHtml(v, depth)}</td></tr>`).join("")}</table>`;
}
function infoHtml(ep) {
  const t = Object.entries(ep.timings).map(([k, v]) => `${k} ${num(v, 2)}`).join(", ");
  return kvTable(ep.info) + (t ? "<p>timings: " + esc(t) + "</p>" : "");
}

const MASK_NAMES = { k: "kept", l: "masked: below the band", h: "masked: above the band", x: "not finite" };
function overlayColor(kind, v, scale, mask) {
  if (v === null || v === undefined) return "";
  if (kind === "ratio") {
    if (mask === "l") return "rgba(51,102,204,0.55)";
    if (mask === "h") return "rgba(204,51,51,0.55)";
    return `rgba(60,150,60,${Math.min(Math.abs(Math.log(v)) / Math.log(scale || 2), 1) * 0.6 + 0.08})`;
  }
  if (kind === "engine_logp" || kind === "new_logp") return `rgba(230,140,20,${(1 - Math.exp(v)) * 0.8})`;
  const a = Math.min(Math.abs(v) / (scale || 1), 1) * 0.75 + 0.05;
  return v >= 0 ? `rgba(40,160,60,${a})` : `rgba(210,50,50,${a})`;
}
function drawTokens() {
  const ep = S.episode;
  if (!ep) return;
  const kind = $("#overlay").value;
  const rec = ep.token_records[Number($("#rec-step").value) || 0];
  const values = kind && rec ? rec[kind] : null;
  const finite = (values || []).filter((v) => v !== null);
  const scale = kind === "ratio" && rec ? Math.max(...rec.band.map((b) => Math.max(b, 1 / b))) : Math.max(1e-9, ...finite.map(Math.abs));
  $("#legend").innerHTML = !kind ? "prompt · action · observation" : !rec ? "this episode has no token record (trainer.token_records)"
    : kind === "ratio" ? `band (${rec.band.map((b) => num(b, 2)).join(", ")}): <span class="swatch" style="background:rgba(60,150,60,.5)"></span> kept
       <span class="swatch" style="background:rgba(51,102,204,.55)"></span> masked below <span class="swatch" style="background:rgba(204,51,51,.55)"></span> masked above · ${(rec.mask || "").replace(/k/g, "").length} of ${(rec.mask || "").length} masked`
    : `${kind.replace("_", " ")} at step ${rec.step}: min ${num(Math.min(...finite))} · max ${num(Math.max(...finite))}` + (kind === "advantage" || kind === "value" ? " (green +, red -)" : " (orange: unlikely)");
  let k = 0;
  const html = ep.segments.map((seg) => {
    const who = seg.kind === "action" ? `action · version ${seg.version}${seg.reward ? " · reward " + num(seg.reward) : ""}` : seg.kind;
    const toks = seg.text.map((t, j) => {
      if (seg.kind !== "action") return `<span class="tok ${seg.kind}">${esc(t)}</span>`;
      const i = k++;
      let style = "", cls = "tok action", title = `id ${seg.ids[j]} · version ${seg.version}`;
      if (rec) {
        const m = rec.mask ? rec.mask[i] : null;
        title += ` · engine logp ${num(rec.engine_logp[i], 4)}` + (rec.new_logp ? ` · new logp ${num(rec.new_logp[i], 4)} · ratio ${num(rec.ratio[i], 4)} (${MASK_NAMES[m]})` : " · no policy step")
          + ` · advantage ${num(rec.advantage[i], 4)}` + (rec.value ? ` · value ${num(rec.value[i], 4)}` : "");
        if (values) { style = `background:${overlayColor(kind, values[i], scale, m)}`; cls += " ov"; }
        if (kind === "ratio" && m === "l") cls += " masked-low";
        if (kind === "ratio" && m === "h") cls += " masked-high";
      }
      return `<span class="${cls}" data-i="${i}" style="${style}" title="${esc(title)}">${esc(t)}</span>`;
    }).join("");
    return `<div class="turn ${seg.kind}"><div class="who">${esc(who)}</div><div class="toks">${toks}</div></div>`;
  }).join("");
  $("#conversation").innerHTML = html;
}

// -- wiring -----------------------------------------------------------------------------------------------------
function wire() {
  for (const b of document.querySelectorAll("button.tab")) b.onclick = () => { show(b.dataset.tab); if (b.dataset.tab === "overview") loadOverview(); if (b.dataset.tab === "episodes") loadEpisodes(); };
  $("#source").onchange = () => { S.source = $("#source").value; S.offset = 0; loadOverview(); loadEpisodes(); };
  $("#filters").onsubmit = (ev) => { ev.preventDefault(); S.offset = 0; loadEpisodes(); };
  for (const id of ["#f-ending", "#f-fate", "#f-sort", "#f-desc", "#f-recorded"]) $(id).onchange = () => { S.offset = 0; loadEpisodes(); };
  $("#prev").onclick = () => { S.offset = Math.max(0, S.offset - 50); loadEpisodes(); };
  $("#next").onclick = () => { if (S.next !== null) { S.offset = S.next; loadEpisodes(); } };
  $("#ep-table tbody").onclick = (ev) => { const tr = ev.target.closest("tr"); if (tr) openEpisode(Number(tr.dataset.line)); };
  $("#steps").onclick = (ev) => {
    const tr = ev.target.closest("tr[data-step]");
    if (!tr) return;
    $("#f-step").value = tr.dataset.step; S.offset = 0; show("episodes"); loadEpisodes();
  };
  $("#run-tables").onclick = (ev) => { if (ev.target.id === "cmp-go") compare().catch((e) => say(e.message)); };
  $("#overlay").onchange = drawTokens;
  $("#conversation").onmouseover = (ev) => { const t = ev.target.closest(".tok.action"); if (t) $("#tok-detail").textContent = t.title; };
  $("#rec-step").onchange = drawTokens;
}

wire();
loadRun().then(() => { loadOverview(); loadEpisodes(); }).catch((e) => say(e.message));
