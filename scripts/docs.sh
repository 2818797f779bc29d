#!/usr/bin/env bash
# Build the documentation site from the repository, strictly (a warning is an error), into
# docs/_build/html, then serve it on http://127.0.0.1:${PORT:-8000}. `bash scripts/docs.sh
# build` builds only. Nothing is published.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh docs
.venv/bin/python -m sphinx -W --keep-going -n -q -b html docs docs/_build/html
echo "built docs/_build/html/index.html"
if [ "${1:-serve}" != "build" ]; then
    echo "serving it on http://127.0.0.1:${PORT:-8000}/ (ctrl-c stops)"
    exec .venv/bin/python -m http.server --bind 127.0.0.1 --directory docs/_build/html "${PORT:-8000}"
fi
