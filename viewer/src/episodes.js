// The per-episode table of a store, read from its attributes as atari_zarr's
// episodes.episode_columns reads it (AtariZarrDataset.episode_table shows the same).

const isInt = (v) => typeof v === "number" && Number.isInteger(v);

function column(raw, ok) {
  return Array.isArray(raw) && raw.every(ok) ? raw : null;
}

/** The checkpoints (or shards) the rows came from: [{checkpoint, firstRow, rows}], in row order. */
function sourceParts(attrs) {
  const conversion = attrs.conversion;
  if (!conversion || typeof conversion !== "object") return [];
  const entries = conversion.checkpoints !== undefined ? conversion.checkpoints : conversion.shards;
  if (!Array.isArray(entries)) return [];
  const parts = [];
  for (const entry of entries) {
    if (!entry || typeof entry !== "object") return [];
    const label = entry.suffix !== undefined ? entry.suffix : entry.shard;
    const values = [label, entry.first_transition, entry.transitions];
    if (!values.every(isInt)) return [];
    if (entry.transitions > 0) parts.push({ checkpoint: label, firstRow: entry.first_transition, rows: entry.transitions });
  }
  return parts;
}

/**
 * The episode table: {columns: {first_row, length, return, terminated, checkpoint?,
 * source_return?, source_clipped_return?, first_step, fragment}, count}, or null when the
 * store's attributes have no usable table.
 */
export function episodeTable(attrs, rows) {
  const table = attrs.episodes;
  if (!table || typeof table !== "object") return null;
  const length = column(table.length, isInt);
  const terminated = column(table.terminated, (v) => typeof v === "boolean");
  if (!length || !terminated || length.length !== terminated.length) return null;
  if (length.some((v) => v <= 0)) return null;
  if (rows !== undefined && length.reduce((a, b) => a + b, 0) !== rows) return null;
  const n = length.length;
  let returns = null;
  if ("return" in table) {
    returns = column(table.return, (v) => typeof v === "number");
    if (!returns || returns.length !== n) return null;
  }
  const firstRow = [];
  let at = 0;
  for (const l of length) {
    firstRow.push(at);
    at += l;
  }
  const columns = {
    first_row: firstRow,
    length,
    return: returns || length.map(() => NaN),
    terminated,
  };
  const parts = sourceParts(attrs);
  const idx = column(table.checkpoint_idx, isInt);
  if (idx && idx.length === n) columns.checkpoint = idx;
  else if (parts.length) {
    columns.checkpoint = firstRow.map((start) => {
      let k = 0;
      while (k + 1 < parts.length && parts[k + 1].firstRow <= start) k++;
      return parts[k].checkpoint;
    });
  }
  for (const [source, name] of [
    ["episode_return", "source_return"],
    ["clipped_episode_return", "source_clipped_return"],
  ]) {
    const raw = table[source];
    if (Array.isArray(raw) && raw.length === n) columns[name] = raw.map((v) => (v === null ? NaN : Number(v)));
  }
  let first = column(table.first_step, (v) => isInt(v) && v >= -1);
  if (!first || first.length !== n) {
    first = length.map(() => 0);
    if (parts.length && n) {
      for (let i = 1; i < n; i++) if (!terminated[i - 1]) first[i] = -1;
      if (parts[0].checkpoint !== 0) first[0] = -1;
    }
  }
  columns.first_step = first;
  columns.fragment = first.map((v) => v !== 0);
  return { columns, count: n };
}
