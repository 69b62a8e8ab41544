// harness run viewer: plain JavaScript, no framework. Four views routed by the URL hash:
//   #/run                       the run: settings, plots, counts, its held-out before/after
//                               (heldout.js)
//   #/rollouts?side=&task=&…    the rollouts table (filter by side, task, step, cause; sort)
//   #/rollout/N?run=a|b&side=S  one rollout: graph, conversation, tokens, rewards, advantage
//   #/compare?task=T            before / after: two runs' rollouts of one task side by side
// Data comes from the server's /api/* (harness/view/server.py), re-read on every request.
"use strict";

const view = document.getElementById("view");
const LANES = ["#4b7bec", "#e8590c", "#2f9e44", "#ae3ec9", "#1098ad", "#f08c00", "#d6336c"];
const TOKEN_LIMIT = 4000;  // per turn, rendered as spans; the rest is summarised
let runInfo = null;
let liveTimer = null;

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;",
    '"': "&quot;", "'": "&#39;"}[c]));
}
function fmt(v, d = 3) {
  if (v === null || v === undefined) return '<span class="none">–</span>';
  if (typeof v === "number") {
    if (Number.isInteger(v)) return String(v);
    return Math.abs(v) < 1e-3 ? v.toExponential(2) : v.toFixed(d);  // 1e-4 is not "0.000"
  }
  return esc(v);
}
function pct(v) { return v === null || v === undefined ? '<span class="none">–</span>' : `${(100 * v).toFixed(0)}%`; }
async function api(path) {
  const r = await fetch(path);
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || `${r.status} on ${path}`);
  return body;
}
function parseHash() {
  const h = location.hash.replace(/^#/, "") || "/run";
  const [path, q] = h.split("?");
  return {parts: path.split("/").filter(Boolean), query: new URLSearchParams(q || "")};
}
function setHashQuery(base, params) {
  const q = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== "" && v !== null && v !== undefined));
  history.replaceState(null, "", `#${base}${q.toString() ? "?" + q : ""}`);
}
function kvTable(obj) {
  const rows = Object.entries(obj || {}).map(([k, v]) =>
    `<tr><td>${esc(k)}</td><td>${typeof v === "object" && v !== null ? esc(JSON.stringify(v, short)) : fmt(v)}</td></tr>`);
  return rows.length ? `<table class="kv">${rows.join("")}</table>` : '<span class="none">none</span>';
}
// JSON.stringify replacer: nested floats to 4 significant digits (timings, rates).
function short(key, x) { return typeof x === "number" && !Number.isInteger(x) ? Number(x.toPrecision(4)) : x; }
function done(state) { view.dataset.state = state; }

// ---- plots (uPlot) ---------------------------------------------------------------------------
function plot(el, title, x, series, opts = {}) {
  const names = Object.keys(series).filter(k => (series[k] || []).some(v => v !== null && v !== undefined));
  if (!x.length || !names.length) {
    el.innerHTML = `<h3>${esc(title)}</h3><div class="none">not recorded yet</div>`;
    el.dataset.plot = "empty";
    return;
  }
  el.innerHTML = `<h3>${esc(title)}</h3>`;
  el.dataset.plot = "drawn";
  const width = Math.max(el.clientWidth - 10, 380);
  // Bars of several series side by side: each series aligned left/right of its x.
  const bars = i => !opts.bars ? undefined : names.length === 1 ? uPlot.paths.bars({size: [0.6, 60]})
    : uPlot.paths.bars({size: [0.35, 40], align: i === 0 ? -1 : 1});
  const scales = {x: {time: false}};
  if (opts.bars) scales.x.range = [Math.min(...x) - 0.7, Math.max(...x) + 0.7];
  if (opts.y) scales.y = {range: opts.y};
  new uPlot({
    width, height: 200, scales,
    axes: [{label: opts.xlabel || "step"}, {}],
    series: [{label: opts.xlabel || "step"}, ...names.map((n, i) => ({
      label: n, stroke: LANES[i % LANES.length], width: 2, paths: bars(i),
      fill: opts.bars ? LANES[i % LANES.length] + "99" : undefined,
      points: {show: x.length < 40},
    }))],
  }, [x, ...names.map(n => series[n])], el);
}

// ---- the run ---------------------------------------------------------------------------------
async function showRun() {
  const run = await api("/api/run");
  runInfo = run;
  const m = run.metrics || {};
  const step = m.step || [];
  const pick = prefix => Object.fromEntries(Object.keys(m).filter(k => k.startsWith(prefix)).map(k => [k, m[k]]));
  const causes = Object.entries(run.causes).map(([c, n]) =>
    `<tr><td class="cause-${esc(c)}">${esc(c)}</td><td class="num">${n}</td>
     <td class="bar"><div style="width:${run.n_rollouts ? 200 * n / run.n_rollouts : 0}px"></div></td></tr>`).join("");
  const skipped = Object.entries(run.groups_skipped).map(([r, n]) => `<tr><td>${esc(r)}</td><td class="num">${n}</td></tr>`).join("")
    || '<tr><td colspan="2" class="none">no group skipped</td></tr>';
  const phases = Object.entries(run.rollout_phases).map(([p, s]) => `<tr><td>${esc(p)}</td><td class="num">${s.toFixed(2)}</td></tr>`).join("");
  const tasks = Object.entries(run.pass_rate_by_task).map(([t, r]) =>
    `<tr><td><a href="#/rollouts?task=${encodeURIComponent(t)}">${esc(t)}</a></td><td class="num">${r.passed}</td>
     <td class="num">${r.scored}</td><td class="num">${r.unscored}</td><td class="num">${pct(r.rate)}</td></tr>`).join("");
  const bad = Object.entries(run.bad_lines).filter(([, n]) => n).map(([f, n]) => `${n} unreadable line(s) in ${esc(f)}`);
  view.innerHTML = `
    <h2>Run <span class="muted">(${esc(run.kind)}, ${run.n_rollouts} rollouts${step.length ? `, ${step.length} steps` : ""})</span></h2>
    ${bad.length ? `<p class="error">${bad.join("; ")}</p>` : ""}
    <div class="grid">
      ${heldoutCard(run)}
      <div class="card plot" id="plot-reward"></div>
      <div class="card plot" id="plot-pass"></div>
      <div class="card"><h3>Rollouts by cause</h3><table class="bars" id="causes">${causes}</table></div>
      <div class="card plot" id="plot-per-minute"></div>
      <div class="card plot" id="plot-staleness"></div>
      <div class="card plot" id="plot-time"></div>
      <div class="card plot" id="plot-tokens"></div>
      <div class="card"><h3>Groups skipped, by reason</h3><table>${skipped}</table>
        <div class="plot" id="plot-skipped"></div></div>
      <div class="card"><h3>Pass rate by task</h3><table><tr><th>task</th><th>passed</th><th>scored</th><th>unscored</th><th>rate</th></tr>${tasks}</table></div>
      <div class="card"><h3>Rollout time per phase (mean s)</h3><table>${phases || '<tr><td class="none">no rollout yet</td></tr>'}</table></div>
      <div class="card"><h3>Settings</h3>${kvTable(run.settings)}</div>
      <div class="card"><h3>Summary</h3>${kvTable(run.summary || run.eval_summary || {})}</div>
    </div>`;
  const rewardSeries = {"reward/mean": m["reward/mean"] || []};
  if (m["rollout/correctness_mean"]) rewardSeries["rollout/correctness_mean"] = m["rollout/correctness_mean"];
  plot(document.getElementById("plot-reward"), "Reward per step", step, rewardSeries);
  const byStep = run.pass_rate_by_step;
  if (byStep.step.length) {
    plot(document.getElementById("plot-pass"), "Pass rate per step (verifier, trained rollouts)", byStep.step, {"pass rate": byStep.rate}, {y: [0, 1]});
  } else {
    const names = Object.keys(run.pass_rate_by_task);
    plot(document.getElementById("plot-pass"), "Pass rate by task (x = task #, see table)",
      names.map((_, i) => i + 1), {"pass rate": names.map(t => run.pass_rate_by_task[t].rate)}, {bars: true, xlabel: "task", y: [0, 1]});
  }
  plot(document.getElementById("plot-per-minute"), "Rollouts finished per minute", run.per_minute.minute,
    {rollouts: run.per_minute.rollouts}, {xlabel: "minute", bars: true});
  plot(document.getElementById("plot-staleness"), "Staleness (policy versions)", step, pick("staleness/m"));
  plot(document.getElementById("plot-time"), "Time per phase per step (s)", step,
    Object.fromEntries(["time/prepare_s", "time/groups_to_rows_s", "time/forward_backward_s", "time/optimizer_s", "time/weight_sync_s", "time/step_s"]
      .filter(k => m[k]).map(k => [k, m[k]])));
  plot(document.getElementById("plot-tokens"), "Tokens trained per step", step, {"tokens/trained": m["tokens/trained"] || []});
  plot(document.getElementById("plot-skipped"), "skipped per step", step, pick("groups/skipped/"), {bars: true});
  drawHeldout(run);
  done("ready");
  scheduleLive(run, showRun);
}

function scheduleLive(run, again) {
  clearTimeout(liveTimer);
  const finished = run.summary || run.eval_summary;
  document.getElementById("live").textContent = finished ? "finished run" : `live · read ${new Date().toLocaleTimeString()}`;
  if (!finished) liveTimer = setTimeout(() => { if (parseHash().parts[0] === "run") again().catch(showError); }, 5000);
}

// ---- the rollouts table ----------------------------------------------------------------------
const COLUMNS = [["index", "#"], ["task_id", "task"], ["step", "step"], ["cause", "cause"],
  ["env_reward", "env reward"], ["reward", "reward"], ["advantage", "advantage"],
  ["seconds", "seconds"], ["attempts", "attempts"], ["error", "error"], ["side", "side"]];
let tableShown = 500;

async function showRollouts(query) {
  const {rollouts} = await api("/api/rollouts");
  const sides = [...new Set(rollouts.map(r => r.side))];  // the run's own first, then eval-*
  const tasks = [...new Set(rollouts.map(r => r.task_id))].sort();
  const causes = [...new Set(rollouts.map(r => r.cause))].sort();
  const steps = [...new Set(rollouts.map(r => r.step).filter(s => s !== null))].sort((a, b) => a - b);
  const opt = (vals, cur) => `<option value="">all</option>` + vals.map(v => `<option ${String(v) === cur ? "selected" : ""}>${esc(v)}</option>`).join("");
  view.innerHTML = `
    <h2>Rollouts <span class="muted" id="count"></span></h2>
    <div class="filters">
      side <select id="f-side">${opt(sides, query.get("side") || "")}</select>
      task <select id="f-task">${opt(tasks, query.get("task") || "")}</select>
      step <select id="f-step">${opt(steps, query.get("step") || "")}</select>
      cause <select id="f-cause">${opt(causes, query.get("cause") || "")}</select>
      reward ≥ <input id="f-min" size="5" value="${esc(query.get("min") || "")}">
      <span class="muted">click a column to sort</span>
    </div>
    <table id="rollouts"><thead><tr>${COLUMNS.map(([k, l]) => `<th class="sortable ${["task_id", "cause", "error", "side"].includes(k) ? "" : "num"}" data-key="${k}">${l}</th>`).join("")}</tr></thead><tbody></tbody></table>
    <p id="more"></p>`;
  const state = {sort: query.get("sort") || "index", desc: query.get("desc") === "1"};
  const render = () => {
    const f = {side: val("f-side"), task: val("f-task"), step: val("f-step"), cause: val("f-cause"), min: val("f-min")};
    const min = f.min === "" ? null : Number(f.min);
    let rows = rollouts.filter(r => (!f.side || r.side === f.side) && (!f.task || r.task_id === f.task) && (!f.cause || r.cause === f.cause)
      && (!f.step || String(r.step) === f.step) && (min === null || (r.env_reward ?? -Infinity) >= min));
    const k = state.sort;
    rows = rows.slice().sort((a, b) => {
      const x = a[k], y = b[k];
      if (x === y) return sides.indexOf(a.side) - sides.indexOf(b.side) || a.index - b.index;
      if (x === null || x === undefined) return 1;  // unrecorded values last, either order
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * (state.desc ? -1 : 1);
    });
    setHashQuery("/rollouts", {...f, sort: state.sort === "index" ? "" : state.sort, desc: state.desc ? "1" : ""});
    document.getElementById("count").textContent = `(${rows.length} of ${rollouts.length})`;
    document.querySelector("#rollouts tbody").innerHTML = rows.slice(0, tableShown).map(r => {
      const href = `#/rollout/${r.index}?side=${encodeURIComponent(r.side)}`;  // indices repeat across sides
      return `<tr data-index="${r.index}" data-side="${esc(r.side)}">
      <td class="num"><a href="${href}">${r.index}</a></td><td><a href="${href}">${esc(r.task_id)}</a></td>
      <td class="num">${fmt(r.step)}</td><td class="cause-${esc(r.cause)}">${esc(r.cause)}</td>
      <td class="num">${fmt(r.env_reward)}</td><td class="num">${fmt(r.reward)}</td><td class="num">${fmt(r.advantage)}</td>
      <td class="num">${fmt(r.seconds, 1)}</td><td class="num">${fmt(r.attempts)}</td><td>${esc(r.error || "")}</td>
      <td class="side-${esc(r.side)}">${esc(r.side)}</td></tr>`;
    }).join("");
    document.getElementById("more").innerHTML = rows.length > tableShown
      ? `showing ${tableShown} of ${rows.length} <button id="show-more">show ${Math.min(rows.length - tableShown, 2000)} more</button>` : "";
    const more = document.getElementById("show-more");
    if (more) more.onclick = () => { tableShown += 2000; render(); };
    document.querySelectorAll("#rollouts th").forEach(th => {
      th.textContent = COLUMNS.find(c => c[0] === th.dataset.key)[1] + (th.dataset.key === state.sort ? (state.desc ? " ▼" : " ▲") : "");
    });
  };
  const val = id => document.getElementById(id).value;
  ["f-side", "f-task", "f-step", "f-cause", "f-min"].forEach(id => document.getElementById(id).addEventListener("input", () => { tableShown = 500; render(); }));
  document.querySelectorAll("#rollouts th").forEach(th => th.addEventListener("click", () => {
    state.desc = state.sort === th.dataset.key ? !state.desc : ["env_reward", "reward", "advantage", "seconds"].includes(th.dataset.key);
    state.sort = th.dataset.key;
    render();
  }));
  render();
  done("ready");
}

// ---- one rollout -----------------------------------------------------------------------------
function content(c) {
  if (c === null || c === undefined) return "";
  if (typeof c === "string") return c;
  if (Array.isArray(c)) return c.map(p => typeof p === "string" ? p : (p.text ?? p.content ?? JSON.stringify(p))).map(content).join("\n");
  return JSON.stringify(c, null, 1);
}
function messageHtml(m, extraClass = "") {
  const role = m.role || m.type || "message";
  const calls = (m.tool_calls || []).map(tc => {
    const fn = tc.function || tc;
    // Arguments as a person reads them: one "key: value" line each, strings unescaped.
    let args = fn.arguments ?? fn.input ?? "";
    try {
      const parsed = typeof args === "string" ? JSON.parse(args) : args;
      if (parsed && typeof parsed === "object" && !Array.isArray(parsed)) {
        args = Object.entries(parsed).map(([k, v]) => `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`).join("\n");
      }
    } catch (e) { /* not JSON: shown as the model wrote it */ }
    return `<div class="toolcall"><b>tool call</b> ${esc(fn.name)} <span class="muted">${esc(tc.id || "")}</span>\n${esc(content(args))}</div>`;
  }).join("");
  const id = m.tool_call_id ? ` <span class="muted">result of ${esc(m.tool_call_id)}</span>` : "";
  return `<div class="msg ${esc(role)} ${extraClass}"><span class="role">${esc(role)}${id}</span>${esc(content(m.content))}${calls}</div>`;
}
function tokenSpans(tokens) {
  const shown = tokens.slice(0, TOKEN_LIMIT).map(([id, text, logp, mask]) => {
    const p = logp === null ? null : Math.exp(logp);
    // trained: green (likely) to red (unlikely) by the sampled token's probability; masked: grey
    const bg = mask ? (p === null ? "#fff3bf" : `hsl(${Math.round(120 * p)}, 75%, 85%)`) : "";
    const title = `id ${id} · logprob ${logp === null ? "none" : logp.toFixed(3)}${p === null ? "" : ` (p ${p.toFixed(3)})`} · ${mask ? "trained" : "masked"}`;
    const shownText = text === null ? `⟨${id}⟩` : text;
    return `<span class="tok t${mask ? 1 : 0}" data-mask="${mask ? 1 : 0}" data-id="${id}" title="${esc(title)}"${bg ? ` style="background:${bg}"` : ""}>${esc(shownText)}</span>`;
  }).join("");
  return shown + (tokens.length > TOKEN_LIMIT ? `<span class="muted"> … ${tokens.length - TOKEN_LIMIT} more tokens</span>` : "");
}
function graphSvg(turns) {
  if (!turns.length) return "";
  const lanes = Math.max(...turns.map(t => t.branch)) + 1, row = 22, col = 22;
  const x = t => 14 + t.branch * col, y = t => 14 + t.i * row;
  const edges = turns.filter(t => t.parent !== null).map(t => {
    const p = turns[t.parent];
    return `<path d="M${x(p)},${y(p)} C${x(p)},${y(t) - row / 2} ${x(t)},${y(p) + row / 2} ${x(t)},${y(t)}" stroke="${LANES[t.branch % LANES.length]}" fill="none" stroke-width="2"/>`;
  }).join("");
  const nodes = turns.map(t => `<a class="graph-node" data-turn="${t.i}" style="cursor:pointer"><circle cx="${x(t)}" cy="${y(t)}" r="6" fill="${t.aux ? "#fff" : LANES[t.branch % LANES.length]}" stroke="${LANES[t.branch % LANES.length]}" stroke-width="2"/>
    <text x="${14 + lanes * col}" y="${y(t) + 4}" font-size="11">turn ${t.i}${t.aux ? ` · aux (${esc(t.aux_reason || "aux")})` : ""}${t.compacted_by !== null && t.compacted_by !== undefined ? ` · compacted (summary: turn ${t.compacted_by})` : ""}${t.forks_from !== null ? (t.forks_from === -1 ? " · new root (its prompt extends no earlier call)" : ` · branch from turn ${t.forks_from} (history rewritten)`) : ""} · ${t.n_trained}/${t.n_completion_tokens} tokens trained</text></a>`).join("");
  return `<svg width="${40 + lanes * col + 600}" height="${turns.length * row + 10}">${edges}${nodes}</svg>`;
}

async function showRollout(index, query) {
  const which = query.get("run") || "a";
  const side = query.get("side") || "";
  const r = await api(`/api/rollout/${index}?run=${which}${side ? "&side=" + encodeURIComponent(side) : ""}`);
  const t = r.trained;
  const outcome = r.outcome || {};
  const branches = new Set(r.turns.map(x => x.branch)).size;
  const group = r.group ? `<table><tr><th>episode</th><th>reward</th><th>advantage</th><th>parts</th></tr>${r.group.rollouts.map(g =>
    `<tr class="${g.episode_id === r.episode_id ? "sel" : ""}"><td>${esc(g.episode_id)}</td><td class="num">${fmt(g.reward)}</td><td class="num">${fmt(g.advantage)}</td><td>${esc(JSON.stringify(g.parts))}</td></tr>`).join("")}</table>
    ${r.group.skipped ? `<p>group skipped: <b>${esc(r.group.skipped)}</b></p>` : ""}` : '<span class="none">not trained (an eval run, or the run stopped before this group\'s step)</span>';
  const verifierOut = r.verifier_output ?? r.verifier_stdout ?? null;
  view.innerHTML = `
    <h2>Rollout ${r.index} <span class="muted">${esc(r.task_id)} · ${esc(r.episode_id || "")}${which === "b" ? " · run B" : ""} · <span id="side">${esc(r.side)}</span></span></h2>
    <div class="grid">
      <div class="card"><h3>Outcome</h3><table class="kv">
        <tr><td>cause</td><td class="cause-${esc(r.cause)}" id="cause">${esc(r.cause)}</td></tr>
        <tr><td>env reward (verifier)</td><td id="env-reward">${fmt(r.env_reward)}</td></tr>
        <tr><td>verifier rewards</td><td>${esc(JSON.stringify(r.rewards || {}))}</td></tr>
        <tr><td>error</td><td class="error">${esc(r.error || "")}</td></tr>
        <tr><td>tool calls</td><td>${fmt(outcome.tool_call_count)} (${fmt(outcome.tool_failure_count)} failed) ${esc(JSON.stringify(outcome.tool_calls_by_name || {}))}</td></tr>
        <tr><td>timed out</td><td>${fmt(outcome.timed_out)}</td></tr>
        <tr><td>attempts</td><td>${fmt(r.attempts)}</td></tr>
        <tr><td>timings (s)</td><td>${esc(Object.entries(r.timings || {}).map(([k, v]) => `${k} ${Number(v).toFixed(1)}`).join(" · "))}</td></tr>
      </table></div>
      <div class="card"><h3>Training</h3><table class="kv">
        <tr><td>step</td><td>${t ? fmt(t.step) : '<span class="none">not trained</span>'}</td></tr>
        <tr><td>reward trained on</td><td id="reward">${t ? fmt(t.reward) : '<span class="none">–</span>'}</td></tr>
        <tr><td>reward functions' parts</td><td id="parts">${t ? kvTable(t.parts) : '<span class="none">–</span>'}</td></tr>
        <tr><td>advantage</td><td id="advantage">${t ? fmt(t.advantage, 4) : '<span class="none">–</span>'}</td></tr>
        ${t && t.reward_failure ? `<tr><td>reward failure</td><td class="error">${esc(t.reward_failure)}</td></tr>` : ""}
      </table><h3>Its group</h3>${group}</div>
      <div class="card"><h3>Verifier output</h3>${verifierOut ? `<pre class="out">${esc(verifierOut)}</pre>` : '<span class="none">not recorded in this rollout\'s record</span>'}</div>
    </div>
    <h3>Rollout graph <span class="muted">(${r.turns.length} engine turns, ${branches} branch${branches === 1 ? "" : "es"})</span></h3>
    <div class="graph">${graphSvg(r.turns)}</div>
    <p class="legend"><span class="tok t1" style="background:hsl(120,75%,85%)">trained, likely</span>
      <span class="tok t1" style="background:hsl(0,75%,85%)">trained, unlikely</span>
      <span class="tok t0">masked (not trained)</span><span class="muted">tokens: ${esc(r.tokenizer)}; hover a token for its id and logprob</span></p>
    <div id="turns">${r.turns.map(turnHtml).join("")}</div>`;
  // Graph nodes scroll to their turn (a #fragment link would re-route the page).
  view.querySelectorAll(".graph-node").forEach(a => a.addEventListener("click", () =>
    document.getElementById(`turn-${a.dataset.turn}`).scrollIntoView({behavior: "smooth"})));
  done("ready");
}
function turnHtml(t) {
  const lane = LANES[t.branch % LANES.length];
  const fork = t.forks_from === null ? "" : t.forks_from === -1 ? (t.join === "rewritten"
      ? '<span class="badge fork">rewritten history: a new row (its prompt extends no earlier call)</span>'
      : '<span class="badge fork">new root: its prompt extends no earlier call</span>')
    : `<span class="badge fork">branch from turn ${t.forks_from}: history rewritten</span>`;
  return `<div class="turn ${t.aux ? "aux" : ""}" id="turn-${t.i}" style="--lane:${lane}">
    <div class="turn-head"><b>turn ${t.i}</b><span class="badge branch">branch ${t.branch}</span>${fork}
      ${t.compacted_by !== null && t.compacted_by !== undefined ? `<span class="badge compacted">history compacted here: the prompt carries turn ${t.compacted_by}'s summary</span>` : ""}
      ${t.aux ? `<span class="badge aux">aux call: ${esc(t.aux_reason || "aux")} (not trained)</span>` : ""}
      <span class="muted">${esc(t.dialect || "")}${t.join ? " · joined: " + esc(t.join) : ""} · parent ${t.parent === null ? "none" : "turn " + t.parent}
      · weights v${fmt(t.weight_version[0])}→v${fmt(t.weight_version[1])} · ${t.latency_s === null || t.latency_s === undefined ? "" : t.latency_s.toFixed(2) + " s ·"}
      prompt ${t.n_prompt_tokens} tok · completion ${t.n_completion_tokens} tok · ${t.n_trained} trained
      ${Object.keys(t.masked_logprobs).length ? "· masked: " + esc(JSON.stringify(t.masked_logprobs)) : ""}</span></div>
    ${t.new_messages.map(m => messageHtml(m)).join("")}
    ${t.reply ? messageHtml(t.reply, "reply") : '<div class="none">no reply recorded</div>'}
    <details ${t.aux ? "" : "open"}><summary>completion tokens (${t.n_completion_tokens}, ${t.n_trained} trained)</summary>
      <div class="tokens completion">${tokenSpans(t.tokens)}</div></details>
    <details><summary>prompt tokens this turn added (${t.prompt_new_tokens.length}, masked)</summary>
      <div class="tokens prompt">${tokenSpans(t.prompt_new_tokens)}</div></details>
  </div>`;
}

// ---- before / after --------------------------------------------------------------------------
async function showCompare(query) {
  const data = await api("/api/compare");
  const tasks = [...new Set([...Object.keys(data.a.run), ...Object.keys(data.b.run)])].sort();
  const task = query.get("task") || tasks[0];
  const rate = (k, t) => (data[k].run[t] || {}).rate ?? null;
  const rows = tasks.map(t => `<tr class="${t === task ? "sel" : ""}"><td><a href="#/compare?task=${encodeURIComponent(t)}">${esc(t)}</a></td>
    <td class="num">${pct(rate("a", t))}</td><td class="num">${pct(rate("b", t))}</td>
    <td class="num">${rate("a", t) === null || rate("b", t) === null ? "–" : ((rate("b", t) - rate("a", t)) * 100).toFixed(0) + " pts"}</td></tr>`).join("");
  const column = k => {
    const rs = data[k].rollouts.filter(r => r.task_id === task);
    return `<div class="card" id="col-${k}"><h3>${k === "a" ? "A (before)" : "B (after)"} <span class="muted">${esc(data[k].dir)}</span></h3>
      <p class="muted">click a row to read it here; # opens the whole rollout</p>
      <div class="scroll"><table><tr><th>#</th><th>cause</th><th>env reward</th><th>seconds</th></tr>${rs.map(r => `<tr class="pick" data-index="${r.index}"><td><a href="#/rollout/${r.index}?run=${k}">${r.index}</a></td>
      <td class="cause-${esc(r.cause)}">${esc(r.cause)}</td><td class="num">${fmt(r.env_reward)}</td><td class="num">${fmt(r.seconds, 1)}</td></tr>`).join("")
      || '<tr><td colspan="4" class="none">no rollout of this task</td></tr>'}</table></div>
      <div class="conversation" data-run="${k}">${rs.length ? "loading…" : ""}</div></div>`;
  };
  view.innerHTML = `<h2>Before / after <span class="muted">${esc(task || "")}</span></h2>
    <div class="grid"><div class="card"><h3>Pass rate by task</h3><table><tr><th>task</th><th>A</th><th>B</th><th>B − A</th></tr>${rows}</table></div>
    <div class="card plot" id="plot-compare"></div></div>
    <div class="cols">${column("a")}${column("b")}</div>`;
  plot(document.getElementById("plot-compare"), "Pass rate by task: A vs B (x = task #)", tasks.map((_, i) => i + 1),
    {A: tasks.map(t => rate("a", t)), B: tasks.map(t => rate("b", t))}, {bars: true, xlabel: "task", y: [0, 1]});
  // A rollout of the task in each run, as the agent lived it (messages only): the first, or
  // the one clicked in that column.
  const load = async (k, index) => {
    const r = await api(`/api/rollout/${index}?run=${k}`);
    document.querySelectorAll(`#col-${k} tr.pick`).forEach(tr => tr.classList.toggle("sel", Number(tr.dataset.index) === index));
    document.querySelector(`.conversation[data-run="${k}"]`).innerHTML =
      `<p class="muted">rollout ${r.index}: ${esc(r.cause)}, env reward ${fmt(r.env_reward)}</p>` +
      r.turns.filter(t => !t.aux).map(t => t.new_messages.map(m => messageHtml(m)).join("") + (t.reply ? messageHtml(t.reply) : "")).join("");
  };
  ["a", "b"].forEach(k => document.querySelectorAll(`#col-${k} tr.pick`).forEach(tr =>
    tr.addEventListener("click", e => { if (e.target.tagName !== "A") load(k, Number(tr.dataset.index)).catch(showError); })));
  await Promise.all(["a", "b"].map(async k => {
    const first = data[k].rollouts.find(r => r.task_id === task);
    if (first) await load(k, first.index);
  }));
  done("ready");
}

// ---- routing ---------------------------------------------------------------------------------
function showError(e) {
  view.innerHTML = `<p class="error">${esc(e.message || e)}</p>`;
  done("error");
}
async function route() {
  clearTimeout(liveTimer);
  const {parts, query} = parseHash();
  document.querySelectorAll("nav a").forEach(a => a.classList.toggle("active", a.dataset.nav === parts[0] || (parts[0] === "rollout" && a.dataset.nav === "rollouts")));
  done("loading");
  try {
    if (!runInfo) {
      runInfo = await api("/api/run");
      document.getElementById("run-dir").textContent = runInfo.dir;
      document.getElementById("nav-compare").hidden = !runInfo.compare;
    }
    if (parts[0] === "rollouts") await showRollouts(query);
    else if (parts[0] === "rollout") await showRollout(Number(parts[1]), query);
    else if (parts[0] === "compare") await showCompare(query);
    else await showRun();
  } catch (e) { showError(e); }
}
window.addEventListener("hashchange", route);
route();
