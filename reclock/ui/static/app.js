// reclock's status page: polls the JSON endpoints of `reclock ui` and redraws; no reload, no internet.
"use strict";

const state = {
  refreshMs: 2000,
  pipeline: null,          // the pipeline whose charts and tables are shown
  selected: null,          // pipelines of the timeline's cut (null: all)
  table: "batches",
  offset: 0,
  limit: 25,
  recipe: "read_as_of",
  refreshes: 0,
  overview: null,
  timeline: null,
  series: null,
  charts: {},
};
window.reclockUI = state; // read by the browser tests

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

const UNHEALTHY = ["degraded", "stalled", "failed", "dead"];

function isClosed(ms) { return ms !== null && ms !== undefined && ms >= 9.2e18; }

function when(ms) {
  if (!ms) return "-";
  if (isClosed(ms)) return "closed (all times)";
  const d = new Date(Number(ms));
  return d.toISOString().replace("T", " ").replace("Z", "");
}

function seconds(ms) {
  if (ms === null || ms === undefined) return "-";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 120000) return `${(ms / 1000).toFixed(1)} s`;
  return `${(ms / 60000).toFixed(1)} min`;
}

function num(v) { return v === null || v === undefined ? "-" : Number(v).toLocaleString("en-US"); }

async function getJSON(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: ${response.status}`);
  return response.json();
}

// -- overview ------------------------------------------------------------------------------------

function drawOverview(data) {
  document.getElementById("lake").textContent = `lake ${data.lake}`;
  document.getElementById("refreshed").textContent =
    `as of ${when(data.taken_ms)} (read in ${data.refresh_ms} ms; every ${data.refresh_s} s)`;
  const body = document.querySelector("#overview tbody");
  body.replaceChildren();
  document.getElementById("no-pipelines").hidden = data.pipelines.length > 0;
  for (const p of data.pipelines) {
    const last = p.last_batch;
    const row = el("tr", { "data-pipeline": p.name, class: p.name === state.pipeline ? "selected" : "" },
      el("td", {}, p.name),
      el("td", {}, p.source),
      el("td", {}, el("span", { class: `state state-${p.state}`, "data-state": p.state, title: p.hint }, p.state)),
      el("td", { class: "num", "data-freshness-ms": p.freshness_ms ?? "" }, seconds(p.freshness_ms)),
      el("td", { class: "num" }, num(p.lag)),
      el("td", { class: "num" }, num(p.rows_in_per_s)),
      el("td", { class: "num" }, num(p.rows_committed_per_s)),
      el("td", {}, last ? `${last.state}, ${num(last.rows)} rows, ${seconds(last.duration_ms)}` : "-"),
      el("td", { "data-readable-upper": p.readable_upper ?? "" }, when(p.readable_upper)),
    );
    row.addEventListener("click", () => selectPipeline(p.name));
    body.append(row);
    // An unhealthy state always gets its row: the error and what to do (the hint is the same
    // text `reclock status` explains); any other state's last error stays, marked as the last.
    const unhealthy = UNHEALTHY.includes(p.state);
    if (p.error || unhealthy) {
      const error = !p.error ? "" : unhealthy ? p.error : `last error: ${p.error}`;
      body.append(el("tr", { class: unhealthy ? "problem" : "problem past", "data-problem": p.name },
        el("td", { colSpan: 9 }, el("span", { class: "error" }, error), error ? " — " : "",
          el("span", { class: "hint" }, p.hint))));
    }
  }
  const select = document.getElementById("pipeline-select");
  const names = data.pipelines.map((p) => p.name);
  if (select.options.length !== names.length || names.some((n, i) => select.options[i].value !== n)) {
    select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  }
  if (!state.pipeline && names.length) state.pipeline = names[0];
  select.value = state.pipeline ?? "";
}

function selectPipeline(name) {
  state.pipeline = name;
  state.offset = 0;
  for (const c of Object.values(state.charts)) c.destroy();
  state.charts = {};
  refresh();
}

// -- timeline ------------------------------------------------------------------------------------

function drawTimeline(data) {
  const box = document.getElementById("timeline-select");
  if (box.childElementCount !== data.pipelines.length) {
    box.replaceChildren(...data.pipelines.map((p) => {
      const input = el("input", { type: "checkbox", checked: true, value: p.name });
      input.addEventListener("change", () => {
        const chosen = [...box.querySelectorAll("input:checked")].map((i) => i.value);
        state.selected = chosen.length === data.pipelines.length ? null : chosen;
        refresh();
      });
      return el("label", {}, input, ` ${p.name}`);
    }));
  }
  const rows = [];
  for (const p of data.pipelines) {
    rows.push({ label: p.name, upper: p.readable_upper, pipeline: true, selected: data.selected.includes(p.name) });
    for (const o of p.outputs) rows.push({ label: `  ${o.name}`, upper: o.upper, pipeline: false });
  }
  const finite = rows.map((r) => r.upper).filter((u) => u && !isClosed(u));
  const now = data.taken_ms;
  const low = Math.min(now - 10000, ...finite) - 1000;
  const span = Math.max(now - low, 1);
  const svg = document.getElementById("timeline");
  const width = svg.clientWidth || 900;
  const left = 200, right = 20, rowH = 16;
  const x = (ms) => left + (Math.min(ms, now) - low) / span * (width - left - right);
  const ns = "http://www.w3.org/2000/svg";
  const node = (tag, attrs, text) => {
    const n = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    return n;
  };
  const height = rows.length * rowH + 30;
  svg.setAttribute("height", height);
  svg.replaceChildren();
  rows.forEach((r, i) => {
    const y = 10 + i * rowH;
    svg.append(node("text", { x: 4, y: y + 11, "font-weight": r.pipeline ? "bold" : "normal" }, r.label));
    if (r.upper) {
      const end = isClosed(r.upper) ? width - right : x(r.upper);
      svg.append(node("rect", {
        x: left, y: y + 3, width: Math.max(end - left, 1), height: rowH - 6,
        fill: r.pipeline ? (r.selected ? "#4b7bd6" : "#a9b8d6") : "#9fd3b0",
      }));
      svg.append(node("text", { x: Math.min(end + 4, width - 150), y: y + 11 },
        isClosed(r.upper) ? "closed" : when(r.upper - 1).slice(11)));
    }
  });
  const cut = data.cut;
  const text = document.getElementById("cut");
  if (cut && cut.as_of !== null && cut.as_of >= 0) {
    if (!isClosed(cut.joint_upper)) {
      const cx = x(cut.as_of);
      svg.append(node("line", { x1: cx, x2: cx, y1: 0, y2: height, stroke: "#d4380d", "stroke-width": 2 }));
    }
    svg.append(node("text", { x: left, y: height - 4 }, `${when(low)}  …  now ${when(now)}`));
    const held = cut.held_back_by
      ? `held back by ${cut.held_back_by.pipeline}${cut.held_back_by.output ? ` (output ${cut.held_back_by.output})` : ""}`
      : "every selected pipeline is finished";
    text.replaceChildren(
      "joint consistent cut of ", data.selected.join(", "), ": ",
      el("span", { id: "cut-as-of", "data-as-of": cut.as_of }, `${cut.as_of}`), ` (${when(cut.as_of)}), `,
      el("span", { id: "cut-held", "data-pipeline": cut.held_back_by?.pipeline ?? "" }, held),
    );
    drawRecipes(cut.recipes);
  } else {
    text.textContent = cut && cut.error ? cut.error : "no consistent cut yet: a selected pipeline has committed nothing";
  }
}

function drawRecipes(recipes) {
  const tabs = document.getElementById("recipe-tabs");
  const labels = { read_as_of: "read_as_of", cli: "reclock as-of", polars: "polars", duckdb: "DuckDB", spark: "Spark" };
  tabs.replaceChildren(...Object.keys(labels).map((k) => {
    const b = el("button", { type: "button", class: k === state.recipe ? "active" : "" }, labels[k]);
    b.addEventListener("click", () => { state.recipe = k; drawRecipes(recipes); });
    return b;
  }));
  document.getElementById("recipe").textContent = recipes[state.recipe];
}

document.getElementById("recipe-button").addEventListener("click", () => {
  const box = document.getElementById("recipes");
  box.hidden = !box.hidden;
});

// -- charts --------------------------------------------------------------------------------------

const COLORS = ["#4b7bd6", "#d4380d", "#1a7f37", "#8a5a00", "#7b3fb3", "#0e7c86", "#b3261e", "#5b6570"];

function chart(id, series, data, extra = {}) {
  const target = document.getElementById(id);
  const existing = state.charts[id];
  const key = series.map((s) => s.label).join("\u0000");
  if (existing && existing.reclockKey === key) { // the same series: new points only
    existing.setData(data);
    return existing;
  }
  if (existing) existing.destroy();
  const opts = {
    width: Math.max(target.clientWidth, 420), height: 180,
    series: [{}, ...series], axes: [{}, { size: 60 }], ...extra,
  };
  state.charts[id] = new uPlot(opts, data, target);
  state.charts[id].reclockKey = key;
  return state.charts[id];
}

function drawSeries(s) {
  const line = (label, i, more = {}) => ({ label, stroke: COLORS[i % COLORS.length], width: 1.5, ...more });
  chart("chart-rates", [line("input rate", 0), line("commit rate", 2)], [s.rates.t, s.rates.input, s.rates.process]);
  chart("chart-rows", [line("rows", 0, { fill: "#4b7bd633", paths: uPlot.paths.bars({ size: [0.6, 40] }) })],
    [s.rows.t, s.rows.rows]);
  // Stacked: each phase is drawn as the sum of it and the phases before it, the biggest first so the
  // smaller ones paint over it; the legend shows each phase's own value.
  const phases = ["probe", "mint", "plan", "read", "commit", "maintenance"];
  const stacked = [];
  let sum = s.phases.t.map(() => 0);
  for (const p of phases) {
    sum = sum.map((v, i) => v + (s.phases[p][i] || 0));
    stacked.push(sum);
  }
  const order = [...phases.keys()].reverse();
  chart("chart-phases", order.map((k) => line(phases[k], k, {
    fill: COLORS[k % COLORS.length] + "aa",
    value: (u, v, si, idx) => (idx === null ? "-" : s.phases[phases[k]][idx] ?? "-"),
  })), [s.phases.t, ...order.map((k) => stacked[k])]);
  const parts = Object.keys(s.lag.partitions);
  chart("chart-lag", parts.length ? parts.map((p, i) => line(p, i)) : [line("no lag recorded", 0)],
    [s.lag.t, ...(parts.length ? parts.map((p) => s.lag.partitions[p]) : [s.lag.t.map(() => null)])]);
  chart("chart-freshness", [line("freshness", 1)], [s.freshness.t, s.freshness.freshness]);
}

// -- tables --------------------------------------------------------------------------------------

for (const b of document.querySelectorAll("#table-tabs button")) {
  b.addEventListener("click", () => {
    state.table = b.dataset.table;
    state.offset = 0;
    document.getElementById("filter-text").value = "";
    for (const o of document.querySelectorAll("#table-tabs button")) o.classList.toggle("active", o === b);
    refresh();
  });
}
document.getElementById("page-prev").addEventListener("click", () => {
  state.offset = Math.max(0, state.offset - state.limit); refresh();
});
document.getElementById("page-next").addEventListener("click", () => { state.offset += state.limit; refresh(); });
document.getElementById("filter-text").addEventListener("change", () => { state.offset = 0; refresh(); });
document.getElementById("pipeline-select").addEventListener("change", (e) => selectPipeline(e.target.value));

function drawTable(data) {
  const head = document.querySelector("#detail thead");
  const body = document.querySelector("#detail tbody");
  const columns = data.rows.length ? Object.keys(data.rows[0]) : [];
  const filter = document.getElementById("filter-column");
  if (columns.length && filter.dataset.table !== data.table) {
    filter.replaceChildren(...columns.map((c) => el("option", { value: c }, c)));
    filter.dataset.table = data.table;
  }
  head.replaceChildren(el("tr", {}, ...columns.map((c) => el("th", {}, c))));
  body.replaceChildren(...data.rows.map((r) => el("tr", {}, ...columns.map((c) => {
    const v = r[c];
    const shown = c.endsWith("time_ms") || c === "start_ms" || c === "into_ts" ? when(v) : v ?? "";
    const long = ["message", "error", "reason", "path"].includes(c);
    return el("td", { class: typeof v === "number" ? "num" : long ? "wrap" : "" }, `${shown}`);
  }))));
  const end = Math.min(data.offset + data.rows.length, data.total);
  document.getElementById("page-info").textContent = data.error
    ? data.error : `${data.total ? data.offset + 1 : 0}–${end} of ${num(data.total)}`;
}

// -- the loop ------------------------------------------------------------------------------------

async function refresh() {
  try {
    const overview = await getJSON("/api/overview");
    state.refreshMs = overview.refresh_s * 1000;
    state.overview = overview;
    drawOverview(overview);
    const selected = state.selected ? `?pipelines=${encodeURIComponent(state.selected.join(","))}` : "";
    state.timeline = await getJSON(`/api/timeline${selected}`);
    drawTimeline(state.timeline);
    if (state.pipeline) {
      const name = encodeURIComponent(state.pipeline);
      state.series = await getJSON(`/api/pipelines/${name}/series`);
      drawSeries(state.series);
      const column = document.getElementById("filter-column").value;
      const text = document.getElementById("filter-text").value;
      const where = text && column ? `&where.${encodeURIComponent(column)}=${encodeURIComponent(text)}` : "";
      drawTable(await getJSON(
        `/api/pipelines/${name}/tables/${state.table}?offset=${state.offset}&limit=${state.limit}${where}`));
    }
    state.refreshes += 1;
    document.body.dataset.refreshes = state.refreshes;
  } catch (err) {
    document.getElementById("refreshed").textContent = `cannot reach the server: ${err.message}`;
  }
}

async function loop() {
  await refresh();
  setTimeout(loop, state.refreshMs);
}
loop();
