// The page: open a store or a root from the URL's hash, list its runs and episodes,
// play an episode on a canvas with a timeline. Everything the page reads goes through
// store.js, one chunk at a time.
//
// The hash is the page's state: #store=URL[&path=Game/run.zarr][&episode=E][&step=K].
// With a step, the page opens paused on it. The canvas carries data-frame-sha256 (the
// sha256 of the 84x84 frame drawn, read back from the canvas, one byte per pixel) and
// the body data-state ("loading", "ready", "error") for whoever watches the page.

import { CACHED_CHUNKS, ViewerError, openLocation, openArray, hasArray, requests, httpUrl, redactUrls } from "./store.js";
import { episodeTable } from "./episodes.js";
import { sha256Hex } from "./checksums.js";

// DQN's Atari settings: 60 frames a second, each step repeats its action 4 frames.
const STEPS_PER_SECOND = 15;
const PAGE_ROWS = 200;
const $ = (id) => document.getElementById(id);

const view = {
  store: null, // {url, meta, attrs, arrays, table}
  root: null,
  episode: 0,
  start: 0,
  length: 0,
  steps: null, // {action, reward, unclipped, terminated, truncated, returns}
  step: 0,
  playing: false,
  speed: 1,
  token: 0, // the newest draw; older ones give way
  playId: 0, // the play loop that may advance; any other stops
  shown: 0, // episode rows listed
  strip: null, // the timeline of the episode shown, drawn once: {key, image}
};

function setState(state) {
  document.body.dataset.state = state;
}

function showError(err) {
  const box = $("error");
  const message = err instanceof ViewerError ? err.message : `Unexpected failure: ${err && err.message ? err.message : err}`;
  box.textContent = redactUrls(message); // as text, never markup; no URL's credentials
  box.dataset.kind = err instanceof ViewerError ? err.kind : "unexpected";
  box.hidden = false;
  pause();
  setState("error");
  $("status").textContent = "";
}

function clearError() {
  const box = $("error");
  box.hidden = true;
  box.textContent = "";
  delete box.dataset.kind;
}

// An episode or step of the hash: its digits as a number, else the text as given (which
// the range checks refuse, quoting it).
const index = (text) => (text === null ? null : /^\d{1,15}$/.test(text) ? Number(text) : text);

function params() {
  const out = new URLSearchParams(location.hash.replace(/^#/, ""));
  return {
    store: out.get("store"),
    path: out.get("path"),
    episode: index(out.get("episode")),
    step: index(out.get("step")),
  };
}

function writeHash(extra) {
  const out = new URLSearchParams();
  if (view.root) {
    out.set("store", view.root.url);
    if (view.store) out.set("path", view.store.path);
  } else if (view.store) out.set("store", view.store.url);
  if (view.store) {
    out.set("episode", String(view.episode));
    if (extra && extra.step !== undefined) out.set("step", String(extra.step));
  }
  history.replaceState(null, "", `#${out.toString().replace(/%2F/g, "/").replace(/%3A/g, ":")}`);
}

// -- opening ------------------------------------------------------------------------------
async function load() {
  const p = params();
  pause();
  clearError();
  view.token++;
  if (!p.store) {
    setState("idle");
    $("status").textContent = "Give the URL of a store or of a root with catalog.json.";
    return;
  }
  $("store-url").value = redactUrls(p.store);
  setState("loading");
  $("status").textContent = `Opening ${redactUrls(p.store)}…`;
  try {
    const where = await openLocation(p.store);
    view.root = null;
    view.store = null;
    $("runs").hidden = true;
    $("episodes").hidden = true;
    $("player").hidden = true;
    if (where.kind === "root") {
      view.root = where;
      listRuns(where);
      if (!p.path) {
        $("status").textContent = `${where.url}: ${where.catalog.stores.length} stores. Pick a run.`;
        setState("ready");
        return;
      }
      const entry = await openLocation(`${where.url}/${p.path}`);
      if (entry.kind !== "store") throw new ViewerError("not-zarr", `${where.url}/${p.path} is a root, not a store: pick a run of the catalog.`);
      await openStore(entry, p.path);
    } else {
      await openStore(where, null);
    }
    const count = view.store.table.count;
    if (!count) {
      $("status").textContent = `${view.store.url} holds no episode.`;
      setState("ready");
      return;
    }
    const episode = p.episode === null ? 0 : p.episode;
    if (!Number.isInteger(episode) || episode < 0 || episode >= count) {
      throw new ViewerError("argument", `episode=${p.episode} is not an episode of ${view.store.url}: it has episodes 0 to ${count - 1}. Fix the link's episode.`);
    }
    await selectEpisode(episode, p.step === null ? 0 : p.step, true);
  } catch (err) {
    showError(err);
  }
}

async function openStore(where, path) {
  const attrs = where.attrs;
  const arrays = {};
  for (const [key, name] of [
    ["observation", "observation"],
    ["action", "action"],
    ["reward", "next/reward"],
    ["terminated", "next/terminated"],
    ["truncated", "next/truncated"],
    ["unclipped", "next/unclipped_reward"],
  ]) {
    arrays[key] = hasArray(where, name) ? await openArray(where, name) : null;
    if (!arrays[key] && key !== "unclipped") {
      throw new ViewerError("damaged", `${where.url} is marked complete but lacks the array ${name}: the store is damaged; convert it again.`);
    }
  }
  const rows = arrays.observation.shape[0];
  const table = episodeTable(attrs, rows);
  if (!table) {
    throw new ViewerError("not-zarr", `${where.url} has no usable episode table in its attributes (episodes): expected lengths adding up to its ${rows} rows. Run \`atari-zarr verify\` on it.`);
  }
  view.store = { ...where, path, attrs, arrays, table, rows };
  listEpisodes();
}

// -- lists --------------------------------------------------------------------------------
function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
}

// a value of the store or the catalog, as text (whatever its type: a catalog is input)
const fmt = (v) =>
  v === null || v === undefined || Number.isNaN(v) ? "–" : typeof v !== "number" || Number.isInteger(v) ? String(v) : v.toFixed(2);

function listRuns(root) {
  const body = $("run-table").tBodies[0];
  body.textContent = "";
  const stores = [...root.catalog.stores].sort((a, b) => String(a.game).localeCompare(String(b.game)) || String(a.run).localeCompare(String(b.run), undefined, { numeric: true }));
  for (const entry of stores) {
    const tr = document.createElement("tr");
    tr.dataset.path = entry.path;
    cell(tr, `${entry.game ?? "?"} / ${entry.run}`);
    cell(tr, entry.kind ?? "–");
    cell(tr, fmt(entry.transitions));
    cell(tr, fmt(entry.episodes));
    cell(tr, fmt(entry.return_mean));
    tr.addEventListener("click", () => {
      location.hash = `store=${root.url}&path=${encodeURIComponent(entry.path).replace(/%2F/g, "/")}`;
    });
    body.appendChild(tr);
  }
  $("runs").hidden = false;
}

function listEpisodes() {
  const { table, attrs, url } = view.store;
  const cols = table.columns;
  const head = $("episode-table").tHead;
  const names = ["Episode", "Length", "Return"];
  if (cols.source_return) names.push("Unclipped return");
  if (cols.checkpoint) names.push(attrs.kind === "rl-unplugged" ? "Shard" : "Checkpoint");
  names.push("End");
  head.innerHTML = `<tr>${names.map((n) => `<th>${n}</th>`).join("")}</tr>`;
  $("episode-table").tBodies[0].textContent = "";
  view.shown = 0;
  $("episodes-title").textContent = `${attrs.game || ""} ${attrs.run !== undefined ? `run ${attrs.run}` : ""}: ${table.count} episodes, ${view.store.rows} steps`.trim();
  moreEpisodes();
  $("episodes").hidden = false;
  $("status").textContent = `${url}`;
}

function moreEpisodes() {
  const { table } = view.store;
  const cols = table.columns;
  const body = $("episode-table").tBodies[0];
  const end = Math.min(table.count, view.shown + PAGE_ROWS);
  for (let e = view.shown; e < end; e++) {
    const tr = document.createElement("tr");
    tr.dataset.episode = String(e);
    // every column of the table, as AtariZarrDataset.episode_table gives it
    const row = {};
    for (const [name, values] of Object.entries(cols)) row[name] = Number.isNaN(values[e]) ? null : values[e];
    tr.dataset.columns = JSON.stringify(row);
    cell(tr, String(e) + (cols.fragment[e] ? " (fragment)" : ""));
    cell(tr, fmt(cols.length[e]));
    cell(tr, fmt(cols.return[e]));
    if (cols.source_return) cell(tr, fmt(cols.source_return[e]));
    if (cols.checkpoint) cell(tr, fmt(cols.checkpoint[e]));
    cell(tr, cols.terminated[e] ? "terminal" : "truncated", cols.terminated[e] ? "" : "cut");
    tr.addEventListener("click", () => selectEpisode(e, 0, false).catch(showError));
    body.appendChild(tr);
  }
  view.shown = end;
  $("more").hidden = end >= table.count;
}

// -- an episode ---------------------------------------------------------------------------
async function selectEpisode(e, step, fromHash) {
  pause();
  clearError();
  const { table, arrays } = view.store;
  const token = ++view.token;
  setState("loading");
  const start = table.columns.first_row[e];
  const length = table.columns.length[e];
  if (!Number.isInteger(step) || step < 0 || step >= length) {
    throw new ViewerError("argument", `step=${step} is not a step of episode ${e}: it has steps 0 to ${length - 1}. Fix the link's step.`);
  }
  for (const tr of $("episode-table").tBodies[0].rows) tr.setAttribute("aria-selected", String(tr.dataset.episode === String(e)));
  const end = start + length;
  const [action, reward, terminated, truncated, unclipped] = await Promise.all([
    arrays.action.rows(start, end),
    arrays.reward.rows(start, end),
    arrays.terminated.rows(start, end),
    arrays.truncated.rows(start, end),
    arrays.unclipped ? arrays.unclipped.rows(start, end) : null,
  ]);
  if (token !== view.token) return;
  const returns = new Float64Array(length);
  let sum = 0;
  for (let i = 0; i < length; i++) returns[i] = sum += reward[i];
  let unclippedReturns = null;
  if (unclipped) {
    unclippedReturns = new Float64Array(length);
    sum = 0;
    for (let i = 0; i < length; i++) unclippedReturns[i] = sum += unclipped[i];
  }
  Object.assign(view, { episode: e, start, length, steps: { action, reward, unclipped, terminated, truncated, returns, unclippedReturns } });
  $("seek").max = String(length - 1);
  $("player").hidden = false;
  await show(step);
  if (!fromHash) writeHash({ step });
}

async function show(step) {
  const token = ++view.token;
  const { observation } = view.store.arrays;
  view.step = step;
  const frame = await observation.row(view.start + step);
  if (token !== view.token) return false;
  draw(frame, step);
  if (view.playing) {
    // the next chunk, while this one plays: only the chunks played are read
    const next = Math.floor((view.start + step) / observation.chunkRows) + 1;
    if (next * observation.chunkRows < view.start + view.length) observation.chunk(next).catch(() => {});
  }
  setState("ready");
  return true;
}

function draw(frame, step) {
  const canvas = $("frame");
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  const image = ctx.createImageData(84, 84);
  for (let i = 0; i < frame.length; i++) {
    image.data[4 * i] = image.data[4 * i + 1] = image.data[4 * i + 2] = frame[i];
    image.data[4 * i + 3] = 255;
  }
  ctx.putImageData(image, 0, 0);
  // what is on the canvas now, not what was meant to be: read it back
  const back = ctx.getImageData(0, 0, 84, 84).data;
  const gray = new Uint8Array(84 * 84);
  for (let i = 0; i < gray.length; i++) gray[i] = back[4 * i];
  canvas.dataset.frameSha256 = sha256Hex(gray);
  canvas.dataset.episode = String(view.episode);
  canvas.dataset.step = String(step);
  canvas.dataset.row = String(view.start + step);
  $("seek").value = String(step);
  readout(step);
  drawTimeline();
}

function readout(step) {
  const s = view.steps;
  const last = step === view.length - 1;
  let end = "";
  if (s.terminated[step]) end = "episode ends here (terminal)";
  else if (s.truncated[step]) end = "episode truncated here";
  else if (last) end = "episode cut here";
  const unclipped = s.unclipped ? `  unclipped ${fmt(s.unclipped[step])} (${fmt(s.unclippedReturns[step])})` : "";
  $("readout").innerHTML = "";
  const line = document.createElement("div");
  line.textContent = `episode ${view.episode}  step ${step} / ${view.length - 1}  row ${view.start + step}  action ${s.action[step]}  reward ${fmt(s.reward[step])}  return so far ${fmt(s.returns[step])}${unclipped}`;
  const mark = document.createElement("div");
  mark.id = "end-mark";
  mark.className = s.terminated[step] ? "" : "cut";
  mark.textContent = end;
  $("readout").append(line, mark);
}

function drawTimeline() {
  const canvas = $("timeline");
  const ratio = window.devicePixelRatio || 1;
  const width = Math.max(1, Math.round(canvas.clientWidth * ratio));
  const height = Math.max(1, Math.round(canvas.clientHeight * ratio));
  if (canvas.width !== width || canvas.height !== height) Object.assign(canvas, { width, height });
  // the episode's strip is drawn once per episode and size; each step adds only the cursor
  const key = `${view.store.url} ${view.episode} ${width}x${height}`;
  if (!view.strip || view.strip.key !== key) view.strip = { key, image: drawStrip(width, height, ratio) };
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, width, height);
  ctx.drawImage(view.strip.image, 0, 0);
  ctx.fillStyle = "#0a6cbd";
  ctx.fillRect(((view.step + 0.5) / view.length) * width - ratio, 0, 2 * ratio, height);
}

function drawStrip(width, height, ratio) {
  const strip = document.createElement("canvas");
  Object.assign(strip, { width, height });
  const ctx = strip.getContext("2d");
  const s = view.steps;
  const n = view.length;
  const x = (i) => ((i + 0.5) / n) * width;
  const w = Math.max(1, width / n);
  const band = height / 4;
  // actions: one colour per action index
  for (let i = 0; i < n; i++) {
    ctx.fillStyle = `hsl(${(s.action[i] * 47) % 360} 70% 50%)`;
    ctx.fillRect((i / n) * width, 0, w, band * 0.8);
  }
  // rewards: bars up (positive) and down (negative) around the middle band
  const mid = band * 2;
  let top = 0;
  for (let i = 0; i < n; i++) top = Math.max(top, Math.abs(s.reward[i]));
  for (let i = 0; i < n; i++) {
    if (!s.reward[i]) continue;
    const h = (Math.abs(s.reward[i]) / (top || 1)) * band * 0.9;
    ctx.fillStyle = s.reward[i] > 0 ? "#2da44e" : "#cf222e";
    ctx.fillRect(x(i) - w / 2, s.reward[i] > 0 ? mid - h : mid, w, h);
  }
  // the return so far, in the bottom band
  let lo = 0, hi = 0;
  for (let i = 0; i < n; i++) { lo = Math.min(lo, s.returns[i]); hi = Math.max(hi, s.returns[i]); }
  const y = (v) => height - 2 - ((v - lo) / (hi - lo || 1)) * (band * 1.1);
  ctx.strokeStyle = "#8250df";
  ctx.lineWidth = Math.max(1, ratio);
  ctx.beginPath();
  for (let i = 0; i < n; i++) (i ? ctx.lineTo : ctx.moveTo).call(ctx, x(i), y(s.returns[i]));
  ctx.stroke();
  // the end: terminal or truncated (and the last stored row, where the data stops)
  ctx.font = `${Math.round(12 * ratio)}px system-ui, sans-serif`;
  ctx.textAlign = "right";
  for (let i = 0; i < n; i++) {
    if (!s.terminated[i] && !s.truncated[i] && i !== n - 1) continue;
    ctx.fillStyle = s.terminated[i] ? "#57606a" : "#cf222e";
    ctx.fillRect(x(i) - ratio, 0, 2 * ratio, height);
    ctx.fillText(s.terminated[i] ? "T" : "✂", x(i) - 3 * ratio, band * 1.4);
  }
  return strip;
}

// -- playing ------------------------------------------------------------------------------
function pause() {
  view.playing = false;
  view.playId++;
  $("play").textContent = "Play";
  $("play").setAttribute("aria-label", "Play");
}

async function play() {
  if (!view.steps) return;
  if (view.step >= view.length - 1) await show(0);
  view.playing = true;
  $("play").textContent = "Pause";
  $("play").setAttribute("aria-label", "Pause");
  const mine = ++view.playId;
  let due = performance.now();
  while (view.playing && view.step < view.length - 1) {
    due += 1000 / (STEPS_PER_SECOND * view.speed);
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, due - performance.now())));
    if (!view.playing || view.playId !== mine) return; // paused, or another play took over
    try {
      if (!(await show(view.step + 1))) break;
    } catch (err) {
      showError(err);
      break;
    }
    due = Math.max(due, performance.now() - 250); // a slow fetch does not make it race after
  }
  if (view.playId !== mine) return;
  if (view.playing) pause();
  writeHash({ step: view.step });
}

async function seek(step) {
  if (!view.steps) return;
  const playing = view.playing;
  pause();
  step = Math.min(view.length - 1, Math.max(0, step));
  try {
    await show(step);
    writeHash({ step });
  } catch (err) {
    showError(err);
  }
  if (playing) play();
}

// -- wiring -------------------------------------------------------------------------------
$("open").addEventListener("submit", (event) => {
  event.preventDefault();
  const url = $("store-url").value.trim();
  if (url) location.hash = `store=${url}`;
});
$("play").addEventListener("click", () => (view.playing ? (pause(), writeHash({ step: view.step })) : play()));
$("back").addEventListener("click", () => seek(view.step - 1));
$("forward").addEventListener("click", () => seek(view.step + 1));
$("seek").addEventListener("input", () => seek(Number($("seek").value)));
$("speed").addEventListener("change", () => (view.speed = Number($("speed").value)));
$("more").addEventListener("click", moreEpisodes);
$("timeline").addEventListener("pointerdown", (event) => {
  const box = $("timeline").getBoundingClientRect();
  seek(Math.floor(((event.clientX - box.left) / box.width) * view.length));
});
document.addEventListener("keydown", (event) => {
  if (!view.steps || event.target instanceof HTMLInputElement || event.target instanceof HTMLSelectElement) return;
  if (event.key === " ") { event.preventDefault(); $("play").click(); }
  else if (event.key === "ArrowLeft") seek(view.step - 1);
  else if (event.key === "ArrowRight") seek(view.step + 1);
});
window.addEventListener("resize", () => view.steps && drawTimeline());
window.addEventListener("hashchange", load);
window.atariZarrViewer = { requests, view, httpUrl, cachedChunks: CACHED_CHUNKS };
load();
