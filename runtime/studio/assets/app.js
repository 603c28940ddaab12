// trinity studio: one page, five views (runs, curves, rollouts, config, plugins), routed by the URL's hash so
// that every view can be linked and reloaded. Everything comes from the JSON API of the same server; the page
// polls it while a view that shows live data is open.
"use strict";

const REFRESH_MS = 3000;
const COLORS = ["#2f6fdf", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c", "#5c940d"];

const STEP_TICKS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 20000, 50000, 100000];

const studio = { charts: {}, timer: null, view: null };
window.studio = studio;

// ---- small helpers -------------------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// The session's token, which the studio wrote into this page: a POST carries it (and JSON, and the page's Origin),
// so that only this page, not one from another site, can validate or save configs.
const STUDIO_TOKEN = document.querySelector('meta[name="studio-token"]')?.content ?? "";

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: "POST", headers: { "content-type": "application/json", "x-studio-token": STUDIO_TOKEN },
    body: JSON.stringify(body),
  };
  const response = await fetch(path, options);
  const data = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

function qs(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    for (const v of [].concat(value)) if (v !== undefined && v !== null && v !== "") search.append(key, v);
  }
  return search.toString();
}

function fmt(value, digits = 3) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  return Number(value).toFixed(digits);
}

function ago(seconds) {
  if (!seconds) return "–";
  const delta = Math.max(0, Date.now() / 1000 - seconds);
  if (delta < 60) return `${Math.round(delta)} s ago`;
  if (delta < 3600) return `${Math.round(delta / 60)} min ago`;
  if (delta < 86400) return `${Math.round(delta / 3600)} h ago`;
  return new Date(seconds * 1000).toLocaleString();
}

function toast(text) {
  const box = document.getElementById("toast");
  box.textContent = text;
  box.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { box.hidden = true; }, 3000);
}

function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [page, query] = hash.split("?");
  return { page: page || "runs", params: new URLSearchParams(query || "") };
}

function go(page, params) {
  location.hash = `#/${page}${params ? "?" + qs(params) : ""}`;
}

function setRefresh(work) {
  clearInterval(studio.timer);
  studio.timer = work ? setInterval(work, REFRESH_MS) : null;
}

function runLabel(run) {
  return [run.project, run.group, run.name].filter(Boolean).join(" / ") || run.id;
}

// ---- runs ----------------------------------------------------------------------------------------------------

async function showRuns(main) {
  const table = el("table", { id: "runs" });
  const compare = el("button", { class: "primary", id: "compare", disabled: true }, "Curves of selected runs");
  main.append(el("h2", {}, "Runs"), el("div", { class: "toolbar" }, compare), table);
  const selected = new Set();
  compare.addEventListener("click", () => go("curves", { run: [...selected] }));
  async function refresh() {
    let data;
    try { data = await api("/api/runs"); } catch (error) { table.replaceChildren(errorRow(error)); return; }
    document.getElementById("root").textContent = data.root;
    const head = el("tr", {}, ["", "run", "mode", "status", "steps", "last reward", "eval accuracy", "model",
      "checkpoints", "updated", ""].map((h) => el("th", {}, h)));
    const rows = data.runs.map((run) => {
      const box = el("input", { type: "checkbox", checked: selected.has(run.id) });
      box.addEventListener("change", () => {
        if (box.checked) selected.add(run.id); else selected.delete(run.id);
        compare.disabled = selected.size === 0;
      });
      const total = run.total_steps;
      const done = run.steps_done ?? 0;
      const steps = el("td", { class: "num" }, `${run.steps_done ?? "–"} / ${total ?? "?"}`,
        total ? el("div", { class: "progress" }, el("div", { style: `width:${Math.min(100, 100 * done / total)}%` })) : null);
      const status = el("td", {}, el("span", { class: `badge ${run.status}`, title: run.error || "" }, run.status),
        run.error ? el("div", { class: "muted", style: "font-size:12px;max-width:260px" }, run.error) : null);
      return el("tr", { "data-run": run.id },
        el("td", {}, box),
        el("td", {}, el("a", { href: `#/curves?${qs({ run: run.id })}` }, runLabel(run)), el("div", { class: "muted" }, run.id)),
        el("td", {}, run.mode || "–"),
        status,
        steps,
        el("td", { class: "num" }, fmt(run.last_reward)),
        el("td", { class: "num", title: run.eval_metric || "" }, fmt(run.eval_accuracy)),
        el("td", { class: "muted", style: "max-width:220px;word-break:break-all" }, run.model || "–"),
        el("td", { class: "num" }, run.checkpoints.length ? run.checkpoints.join(", ") : "–"),
        el("td", {}, ago(run.updated_at)),
        el("td", {}, el("a", { href: `#/rollouts?${qs({ run: run.id })}` }, "rollouts")));
    });
    if (rows.length === 0) rows.push(el("tr", {}, el("td", { colspan: 11, class: "muted" }, `no runs under ${data.root} yet`)));
    table.replaceChildren(head, ...rows);
  }
  await refresh();
  setRefresh(refresh);
}

function errorRow(error) {
  return el("tr", {}, el("td", { class: "error-box" }, error.message));
}

// ---- curves --------------------------------------------------------------------------------------------------

// The metrics drawn are those the URL names; a URL that names none (a run's link on the Runs page) opens on the
// selected runs' reward and eval accuracies (the server's `preselected`), and the selection follows the runs
// checked until a metric is picked or dropped by hand.
async function showCurves(main, params) {
  let runs = params.getAll("run");
  let metrics = params.getAll("metric");
  let picked = metrics.length > 0;
  const allRuns = (await api("/api/runs")).runs;
  if (runs.length === 0 && allRuns.length) runs = [allRuns[allRuns.length - 1].id];
  const runBox = el("div", { class: "metric-list", id: "curve-runs" });
  for (const run of allRuns) {
    const box = el("input", { type: "checkbox", checked: runs.includes(run.id), value: run.id });
    box.addEventListener("change", () => {
      runs = box.checked ? [...runs, run.id] : runs.filter((r) => r !== run.id);
      update();
    });
    runBox.append(el("label", { title: run.id }, box, " ", run.id));
  }
  const search = el("input", { type: "text", id: "metric-search", placeholder: "search metrics…", style: "width:100%" });
  const list = el("div", { class: "metric-list", id: "metric-list" });
  const charts = el("div", { class: "charts", id: "charts" });
  const note = el("div", { class: "muted", id: "curve-note" });
  main.append(el("h2", {}, "Curves"), el("div", { class: "row" },
    el("div", { class: "side" }, el("h3", {}, "Runs"), runBox, el("h3", {}, "Metrics"), search, list),
    el("div", { class: "grow" }, note, charts)));
  let names = [];

  function update() {
    history.replaceState(null, "", `#/curves?${qs({ run: runs, metric: picked ? metrics : [] })}`);
    loadNames().then(draw);
  }
  async function loadNames() {
    const found = new Set();
    const preselected = new Set();
    const skipped = [];
    for (const run of runs) {
      try {
        const data = await api(`/api/metrics?${qs({ run })}`);
        data.names.forEach((n) => found.add(n));
        data.preselected.forEach((n) => preselected.add(n));
        for (const s of data.skipped) skipped.push(`${run}: ${s.count} unreadable line(s) in ${s.file} (line ${s.lines.map((l) => l.line).join(", ")})`);
      } catch (error) { skipped.push(`${run}: ${error.message}`); }
    }
    names = [...found].sort();
    if (!picked) metrics = [...preselected];
    note.textContent = skipped.join("; ");
    renderList();
  }
  function renderList() {
    const term = search.value.trim().toLowerCase();
    list.replaceChildren(...names.filter((n) => n.toLowerCase().includes(term)).map((name) => {
      const box = el("input", { type: "checkbox", checked: metrics.includes(name), "data-metric": name });
      box.addEventListener("change", () => {
        metrics = box.checked ? [...metrics, name] : metrics.filter((m) => m !== name);
        picked = true;
        update();
      });
      return el("label", { title: name }, box, " ", name);
    }));
  }
  search.addEventListener("input", renderList);

  async function draw() {
    if (metrics.length === 0) {
      charts.replaceChildren(el("div", { class: "muted" }, "pick metrics on the left"));
      studio.charts = {};
      return;
    }
    const perRun = [];
    for (const run of runs) {
      try { perRun.push({ run, data: await api(`/api/series?${qs({ run, name: metrics })}`) }); }
      catch (error) { note.textContent = `${run}: ${error.message}`; }
    }
    charts.querySelectorAll(":scope > :not(.chart)").forEach((n) => n.remove());
    const stale = new Set(Object.keys(studio.charts));
    for (const metric of metrics) {
      stale.delete(metric);
      const data = align(perRun, metric);
      const points = data.slice(1).reduce((n, s) => n + s.filter((v) => v !== null).length, 0);
      let chart = studio.charts[metric];
      if (chart && chart.series.length === data.length) {
        chart.setData(data);
      } else {
        if (chart) chart.destroy();
        const box = charts.querySelector(`[data-metric="${CSS.escape(metric)}"]`) || el("div", { class: "chart", "data-metric": metric },
          el("div", { class: "title" }, metric));
        charts.append(box);
        box.querySelectorAll(".uplot").forEach((n) => n.remove());
        chart = new uPlot({
          width: Math.max(420, box.clientWidth - 16), height: 240,
          scales: { x: { time: false } },
          // Steps are whole numbers: ticks at 1, 2, 5, 10, ... apart, never between two steps.
          // The value axis is as wide as its longest label: uPlot's fixed default width cut the minus sign off
          // labels such as -0.025.
          axes: [{ label: "step", incrs: STEP_TICKS }, { size: valueAxisWidth }],
          series: [{ label: "step" }, ...perRun.map((r, i) => ({
            label: r.run, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true, points: { show: true, size: 5 },
          }))],
        }, data, box);
        studio.charts[metric] = chart;
      }
      chart.root.parentElement.setAttribute("data-points", points);
    }
    for (const metric of stale) {
      studio.charts[metric].destroy();
      delete studio.charts[metric];
      charts.querySelector(`[data-metric="${CSS.escape(metric)}"]`)?.remove();
    }
    charts.querySelectorAll(".chart").forEach((box) => {
      if (!metrics.includes(box.getAttribute("data-metric"))) box.remove();
    });
  }
  studio.charts = {};
  update();
  setRefresh(() => draw());
}

// uPlot's `size` callback for a value axis: tick length, gap and the widest label in the axis font. On uPlot's
// later layout passes (cycleNum > 1) the size it settled on is kept, so the layout converges.
function valueAxisWidth(u, values, axisIdx, cycleNum) {
  const axis = u.axes[axisIdx];
  if (cycleNum > 1) return axis._size;
  const longest = (values || []).reduce((a, v) => (String(v).length > a.length ? String(v) : a), "");
  let width = axis.ticks.size + axis.gap;
  if (longest) {
    u.ctx.font = axis.font[0];
    width += u.ctx.measureText(longest).width / devicePixelRatio;
  }
  return Math.ceil(width) + 4;
}

// One uPlot table for `metric` over several runs: the union of their steps on x, one series per run.
function align(perRun, metric) {
  const steps = [...new Set(perRun.flatMap((r) => r.data.steps))].sort((a, b) => a - b);
  const columns = perRun.map((r) => {
    const at = new Map(r.data.steps.map((s, i) => [s, r.data.values[metric]?.[i] ?? null]));
    return steps.map((s) => (at.has(s) ? at.get(s) : null));
  });
  return [steps, ...columns];
}

// ---- rollouts ------------------------------------------------------------------------------------------------

async function showRollouts(main, params) {
  const allRuns = (await api("/api/runs")).runs;
  const state = {
    run: params.get("run") || (allRuns.length ? allRuns[allRuns.length - 1].id : ""),
    file: params.get("file") || "",
    step: params.get("step") || "",
    group: params.get("group") || "",
    reward_min: params.get("reward_min") || "",
    reward_max: params.get("reward_max") || "",
    truncated: params.get("truncated") || "",
    offset: Number(params.get("offset") || 0),
    color: params.get("color") || "logprob",
    // "failed": the run's failed tasks (failed_tasks.jsonl) instead of its experiences.
    show: params.get("show") || "",
  };
  const LIMIT = 10;
  const runSelect = el("select", { id: "rollout-run" }, allRuns.map((r) => el("option", { value: r.id, selected: r.id === state.run }, r.id)));
  const fileSelect = el("select", { id: "rollout-file" });
  const stepSelect = el("select", { id: "rollout-step" });
  const min = el("input", { type: "number", step: "any", id: "reward-min", placeholder: "min", style: "width:80px", value: state.reward_min });
  const max = el("input", { type: "number", step: "any", id: "reward-max", placeholder: "max", style: "width:80px", value: state.reward_max });
  const truncated = el("select", { id: "rollout-truncated" },
    [["", "any length"], ["true", "truncated only"], ["false", "complete only"]].map(([v, t]) => el("option", { value: v, selected: v === state.truncated }, t)));
  const show = el("select", { id: "rollout-show" },
    [["", "experiences"], ["failed", "failed tasks"]].map(([v, t]) => el("option", { value: v, selected: v === state.show }, t)));
  const color = el("select", { id: "rollout-color" },
    [["logprob", "colour by logprob"], ["advantage", "colour by advantage"]].map(([v, t]) => el("option", { value: v, selected: v === state.color }, t)));
  const apply = el("button", { class: "primary", id: "apply-filter" }, "Filter");
  const prev = el("button", { id: "prev-page" }, "‹ Prev");
  const next = el("button", { id: "next-page" }, "Next ›");
  const position = el("span", { id: "page-position", class: "muted" });
  const groupNote = el("span", { id: "group-filter" });
  const groups = el("div", { class: "panel", id: "groups" });
  const list = el("div", { id: "rollout-list" });
  main.append(el("h2", {}, "Rollouts"),
    el("div", { class: "toolbar" }, "run", runSelect, show, fileSelect, "step", stepSelect,
      el("span", { class: "experience-filters" }, "reward ", min, " – ", max, " ", truncated, " ", apply, " ", color), groupNote),
    el("div", { class: "row" },
      el("div", { class: "grow" }, el("div", { class: "toolbar" }, prev, next, position), list),
      el("div", { class: "side" }, groups)));

  function sync() {
    history.replaceState(null, "", `#/rollouts?${qs(state)}`);
  }
  async function load() {
    sync();
    main.querySelector(".experience-filters").hidden = state.show === "failed";
    groups.hidden = state.show === "failed";
    if (state.show === "failed") return loadFailed();
    list.replaceChildren(el("div", { class: "muted" }, "loading…"));
    let data;
    const truncatedParam = state.truncated;
    try {
      data = await api(`/api/rollouts?${qs({ run: state.run, file: state.file, step: state.step, group: state.group,
        reward_min: state.reward_min, reward_max: state.reward_max, truncated: truncatedParam, offset: state.offset, limit: LIMIT })}`);
    } catch (error) {
      list.replaceChildren(el("div", { class: "error-box" }, error.message));
      position.textContent = "";
      groups.replaceChildren();
      return;
    }
    fileSelect.replaceChildren(...data.files.map((f) => el("option", { value: f, selected: f === data.file }, f)));
    fileSelect.hidden = data.files.length < 2;
    stepSelect.replaceChildren(el("option", { value: "" }, "all steps"),
      ...data.steps.map((s) => el("option", { value: s.step, selected: String(s.step) === String(state.step) }, `${s.step} (${s.experiences})`)));
    const first = data.total === 0 ? 0 : data.offset + 1;
    position.textContent = `rows ${first}–${data.offset + data.rows.length} of ${data.total}` +
      (data.skipped_lines ? ` · ${data.skipped_lines} unreadable line(s) skipped` : "");
    position.setAttribute("data-total", data.total);
    prev.disabled = state.offset === 0;
    next.disabled = data.offset + data.rows.length >= data.total;
    groupNote.replaceChildren(...(state.group ? [`group ${state.group} `, el("a", { href: "#", onclick: (e) => {
      e.preventDefault(); state.group = ""; state.offset = 0; load();
    } }, "(clear)")] : []));
    const note = data.token_texts_error ? el("div", { class: "muted" }, `tokens shown as text: ${data.token_texts_error}`) : null;
    list.replaceChildren(...[note, ...data.rows.map((row) => rolloutCard(row, state.color))].filter(Boolean));
    if (data.rows.length === 0) list.append(el("div", { class: "muted" }, "no experiences match"));
    loadGroups(data);
  }
  // The run's failed tasks, paged like the experiences: what failed (task, row), in which step and workflow, after
  // how many attempts, and the last error.
  async function loadFailed() {
    list.replaceChildren(el("div", { class: "muted" }, "loading…"));
    groups.replaceChildren();
    groupNote.replaceChildren();
    let data;
    try {
      data = await api(`/api/failed?${qs({ run: state.run, file: state.file, step: state.step, offset: state.offset, limit: LIMIT })}`);
    } catch (error) {
      list.replaceChildren(el("div", { class: "error-box" }, error.message));
      position.textContent = "";
      return;
    }
    fileSelect.replaceChildren(...data.files.map((f) => el("option", { value: f, selected: f === data.file }, f)));
    fileSelect.hidden = data.files.length < 2;
    stepSelect.replaceChildren(el("option", { value: "" }, "all steps"),
      ...data.steps.map((s) => el("option", { value: s.step, selected: String(s.step) === String(state.step) }, `${s.step} (${s.failed} failed)`)));
    const first = data.total === 0 ? 0 : data.offset + 1;
    position.textContent = `failed tasks ${first}–${data.offset + data.rows.length} of ${data.total}` +
      (data.skipped_lines ? ` · ${data.skipped_lines} unreadable line(s) skipped` : "");
    position.setAttribute("data-total", data.total);
    prev.disabled = state.offset === 0;
    next.disabled = data.offset + data.rows.length >= data.total;
    list.replaceChildren(...data.rows.map(failedCard));
    if (data.rows.length === 0) list.append(el("div", { class: "muted", id: "no-failed" }, "no failed tasks"));
  }
  async function loadGroups(data) {
    const step = state.step || (data.steps.length ? data.steps[data.steps.length - 1].step : "");
    if (step === "") { groups.replaceChildren(); return; }
    try {
      const g = await api(`/api/groups?${qs({ run: state.run, file: data.file, step, k: 3 })}`);
      const item = (group) => el("li", { onclick: () => { state.group = group.group; state.step = String(step); state.offset = 0; load(); } },
        `${group.group}: mean ${fmt(group.reward_mean)} (${fmt(group.reward_min, 2)}…${fmt(group.reward_max, 2)}, ${group.experiences} runs)`);
      groups.replaceChildren(el("h3", {}, `Step ${step}: ${g.groups} groups`),
        el("div", { class: "muted" }, "best"), el("ul", { class: "groups", id: "best-groups" }, g.best.map(item)),
        el("div", { class: "muted" }, "worst"), el("ul", { class: "groups", id: "worst-groups" }, g.worst.map(item)));
    } catch (error) { groups.replaceChildren(el("div", { class: "error-box" }, error.message)); }
  }
  runSelect.addEventListener("change", () => { Object.assign(state, { run: runSelect.value, file: "", step: "", group: "", offset: 0 }); load(); });
  show.addEventListener("change", () => { Object.assign(state, { show: show.value, file: "", step: "", group: "", offset: 0 }); load(); });
  fileSelect.addEventListener("change", () => { Object.assign(state, { file: fileSelect.value, step: "", group: "", offset: 0 }); load(); });
  stepSelect.addEventListener("change", () => { Object.assign(state, { step: stepSelect.value, group: "", offset: 0 }); load(); });
  apply.addEventListener("click", () => {
    Object.assign(state, { reward_min: min.value, reward_max: max.value, truncated: truncated.value, offset: 0 });
    load();
  });
  color.addEventListener("change", () => { state.color = color.value; load(); });
  prev.addEventListener("click", () => { state.offset = Math.max(0, state.offset - LIMIT); load(); });
  next.addEventListener("click", () => { state.offset += LIMIT; load(); });
  if (state.run) await load(); else list.append(el("div", { class: "muted" }, "no runs yet"));
}

function failedCard(row) {
  const rowText = row.row ? JSON.stringify(row.row, null, 2) : `(row of ${row.row_bytes ?? "?"} bytes not recorded)`;
  return el("div", { class: "rollout failed", "data-task": row.task, "data-step": row.step },
    el("div", { class: "meta" },
      el("span", {}, "step ", el("b", {}, row.step)),
      el("span", {}, "task ", el("b", {}, row.task)),
      row.phase === "eval" ? el("span", { class: "badge truncated" }, "eval") : null,
      el("span", {}, "workflow ", el("b", {}, row.workflow)),
      row.reward_fn ? el("span", {}, "reward ", el("b", {}, row.reward_fn)) : null,
      el("span", {}, "attempts ", el("b", {}, row.attempts)),
      el("span", {}, "model version ", el("b", {}, row.model_version ?? "–")),
      el("span", {}, ago(row.time))),
    el("pre", { class: "error-text" }, row.error),
    el("details", {}, el("summary", {}, "task row"), el("pre", {}, rowText)));
}

function rolloutCard(row, colorBy) {
  const components = Object.entries(row.metrics || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
  const advantage = Array.isArray(row.advantages) && row.advantages.length ? row.advantages[0] : null;
  return el("div", { class: "rollout", "data-uid": row.uid, "data-reward": row.reward },
    el("div", { class: "meta" },
      el("span", {}, "experience ", el("b", {}, row.uid)),
      el("span", {}, "group ", el("b", {}, row.group)),
      el("span", {}, "reward ", el("b", { class: "reward" }, fmt(row.reward))),
      components ? el("span", {}, "components ", el("b", {}, components)) : null,
      el("span", {}, "advantage ", el("b", {}, fmt(advantage))),
      el("span", {}, "model version ", el("b", {}, row.model_version ?? "–")),
      el("span", {}, `${row.prompt_tokens} prompt + ${row.response_tokens.length} response tokens`),
      row.truncate_status ? el("span", { class: "badge truncated" }, row.truncate_status.replace("_", " ")) : null),
    el("details", {}, el("summary", {}, "prompt"), el("pre", {}, row.prompt_text ?? "(no prompt text recorded)")),
    tokensView(row, colorBy));
}

// The response, one span per token, its background saying how likely the token was (logprob: red unlikely, green
// likely) or how it was reinforced (advantage: green positive, red negative); the tooltip gives the numbers.
function tokensView(row, colorBy) {
  const texts = row.token_texts;
  if (!Array.isArray(texts) || texts.length === 0) {
    return el("pre", { class: "tokens" }, row.response_text ?? "");
  }
  const advantages = Array.isArray(row.advantages) ? row.advantages : [];
  const scale = Math.max(1e-9, ...advantages.map((a) => Math.abs(a)));
  const spans = texts.map((text, i) => {
    const logprob = row.logprobs?.[i];
    const advantage = advantages[i];
    let background = "transparent";
    if (colorBy === "advantage" && advantage !== undefined) {
      const strength = Math.min(1, Math.abs(advantage) / scale);
      background = advantage >= 0 ? `rgba(35,134,74,${0.12 + 0.45 * strength})` : `rgba(200,53,43,${0.12 + 0.45 * strength})`;
    } else if (logprob !== undefined && logprob !== null) {
      const p = Math.exp(logprob);
      background = `hsl(${Math.round(120 * p)}, 75%, ${88 - 10 * (1 - p)}%)`;
    }
    const title = `token ${row.response_tokens[i]}${logprob !== undefined ? ` · logprob ${fmt(logprob)}` : ""}` +
      `${advantage !== undefined ? ` · advantage ${fmt(advantage)}` : ""}`;
    return el("span", { style: `background:${background}`, title }, text ?? `⟨${row.response_tokens[i]}⟩`);
  });
  const legend = colorBy === "advantage" ? "green: positive advantage, red: negative" : "green: likely token, red: unlikely (sampling logprob)";
  return el("div", {}, el("div", { class: "tokens" }, spans), el("div", { class: "legend" }, legend));
}

// ---- config --------------------------------------------------------------------------------------------------

async function showConfig(main, params) {
  const examples = (await api("/api/examples")).examples;
  const schema = await api("/api/schema");
  // Registered names (algorithm presets, workflows, rewards, ...) complete the keys that name one.
  const plugins = (await api("/api/plugins")).plugins;
  const exampleSelect = el("select", { id: "example" }, el("option", { value: "" }, "start from an example…"),
    examples.map((e) => el("option", { value: e }, e)));
  const pathInput = el("input", { type: "text", id: "config-path", value: params.get("path") || "config.yaml", style: "width:280px" });
  const validate = el("button", { class: "primary", id: "validate" }, "Validate");
  const save = el("button", { id: "save" }, "Save");
  const gutter = el("div", { class: "gutter", id: "gutter" });
  const text = el("textarea", { id: "config-text", spellcheck: "false", placeholder: "paste a Trinity-RFT config…" });
  const suggest = el("div", { class: "suggest", id: "suggest", hidden: true });
  const result = el("div", { id: "validation" });
  main.append(el("h2", {}, "Config"),
    el("div", { class: "toolbar" }, exampleSelect, "file", pathInput, validate, save),
    el("div", { class: "row" },
      el("div", { class: "grow" }, el("div", { class: "editor" }, gutter, text), suggest),
      el("div", { class: "grow" }, result)));
  let errorLines = new Set();
  function renderGutter() {
    const count = text.value.split("\n").length;
    gutter.replaceChildren(...Array.from({ length: count }, (_, i) =>
      el("div", { class: errorLines.has(i + 1) ? "error" : "", "data-line": i + 1 }, i + 1)));
    gutter.scrollTop = text.scrollTop;
  }
  text.addEventListener("input", () => { errorLines = new Set(); renderGutter(); showSuggestions(); });
  text.addEventListener("scroll", () => { gutter.scrollTop = text.scrollTop; });
  text.addEventListener("click", showSuggestions);
  // Hidden a moment after the editor loses focus, so that a click on a suggestion still lands; not when the
  // editor has the focus again by then (a click on Validate, then typing at once, must keep the new suggestions).
  text.addEventListener("blur", () => setTimeout(() => {
    if (document.activeElement !== text) suggest.hidden = true;
  }, 200));
  text.addEventListener("keyup", (e) => { if (e.key.startsWith("Arrow")) showSuggestions(); });
  text.addEventListener("keydown", (e) => {
    if (e.key === "Tab" && !suggest.hidden) {
      const first = suggest.querySelector("div");
      if (first) { e.preventDefault(); first.click(); }
    }
  });
  exampleSelect.addEventListener("change", async () => {
    if (!exampleSelect.value) return;
    const example = await api(`/api/example?${qs({ path: exampleSelect.value })}`);
    text.value = example.text;
    pathInput.value = example.path;
    errorLines = new Set();
    renderGutter();
    result.replaceChildren();
  });
  validate.addEventListener("click", async () => {
    result.replaceChildren(el("div", { class: "muted" }, "validating…"));
    try {
      const v = await api("/api/config/validate", { text: text.value, path: pathInput.value });
      errorLines = new Set(v.problems.map((p) => p.line).filter(Boolean));
      renderGutter();
      const problems = el("ul", { class: "problems", id: "problems" }, v.problems.map((p) =>
        el("li", { "data-line": p.line ?? "", onclick: () => p.line && goToLine(p.line) },
          p.line ? el("b", {}, `line ${p.line}: `) : null, p.message)));
      const notes = v.notes.length ? el("div", {}, el("h3", {}, "Notes"), el("ul", { class: "notes" }, v.notes.map((n) => el("li", {}, n)))) : null;
      result.replaceChildren(...[
        v.ok ? el("div", { class: "ok", id: "valid" }, "valid: trinity run would start with this config") : problems,
        notes,
        v.resolved ? el("div", {}, el("h3", {}, "Resolved config (every default filled in)"), el("pre", { class: "resolved panel", id: "resolved" }, v.resolved)) : null,
      ].filter(Boolean));
    } catch (error) { result.replaceChildren(el("div", { class: "error-box" }, error.message)); }
  });
  save.addEventListener("click", async () => {
    try { toast(`saved ${(await api("/api/config/save", { text: text.value, path: pathInput.value })).saved}`); }
    catch (error) { toast(error.message); }
  });
  function goToLine(line) {
    const lines = text.value.split("\n");
    const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
    text.focus();
    text.setSelectionRange(start, start + (lines[line - 1] || "").length);
    text.scrollTop = Math.max(0, (line - 5) * 20);
  }

  // Completion: the keys the schema allows at the cursor (found from the indentation of the lines above), or after
  // `key: ` the values it allows (the schema's enums and booleans, and the registered names of the plugin kind a
  // name key takes), filtered by what is typed; a click or Tab inserts one.
  function showSuggestions() {
    const before = text.value.slice(0, text.selectionStart);
    const lines = before.split("\n");
    const current = lines[lines.length - 1];
    const indent = current.match(/^\s*/)[0].length;
    const typed = current.trim();
    if (typed.startsWith("-") || typed.startsWith("#")) { suggest.hidden = true; return; }
    const path = [];
    let level = indent;
    for (let i = lines.length - 2; i >= 0 && level > 0; i--) {
      const m = lines[i].match(/^(\s*)(?:- )?([A-Za-z_][\w.]*)\s*:/);
      if (m && m[1].length < level) { path.unshift(m[2]); level = m[1].length; }
    }
    const valueMatch = current.match(/^\s*([A-Za-z_][\w.]*)\s*:\s*(.*)$/);
    if (valueMatch) { showValues(path, valueMatch[1], valueMatch[2]); return; }
    const node = schemaAt(schema, path);
    const props = node && node.properties ? Object.entries(node.properties) : [];
    const options = props.filter(([k]) => k.startsWith(typed)).slice(0, 30);
    if (options.length === 0 || (options.length === 1 && options[0][0] === typed)) { suggest.hidden = true; return; }
    suggest.replaceChildren(...options.map(([key, prop]) => el("div", { onclick: () => insertKey(key, typed) },
      key, el("small", {}, (resolveRef(schema, prop).description || "").split("\n")[0].slice(0, 90)))));
    suggest.hidden = false;
  }
  function showValues(path, key, typed) {
    const parent = schemaAt(schema, path);
    const prop = parent && parent.properties ? parent.properties[key] : undefined;
    if (!prop || typed.includes(" ") || typed.includes("#")) { suggest.hidden = true; return; }
    const values = [...schemaValues(schema, prop), ...(NAME_KINDS[key] ? registeredNames(NAME_KINDS[key]) : [])];
    const options = [...new Map(values.map((v) => [v.value, v])).values()].filter((v) => v.value.startsWith(typed)).slice(0, 40);
    if (options.length === 0 || (options.length === 1 && options[0].value === typed)) { suggest.hidden = true; return; }
    suggest.replaceChildren(...options.map((v) => el("div", { "data-value": v.value, onclick: () => insertValue(v.value, typed) },
      v.value, el("small", {}, (v.description || "").split("\n")[0].slice(0, 90)))));
    suggest.hidden = false;
  }
  function registeredNames(kind) {
    return plugins.filter((p) => p.kind === kind).map((p) => ({ value: p.name, description: `${p.kind} · ${p.origin}` }));
  }
  function insertValue(value, typed) {
    const at = text.selectionStart;
    text.setRangeText(value, at - typed.length, at, "end");
    text.focus();
    suggest.hidden = true;
    renderGutter();
  }
  function insertKey(key, typed) {
    const at = text.selectionStart;
    text.setRangeText(key.slice(typed.length) + ": ", at, at, "end");
    text.focus();
    suggest.hidden = true;
    renderGutter();
  }
  text.value = "";
  renderGutter();
}

// Keys whose value is a registered name, and the plugin kind (as `trinity plugins list` names it) that holds them.
const NAME_KINDS = {
  algorithm_type: "algorithm type", advantage_fn: "advantage function", policy_loss_fn: "policy loss",
  kl_loss_fn: "KL function", kl_penalty_fn: "KL function", entropy_loss_fn: "entropy loss",
  sample_strategy: "sample strategy", default_workflow_type: "workflow", default_eval_workflow_type: "workflow",
  default_reward_fn_type: "reward",
};

// The values a schema node allows: its enum, the constants of its oneOf/anyOf, or true/false.
function schemaValues(root, node) {
  let current = node || {};
  for (let i = 0; i < 10 && current.$ref; i++) {
    current = current.$ref.replace(/^#\//, "").split("/").reduce((n, part) => (n ? n[part] : undefined), root) || {};
  }
  const values = [];
  for (const v of current.enum || []) if (v !== null) values.push({ value: String(v), description: current.description });
  if (current.const !== undefined && current.const !== null) values.push({ value: String(current.const), description: current.description });
  for (const inner of current.oneOf || current.anyOf || []) values.push(...schemaValues(root, inner));
  const types = [].concat(current.type || []);
  if (types.includes("boolean")) values.push({ value: "true" }, { value: "false" });
  return values;
}

function resolveRef(root, node) {
  let current = node || {};
  for (let i = 0; i < 10 && current.$ref; i++) {
    current = current.$ref.replace(/^#\//, "").split("/").reduce((n, part) => (n ? n[part] : undefined), root) || {};
  }
  if (!current.properties) {
    const inner = (current.anyOf || current.oneOf || current.allOf || []).map((n) => resolveRef(root, n)).find((n) => n.properties || n.items);
    if (inner) current = { ...inner, description: current.description || inner.description };
  }
  return current;
}

function schemaAt(root, path) {
  let node = resolveRef(root, root);
  for (const key of path) {
    let next = node.properties ? node.properties[key] : undefined;
    if (!next) return null;
    next = resolveRef(root, next);
    if (!next.properties && next.items) next = resolveRef(root, next.items);
    node = next;
  }
  return node;
}

// ---- plugins -------------------------------------------------------------------------------------------------

async function showPlugins(main) {
  const filter = el("input", { type: "text", placeholder: "filter…", id: "plugin-filter" });
  const table = el("table", { id: "plugins" });
  main.append(el("h2", {}, "Plugins"), el("div", { class: "toolbar" }, filter), table);
  const plugins = (await api("/api/plugins")).plugins;
  function render() {
    const term = filter.value.trim().toLowerCase();
    const rows = plugins.filter((p) => `${p.kind} ${p.name} ${p.origin}`.toLowerCase().includes(term));
    table.replaceChildren(el("tr", {}, ["kind", "name", "version", "origin"].map((h) => el("th", {}, h))),
      ...rows.map((p) => el("tr", {}, el("td", {}, p.kind), el("td", {}, el("b", {}, p.name)), el("td", {}, p.version),
        el("td", { class: "muted" }, p.origin))));
  }
  filter.addEventListener("input", render);
  render();
}

// ---- routing -------------------------------------------------------------------------------------------------

const VIEWS = { runs: showRuns, curves: showCurves, rollouts: showRollouts, config: showConfig, plugins: showPlugins };

async function render() {
  const { page, params } = route();
  setRefresh(null);
  for (const chart of Object.values(studio.charts)) chart.destroy();
  studio.charts = {};
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === page));
  const main = document.getElementById("main");
  main.replaceChildren();
  main.setAttribute("data-view", page);
  studio.view = page;
  try {
    await (VIEWS[page] || showRuns)(main, params);
  } catch (error) {
    main.append(el("div", { class: "error-box" }, error.message));
  }
  main.setAttribute("data-ready", page);
}

// Curves and rollouts rewrite the hash with replaceState as their controls change; only a real navigation
// (a link, the back button) renders a view again.
window.addEventListener("hashchange", render);
render();
