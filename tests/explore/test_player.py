"""The episode player, opened in a real headless Chromium: a frame is drawn, play advances."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import pytest
from atari_zarr_testkit.browser import HeadlessChromium, find_chromium

from atari_zarr import AtariZarrDataset
from atari_zarr.explore.video import action_names, caption_lines

needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="no Chromium on PATH: apt-get install chromium (scripts/setup.sh test installs it)",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[HeadlessChromium]:
    with HeadlessChromium() as chromium:
        yield chromium


def check_player_in_browser(
    browser: HeadlessChromium, page_path, steps: int, first: np.ndarray
) -> None:
    """The first frame is drawn (the screenshot shows it, not a blank), play advances the
    step and its caption, the slider shows any step. Used by the notebook's test too,
    on the notebook's own output."""
    from PIL import Image

    page = browser.open(page_path.as_uri())
    root = "document.querySelector('.atari-zarr-player')"
    page.wait_for(f"{root}.querySelector('.azp-frame').complete")
    box = page.evaluate(
        f"(function(){{var r={root}.querySelector('.azp-frame').getBoundingClientRect();"
        f"return [r.left, r.top, r.right, r.bottom];}})()"
    )
    shot = np.asarray(Image.open(io.BytesIO(page.screenshot())).convert("L"), dtype=np.float64)
    left, top, right, bottom = (int(round(v)) for v in box)
    frame = shot[top:bottom, left:right]
    scale = frame.shape[0] // first.shape[0]
    want = np.repeat(np.repeat(first.astype(np.float64), scale, 0), scale, 1)
    assert scale >= 2 and frame.shape == want.shape
    assert want.std() > 0 and np.abs(frame - want).mean() < 2, "the frame drawn is not the episode's"
    assert np.abs(frame - frame.mean()).mean() > 0  # not blank
    assert page.evaluate(f"{root}.getAttribute('data-step')") == "0"
    page.evaluate(f"{root}.querySelector('.azp-play').click()")
    page.wait_for(f"Number({root}.getAttribute('data-step')) >= 3", timeout=30)
    caption = page.evaluate(f"{root}.querySelector('.azp-caption').textContent")
    step = int(page.evaluate(f"{root}.getAttribute('data-step')"))
    assert caption.startswith(f"step {step}  ") or caption.startswith("step ")
    page.evaluate(f"{root}.querySelector('.azp-play').click()")  # pause
    last = steps - 1
    page.evaluate(
        f"(function(){{var s={root}.querySelector('.azp-step'); s.value={last};"
        f"s.dispatchEvent(new Event('input'));}})()"
    )
    assert page.evaluate(f"{root}.getAttribute('data-step')") == str(last)
    assert page.evaluate(f"{root}.querySelector('.azp-caption').textContent").startswith(
        f"step {last}  "
    )


@needs_chromium
def test_the_player_plays_in_chromium(browser, pong_store, tmp_path):
    ds = AtariZarrDataset(pong_store.url)
    player = ds.show_episode(1)
    assert player.steps == int(ds.episode_table["length"][1])
    first = ds.episode(1)["observation"].numpy()[0]
    check_player_in_browser(browser, player.save(tmp_path / "player.html"), player.steps, first)


def test_the_player_holds_the_episode_and_its_captions(pong_store):
    import base64
    import json
    import re

    from PIL import Image

    ds = AtariZarrDataset(pong_store.url)
    player = ds.show_episode(0, scale=2)
    frames = json.loads(re.search(r"var frames = (\[.*?\]);", player.html).group(1))
    captions = json.loads(re.search(r"var captions = (\[.*?\]);", player.html).group(1))
    ep = ds.episode(0)
    want = ep["observation"].numpy()
    got = np.stack(
        [
            np.asarray(Image.open(io.BytesIO(base64.b64decode(f.split(",", 1)[1]))))
            for f in frames
        ]
    )
    np.testing.assert_array_equal(got, want)
    assert captions == caption_lines(
        ep["action"].numpy().astype(np.int64), ep["next", "reward"].numpy(), action_names(ds)
    )
    assert 'width="168"' in player.html
    with pytest.raises(IndexError, match="out of range"):
        ds.show_episode(10_000)


def test_the_player_of_a_store_in_a_bucket_reads_only_its_episode(pong_store):
    import fsspec
    from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

    local = AtariZarrDataset(pong_store.url)
    with FakeGCSServer() as server, CountingProxy(server.endpoint_url) as proxy:
        server.create_bucket("player")
        fs = fsspec.filesystem("gs", skip_instance_cache=True, **server.storage_options())
        fs.put(pong_store.url, "player/Pong/1.zarr", recursive=True)
        stored = fs.du("player/Pong/1.zarr")
        remote = AtariZarrDataset(
            "gs://player/Pong/1.zarr",
            storage_options=server.storage_options(endpoint_url=proxy.endpoint_url),
        )
        proxy.reset()
        player = remote.show_episode(2)
        assert player.html.count("data:image/png") == local.show_episode(2).html.count(
            "data:image/png"
        )
        assert 0 < proxy.bytes_received < stored / 2  # that episode's chunks, not the store
