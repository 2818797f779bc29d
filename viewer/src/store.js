// Reading an atari_zarr store (Zarr v3) over http(s): metadata, shard indexes and the
// byte ranges of single chunks, each chunk's crc32c checked before it is decoded.
//
// The layout is docs/format.md's: arrays of rows, chunked (and, for frames, sharded) along
// the first axis; codecs bytes -> blosc -> crc32c, inside sharding_indexed for frames with
// the shard index (offset, nbytes per inner chunk, uint64 little-endian, then its crc32c)
// at the start of each shard object. Every chunk is fetched on its own with a Range
// request, so the page reads only what it shows.

import Blosc from "numcodecs/blosc";
import { checkCrc } from "./checksums.js";

/** A failure the page explains in its error element: `kind` names the case. */
export class ViewerError extends Error {
  constructor(kind, message) {
    super(message);
    this.kind = kind;
  }
}

/**
 * `text` with the credentials of any URL in it removed: user info and the secret parameters
 * of a query (signed URLs), as atari_zarr.redaction removes them from what Python prints.
 */
export function redactUrls(text) {
  return String(text)
    .replace(/(:\/\/)[^/@\s]+@/g, "$1***@")
    .replace(
      /([?&](?:access_token|token|signature|sig|key|secret|password|credential|x-goog-signature|x-goog-credential|x-amz-signature|x-amz-credential|x-amz-security-token)=)[^&\s'":]+/gi,
      "$1***",
    );
}

/**
 * The address, checked: a URL the page can read each file of a store under. The page
 * fetches `URL/zarr.json` and the rest, so credentials (which fetch refuses, and a
 * browser sends with no request) and a query (a signed URL grants one file) cannot work.
 */
export function checkAddress(address) {
  const text = String(address).trim();
  const shown = redactUrls(text);
  if (!/^(https?|gs|s3|hf):\/\//i.test(text)) {
    throw new ViewerError(
      "argument",
      `${shown} is not a store's URL: expected https://, http://, gs://, s3:// or ` +
        `hf://datasets/... of a store (…/Pong/1.zarr) or of a root with catalog.json.`,
    );
  }
  if (/^[a-z0-9]+:\/\/[^/?#]*@/i.test(text) || /[?#]/.test(text)) {
    throw new ViewerError(
      "argument",
      `${shown}: the viewer reads public stores, by URLs without credentials ` +
        `(user:password@) or a query (?...). Make the store public (or readable by this ` +
        `page: CORS), or copy it (\`atari-zarr pull\`) and run \`atari-zarr view\` on the copy.`,
    );
  }
  return text;
}

/** The https URL a store address means: gs://, s3:// and hf:// spelled as their hosts serve them. */
export function httpUrl(address) {
  let url = String(address).trim().replace(/\/+$/, "");
  let m;
  if ((m = url.match(/^gs:\/\/(.+)$/))) return `https://storage.googleapis.com/${m[1]}`;
  if ((m = url.match(/^s3:\/\/([^/]+)\/?(.*)$/))) return `https://${m[1]}.s3.amazonaws.com/${m[2]}`.replace(/\/$/, "");
  if ((m = url.match(/^hf:\/\/datasets\/([^/@]+\/[^/@]+)(?:@([^/]+))?\/?(.*)$/))) {
    const rev = encodeURIComponent(decodeURIComponent(m[2] || "main"));
    return `https://huggingface.co/datasets/${m[1]}/resolve/${rev}/${m[3]}`.replace(/\/$/, "");
  }
  return url;
}

/** Every request the page made, in order: `{url, range}` (what "reads only what it shows" means). */
export const requests = [];

async function request(url, range) {
  const headers = range ? { Range: `bytes=${range[0]}-${range[1] - 1}` } : {};
  requests.push({ url, range: range || null });
  let answer;
  try {
    answer = await fetch(url, { headers, cache: "no-store" });
  } catch (err) {
    throw new ViewerError(
      "cors",
      `The browser refused to read ${url}: its host sent no CORS header allowing this page ` +
        `(${location.protocol === "file:" ? "a file:// page" : location.origin}) to read it, or ` +
        `could not be reached. Serve the store with Access-Control-Allow-Origin (a bucket's ` +
        `CORS configuration), or run \`atari-zarr view\` on a local copy.`,
    );
  }
  if (answer.status === 429) {
    const after = answer.headers.get("Retry-After");
    throw new ViewerError(
      "rate-limit",
      `${url} answered 429 Too Many Requests: its host limits how fast files are read` +
        (after ? ` (retry after ${after} s)` : "") +
        `. Wait and reload the page; for many episodes, mirror the store ` +
        `(\`atari-zarr pull\`) and view the copy.`,
    );
  }
  return answer;
}

async function fetchJson(url, { optional = false } = {}) {
  const answer = await request(url);
  if (answer.status === 404 || answer.status === 403 || answer.status === 401) {
    if (optional) return null;
    throw missing(url, answer.status);
  }
  if (!answer.ok) throw httpError(url, answer.status);
  const text = await answer.text();
  try {
    return JSON.parse(text);
  } catch {
    throw new ViewerError(
      "not-zarr",
      `${url} is not Zarr metadata: expected JSON, found ${JSON.stringify(text.slice(0, 40))}. ` +
        `Give the URL of a store (the folder holding zarr.json, e.g. .../Pong/1.zarr) or of a ` +
        `root with catalog.json.`,
    );
  }
}

function missing(url, status) {
  return new ViewerError(
    "missing",
    `${url} was not found (HTTP ${status}): expected a store there. Check the URL ` +
      `(a store ends in {Game}/{run}.zarr; a root holds catalog.json), and that the files ` +
      `are public.`,
  );
}

function httpError(url, status) {
  return new ViewerError(
    "http",
    `${url} answered HTTP ${status}: expected the file. Reload the page; if it persists, ` +
      `check the host.`,
  );
}

async function fetchBytes(url, range) {
  const answer = await request(url, range);
  if (answer.status === 404) throw missing(url, 404);
  if (!answer.ok) throw httpError(url, answer.status);
  const body = new Uint8Array(await answer.arrayBuffer());
  if (range && answer.status === 200) return body.slice(range[0], range[1]); // Range ignored
  return body;
}

/**
 * What `url` holds: `{kind: "store", url, meta, attrs}` or `{kind: "root", url, catalog}`.
 * Throws a ViewerError for anything else (nothing there, not Zarr, not ours, unfinished).
 */
export async function openLocation(address) {
  const url = httpUrl(checkAddress(address));
  const meta = await fetchJson(`${url}/zarr.json`, { optional: true });
  if (meta === null) {
    const catalog = await fetchJson(`${url}/catalog.json`, { optional: true });
    if (catalog === null) {
      throw new ViewerError(
        "missing",
        `${url} holds no store: neither ${url}/zarr.json nor ${url}/catalog.json was found. ` +
          `Check the URL (a store ends in {Game}/{run}.zarr; a root holds catalog.json, ` +
          `written by \`atari-zarr index ROOT\`), and that the files are public.`,
      );
    }
    // every entry names its store's path; the rest of an entry is only shown, as text
    const stores = catalog && Array.isArray(catalog.stores) ? catalog.stores : null;
    const bad = stores ? stores.findIndex((e) => !e || typeof e !== "object" || typeof e.path !== "string") : -1;
    if (!stores || bad !== -1) {
      const found = stores ? `, found store ${bad}: ${String(JSON.stringify(stores[bad])).slice(0, 80)}` : "";
      throw new ViewerError(
        "not-zarr",
        `${url}/catalog.json is not a catalog of stores: expected {"format": 1, "stores": ` +
          `[{"path": "Game/run.zarr", ...}, ...]}${found}. Write it again with ` +
          `\`atari-zarr index ROOT\`.`,
      );
    }
    return { kind: "root", url, catalog };
  }
  return { kind: "store", url, ...checkGroup(url, meta) };
}

function checkGroup(url, meta) {
  if (!meta || meta.zarr_format !== 3 || meta.node_type !== "group") {
    const found = meta && meta.zarr_format ? `zarr_format ${meta.zarr_format} ${meta.node_type || ""}` : "other JSON";
    throw new ViewerError(
      "not-zarr",
      `${url}/zarr.json is not the metadata of a Zarr v3 group: found ${found}. Give the URL ` +
        `of an atari_zarr store (…/{Game}/{run}.zarr) or of a root with catalog.json.`,
    );
  }
  const attrs = meta.attributes && meta.attributes.atari_zarr;
  if (!attrs || typeof attrs !== "object" || !("format_version" in attrs)) {
    throw new ViewerError(
      "not-zarr",
      `${url} is a Zarr group but not an atari_zarr store: expected attributes under ` +
        `"atari_zarr". Create stores with \`atari-zarr convert\` or \`atari-zarr collect\`.`,
    );
  }
  if (attrs.complete !== true) {
    throw new ViewerError(
      "incomplete",
      `${url} is incomplete: an unfinished store, not a damaged one; its writer has not ` +
        `finished. Run ${attrs.command || "the command that created it"} again to finish it.`,
    );
  }
  return { meta, attrs };
}

const TYPES = {
  uint8: Uint8Array,
  bool: Uint8Array,
  int8: Int8Array,
  int16: Int16Array,
  uint16: Uint16Array,
  int32: Int32Array,
  uint32: Uint32Array,
  int64: BigInt64Array,
  uint64: BigUint64Array,
  float32: Float32Array,
  float64: Float64Array,
};

/**
 * Decoded chunks an array keeps (the newest used): what is shown and the chunk played
 * next, and a few to step back through. 16 chunks of frames are 1.8 MB; a page that
 * kept every chunk it had shown would hold a long episode's frames, and then the next's.
 */
export const CACHED_CHUNKS = 16;

/** One array of a store, read a chunk at a time (the last CACHED_CHUNKS used kept, as promises). */
export class ZArray {
  constructor(storeUrl, name, meta) {
    this.url = `${storeUrl}/${name}`;
    this.name = name;
    const where = `${this.url}/zarr.json`;
    const unsupported = (what) =>
      new ViewerError("not-zarr", `${where}: ${what}, which this viewer does not read (it reads the atari_zarr layout).`);
    if (!meta || meta.zarr_format !== 3 || meta.node_type !== "array") throw unsupported("not a Zarr v3 array");
    this.type = TYPES[meta.data_type];
    if (!this.type) throw unsupported(`data type ${meta.data_type}`);
    this.shape = meta.shape;
    this.rowItems = this.shape.slice(1).reduce((a, b) => a * b, 1);
    const grid = meta.chunk_grid && meta.chunk_grid.configuration && meta.chunk_grid.configuration.chunk_shape;
    if (!grid) throw unsupported("an irregular chunk grid");
    const keyConf = (meta.chunk_key_encoding && meta.chunk_key_encoding.configuration) || {};
    this.separator = keyConf.separator || "/";
    this.v2Keys = meta.chunk_key_encoding && meta.chunk_key_encoding.name === "v2";
    let codecs = meta.codecs || [];
    this.shardRows = null;
    this.chunkRows = grid[0];
    if (codecs.length === 1 && codecs[0].name === "sharding_indexed") {
      const conf = codecs[0].configuration;
      this.shardRows = grid[0];
      this.chunkRows = conf.chunk_shape[0];
      this.indexAtStart = (conf.index_location || "end") === "start";
      const names = (conf.index_codecs || []).map((c) => c.name);
      this.indexChecksum = names.includes("crc32c");
      codecs = conf.codecs;
    }
    const names = codecs.map((c) => c.name);
    if (names[0] !== "bytes") throw unsupported(`codecs ${names.join(", ")}`);
    const endian = codecs[0].configuration && codecs[0].configuration.endian;
    if (endian === "big" && this.type.BYTES_PER_ELEMENT > 1) throw unsupported("big-endian chunks");
    this.checksum = names[names.length - 1] === "crc32c";
    const middle = names.slice(1, this.checksum ? -1 : undefined);
    if (middle.length > 1 || (middle.length === 1 && middle[0] !== "blosc")) throw unsupported(`codecs ${names.join(", ")}`);
    this.blosc = middle.length === 1;
    this.chunks = new Map();
    this.indexes = new Map();
  }

  key(coord) {
    const coords = [coord, ...this.shape.slice(1).map(() => 0)];
    return this.v2Keys ? coords.join(this.separator) : ["c", ...coords].join(this.separator);
  }

  /** The index of shard `s`: an array of [offset, nbytes] per inner chunk (null: absent). */
  shardIndex(s) {
    if (!this.indexes.has(s)) {
      const perShard = this.shardRows / this.chunkRows;
      const size = 16 * perShard + (this.indexChecksum ? 4 : 0);
      const url = `${this.url}/${this.key(s)}`;
      const promise = (async () => {
        let raw;
        if (this.indexAtStart) raw = await fetchBytes(url, [0, size]);
        else {
          const answer = await request(url, null);
          if (answer.status === 404) throw missing(url, 404);
          if (!answer.ok) throw httpError(url, answer.status);
          const whole = new Uint8Array(await answer.arrayBuffer());
          raw = whole.slice(whole.length - size);
        }
        if (raw.length !== size || (this.indexChecksum && !checkCrc(raw))) {
          throw damaged(`the index of shard ${url}`, raw.length !== size ? `is ${raw.length} bytes, expected ${size}` : "fails its crc32c check");
        }
        const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
        const out = [];
        for (let i = 0; i < perShard; i++) {
          const lo = view.getUint32(16 * i, true), hi = view.getUint32(16 * i + 4, true);
          const nlo = view.getUint32(16 * i + 8, true), nhi = view.getUint32(16 * i + 12, true);
          if (lo === 0xffffffff && hi === 0xffffffff) out.push(null);
          else out.push([hi * 2 ** 32 + lo, nhi * 2 ** 32 + nlo]);
        }
        return { url, entries: out };
      })();
      promise.catch(() => this.indexes.delete(s)); // a failure is not remembered
      this.indexes.set(s, promise);
    }
    return this.indexes.get(s);
  }

  /** Chunk `c` (along the rows) decoded: a typed array of chunkRows * rowItems values. */
  chunk(c) {
    let promise = this.chunks.get(c);
    if (promise) this.chunks.delete(c); // set again below: the newest used, the last evicted
    else {
      promise = this._load(c);
      promise.catch(() => this.chunks.get(c) === promise && this.chunks.delete(c));
    }
    this.chunks.set(c, promise);
    // a Map iterates in insertion order: its first key is the least recently used
    while (this.chunks.size > CACHED_CHUNKS) this.chunks.delete(this.chunks.keys().next().value);
    return promise;
  }

  async _load(c) {
    const items = this.chunkRows * this.rowItems;
    let raw, what;
    if (this.shardRows) {
      const perShard = this.shardRows / this.chunkRows;
      const s = Math.floor(c / perShard);
      const { url, entries } = await this.shardIndex(s);
      const entry = entries[c - s * perShard];
      if (entry === null) return new this.type(items); // absent: the fill value, 0
      raw = await fetchBytes(url, [entry[0], entry[0] + entry[1]]);
      what = `inner chunk ${c - s * perShard} of ${url} (rows ${c * this.chunkRows}-${(c + 1) * this.chunkRows - 1})`;
    } else {
      const url = `${this.url}/${this.key(c)}`;
      raw = await fetchBytes(url);
      what = `chunk ${url}`;
    }
    if (this.checksum) {
      if (!checkCrc(raw)) throw damaged(what, "fails its crc32c check");
      raw = raw.subarray(0, raw.length - 4);
    }
    let bytes = raw;
    if (this.blosc) {
      try {
        bytes = await new Blosc().decode(raw);
      } catch (err) {
        throw damaged(what, `cannot be decompressed (${err.message || err})`);
      }
    }
    const size = items * this.type.BYTES_PER_ELEMENT;
    if (bytes.length !== size) throw damaged(what, `decodes to ${bytes.length} bytes, expected ${size}`);
    const copy = new Uint8Array(size);
    copy.set(bytes);
    return new this.type(copy.buffer);
  }

  /** Rows [a, b) as one typed array (numbers for 64-bit integers). */
  async rows(a, b) {
    const first = Math.floor(a / this.chunkRows), last = Math.floor((b - 1) / this.chunkRows);
    const chunks = [];
    for (let c = first; c <= last; c++) chunks.push(this.chunk(c));
    const done = await Promise.all(chunks);
    const big = this.type === BigInt64Array || this.type === BigUint64Array;
    const out = big ? new Float64Array((b - a) * this.rowItems) : new this.type((b - a) * this.rowItems);
    for (let r = a; r < b; r++) {
      const chunk = done[Math.floor(r / this.chunkRows) - first];
      const at = (r % this.chunkRows) * this.rowItems;
      for (let i = 0; i < this.rowItems; i++) out[(r - a) * this.rowItems + i] = big ? Number(chunk[at + i]) : chunk[at + i];
    }
    return out;
  }

  /** Row `r` (a frame: rowItems bytes). */
  async row(r) {
    const chunk = await this.chunk(Math.floor(r / this.chunkRows));
    const at = (r % this.chunkRows) * this.rowItems;
    return chunk.subarray(at, at + this.rowItems);
  }
}

function damaged(what, how) {
  return new ViewerError(
    "damaged",
    `${what} ${how}: the store is damaged (or its bytes changed on the way). Run ` +
      `\`atari-zarr verify\` on it, and convert or copy the store again.`,
  );
}

/** The array `name` of an opened store (metadata from the consolidated metadata when there). */
export async function openArray(store, name) {
  const consolidated = store.meta.consolidated_metadata && store.meta.consolidated_metadata.metadata;
  let meta = consolidated && consolidated[name];
  if (!meta) meta = await fetchJson(`${store.url}/${name}/zarr.json`, { optional: true });
  if (!meta) return null;
  return new ZArray(store.url, name, meta);
}

/** Whether the store has array `name`, from its consolidated metadata (no request). */
export function hasArray(store, name) {
  const consolidated = store.meta.consolidated_metadata && store.meta.consolidated_metadata.metadata;
  return consolidated ? name in consolidated : true;
}
