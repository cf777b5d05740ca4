// The overlay page: wires the source, the sender, the client's connection, the overlay
// and the heads-up display to the controls. Protocol: docs/protocol.md; the client that
// speaks it: client/ (docs/js-client.md).

import {
  AccessForbidden,
  AuthenticationFailed,
  EdgeVisionClient,
  FrameRejected,
  HandshakeRefused,
  MessageTooBig,
  ServerUnavailable,
  ServerUnreachable,
  SessionEnded,
  SessionSuperseded,
  TokenExpired,
} from "./client/index.js";
import { Overlay } from "./overlay.js";
import { EVENTS_SHOWN, PROTOCOL_VERSION, describeEvent, sameClasses } from "./protocol.js";
import { FrameSender } from "./sender.js";
import { SourceManager, naturalSize } from "./source.js";
import { RollingWindow, TimingWindow } from "./stats.js";
import { NAME_PATTERN, ZoneDraft, pictureFraction, regionColour, regionsOf } from "./zones.js";

const $ = (id) => document.getElementById(id);
const PREFS_KEY = "edge-vision.overlay.prefs";
const RATE_WINDOW_MS = 3000;
const LATENCY_WINDOW_MS = 5000;

const ui = {
  connState: $("conn-state"),
  stage: $("stage"),
  video: $("video"),
  image: $("image"),
  overlay: $("overlay"),
  hud: $("hud"),
  banner: $("banner"),
  pause: $("pause"),
  snapshot: $("snapshot"),
  reconnect: $("reconnect"),
  sourceKind: $("source-kind"),
  camera: $("camera"),
  resolution: $("resolution"),
  file: $("file"),
  threshold: $("threshold"),
  thresholdValue: $("threshold-value"),
  classes: $("classes"),
  serverSettings: $("server-settings"),
  inputSize: $("input-size"),
  track: $("track"),
  read: $("read"),
  readTexts: $("read-texts"),
  copyTexts: $("copy-texts"),
  events: $("events"),
  eventsNone: $("events-none"),
  drawZone: $("draw-zone"),
  zoneHelp: $("zone-help"),
  zones: $("zones"),
  zoneDialog: $("zone-dialog"),
  zoneForm: $("zone-form"),
  zoneName: $("zone-name"),
  zoneAppear: $("zone-appear"),
  zoneNameError: $("zone-name-error"),
  zoneCancel: $("zone-cancel"),
  quality: $("quality"),
  qualityValue: $("quality-value"),
  maxFps: $("max-fps"),
  sendSize: $("send-size"),
  inFlight: $("in-flight"),
  wire: $("wire"),
  fit: $("fit"),
  view: $("view"),
  compensate: $("compensate"),
  showHud: $("show-hud"),
};

// What the user asked for; re-sent after every (re)connection whose session differs.
// inputSize, track, read: settings since protocol 2, sent only where hello's features name
// them; inputSize null is the server's own size (limits.input_size). events (protocol 3):
// the session's own zones, lines and rules once this page changed them, else null.
const wanted = {
  confidence: null,
  classes: null,
  inputSize: null,
  track: true,
  read: false,
  events: null,
};
const counters = { answered: 0, lost: 0, serverDropped: 0 };
const windows = {
  sent: new RollingWindow(RATE_WINDOW_MS),
  answered: new RollingWindow(RATE_WINDOW_MS),
  latency: new RollingWindow(LATENCY_WINDOW_MS),
  timing: new TimingWindow(LATENCY_WINDOW_MS),
};
let labels = [];
let limits = null;
let hello = null;
let features = new Set();
let lastFrame = null;
let bannerTimer = null;
// Zones and lines (protocol 3): the node's, from hello's `events`, and the session's own as
// the server last said (hello's settings, each settings answer); the zone being drawn.
let nodeEvents = null;
let sessionEvents = { zones: {}, lines: {}, rules: [] };
let draft = null;

const sources = new SourceManager(ui.video, ui.image);
// The page runs unattended: it retries for ever (0.25 s doubling to 8 s, jittered), resumes
// its session after every resumable close, and says why it waits (onState).
const client = new EdgeVisionClient(serverUrl(), {
  token: accessToken(),
  retryMs: Infinity,
  backoffMaxMs: 8000,
  onHello,
  onState,
  onEvent: showEvent,
});
const sender = new FrameSender(client, {
  onSent: (frame) => {
    windows.sent.push(frame.sentAt);
    lastFrame = frame;
  },
  onLost: (n) => {
    counters.lost += n;
  },
  onResult,
  onRejected,
});
const overlay = new Overlay(ui.overlay, () => sources.element);

/** `/ws` on the page's own server; `?server=ws://host:port/ws` points elsewhere. */
function serverUrl() {
  const asked = new URLSearchParams(location.search).get("server");
  if (asked) return asked;
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  return `${proto}//${location.host}/ws`;
}

/**
 * The access token, from `#token=…` (a fragment never reaches a server or its logs); kept
 * for this tab in sessionStorage and taken out of the address bar, so a screenshot or a
 * copied link does not carry it.
 */
function accessToken() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const given = fragment.get("token");
  if (given) {
    sessionStorage.setItem("edge_vision.token", given);
    fragment.delete("token");
    const rest = fragment.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  }
  return sessionStorage.getItem("edge_vision.token");
}

// -- server messages ---------------------------------------------------------------------

function onHello(msg) {
  hello = msg;
  if (msg.protocol !== PROTOCOL_VERSION) {
    showBanner(
      `The server speaks protocol ${msg.protocol}; this page was written for ${PROTOCOL_VERSION}.`,
      "error",
      0,
      "protocol",
    );
  }
  limits = msg.limits || null;
  features = new Set(msg.features || []);
  nodeEvents = msg.events || null;
  sessionEvents = { zones: {}, lines: {}, rules: [] };
  if (!features.has("events") && draft) stopDrawing("this server has no zones");
  offerSessionOptions();
  if (!sameLabels(labels, msg.labels || [])) {
    labels = msg.labels || [];
    buildClassFilter();
  }
  applySendOptions();
  if (wanted.confidence === null) {
    wanted.confidence = msg.settings.confidence;
    ui.threshold.value = String(wanted.confidence);
    showThreshold();
  }
  showServerSettings(msg.settings);
  syncSettings(msg.settings);
  hideBanner("connection");
  sender.tick();
}

/** A frame's result (the sender's frame, matched by the client by its id). */
function onResult(frame, result) {
  const now = performance.now();
  counters.answered += 1;
  counters.serverDropped = result.dropped ?? counters.serverDropped;
  windows.answered.push(now);
  windows.latency.push(now, now - frame.capturedAt);
  windows.timing.push(now, result.timing);
  overlay.show(result, frame, now);
  showReadTexts(result.detections);
  requestRender();
}

/** The server answered a frame with `error`, or a frame could not be sent at all. */
function onRejected(_frame, error) {
  if (error instanceof FrameRejected) {
    showBanner(`server: ${error.code}: ${error.detail}`, "error", 6000);
  } else if (error instanceof MessageTooBig) {
    showBanner(`${error.message}; lower the quality or send size`, "error", 6000);
  }
}

/** An event (protocol 3) at the top of the list; the oldest leave past EVENTS_SHOWN. */
function showEvent(event) {
  const item = document.createElement("li");
  const when = new Date((event.at ?? 0) * 1000).toLocaleTimeString();
  item.textContent = `${when} ${describeEvent(event)}`;
  item.dataset.rule = event.rule;
  item.dataset.on = event.on;
  item.dataset.track = String(event.track);
  ui.events.prepend(item);
  while (ui.events.children.length > EVENTS_SHOWN) ui.events.lastElementChild.remove();
  ui.eventsNone.hidden = true;
}

/** The text read in the newest result's boxes, one per line, top to bottom (copyable). */
function showReadTexts(detections) {
  const lines = detections
    .filter((d) => typeof d.text === "string" && d.text)
    .sort((a, b) => a.box[1] - b.box[1] || a.box[0] - b.box[0])
    .map((d) => d.text);
  const text = lines.join("\n");
  if (ui.readTexts.value !== text) ui.readTexts.value = text;
}

ui.copyTexts.addEventListener("click", async () => {
  try {
    await navigator.clipboard.writeText(ui.readTexts.value);
    showBanner("text copied", "info", 1500);
  } catch {
    ui.readTexts.select(); // no clipboard permission: selected for Ctrl+C instead
  }
});

/**
 * The client's state in the page's words: the top bar, the HUD's link row, and a banner on
 * the picture while it waits or was refused (that is where a technician looks when the
 * boxes go away). A refusal or a session taken over is not retried: Reconnect does.
 */
function onState(state) {
  let kind = state.kind;
  let text;
  if (state.kind === "connecting") {
    text = state.attempt ? `connecting (attempt ${state.attempt + 1})` : "connecting";
  } else if (state.kind === "open") {
    text = `live · session ${state.hello.session_id}`;
    if (state.resumed) text += " (resumed)";
    else if (state.resuming) text += " (new session: the server did not know the old one)";
  } else if (state.kind === "waiting") {
    text = whyWaiting(state.error);
  } else if (state.kind === "closed") {
    kind = state.error instanceof SessionEnded ? "stopped" : "refused";
    text = kind === "stopped" ? "disconnected" : whyRefused(state.error);
  } else {
    text = "not connected";
  }
  ui.connState.dataset.kind = kind;
  ui.connState.textContent =
    kind === "waiting" ? `${text} — retrying in ${secondsUntil(state.retryAt)} s` : text;
  $("hud-state").textContent =
    kind === "waiting" ? `waiting to retry (attempt ${state.attempt})` : kind;
  if (kind === "refused") showBanner(text, "error", 0, "connection");
  else if (kind === "waiting") showBanner(`${text}; reconnecting…`, "info", 0, "connection");
}

function secondsUntil(epochMs) {
  return Math.max(0, (epochMs - Date.now()) / 1000).toFixed(1);
}

/** Why the client waits before its next attempt, in a few words. */
function whyWaiting(error) {
  if (error instanceof ServerUnavailable) return `server busy: ${error.body}`;
  if (error instanceof ServerUnreachable) return "server unreachable";
  if (error.code === 1006 || error.code === null) return error.reason || "connection lost";
  if (error.code === 1001) return error.reason ? `server closed: ${error.reason}` : "server went away";
  if (error.code === 4002) return "the server closed the connection: this page stopped reading results";
  if (error.code === 4003) return "closed after a quiet spell (idle timeout)";
  if (error.code === 1009) return "a frame was larger than the server accepts; lower the quality or send size";
  return error.message;
}

/** Why the client gave up, and what to do about it. */
function whyRefused(error) {
  if (error instanceof SessionSuperseded) {
    return "this session was taken over by another connection; press Reconnect";
  }
  if (error instanceof TokenExpired) {
    return "the access token expired; open the page with a fresh #token=… and press Reconnect";
  }
  let why = error.message;
  if (error instanceof AuthenticationFailed) {
    why = `refused: not authorised (401: ${error.body || "credentials required"})`;
  } else if (error instanceof AccessForbidden) {
    why = `refused: forbidden (403: ${error.body || "forbidden"})`;
  } else if (error instanceof HandshakeRefused && error.status >= 400) {
    why = `refused: HTTP ${error.status}${error.body ? ` ${error.body}` : ""}`;
  }
  return `${why}; press Reconnect after fixing it`;
}

// -- settings ----------------------------------------------------------------------------

function syncSettings(server) {
  if (!client.isOpen || wanted.confidence === null) return;
  const extra = {};
  if (features.has("track")) extra.track = wanted.track;
  if (features.has("input_size")) extra.input_size = wanted.inputSize;
  if (features.has("read")) extra.read = wanted.read;
  if (features.has("events") && wanted.events) Object.assign(extra, wanted.events);
  if (
    server &&
    server.confidence === wanted.confidence &&
    sameClasses(server.classes, wanted.classes) &&
    Object.entries(extra).every(([k, v]) => sameJson(server[k] ?? null, v))
  ) {
    return;
  }
  client.settings({ confidence: wanted.confidence, classes: wanted.classes, ...extra }).then(
    showServerSettings,
    (e) => {
      if (e instanceof FrameRejected) showBanner(`server: ${e.code}: ${e.detail}`, "error", 6000);
    },
  );
}

/**
 * The per-session options this server offers (hello's `features`): the input sizes from
 * `limits.input_sizes`, track ids, reading. A wanted size this server lacks falls back to
 * its default; an option it does not offer is shown disabled.
 */
function offerSessionOptions() {
  const sizes = features.has("input_size") && limits ? limits.input_sizes || [] : [];
  if (wanted.inputSize !== null && !sizes.includes(wanted.inputSize)) wanted.inputSize = null;
  const byDefault = limits ? `server default (${limits.input_size} px)` : "server default";
  const options = [new Option(byDefault, "")];
  for (const size of sizes) options.push(new Option(`${size} px`, String(size)));
  ui.inputSize.replaceChildren(...options);
  ui.inputSize.value = wanted.inputSize === null ? "" : String(wanted.inputSize);
  ui.inputSize.disabled = sizes.length === 0;
  ui.track.disabled = !features.has("track");
  ui.read.disabled = !features.has("read");
  ui.track.checked = wanted.track && !ui.track.disabled;
  ui.read.checked = wanted.read && !ui.read.disabled;
}

/** The long side the engine input has for this session: the chosen size or the server's. */
function modelInputSize() {
  return wanted.inputSize ?? (limits ? limits.input_size : 640);
}

function showServerSettings(s) {
  const classes =
    s.classes === null || s.classes === undefined
      ? "all classes"
      : s.classes.length
        ? s.classes.map((c) => labels[c] ?? c).join(", ")
        : "no classes";
  const parts = [`score ≥ ${Number(s.confidence).toFixed(2)}`, classes];
  const shown = ui.serverSettings.dataset;
  if ("input_size" in s) {
    const size = s.input_size ?? (limits ? limits.input_size : null);
    parts.push(s.input_size === null ? `input ${size ?? "default"} px (default)` : `input ${size} px`);
    shown.inputSize = s.input_size === null ? "" : String(s.input_size);
  }
  if ("track" in s) {
    parts.push(s.track ? "track ids on" : "track ids off");
    shown.track = String(s.track);
  }
  if ("read" in s) {
    parts.push(s.read ? "reading on" : "reading off");
    shown.read = String(s.read);
  }
  ui.serverSettings.textContent = `server settings: ${parts.join(" · ")}`;
  shown.confidence = String(s.confidence);
  if ("zones" in s || "lines" in s || "rules" in s) {
    sessionEvents = { zones: s.zones || {}, lines: s.lines || {}, rules: s.rules || [] };
  }
  showRegions();
}

// -- zones and lines (protocol 3) ---------------------------------------------------------

/** The node's and the session's zones and lines: on the picture, and listed. */
function showRegions() {
  const regions = regionsOf(nodeEvents, sessionEvents);
  overlay.regions = regions;
  const items = regions.map((r) => {
    const item = document.createElement("li");
    item.dataset.name = r.name;
    item.dataset.kind = r.kind;
    item.dataset.source = r.source;
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = regionColour(r.name).stroke;
    const what = document.createElement("span");
    what.className = "muted";
    what.textContent = ` ${r.source === "node" ? "node's" : "this session's"} ${r.kind}`;
    item.append(swatch, r.name, what);
    if (r.source === "session") {
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "remove";
      remove.textContent = "Remove";
      remove.setAttribute("aria-label", `Remove ${r.kind} ${r.name}`);
      remove.addEventListener("click", () => removeRegion(r));
      item.append(remove);
    }
    return item;
  });
  ui.zones.replaceChildren(...items);
  ui.drawZone.disabled = !features.has("events");
  if (!draft) showZoneHelp();
  requestRender();
}

function showZoneHelp(text = null) {
  let help = text;
  if (help === null && draft) {
    const n = draft.points.length;
    help =
      `drawing: ${n} point${n === 1 ? "" : "s"}. Click the corners (or arrow keys, Space); ` +
      "Enter or double-click closes, Backspace undoes, Escape cancels.";
  } else if (help === null) {
    help = features.has("events")
      ? "Draw zone, then click its corners on the picture; detections in a zone show its name."
      : hello
        ? "this server has no zones (protocol 3, feature events)"
        : "zones: waiting for the server…";
  }
  if (ui.zoneHelp.textContent !== help) ui.zoneHelp.textContent = help;
}

function startDrawing() {
  if (draft || ui.drawZone.disabled) return;
  draft = new ZoneDraft(onDraftChanged);
  overlay.draft = draft;
  ui.drawZone.setAttribute("aria-pressed", "true");
  ui.stage.classList.add("drawing");
  ui.stage.tabIndex = 0;
  ui.stage.setAttribute("aria-describedby", "zone-help");
  ui.stage.focus({ preventScroll: true });
  onDraftChanged();
}

/** End the drawing (added, or cancelled: `why` says so), focus back on the button. */
function stopDrawing(why = null) {
  if (!draft) return;
  draft = null;
  overlay.draft = null;
  ui.drawZone.setAttribute("aria-pressed", "false");
  ui.stage.classList.remove("drawing");
  ui.stage.removeAttribute("tabindex");
  ui.stage.removeAttribute("aria-describedby");
  if (ui.zoneDialog.open) ui.zoneDialog.close("cancel");
  ui.drawZone.focus({ preventScroll: true });
  showZoneHelp(why);
  requestRender();
}

function onDraftChanged() {
  showZoneHelp();
  requestRender();
}

/** Close the zone being drawn: ask for its name (the dialog), or say what it lacks. */
function finishDrawing() {
  if (!draft) return;
  if (!draft.closable) {
    showZoneHelp(`a zone needs at least 3 points (${draft.points.length} so far); Escape cancels`);
    return;
  }
  draft.cursor = null;
  requestRender();
  let n = 1;
  while (nameTaken(`zone-${n}`)) n += 1;
  ui.zoneName.value = `zone-${n}`;
  ui.zoneNameError.textContent = "";
  ui.zoneDialog.returnValue = "";
  ui.zoneDialog.showModal();
  ui.zoneName.select();
}

function nameTaken(name) {
  return [nodeEvents, sessionEvents].some(
    (e) => e && (Object.hasOwn(e.zones || {}, name) || Object.hasOwn(e.lines || {}, name)),
  );
}

async function addDrawnZone(event) {
  event.preventDefault();
  if (!draft) return;
  const name = ui.zoneName.value.trim();
  if (!NAME_PATTERN.test(name)) {
    ui.zoneNameError.textContent = "letters, digits, _ . - only (at most 64)";
    return;
  }
  if (nameTaken(name)) {
    ui.zoneNameError.textContent = `there is a zone or line called ${name} already`;
    return;
  }
  const base = wanted.events ?? sessionEvents;
  const next = {
    zones: { ...base.zones, [name]: draft.points.map((p) => [...p]) },
    lines: { ...base.lines },
    rules: [...base.rules],
  };
  if (ui.zoneAppear.checked) next.rules.push({ name: `${name}-appear`, on: "appear", zone: name });
  ui.zoneNameError.textContent = "adding…";
  const problem = await setSessionEvents(next);
  if (problem !== null) {
    ui.zoneNameError.textContent = `not added: ${problem}`;
    return;
  }
  ui.zoneDialog.close("added");
  stopDrawing(`zone ${name} added`);
}

async function removeRegion(region) {
  const base = wanted.events ?? sessionEvents;
  const next = { zones: { ...base.zones }, lines: { ...base.lines }, rules: [...base.rules] };
  if (region.kind === "zone") {
    delete next.zones[region.name];
    next.rules = next.rules.filter((r) => r.zone !== region.name);
  } else {
    delete next.lines[region.name];
    next.rules = next.rules.filter((r) => r.line !== region.name);
  }
  const problem = await setSessionEvents(next);
  if (problem !== null) showBanner(`server: ${problem}`, "error", 6000);
  else showZoneHelp(`${region.kind} ${region.name} removed`);
}

/**
 * Send the session's own zones, lines and rules; the answer is shown. Returns null, or
 * what the server (or the connection) said was wrong, with nothing changed.
 */
async function setSessionEvents(next) {
  const before = wanted.events;
  wanted.events = next;
  try {
    showServerSettings(await client.settings(next));
    return null;
  } catch (e) {
    wanted.events = before;
    return e instanceof FrameRejected ? e.detail : e.message;
  }
}

/** Keys while drawing; true when the key was the drawing's. */
function onDrawKey(e) {
  const step = e.shiftKey ? 0.05 : 0.01;
  const moves = { ArrowLeft: [-step, 0], ArrowRight: [step, 0], ArrowUp: [0, -step], ArrowDown: [0, step] };
  if (e.key === "Escape") stopDrawing("drawing cancelled");
  else if (e.key === "Enter") finishDrawing();
  else if (e.key === "Backspace") draft.undo();
  else if (e.key === " " || e.key === "+") draft.add(draft.cursor ?? [0.5, 0.5]);
  else if (e.key in moves) draft.nudge(...moves[e.key]);
  else return false;
  e.preventDefault();
  return true;
}

function onStagePointer(e) {
  if (!draft) return;
  const p = pictureFraction(sources.element, e.clientX, e.clientY);
  if (p === null) return;
  if (e.type === "click") draft.add(p);
  else if (e.type === "dblclick") finishDrawing();
  else draft.moveCursor(p);
}

function buildClassFilter() {
  const box = ui.classes;
  box.replaceChildren();
  const legend = document.createElement("legend");
  legend.textContent = "Classes";
  box.append(legend);
  labels.forEach((name, index) => {
    const label = document.createElement("label");
    const input = document.createElement("input");
    input.type = "checkbox";
    input.value = String(index);
    input.checked = wanted.classes === null || wanted.classes.includes(index);
    input.addEventListener("change", onClassesChanged);
    label.append(input, ` ${name}`);
    box.append(label);
  });
  if (labels.length > 3) {
    const row = document.createElement("div");
    row.className = "buttons";
    for (const [text, on] of [["All", true], ["None", false]]) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = text;
      b.addEventListener("click", () => {
        for (const input of box.querySelectorAll("input")) input.checked = on;
        onClassesChanged();
      });
      row.append(b);
    }
    box.append(row);
  }
}

function onClassesChanged() {
  const inputs = [...ui.classes.querySelectorAll("input[type=checkbox]")];
  const chosen = inputs.filter((i) => i.checked).map((i) => Number(i.value));
  wanted.classes = chosen.length === inputs.length ? null : chosen;
  syncSettings(null);
}

function sameJson(a, b) {
  return a === b || JSON.stringify(a) === JSON.stringify(b);
}

function sameLabels(a, b) {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

function showThreshold() {
  ui.thresholdValue.textContent = Number(ui.threshold.value).toFixed(2);
}

// -- sending options, view, prefs ---------------------------------------------------------

function applySendOptions() {
  const size = ui.sendSize.value;
  // "model input": frames are sent at the size the engine works at, so a larger chosen
  // input size gets the detail it is chosen for and a smaller one costs no extra bytes.
  const model = limits ? `model input (${modelInputSize()} px)` : "model input";
  ui.sendSize.querySelector('option[value="model"]').textContent = model;
  sender.options.maxSide = size === "model" ? modelInputSize() : Number(size);
  sender.options.quality = Number(ui.quality.value);
  sender.options.maxFps = clamp(Number(ui.maxFps.value) || 30, 1, 60);
  sender.options.maxInFlight = Number(ui.inFlight.value);
  sender.options.wire = ui.wire.value;
  ui.qualityValue.textContent = Number(ui.quality.value).toFixed(2);
  sender.tick();
}

function applyView() {
  ui.stage.style.setProperty("--fit", ui.fit.value);
  overlay.view = ui.view.value;
  overlay.compensate = ui.compensate.checked;
  ui.hud.hidden = !ui.showHud.checked;
  requestRender();
}

const PREF_FIELDS = ["resolution", "quality", "maxFps", "sendSize", "inFlight", "wire", "fit", "view"];

function savePrefs() {
  const prefs = {
    threshold: wanted.confidence,
    showHud: ui.showHud.checked,
    compensate: ui.compensate.checked,
    inputSize: wanted.inputSize,
    track: wanted.track,
    read: wanted.read,
  };
  for (const name of PREF_FIELDS) prefs[name] = ui[name].value;
  try {
    localStorage.setItem(PREFS_KEY, JSON.stringify(prefs));
  } catch {
    // storage disabled (private mode): preferences just do not persist
  }
}

function loadPrefs() {
  let prefs = null;
  try {
    prefs = JSON.parse(localStorage.getItem(PREFS_KEY) || "null");
  } catch {
    prefs = null;
  }
  if (!prefs || typeof prefs !== "object") return;
  for (const name of PREF_FIELDS) {
    if (typeof prefs[name] === "string") ui[name].value = prefs[name];
  }
  if (typeof prefs.showHud === "boolean") ui.showHud.checked = prefs.showHud;
  if (typeof prefs.compensate === "boolean") ui.compensate.checked = prefs.compensate;
  // Checked against the server's offer when its hello comes (offerSessionOptions).
  if (Number.isInteger(prefs.inputSize) && prefs.inputSize > 0) wanted.inputSize = prefs.inputSize;
  if (typeof prefs.track === "boolean") wanted.track = prefs.track;
  if (typeof prefs.read === "boolean") wanted.read = prefs.read;
  ui.track.checked = wanted.track;
  ui.read.checked = wanted.read;
  if (typeof prefs.threshold === "number") {
    wanted.confidence = prefs.threshold;
    ui.threshold.value = String(prefs.threshold);
  }
}

function clamp(v, lo, hi) {
  return Math.min(hi, Math.max(lo, v));
}

// -- source ------------------------------------------------------------------------------

async function startCamera() {
  try {
    const opened = await sources.openCamera(ui.camera.value, ui.resolution.value);
    if (opened === null) return; // a file chosen while the camera started is the source
    await fillCameraPicker(opened);
    hideBanner("source");
  } catch (e) {
    showBanner(
      `Camera unavailable (${e.name === "Error" ? e.message : e.name}). Choose a video or image file instead.`,
      "error",
      0,
      "source",
    );
    ui.sourceKind.value = "file";
    showSourceFields();
  }
  sender.setSource(sources.element);
}

async function fillCameraPicker(selected) {
  const cameras = await sources.listCameras();
  const options = [new Option("default", "")];
  for (const cam of cameras) options.push(new Option(cam.label, cam.deviceId));
  ui.camera.replaceChildren(...options);
  ui.camera.value = cameras.some((c) => c.deviceId === selected) ? selected : "";
}

async function openChosenFile() {
  const file = ui.file.files && ui.file.files[0];
  if (!file) return;
  try {
    if (!(await sources.openFile(file))) return; // a newer source took its place
    hideBanner("source");
  } catch (e) {
    showBanner(`Cannot use ${file.name}: ${e.message}`, "error", 0, "source");
  }
  sender.setSource(sources.element);
}

function showSourceFields() {
  const kind = ui.sourceKind.value;
  for (const el of document.querySelectorAll("[data-for]")) el.hidden = el.dataset.for !== kind;
}

// -- pause, snapshot, banner --------------------------------------------------------------

function setPaused(paused) {
  sender.paused = paused;
  overlay.frozen = paused;
  overlay.frozenAt = paused ? performance.now() : null; // boxes carried to the frozen picture
  sources.setPaused(paused);
  ui.pause.setAttribute("aria-pressed", String(paused));
  ui.pause.textContent = paused ? "Resume" : "Pause";
  if (!paused) {
    // Boxes kept while paused belong to the frozen picture; they start ageing again now.
    if (overlay.current) overlay.current.receivedAt = performance.now();
    sender.tick();
  }
  requestRender();
}

async function takeSnapshot() {
  const blob = await overlay.snapshot();
  if (!blob) {
    showBanner("Nothing to snapshot yet", "info", 3000);
    return;
  }
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = `edge-vision-${new Date().toISOString().replace(/[:.]/g, "-")}.png`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

function showBanner(text, level = "info", hideAfterMs = 0, owner = "") {
  ui.banner.textContent = text;
  ui.banner.dataset.level = level;
  ui.banner.dataset.owner = owner;
  ui.banner.hidden = false;
  clearTimeout(bannerTimer);
  if (hideAfterMs) bannerTimer = setTimeout(() => (ui.banner.hidden = true), hideAfterMs);
}

function hideBanner(owner) {
  if (ui.banner.dataset.owner === owner) ui.banner.hidden = true;
}

// -- drawing and the heads-up display ------------------------------------------------------

let renderWanted = true;
let wakeAt = 0;

function requestRender() {
  renderWanted = true;
}

function animate(now) {
  if (renderWanted || now >= wakeAt) {
    renderWanted = false;
    wakeAt = now + overlay.render(now);
    // Where the labels went (canvas pixels) and what they say: the page's own record of
    // what is on screen, read by the browser tests and handy in devtools.
    const labelsDrawn = JSON.stringify(overlay.labels);
    if (ui.overlay.dataset.labels !== labelsDrawn) ui.overlay.dataset.labels = labelsDrawn;
    // And the boxes (canvas pixels) with the time of the picture they were drawn for.
    ui.overlay.dataset.drawn = JSON.stringify({ at: overlay.drawnAt, boxes: overlay.drawn });
    // And the zones and lines (canvas pixels), and the zone being drawn (fractions).
    const regionsDrawn = JSON.stringify(overlay.drawnRegions);
    if (ui.overlay.dataset.regions !== regionsDrawn) ui.overlay.dataset.regions = regionsDrawn;
    ui.overlay.dataset.draft = draft ? JSON.stringify(draft.points) : "";
  }
  requestAnimationFrame(animate);
}

function fmt(v, digits = 0) {
  return v === null || v === undefined || !Number.isFinite(v) ? "—" : v.toFixed(digits);
}

function setHud(id, text, data = {}) {
  const el = $(id);
  if (el.textContent !== text) el.textContent = text;
  for (const [k, v] of Object.entries(data)) el.dataset[k] = String(v);
}

function updateHud() {
  const now = performance.now();
  const sentFps = windows.sent.rate(now);
  const answeredFps = windows.answered.rate(now);
  setHud("hud-sent-fps", fmt(sentFps, 1), { value: sentFps.toFixed(2) });
  setHud("hud-answered-fps", fmt(answeredFps, 1), { value: answeredFps.toFixed(2) });
  setHud("hud-answered", String(counters.answered), { value: counters.answered });
  const p50 = windows.latency.percentile(50, now);
  const p95 = windows.latency.percentile(95, now);
  setHud(
    "hud-latency",
    p50 === null ? "—" : `p50 ${fmt(p50)} ms · p95 ${fmt(p95)} ms`,
    { p50: p50 === null ? "" : p50.toFixed(1), p95: p95 === null ? "" : p95.toFixed(1) },
  );
  const t = (name) => windows.timing.mean(name, now);
  setHud(
    "hud-server",
    t("server_ms") === null
      ? "—"
      : `total ${fmt(t("server_ms"))} ms · infer ${fmt(t("infer_ms"))} · decode ${fmt(t("decode_ms"), 1)}` +
          ` · queue ${fmt(t("queue_ms"), 1)} · post ${fmt(t("post_ms"), 1)}`,
  );
  setHud(
    "hud-dropped",
    counters.lost ? `${counters.serverDropped} by server · ${counters.lost} lost` : `${counters.serverDropped}`,
    { server: counters.serverDropped, lost: counters.lost },
  );
  setHud("hud-boxes", String(overlay.visibleBoxes), { value: overlay.visibleBoxes });
  const { width: natW, height: natH } = naturalSize(sources.element);
  setHud(
    "hud-frame",
    lastFrame
      ? `${natW}×${natH} → ${lastFrame.width}×${lastFrame.height}, ${(lastFrame.bytes / 1024).toFixed(0)} KB`
      : natW
        ? `${natW}×${natH}`
        : "no source",
  );
  if (hello) {
    const e = hello.engine || {};
    setHud("hud-engine", `${hello.model} · ${e.active || e.configured || "?"}${e.degraded ? " (degraded)" : ""}`);
  }
  // Boxes count as stale once results are clearly overdue for this link's pace.
  overlay.staleAfterMs = Math.max(700, 2 * (p95 ?? 0));
}

// -- keyboard ----------------------------------------------------------------------------

function onKey(e) {
  if (e.ctrlKey || e.metaKey || e.altKey || ui.zoneDialog.open) return;
  const tag = e.target && e.target.tagName;
  const field = tag === "INPUT" || tag === "SELECT" || tag === "TEXTAREA";
  if (draft && (e.key === "Escape" || !field) && onDrawKey(e)) return;
  if (field) return;
  const key = e.key.toLowerCase();
  if (key === "p" || (key === " " && tag !== "BUTTON")) {
    e.preventDefault();
    setPaused(!sender.paused);
  } else if (key === "s") {
    e.preventDefault();
    takeSnapshot();
  } else if (key === "h") {
    ui.showHud.checked = !ui.showHud.checked;
    applyView();
    savePrefs();
  } else if (key === "r") {
    client.reconnect();
  } else if (key === "z" && !ui.drawZone.disabled) {
    e.preventDefault();
    startDrawing();
  }
}

// -- start -------------------------------------------------------------------------------

function main() {
  loadPrefs();
  showThreshold();
  showSourceFields();
  applySendOptions();
  applyView();

  ui.threshold.addEventListener("input", showThreshold);
  let thresholdTimer = null;
  ui.threshold.addEventListener("change", () => {
    wanted.confidence = Number(ui.threshold.value);
    // Arrow keys fire one change per step: send the value the user settles on.
    clearTimeout(thresholdTimer);
    thresholdTimer = setTimeout(() => syncSettings(null), 120);
    savePrefs();
  });
  for (const el of [ui.quality, ui.maxFps, ui.sendSize, ui.inFlight, ui.wire]) {
    el.addEventListener("change", () => {
      applySendOptions();
      savePrefs();
    });
  }
  ui.quality.addEventListener("input", applySendOptions);
  ui.inputSize.addEventListener("change", () => {
    wanted.inputSize = ui.inputSize.value === "" ? null : Number(ui.inputSize.value);
    applySendOptions();
    syncSettings(null);
    savePrefs();
  });
  for (const [el, name] of [[ui.track, "track"], [ui.read, "read"]]) {
    el.addEventListener("change", () => {
      wanted[name] = el.checked;
      syncSettings(null);
      savePrefs();
    });
  }
  for (const el of [ui.fit, ui.view, ui.compensate, ui.showHud]) {
    el.addEventListener("change", () => {
      applyView();
      savePrefs();
    });
  }
  ui.sourceKind.addEventListener("change", () => {
    showSourceFields();
    if (ui.sourceKind.value === "camera") startCamera();
    else if (ui.file.files && ui.file.files.length) openChosenFile();
  });
  ui.camera.addEventListener("change", startCamera);
  ui.resolution.addEventListener("change", () => {
    savePrefs();
    startCamera();
  });
  ui.file.addEventListener("change", openChosenFile);
  ui.pause.addEventListener("click", () => setPaused(!sender.paused));
  ui.snapshot.addEventListener("click", takeSnapshot);
  ui.reconnect.addEventListener("click", () => client.reconnect());
  ui.drawZone.addEventListener("click", () => (draft ? stopDrawing("drawing cancelled") : startDrawing()));
  for (const type of ["click", "dblclick", "pointermove"]) ui.stage.addEventListener(type, onStagePointer);
  ui.zoneForm.addEventListener("submit", addDrawnZone);
  ui.zoneCancel.addEventListener("click", () => stopDrawing("drawing cancelled"));
  // Escape in the dialog (or any close but "added") cancels the zone altogether.
  ui.zoneDialog.addEventListener("close", () => {
    if (ui.zoneDialog.returnValue !== "added") stopDrawing("drawing cancelled");
  });
  document.addEventListener("keydown", onKey);

  new ResizeObserver(onStageResized).observe(ui.stage);
  ui.video.addEventListener("resize", onPictureSize);
  ui.video.addEventListener("loadedmetadata", onPictureSize);
  ui.image.addEventListener("load", onPictureSize);
  watchPixelRatio();
  window.addEventListener("online", () => {
    if (client.state.kind === "waiting") client.reconnect();
  });
  // A page that goes away ends its session (code 1000) instead of leaving it resumable.
  window.addEventListener("pagehide", () => client.close());
  window.addEventListener("pageshow", (e) => {
    if (e.persisted) client.reconnect(); // back from the back/forward cache
  });

  requestAnimationFrame(animate);
  updateHud();
  setInterval(updateHud, 250);
  client.connect().catch(() => {}); // a refusal is shown by onState
  if (sources.cameraAvailable) startCamera();
  else {
    ui.sourceKind.value = "file";
    showSourceFields();
    showBanner(
      window.isSecureContext
        ? "No camera access in this browser: choose a video or image file."
        : "Camera access needs HTTPS or localhost: choose a video or image file, or open the page over HTTPS.",
      "info",
      0,
      "source",
    );
  }
}

// The stage's height, for the phone portrait layout, where the picture stays at the top
// while the page scrolls under it: a control scrolled into view stays clear of it (style.css).
function onStageResized() {
  document.documentElement.style.setProperty("--stage-h", `${ui.stage.offsetHeight}px`);
  requestRender();
}

// The phone portrait layout sizes the stage to the picture's aspect ratio (style.css).
function onPictureSize() {
  const { width: w, height: h } = naturalSize(sources.element);
  if (w && h) ui.stage.style.setProperty("--aspect", `${w} / ${h}`);
  requestRender();
}

// Moving the window to a screen with another pixel density changes the backing size.
function watchPixelRatio() {
  const query = matchMedia(`(resolution: ${window.devicePixelRatio}dppx)`);
  query.addEventListener("change", () => {
    requestRender();
    watchPixelRatio();
  }, { once: true });
}

main();
