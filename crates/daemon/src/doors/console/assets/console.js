// toolhost console: the pages' behaviour, with no build step and no inline script (the
// Content-Security-Policy allows only this file). Text from tools and callers is only ever put
// into the page with textContent, never as HTML.
"use strict";

const csrf = () => document.querySelector('meta[name="csrf-token"]').content;

async function post(url, body) {
  const response = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf() },
    body: JSON.stringify(body || {}),
    credentials: "same-origin",
  });
  let data = {};
  try { data = await response.json(); } catch (_) { /* an empty body */ }
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

// A W3C traceparent for a call made from this page: a new trace, the page as its root span,
// sampled, so the call's spans have the page's trace id.
function newTraceparent() {
  const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  const random = (n) => {
    const bytes = new Uint8Array(n);
    do { crypto.getRandomValues(bytes); } while (bytes.every((b) => b === 0));
    return hex(bytes);
  };
  return "00-" + random(16) + "-" + random(8) + "-01";
}

function flash(text) {
  document.getElementById("flash").textContent = text;
}

function element(tag, attributes, text) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

// The content blocks of an answer (docs/CONTRACTS.md, "Content blocks"): an image as an image,
// from a data: URL of its own base64 and an image/* type (the CSP allows data: images only);
// every other block, and an image whose type is not an image type, as text, never as HTML.
function contentBlocks(blocks) {
  const nodes = [];
  for (const block of Array.isArray(blocks) ? blocks : []) {
    const type = block && typeof block.type === "string" ? block.type : "?";
    const mime = typeof block.mimeType === "string" ? block.mimeType : "";
    if (type === "image" && /^image\/[a-z0-9.+-]+$/i.test(mime) && /^[A-Za-z0-9+/=]*$/.test(block.data || "")) {
      nodes.push(element("img", { class: "block-image", alt: "image (" + mime + ") from the tool", src: "data:" + mime + ";base64," + block.data }));
    } else if (type === "text") {
      nodes.push(element("pre", { class: "block-text" }, String(block.text)));
    } else if (type === "resource_link") {
      nodes.push(element("pre", { class: "block-text" }, "resource link: " + block.uri + " (" + block.name + ")"));
    } else if (type === "resource" && block.resource && typeof block.resource.text === "string") {
      nodes.push(element("pre", { class: "block-text" }, block.resource.uri + ":\n" + block.resource.text));
    } else {
      const size = typeof block.data === "string" ? ", " + block.data.length + " base64 characters" : "";
      nodes.push(element("pre", { class: "block-text" }, type + (mime ? " (" + mime + size + ")" : "") + (block.resource ? ": " + block.resource.uri : "")));
    }
  }
  return nodes;
}

// Filters the rows of a table by a search box: a row stays when its text holds every word.
function filterRows(input, table) {
  const apply = () => {
    const words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    for (const row of table.tBodies[0].rows) {
      const text = row.textContent.toLowerCase();
      row.hidden = !words.every((word) => text.includes(word));
    }
  };
  input.addEventListener("input", apply);
  return apply;
}

// ---- JSON Schema: the form and the check before sending --------------------------------------

function schemaType(schema) {
  if (!schema || typeof schema !== "object") return "any";
  if (Array.isArray(schema.enum)) return "enum";
  let type = schema.type;
  if (Array.isArray(type)) type = type.find((t) => t !== "null") || "any";
  if (!type && schema.properties) return "object";
  return type || "any";
}

const pointerPart = (name) => String(name).replace(/~/g, "~0").replace(/\//g, "~1");

// Builds the controls of `schema` at `pointer` into `parent`.
function buildField(parent, schema, pointer, label, required) {
  const type = schemaType(schema);
  const wrap = element("div", { class: "field" });
  const title = element("label", {}, label + (required ? " *" : ""));
  if (type === "object") {
    const set = element("fieldset", { "data-pointer": pointer, "data-type": "object" });
    set.appendChild(element("legend", {}, label || "arguments"));
    const needed = new Set(schema.required || []);
    for (const [name, child] of Object.entries(schema.properties || {})) {
      buildField(set, child, pointer + "/" + pointerPart(name), name, needed.has(name));
    }
    parent.appendChild(set);
    return;
  }
  wrap.appendChild(title);
  let control;
  if (type === "enum") {
    control = element("select", { "data-pointer": pointer, "data-type": "enum" });
    if (!required) control.appendChild(element("option", { value: "" }, "(none)"));
    schema.enum.forEach((value, index) => control.appendChild(element("option", { value: String(index) }, JSON.stringify(value))));
  } else if (type === "boolean") {
    control = element("input", { type: "checkbox", "data-pointer": pointer, "data-type": "boolean" });
  } else if (type === "array") {
    control = element("div", { "data-pointer": pointer, "data-type": "array", class: "array" });
    const items = element("div", { class: "items" });
    const add = element("button", { type: "button", class: "add" }, "Add item");
    add.addEventListener("click", () => {
      const index = items.children.length;
      const row = element("div", { class: "item" });
      buildField(row, schema.items || {}, pointer + "/" + index, "#" + index, true);
      const remove = element("button", { type: "button", class: "remove" }, "Remove");
      remove.addEventListener("click", () => { row.remove(); renumber(items, pointer); });
      row.appendChild(remove);
      items.appendChild(row);
    });
    control.appendChild(items);
    control.appendChild(add);
  } else if (type === "number" || type === "integer") {
    control = element("input", { type: "text", inputmode: "decimal", "data-pointer": pointer, "data-type": type });
  } else if (type === "string") {
    control = element("input", { type: "text", "data-pointer": pointer, "data-type": "string" });
  } else {
    control = element("input", { type: "text", "data-pointer": pointer, "data-type": "json", placeholder: "JSON" });
  }
  wrap.appendChild(control);
  if (schema.description) wrap.appendChild(element("span", { class: "hint" }, schema.description));
  parent.appendChild(wrap);
}

// After an array item is removed, its siblings' pointers and labels follow their new places.
function renumber(items, pointer) {
  Array.from(items.children).forEach((row, index) => {
    const label = row.querySelector(":scope > .field > label, :scope > fieldset > legend");
    if (label) label.textContent = "#" + index + (label.textContent.endsWith(" *") ? " *" : "");
    for (const node of row.querySelectorAll("[data-pointer]")) {
      const rest = node.getAttribute("data-pointer").slice(pointer.length + 1);
      const tail = rest.includes("/") ? rest.slice(rest.indexOf("/")) : "";
      node.setAttribute("data-pointer", pointer + "/" + index + tail);
    }
  });
}

// Reads the value of the control tree under `node` (a fieldset, array or input), with errors.
function readValue(node, schema, errors) {
  const pointer = node.getAttribute("data-pointer");
  const type = node.getAttribute("data-type");
  if (type === "object") {
    const out = {};
    for (const [name, child] of Object.entries(schema.properties || {})) {
      const childPointer = pointer + "/" + pointerPart(name);
      const control = Array.from(node.querySelectorAll("[data-pointer]")).find((n) => n.getAttribute("data-pointer") === childPointer);
      if (!control) continue;
      const value = readValue(control, child, errors);
      if (value !== undefined) out[name] = value;
    }
    return out;
  }
  if (type === "array") {
    const items = node.querySelector(".items");
    return Array.from(items.children).map((row) => {
      const control = row.querySelector("[data-pointer]");
      return readValue(control, schema.items || {}, errors);
    });
  }
  if (type === "enum") return node.value === "" ? undefined : schema.enum[Number(node.value)];
  if (type === "boolean") return node.checked;
  const text = node.value;
  if (text === "") return undefined;
  if (type === "number" || type === "integer") {
    const number = Number(text.trim());
    if (text.trim() === "" || Number.isNaN(number)) {
      errors.push([pointer, "must be a number, not " + JSON.stringify(text)]);
      return text;
    }
    return number;
  }
  if (type === "json") {
    try { return JSON.parse(text); } catch (_) { errors.push([pointer, "is not JSON"]); return text; }
  }
  return text;
}

const typeOf = (value) => (value === null ? "null" : Array.isArray(value) ? "array" : typeof value);

// Checks `value` against the parts of JSON Schema a form can get wrong: type, enum, required,
// bounds and lengths, nested objects and arrays. The host validates fully; this catches the
// common mistakes before a call is sent.
function validate(value, schema, pointer, errors) {
  if (!schema || typeof schema !== "object") return;
  if (Array.isArray(schema.enum) && !schema.enum.some((option) => JSON.stringify(option) === JSON.stringify(value))) {
    errors.push([pointer, "must be one of " + schema.enum.map((option) => JSON.stringify(option)).join(", ")]);
    return;
  }
  const types = schema.type === undefined ? [] : [].concat(schema.type);
  const actual = typeOf(value);
  const fits = (type) => type === actual || (type === "integer" && actual === "number" && Number.isInteger(value)) || (type === "number" && actual === "number");
  if (types.length && !types.some(fits)) {
    errors.push([pointer, "must be " + types.join(" or ") + ", not " + actual]);
    return;
  }
  if (actual === "number") {
    if (schema.minimum !== undefined && value < schema.minimum) errors.push([pointer, "must be at least " + schema.minimum]);
    if (schema.maximum !== undefined && value > schema.maximum) errors.push([pointer, "must be at most " + schema.maximum]);
  }
  if (actual === "string") {
    if (schema.minLength !== undefined && value.length < schema.minLength) errors.push([pointer, "must be at least " + schema.minLength + " characters"]);
    if (schema.maxLength !== undefined && value.length > schema.maxLength) errors.push([pointer, "must be at most " + schema.maxLength + " characters"]);
  }
  if (actual === "object") {
    for (const name of schema.required || []) {
      if (!(name in value)) errors.push([pointer + "/" + pointerPart(name), "is required"]);
    }
    for (const [name, child] of Object.entries(value)) {
      const childSchema = (schema.properties || {})[name];
      if (childSchema) validate(child, childSchema, pointer + "/" + pointerPart(name), errors);
      else if (schema.additionalProperties === false) errors.push([pointer + "/" + pointerPart(name), "is not a known argument"]);
    }
  }
  if (actual === "array" && schema.items) value.forEach((item, index) => validate(item, schema.items, pointer + "/" + index, errors));
}

// Lists the errors under the form and marks each control they name, with its message beside
// it; the marks of an earlier check are cleared first.
function showErrors(errors) {
  const list = document.getElementById("errors");
  list.replaceChildren(...errors.map(([pointer, message]) => element("li", { "data-pointer": pointer }, (pointer || "/") + " " + message)));
  const fields = document.getElementById("fields");
  for (const node of fields.querySelectorAll(".field-error")) node.remove();
  for (const node of fields.querySelectorAll("[aria-invalid]")) {
    node.removeAttribute("aria-invalid");
    node.classList.remove("invalid");
  }
  for (const [pointer, message] of errors) {
    const control = Array.from(fields.querySelectorAll("[data-pointer]")).find((node) => node.getAttribute("data-pointer") === pointer);
    if (!control) continue;
    control.setAttribute("aria-invalid", "true");
    control.classList.add("invalid");
    const note = element("span", { class: "field-error", "data-pointer": pointer }, message);
    if (control.tagName === "FIELDSET") control.appendChild(note); else control.after(note);
  }
}

function tryIt(form) {
  const schema = JSON.parse(document.getElementById("input-schema").textContent || "{}");
  const fields = document.getElementById("fields");
  buildField(fields, schemaType(schema) === "object" ? schema : { type: "object", properties: {} }, "", "arguments", true);
  const raw = document.getElementById("raw-args");
  const useRaw = document.getElementById("use-raw");
  useRaw.addEventListener("change", () => {
    raw.hidden = !useRaw.checked;
    fields.hidden = useRaw.checked;
  });
  const state = document.getElementById("call-state");
  const result = document.getElementById("result");
  const blocks = document.getElementById("blocks");
  const progress = document.getElementById("progress");
  const cancel = document.getElementById("cancel");
  const requestId = document.getElementById("request-id");
  let source = null;

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const errors = [];
    let args;
    if (useRaw.checked) {
      try { args = JSON.parse(raw.value || "{}"); } catch (error) { errors.push(["", "is not JSON: " + error.message]); }
    } else {
      args = readValue(fields.querySelector("fieldset"), schema, errors);
    }
    // The schema's errors too, but one per control: text in a number field is already named.
    if (args !== undefined) {
      const named = new Set(errors.map(([pointer]) => pointer));
      const more = [];
      validate(args, schema, "", more);
      errors.push(...more.filter(([pointer]) => !named.has(pointer)));
    }
    showErrors(errors);
    if (errors.length) return;
    if (source) source.close();
    progress.replaceChildren();
    result.textContent = "";
    blocks.replaceChildren();
    state.textContent = "sending";
    state.className = "";
    try {
      const sent = await post("/api/call", {
        tool: form.getAttribute("data-tool"), arguments: args, traceparent: newTraceparent(),
      });
      requestId.textContent = sent.request_id;
      state.textContent = "running";
      cancel.disabled = false;
      source = new EventSource("/api/calls/" + encodeURIComponent(sent.request_id) + "/events");
      source.addEventListener("progress", (message) => {
        const report = JSON.parse(message.data);
        const total = report.total == null ? "" : " / " + report.total;
        progress.appendChild(element("li", {}, report.progress + total + (report.message ? " " + report.message : "")));
      });
      source.addEventListener("answer", (message) => {
        const answer = JSON.parse(message.data);
        result.textContent = JSON.stringify(answer, null, 2);
        blocks.replaceChildren(...contentBlocks(answer.content));
        const cancelled = !answer.success && answer.error_code === "cancelled";
        state.textContent = answer.success ? "answered" : cancelled ? "cancelled" : "error";
        state.className = state.textContent;
        cancel.disabled = true;
        source.close();
      });
      source.addEventListener("timeout", (message) => {
        result.textContent = JSON.parse(message.data).error;
        state.textContent = "no answer";
        cancel.disabled = true;
        source.close();
      });
    } catch (error) {
      state.textContent = "error";
      result.textContent = error.message;
    }
  });

  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    try {
      const answer = await post("/api/cancel", { request_id: requestId.textContent });
      flash("cancel: " + answer.state);
    } catch (error) {
      flash("cancel failed: " + error.message);
    }
  });
}

// ---- Calls: the live view --------------------------------------------------------------------

function callRow(call) {
  const row = element("tr", { "data-request-id": call.request_id });
  const duration = typeof call.duration_us === "number" ? (call.duration_us / 1000).toFixed(1) + " ms" : "";
  const link = element("a", {
    class: "call-link",
    href: "/calls/" + encodeURIComponent(call.log_toolbox_id) + "/" + encodeURIComponent(call.log_id),
  }, call.request_id);
  const cells = [["time", call.time], ["id", null], ["tool", call.tool], ["tenant", call.tenant], ["door", call.door],
    ["outcome", call.outcome], ["duration", duration], ["toolbox", call.log_toolbox_id]];
  for (const [name, text] of cells) {
    const cell = element("td", { class: name });
    if (name === "id") cell.appendChild(link); else cell.textContent = text == null ? "" : String(text);
    row.appendChild(cell);
  }
  return row;
}

function liveCalls(table) {
  const filter = document.getElementById("calls-filter");
  const apply = filterRows(filter, table);
  const source = new EventSource("/api/calls/stream");
  source.addEventListener("call", (message) => {
    const body = table.tBodies[0];
    body.insertBefore(callRow(JSON.parse(message.data)), body.firstChild);
    while (body.rows.length > 500) body.deleteRow(body.rows.length - 1);
    apply();
  });
}

// ---- Dead letters ----------------------------------------------------------------------------

function letterActions(table) {
  table.addEventListener("click", async (event) => {
    const button = event.target.closest("button.replay, button.delete");
    if (!button) return;
    const row = button.closest("tr");
    const action = button.classList.contains("replay") ? "replay" : "delete";
    const url = "/api/dlq/" + encodeURIComponent(row.getAttribute("data-toolbox")) + "/" +
      encodeURIComponent(row.getAttribute("data-dlq-id")) + "/" + action;
    button.disabled = true;
    try {
      const answer = await post(url);
      row.remove();
      flash(action === "replay" ? "replayed as entry " + answer.entry_id : "deleted");
    } catch (error) {
      button.disabled = false;
      flash(action + " failed: " + error.message);
    }
  });
}

// Charts of the last hour, hand-made SVG from /api/history (one point every few seconds per
// replica; see telemetry/history.rs), redrawn at each new point. Every label is set with
// textContent: a tool name is text, whatever it holds.
const SVG = "http://www.w3.org/2000/svg";
const SERIES_COLORS = ["#2457c5", "#b42318", "#157f3b", "#a15c07", "#6b3fa0"];

function svgNode(tag, attributes) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
  return node;
}

// A line chart of `series` ([{name, points: [[t, value]]}]) over [from, to], in a figure with a
// title and a legend; `unit` follows the largest value.
function lineChart(title, series, from, to, unit) {
  const figure = element("figure", { class: "chart" });
  const caption = element("figcaption", {}, title);
  figure.appendChild(caption);
  const width = 360, height = 120, pad = 4;
  const svg = svgNode("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img" });
  // At least 1 (a call, a millisecond, an entry): an idle chart reads 0 to 1, not 0 to nothing.
  const max = Math.max(1, ...series.flatMap((s) => s.points.map((p) => p[1])));
  const x = (t) => pad + (width - 2 * pad) * ((t - from) / Math.max(1, to - from));
  const y = (v) => height - pad - (height - 2 * pad) * (v / max);
  svg.appendChild(svgNode("line", { x1: pad, y1: height - pad, x2: width - pad, y2: height - pad, class: "axis" }));
  let drawn = 0;
  series.forEach((s, i) => {
    if (s.points.length === 0) return;
    const points = s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    const color = SERIES_COLORS[i % SERIES_COLORS.length];
    const line = svgNode("polyline", { points, fill: "none", stroke: color, "stroke-width": 1.5 });
    line.setAttribute("data-series", s.name);
    svg.appendChild(line);
    // A dot per point, so a lone point shows too.
    for (const p of s.points) svg.appendChild(svgNode("circle", { cx: x(p[0]).toFixed(1), cy: y(p[1]).toFixed(1), r: 1.6, fill: color }));
    drawn = Math.max(drawn, s.points.length);
  });
  const top = svgNode("text", { x: width - pad, y: 12, "text-anchor": "end", class: "scale" });
  top.textContent = `${Number(max.toPrecision(3))} ${unit}`;
  svg.appendChild(top);
  const since = svgNode("text", { x: pad + 2, y: 12, class: "scale" });
  since.textContent = "since " + new Date(from).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  svg.appendChild(since);
  figure.setAttribute("data-points", String(drawn));
  figure.appendChild(svg);
  const legend = element("div", { class: "legend" });
  series.forEach((s, i) => {
    const key = element("span", { class: "key" }, s.name);
    key.style.borderColor = SERIES_COLORS[i % SERIES_COLORS.length];
    legend.appendChild(key);
  });
  figure.appendChild(legend);
  return figure;
}

// The quantile `q` of merged bucket counts, as the upper bound (ms) of the bucket it falls in;
// the last bucket has no bound and reads as twice the last one.
function quantile(buckets, bounds, q) {
  const total = buckets.reduce((a, b) => a + b, 0);
  if (total === 0) return null;
  let seen = 0;
  for (let i = 0; i < buckets.length; i++) {
    seen += buckets[i];
    if (seen >= q * total) return i < bounds.length ? bounds[i] : 2 * bounds[bounds.length - 1];
  }
  return 2 * bounds[bounds.length - 1];
}

// Per tool, across replicas, by time slot: calls/s, errors/s and p50/p95/p99.
function toolSeries(history) {
  const every = history.every_ms;
  const byTool = new Map();
  for (const replica of history.replicas) {
    for (const point of replica.points) {
      const slot = Math.floor(point.t / every) * every;
      for (const [tool, counts] of Object.entries(point.tools || {})) {
        if (!byTool.has(tool)) byTool.set(tool, new Map());
        const slots = byTool.get(tool);
        const merged = slots.get(slot) || { calls: 0, errors: 0, buckets: [] };
        merged.calls += counts.calls || 0;
        merged.errors += counts.errors || 0;
        (counts.buckets || []).forEach((n, i) => { merged.buckets[i] = (merged.buckets[i] || 0) + n; });
        slots.set(slot, merged);
      }
    }
  }
  return byTool;
}

function drawTools(section, history, from, to) {
  const byTool = toolSeries(history);
  const holder = element("div", { class: "chart-grid" });
  const seconds = history.every_ms / 1000;
  for (const tool of [...byTool.keys()].sort()) {
    const slots = [...byTool.get(tool).entries()].sort((a, b) => a[0] - b[0]);
    const group = element("div", { class: "chart-group" });
    group.setAttribute("data-tool", tool);
    group.appendChild(element("h3", { class: "chart-tool" }, tool));
    group.appendChild(lineChart("calls per second", [
      { name: "calls/s", points: slots.map(([t, m]) => [t, m.calls / seconds]) },
      { name: "errors/s", points: slots.map(([t, m]) => [t, m.errors / seconds]) },
    ], from, to, "/s"));
    const latency = (q) => slots
      .map(([t, m]) => [t, quantile(m.buckets, history.buckets_ms, q)])
      .filter((p) => p[1] !== null);
    group.appendChild(lineChart("latency", [
      { name: "p50", points: latency(0.5) },
      { name: "p95", points: latency(0.95) },
      { name: "p99", points: latency(0.99) },
    ], from, to, "ms"));
    holder.appendChild(group);
  }
  return [holder, byTool.size];
}

function drawReplicas(section, history, from, to) {
  const holder = element("div", { class: "chart-grid" });
  let count = 0;
  for (const replica of history.replicas) {
    if (replica.points.length === 0) continue;
    count++;
    const group = element("div", { class: "chart-group" });
    group.setAttribute("data-replica", replica.toolbox_id + "/" + replica.consumer);
    group.appendChild(element("h3", {}, replica.toolbox_id + " / " + replica.consumer));
    group.appendChild(lineChart("in flight and queue depth", [
      { name: "in flight", points: replica.points.map((p) => [p.t, p.in_flight || 0]) },
      { name: "pending", points: replica.points.map((p) => [p.t, p.pending || 0]) },
      { name: "lag", points: replica.points.map((p) => [p.t, p.lag || 0]) },
    ], from, to, ""));
    holder.appendChild(group);
  }
  return [holder, count];
}

async function charts(section) {
  const kind = section.getAttribute("data-charts");
  const empty = section.querySelector(".charts-empty");
  let holder = null;
  const draw = async () => {
    let history;
    try {
      const response = await fetch("/api/history", { credentials: "same-origin" });
      if (!response.ok) return;
      history = await response.json();
    } catch (_) { return; }
    // The last hour, or less when the oldest point is younger: the lines fill the chart.
    const to = Date.now();
    const oldest = Math.min(to, ...history.replicas.flatMap((r) => r.points.map((p) => p.t)));
    const from = Math.max(to - 3600 * 1000, oldest - history.every_ms);
    const [fresh, count] = kind === "tools" ? drawTools(section, history, from, to) : drawReplicas(section, history, from, to);
    if (holder) holder.replaceWith(fresh); else section.appendChild(fresh);
    holder = fresh;
    if (empty) empty.hidden = count > 0;
    section.setAttribute("data-updated", String(Number(section.getAttribute("data-updated") || 0) + 1));
  };
  await draw();
  setInterval(draw, 5000);
}

document.addEventListener("DOMContentLoaded", () => {
  const tools = document.getElementById("tools");
  if (tools) filterRows(document.getElementById("tool-search"), tools);
  const form = document.getElementById("try-it");
  if (form) tryIt(form);
  const calls = document.getElementById("calls");
  if (calls) liveCalls(calls);
  const letters = document.getElementById("dead-letters");
  if (letters) letterActions(letters);
  document.querySelectorAll("section.charts").forEach((section) => { charts(section); });
});
