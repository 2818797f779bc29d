"""One result file of a benchmark: ``benchmarks/results/<prefix>-<time>.json``.

It holds the date and the machine beside the benchmark's own figures, which the
site's ``bench-results`` directive shows.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def save_result(prefix: str, **figures: Any) -> Path:
    """Write ``figures`` with the date and machine to a new result file; its path."""
    stamp = time.strftime("%Y%m%dT%H%M", time.gmtime())
    out = RESULTS / f"{prefix}-{stamp}.json"
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        **figures,
    }
    out.write_text(json.dumps(doc, indent=1))
    return out
