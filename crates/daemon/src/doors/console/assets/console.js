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

document.addEventListener("DOMContentLoaded", () => {
  const tools = document.getElementById("tools");
  if (tools) filterRows(document.getElementById("tool-search"), tools);
  const form = document.getElementById("try-it");
  if (form) tryIt(form);
  const calls = document.getElementById("calls");
  if (calls) liveCalls(calls);
  const letters = document.getElementById("dead-letters");
  if (letters) letterActions(letters);
});
