"""An episode player for Jupyter: play/pause, a step slider, the frame and its caption.

:class:`EpisodePlayer` is plain HTML with its own small script and the episode's
frames inside it (PNGs as data URLs): nothing to install in the notebook server, and
it plays the same in JupyterLab, VS Code and a notebook exported to HTML (it is the
output itself). ``AtariZarrDataset.show_episode(i)`` makes one; only that episode's
frames are read, so it works on a store in a bucket.

Examples
--------
>>> from atari_zarr import AtariZarrDataset
>>> player = episode_player(AtariZarrDataset(store_url), 0)  # a converted Pong/1 fixture
>>> player.steps == int(AtariZarrDataset(store_url).episode_table["length"][0])
True
>>> "azp-play" in player._repr_html_()
True
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from atari_zarr.errors import import_optional
from atari_zarr.explore.video import check_fps, check_scale, episode_frames

__all__ = ["EpisodePlayer", "episode_player"]

_TEMPLATE = """<div class="atari-zarr-player" id="{uid}" data-step="0"
 style="font-family: monospace; display: inline-block">
<div style="font-weight: bold">{title}</div>
<img class="azp-frame" alt="frame" width="{size}" height="{size}"
 style="image-rendering: pixelated; display: block; background: #000" src="{first}">
<div style="margin-top: 4px">
<button class="azp-play" type="button">&#9654; play</button>
<input class="azp-step" type="range" min="0" max="{last}" value="0" style="width: {slider}px">
</div>
<div class="azp-caption">{caption}</div>
<script>
(function () {{
  var root = document.getElementById("{uid}");
  var frames = {frames};
  var captions = {captions};
  var img = root.querySelector(".azp-frame"), slider = root.querySelector(".azp-step");
  var button = root.querySelector(".azp-play"), caption = root.querySelector(".azp-caption");
  var timer = null;
  function show(t) {{
    t = Math.max(0, Math.min(frames.length - 1, t));
    img.src = frames[t]; slider.value = t; caption.textContent = captions[t];
    root.setAttribute("data-step", String(t));
  }}
  function stop() {{ if (timer) {{ clearInterval(timer); timer = null; }}
    button.innerHTML = "&#9654; play"; }}
  button.addEventListener("click", function () {{
    if (timer) {{ stop(); return; }}
    if (Number(slider.value) >= frames.length - 1) {{ show(0); }}
    button.innerHTML = "&#10074;&#10074; pause";
    timer = setInterval(function () {{
      var t = Number(slider.value) + 1;
      if (t >= frames.length) {{ stop(); return; }}
      show(t);
    }}, {interval});
  }});
  slider.addEventListener("input", function () {{ stop(); show(Number(slider.value)); }});
}})();
</script>
</div>"""


def _png(frame: np.ndarray) -> str:
    image = import_optional("PIL.Image", extra="video", purpose="the episode player")
    buf = io.BytesIO()
    image.fromarray(np.ascontiguousarray(frame), mode="L").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class EpisodePlayer:
    """One episode as an inline HTML player (``_repr_html_``), also savable as a page.

    Attributes
    ----------
    steps : int
        Frames in the episode.
    html : str
        The player (a ``<div>`` with its script).
    """

    def __init__(self, html_text: str, steps: int, title: str) -> None:
        self.html = html_text
        self.steps = steps
        self.title = title

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return f"EpisodePlayer({self.title!r}, steps={self.steps})"

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the player as a web page of its own."""
        out = Path(path)
        page = (
            f"<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(self.title)}</title></head>"
            f"<body>{self.html}</body></html>"
        )
        out.write_text(page, encoding="utf-8")
        return out


def episode_player(ds: Any, episode: int, *, scale: int = 4, fps: float = 15.0) -> EpisodePlayer:
    """The player of episode ``episode`` of ``ds`` (see :class:`EpisodePlayer`).

    Raises
    ------
    IndexError
        ``episode`` is out of range: the message gives the valid range.
    """
    where = f"{ds.where}: the player of episode {episode}"
    scale = check_scale(scale, where)
    fps = float(check_fps(fps, where))
    frames, captions = episode_frames(ds, episode)
    assert captions is not None
    pngs = [_png(f) for f in frames]
    game, run = ds.metadata.get("game"), ds.metadata.get("run")
    title = f"{game}/{run}, episode {episode} ({len(pngs)} steps)"
    text = _TEMPLATE.format(
        uid=f"azp-{uuid.uuid4().hex[:12]}",
        title=html.escape(title),
        size=84 * int(scale),
        slider=max(200, 84 * int(scale) - 100),
        first=pngs[0],
        last=len(pngs) - 1,
        caption=html.escape(captions[0]),
        frames=json.dumps(pngs),
        captions=json.dumps(captions),
        interval=max(1, round(1000 / float(fps))),
    )
    return EpisodePlayer(text, len(pngs), title)
