// Bundles the page: src/main.js and what it imports (numcodecs' Blosc, its WebAssembly
// inlined) into one classic script, so that the page also works from file://, where
// module scripts are refused. Writes ../src/atari_zarr/viewer/{index.html,viewer.js};
// the bundle's first line records the sha256 of the sources it was built from, which
// tests/explore/test_viewer.py checks against the sources.
import { build } from "esbuild";
import { createHash } from "node:crypto";
import { copyFileSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "src", "atari_zarr", "viewer");

/** The sha256 of the sources: every file of src/ and the lockfile, by name, in order. */
export function sourcesDigest() {
  const hash = createHash("sha256");
  const names = [...readdirSync(join(here, "src")).map((n) => `src/${n}`), "package-lock.json"].sort();
  for (const name of names) {
    hash.update(`${name}\n`);
    hash.update(readFileSync(join(here, name)));
  }
  return hash.digest("hex");
}

const result = await build({
  entryPoints: [join(here, "src", "main.js")],
  bundle: true,
  format: "iife",
  target: ["chrome100", "firefox100", "safari15"],
  minify: true,
  legalComments: "eof",
  write: false,
  logLevel: "warning",
});
const header = `/* atari_zarr viewer, built by scripts/viewer.sh from viewer/ (sources sha256 ${sourcesDigest()}) */\n`;
writeFileSync(join(out, "viewer.js"), header + result.outputFiles[0].text);
copyFileSync(join(here, "src", "index.html"), join(out, "index.html"));
console.log(`wrote ${join(out, "viewer.js")} and index.html`);
