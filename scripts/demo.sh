#!/usr/bin/env bash
# Quick start 1: set up, then record, convert and read back a small run (no download).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all
exec .venv/bin/atari-zarr demo "${1:-atari-zarr-demo}"
