// harness run viewer: a train run's own held-out evaluation (harness.train --eval-tasks), on the
// run page. before_after.json gives the pass rates per task and overall, before and after
// training, and the change; each count links to that side's rollouts of the task (the rollouts
// table filtered by side: eval-before / eval-after), which open turn by turn like training ones.
// Loaded before app.js; uses its esc(), fmt(), pct(), kvTable() and plot() when called.
"use strict";

function heldoutRate(row) { return row && row.scored ? row.passed / row.scored : null; }
function heldoutChange(b, a) {
  return b === null || b === undefined || a === null || a === undefined ? null : (a - b) * 100;
}
function heldoutCell(row, side, task) {
  if (!row) return '<span class="none">–</span>';
  const q = new URLSearchParams({side, ...(task ? {task} : {})});
  const unscored = row.unscored ? ` <span class="muted">+${row.unscored} unscored</span>` : "";
  return `<a href="#/rollouts?${q}">${row.passed}/${row.scored}</a> (${pct(heldoutRate(row))})${unscored}`;
}
function heldoutChangeCell(points, digits) {
  if (points === null) return '<span class="none">–</span>';
  const cls = points > 0 ? "up" : points < 0 ? "down" : "";
  return `<span class="change ${cls}">${points > 0 ? "+" : ""}${points.toFixed(digits)} points</span>`;
}

// The card (HTML) for the run page; "" when the run has no before_after.json.
function heldoutCard(run) {
  const d = run.before_after;
  if (!d) return "";
  if (d._unreadable) return `<div class="card wide" id="heldout"><h3>Held-out before / after</h3><p class="error">${esc(d._unreadable)}</p></div>`;
  const tasks = Object.keys(d.per_task || {}).sort();
  const rows = tasks.map(t => {
    const r = d.per_task[t];
    return `<tr data-task="${esc(t)}"><td class="task">${esc(t)}</td><td class="num">${heldoutCell(r.before, "eval-before", t)}</td>
      <td class="num">${heldoutCell(r.after, "eval-after", t)}</td><td class="num">${heldoutChangeCell(heldoutChange(heldoutRate(r.before), heldoutRate(r.after)), 0)}</td></tr>`;
  }).join("");
  const overall = `<tr class="overall"><td><b>overall</b></td><td class="num">${heldoutCell(d.before, "eval-before")}</td>
    <td class="num">${heldoutCell(d.after, "eval-after")}</td><td class="num">${heldoutChangeCell(heldoutChange(d.before_pass_rate, d.after_pass_rate), 1)}</td></tr>`;
  const {per_task, before, after, ...rest} = d;  // the rest: eval tasks, seed, control, versions…
  const n = side => (run.sides || {})[side] ?? 0;
  return `<div class="card wide" id="heldout"><h3>Held-out before / after training <span class="muted">(this run's own evaluation, at the starting and the last pushed weights)</span></h3>
    <table id="heldout-table"><tr><th>task</th><th>before</th><th>after</th><th>change</th></tr>${rows}${overall}</table>
    <p class="muted">passed/scored; a pass is env reward ≥ ${fmt(d.pass_threshold ?? 1)}. Rollouts:
      <a href="#/rollouts?side=eval-before">${n("eval-before")} before</a> ·
      <a href="#/rollouts?side=eval-after">${n("eval-after")} after</a></p>
    <div class="plot" id="plot-heldout"></div>
    <details><summary>before_after.json: the rest</summary>${kvTable(rest)}</details></div>`;
}

// Its plot (after the card is in the page): pass rate per task and overall, before and after.
function drawHeldout(run) {
  const d = run.before_after, el = document.getElementById("plot-heldout");
  if (!d || !el) return;
  const tasks = Object.keys(d.per_task || {}).sort();
  const side = k => [...tasks.map(t => heldoutRate(d.per_task[t][k])), heldoutRate(d[k])];
  plot(el, `Pass rate before / after (x = task # in the table, ${tasks.length + 1} = overall)`,
    [...tasks, "overall"].map((_, i) => i + 1), {before: side("before"), after: side("after")},
    {bars: true, xlabel: "task", y: [0, 1]});
}
