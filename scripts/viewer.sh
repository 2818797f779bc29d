#!/usr/bin/env bash
# Rebuilds the episode viewer's bundle, src/atari_zarr/viewer/{index.html,viewer.js}, from
# its sources in viewer/ (npm's esbuild and numcodecs, at the versions package-lock.json
# pins). The bundle is committed, so that installing and using the package needs no
# Node.js; run this after changing viewer/, and commit what it writes
# (tests/explore/test_viewer.py checks that the bundle was built from the sources).
set -euo pipefail
cd "$(dirname "$0")/../viewer"
npm ci --no-audit --no-fund
node build.mjs
