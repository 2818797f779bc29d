"""The episode viewer, a static page, in a real headless Chromium: it draws the reader's
frames, lists the reader's episodes, reads only the chunks it shows, and says what is
wrong with a store it cannot read; from a loopback server, ``file://`` and the test kit's
Hub emulator. Its server answers ranges and serves nothing outside what it was given.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from atari_zarr_testkit.browser import HeadlessChromium, Page, find_chromium
from atari_zarr_testkit.hub import HubEmulator
from atari_zarr_testkit.rl_unplugged import write_fixture_rlu

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.catalog import write_catalog
from atari_zarr.errors import InvalidArgumentError, StoreFormatError
from atari_zarr.explore.viewer import STORE_PREFIX, ViewerServer, page_path, view
from atari_zarr.shard_format import index_size, parse_index

REPO = Path(__file__).resolve().parents[2]
needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="no Chromium on PATH: apt-get install chromium (scripts/setup.sh test installs it)",
)
#: A page is given this long to open a store and draw (a hang guard, not a speed limit).
SETTLE = 120.0
STATE = "document.body.dataset.state"
FRAME = "document.getElementById('frame')"
ERROR = "document.getElementById('error')"
#: Both source kinds: (path under the root, kind).
STORES = {"dqn-replay": "Pong/1.zarr", "rl-unplugged": "Asterix/1.zarr"}


@pytest.fixture(scope="module")
def browser() -> Iterator[HeadlessChromium]:
    with HeadlessChromium() as chromium:
        yield chromium


@pytest.fixture(scope="module")
def root(pong_store, tmp_path_factory) -> Path:
    """A root with a DQN Replay-converted store, an RL Unplugged-converted one and a
    catalog.json."""
    root = tmp_path_factory.mktemp("viewer-root")
    shutil.copytree(pong_store.url, root / STORES["dqn-replay"])
    rlu = write_fixture_rlu(
        str(tmp_path_factory.mktemp("viewer-rlu")),
        "Asterix",
        1,
        num_shards=50,
        present=(0, 1),
        episodes_per_shard=3,
    )
    convert(rlu.root, str(root), progress=False)
    write_catalog(str(root))
    return root


def settle(page: Page) -> str:
    """The page's state once it is done loading (``ready`` or ``error``)."""
    return page.wait_for(f"{STATE} !== 'loading' && {STATE} !== 'idle' && {STATE}", SETTLE)


def sha(frame: np.ndarray) -> str:
    assert frame.shape == (84, 84) and frame.dtype == np.uint8
    return hashlib.sha256(frame.tobytes()).hexdigest()


def shown(page: Page) -> dict:
    return page.evaluate(f"JSON.parse(JSON.stringify({FRAME}.dataset))")


def episode_rows(page: Page) -> list[dict]:
    return page.evaluate(
        "Array.from(document.querySelectorAll('#episode-table tbody tr'),"
        " tr => JSON.parse(tr.dataset.columns))"
    )


def same_table(rows: list[dict], table) -> None:
    """The rows the page lists are ``table`` (``AtariZarrDataset.episode_table``)."""
    assert len(rows) == len(table)
    for (_, want), got in zip(table.iterrows(), rows, strict=True):
        assert set(got) == set(table.columns)
        for name, value in want.items():
            if isinstance(value, float) and math.isnan(value):
                assert got[name] is None, name
            else:
                assert got[name] == value, (name, got[name], value)


def picks(ds: AtariZarrDataset) -> list[tuple[int, int]]:
    """Episodes and steps to look at: a first step, a step past the first chunk of
    frames, an episode's last step."""
    lengths = ds.episode_table["length"].to_numpy()
    long = int(np.argmax(lengths))
    return [(0, 0), (long, min(int(lengths[long]) - 1, 20)), (1, int(lengths[1]) - 1)]


@needs_chromium
@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(STORES))
def test_the_page_draws_the_readers_frames_and_lists_its_episodes(browser, root, kind):
    """Opened on ``#store=ROOT&path=...&episode=E&step=K``, the page shows that step,
    paused: the frame read back from its canvas is the reader's, byte for byte; the episode
    list is ``episode_table``; it fetched the shard index and the one chunk of frames it
    shows, and the per-step chunks of the episode's rows, nothing else; the layout fits
    a phone's 390 px as well as 1280."""
    path = STORES[kind]
    ds = AtariZarrDataset(str(root / path))
    assert ds.metadata["kind"] == kind
    with ViewerServer(root) as server:
        for episode, step in picks(ds):
            server.log.clear()
            page = browser.open(server.url(path=path, episode=episode, step=step))
            assert settle(page) == "ready", page.evaluate(f"{ERROR}.textContent")
            frames = ds.episode(episode)["observation"].numpy()
            got = shown(page)
            assert (got["episode"], got["step"]) == (str(episode), str(step))
            assert got["frameSha256"] == sha(frames[step])
            assert page.evaluate("document.getElementById('play').textContent") == "Play"
            same_table(episode_rows(page), ds.episode_table)

            row = int(ds.episode_table["first_row"][episode]) + step
            prefix = f"{STORE_PREFIX}/{path}/"
            fetched = [(p[len(prefix) :], r) for _, p, r, _ in server.log if p.startswith(prefix)]
            frames_read = [(p, r) for p, r in fetched if p.startswith("observation/")]
            shard, chunk = divmod(row, 4096)[0], row // 16 % 256
            raw = (root / path / f"observation/c/{shard}/0/0").read_bytes()
            offset, nbytes = parse_index(
                raw[: index_size(256)], where=path, name="observation", key="k"
            )[chunk]
            assert frames_read == [
                (f"observation/c/{shard}/0/0", f"bytes=0-{index_size(256) - 1}"),
                (f"observation/c/{shard}/0/0", f"bytes={offset}-{offset + nbytes - 1}"),
            ]
            others = sorted(p for p, _ in fetched if not p.startswith("observation/"))
            steps = ["action", "next/reward", "next/terminated", "next/truncated"]
            if kind == "rl-unplugged":
                steps.append("next/unclipped_reward")
            assert others == sorted(["zarr.json", *(f"{name}/c/0" for name in steps)])

            for width in (1280, 390):
                box = page.evaluate(
                    f"(() => {{ const r = {FRAME}.getBoundingClientRect(); return [r.left,"
                    " r.right, r.width, document.documentElement.scrollWidth]; })()",
                    width=width,
                )
                left, right, drawn, scroll = box
                assert left >= 0 and right <= width and drawn >= 84 and scroll <= width


@needs_chromium
@pytest.mark.slow
def test_step_seek_play_and_speed_move_through_the_episode(browser, root):
    """Step, seek and play show the reader's frames of the steps they reach, and the
    page's address follows (a link to what is shown)."""
    path = STORES["dqn-replay"]
    ds = AtariZarrDataset(str(root / path))
    episode = int(np.argmax(ds.episode_table["length"].to_numpy()))
    frames = ds.episode(episode)["observation"].numpy()
    with ViewerServer(root / path) as server:
        page = browser.open(server.url(episode=episode, step=2))
        assert settle(page) == "ready"
        page.evaluate("document.getElementById('forward').click()")
        page.wait_for(f"{FRAME}.dataset.step === '3'", SETTLE)
        assert shown(page)["frameSha256"] == sha(frames[3])
        last = len(frames) - 1
        page.evaluate(
            f"(() => {{ const s = document.getElementById('seek'); s.value = '{last}';"
            " s.dispatchEvent(new Event('input')); })()"
        )
        page.wait_for(f"{FRAME}.dataset.step === '{last}'", SETTLE)
        assert shown(page)["frameSha256"] == sha(frames[last])
        assert page.evaluate("document.getElementById('end-mark').textContent").startswith(
            "episode ends here" if ds.episode_table["terminated"][episode] else "episode"
        )
        assert page.evaluate("location.hash").endswith(f"episode={episode}&step={last}")
        page.evaluate("document.getElementById('back').click()")
        page.wait_for(f"{FRAME}.dataset.step === '{last - 1}'", SETTLE)
        page.evaluate(
            "(() => { const s = document.getElementById('speed'); s.value = '4';"
            " s.dispatchEvent(new Event('change')); })()"
        )
        page.evaluate(
            "(() => { const s = document.getElementById('seek'); s.value = '0';"
            " s.dispatchEvent(new Event('input')); })()"
        )
        page.wait_for(f"{FRAME}.dataset.step === '0'", SETTLE)
        page.evaluate("document.getElementById('play').click()")
        page.wait_for(f"Number({FRAME}.dataset.step) >= 3", SETTLE)
        page.evaluate("document.getElementById('play').click()")  # pause
        page.wait_for("document.getElementById('play').textContent === 'Play'", SETTLE)
        now = shown(page)  # the step and its frame, read together
        assert now["frameSha256"] == sha(frames[int(now["step"])])


def _flip_a_frame_chunk(store: Path, row: int) -> None:
    """Flip a byte inside the chunk of frames holding ``row`` (its index left intact)."""
    shard = store / f"observation/c/{row // 4096}/0/0"
    raw = bytearray(shard.read_bytes())
    offset, nbytes = parse_index(
        bytes(raw[: index_size(256)]), where=str(store), name="observation", key="k"
    )[row // 16 % 256]
    raw[int(offset) + int(nbytes) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))


@needs_chromium
@pytest.mark.slow
def test_each_failure_shows_its_message_in_the_page(browser, root, tmp_path):
    """A missing store, a CORS refusal, a URL that is not Zarr, a damaged chunk and a rate
    limit each show their own message in the element ``error``; from ``file://``, a store
    whose host allows any origin is read as from the server."""
    damaged = tmp_path / "damaged"
    shutil.copytree(root / STORES["dqn-replay"], damaged / "1.zarr")
    _flip_a_frame_chunk(damaged / "1.zarr", 0)
    (tmp_path / "web" / "page").mkdir(parents=True)
    (tmp_path / "web" / "page" / "zarr.json").write_text("<!doctype html><p>a web page</p>")
    ds = AtariZarrDataset(str(root / STORES["dqn-replay"]))

    def error_of(page: Page) -> tuple[str, str]:
        assert settle(page) == "error"
        return page.evaluate(f"[{ERROR}.dataset.kind, {ERROR}.textContent]")

    with (
        ViewerServer(root) as server,
        ViewerServer(root, cors=False, page=False) as closed,
        ViewerServer(root, cors=True, page=False) as open_,
        ViewerServer(damaged) as spoiled,
        ViewerServer(tmp_path / "web") as web,
    ):
        kind, text = error_of(browser.open(server.url(f"{server.store_url}/Nothing/1.zarr")))
        assert kind == "missing" and "Nothing/1.zarr" in text and "was found" in text
        kind, text = error_of(browser.open(server.url(f"{closed.store_url}/Pong/1.zarr")))
        assert kind == "cors" and "CORS" in text and closed.origin in text
        kind, text = error_of(browser.open(web.url(f"{web.store_url}/page")))
        assert kind == "not-zarr" and "is not Zarr metadata" in text
        kind, text = error_of(browser.open(spoiled.url(f"{spoiled.store_url}/1.zarr")))
        assert kind == "damaged" and "fails its crc32c check" in text and "rows 0-15" in text

        # from file://: a host that allows any origin is read, one that does not is refused
        page_file = page_path().as_uri()
        page = browser.open(f"{page_file}#store={open_.store_url}/Pong/1.zarr&episode=1&step=2")
        assert settle(page) == "ready"
        assert shown(page)["frameSha256"] == sha(ds.episode(1)["observation"].numpy()[2])
        kind, text = error_of(browser.open(f"{page_file}#store={closed.store_url}/Pong/1.zarr"))
        assert kind == "cors" and "a file:// page" in text

    with HubEmulator({"org/atari": root}, refuse_every=1, cors=True) as hub:
        resolve = f"{hub.endpoint}/datasets/org/atari/resolve/main"
        with ViewerServer() as server:
            kind, text = error_of(browser.open(server.url(f"{resolve}/Pong/1.zarr")))
        assert kind == "rate-limit" and "429" in text and "retry after 1 s" in text


@needs_chromium
@pytest.mark.slow
def test_a_root_on_the_hub_lists_its_runs_and_plays_each_kind(browser, root):
    """A Hub dataset's ``resolve`` URL of a root: the page lists the catalog's runs, and
    shows a step of each source kind's store as the reader has it (large files reach it
    through the Hub's redirect to its CDN)."""
    catalog = json.loads((root / "catalog.json").read_text())
    with (
        HubEmulator({"org/atari": root}, cors=True, redirect=True) as hub,
        ViewerServer() as server,
    ):
        resolve = f"{hub.endpoint}/datasets/org/atari/resolve/main"
        page = browser.open(server.url(resolve))
        assert settle(page) == "ready"
        listed = page.evaluate(
            "Array.from(document.querySelectorAll('#run-table tbody tr'), tr => tr.dataset.path)"
        )
        assert sorted(listed) == sorted(e["path"] for e in catalog["stores"])
        for path in STORES.values():
            ds = AtariZarrDataset(str(root / path))
            episode = len(ds.episode_table) - 1
            step = int(ds.episode_table["length"][episode]) - 1
            page.evaluate(f"document.querySelector('#run-table tr[data-path=\"{path}\"]').click()")
            page.wait_for(f"{FRAME}.dataset.row === '0' && {STATE} === 'ready'", SETTLE)
            same_table(episode_rows(page), ds.episode_table)
            row = int(ds.episode_table["first_row"][episode]) + step
            page.evaluate(
                f"location.hash = 'store={resolve}&path={path}&episode={episode}&step={step}'"
            )
            page.wait_for(f"{FRAME}.dataset.row === '{row}' && {STATE} === 'ready'", SETTLE)
            want = ds.episode(episode)["observation"].numpy()[step]
            assert shown(page)["frameSha256"] == sha(want)
        assert any(p.startswith("/cdn/") for _, p, _ in hub.log)  # the redirect was taken
        # the addresses of buckets and of the Hub, as their hosts serve them over https
        spelled = page.evaluate(
            "['gs://b/r/Pong/1.zarr', 's3://b/r', 'hf://datasets/org/atari@v1/Pong/1.zarr',"
            " 'https://h/r/'].map(atariZarrViewer.httpUrl)"
        )
        assert spelled == [
            "https://storage.googleapis.com/b/r/Pong/1.zarr",
            "https://b.s3.amazonaws.com/r",
            "https://huggingface.co/datasets/org/atari/resolve/v1/Pong/1.zarr",
            "https://h/r",
        ]


def test_the_server_answers_ranges_and_nothing_outside_what_it_serves(root):
    zarr_json = root / STORES["dqn-replay"] / "zarr.json"
    data = zarr_json.read_bytes()
    with ViewerServer(root / STORES["dqn-replay"]) as server:

        def get(path: str, **headers: str) -> tuple[int, bytes]:
            request = urllib.request.Request(server.origin + path, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    return answer.status, answer.read()
            except urllib.error.HTTPError as err:
                return err.code, b""

        assert get("/store/zarr.json") == (200, data)
        assert get("/store/zarr.json", Range="bytes=2-9") == (206, data[2:10])
        assert get("/store/zarr.json", Range="bytes=-5") == (206, data[-5:])
        assert get("/store/zarr.json", Range=f"bytes={len(data)}-")[0] == 416
        assert get("/index.html")[1] == page_path().read_bytes()
        for outside in ("/store/../../catalog.json", "/store/%2e%2e/catalog.json", "/x/y.js"):
            assert get(outside)[0] == 404
        assert [status for *_, status in server.log][-3:] == [404, 404, 404]


def test_the_committed_bundle_is_built_from_the_sources():
    """``atari_zarr/viewer`` holds what ``scripts/viewer.sh`` builds from ``viewer/``: its
    page, and a script whose first line records the sha256 of the sources it was built
    from (the digest of ``viewer/build.mjs``). Run ``scripts/viewer.sh`` after a change."""
    sources = REPO / "viewer"
    digest = hashlib.sha256()
    names = sorted([f"src/{p.name}" for p in (sources / "src").iterdir()] + ["package-lock.json"])
    for name in names:
        digest.update(f"{name}\n".encode())
        digest.update((sources / name).read_bytes())
    built = page_path().parent
    header = (built / "viewer.js").read_text().split("\n", 1)[0]
    assert f"sources sha256 {digest.hexdigest()}" in header, "run scripts/viewer.sh"
    assert (built / "index.html").read_bytes() == (sources / "src" / "index.html").read_bytes()
    assert json.loads((sources / "package.json").read_text())["devDependencies"].keys() >= {
        "esbuild",
        "numcodecs",
    }


def _raw_get(origin: str, target: str, **headers: str) -> bytes:
    """The status line the server answers to ``GET target`` sent as is (bytes no client
    library would send: a NUL, a path longer than a file name may be); b"" for none."""
    host, port = origin.removeprefix("http://").split(":")
    lines = [f"GET {target} HTTP/1.1", "Host: x", "Connection: close"]
    lines += [f"{key}: {value}" for key, value in headers.items()]
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


def test_the_server_answers_paths_no_file_may_have(root, tmp_path, capfd):
    """A path with a NUL, one longer than a file name may be, or a range whose numbers
    run past any file get an answer (not found, or the whole file), never a dropped
    connection and a traceback; a link in the store to a file outside it is not followed."""
    store = tmp_path / "1.zarr"
    shutil.copytree(root / STORES["dqn-replay"], store)
    (tmp_path / "secret.txt").write_text("outside the store")
    (store / "link").symlink_to(tmp_path / "secret.txt")
    (store / "folder").symlink_to(tmp_path)
    with ViewerServer(store) as server:
        for outside in ("/store/link", "/store/folder/secret.txt", "/store/%2Flink"):
            assert _raw_get(server.origin, outside) == b"HTTP/1.1 404 Not Found", outside
        assert _raw_get(server.origin, "/store/zarr.json%00.txt") == b"HTTP/1.1 404 Not Found"
        assert _raw_get(server.origin, "/%00") == b"HTTP/1.1 404 Not Found"
        assert _raw_get(server.origin, "/store/" + "a" * 5000) == b"HTTP/1.1 404 Not Found"
        huge = f"bytes={'9' * 5000}-"
        assert _raw_get(server.origin, "/store/zarr.json", Range=huge) == b"HTTP/1.1 200 OK"
    assert "Traceback" not in capfd.readouterr().err


def test_view_refuses_what_it_cannot_serve_in_one_line(root, tmp_path):
    """``view`` on a file, on a URL with credentials or a query (no browser sends them with
    each file's request; they are not echoed), on a port out of range or one in use: an
    ``AtariZarrError`` that says what to do, not a traceback of the socket."""
    (tmp_path / "notes.txt").write_text("not a store")
    with pytest.raises(StoreFormatError, match=r"notes.txt is a file: expected a store"):
        view(str(tmp_path / "notes.txt"), browser=False)
    for url in ("https://alice:hunter2@example.org/Pong/1.zarr", "https://h/1.zarr?sig=hunter2"):
        with pytest.raises(InvalidArgumentError) as caught:
            view(url, browser=False, print_url=pytest.fail)
        assert "hunter2" not in str(caught.value) and "Make the store public" in str(caught.value)
    with pytest.raises(InvalidArgumentError, match=r"port 70000: expected a port from 0 to"):
        view(str(root), port=70000, browser=False)
    with ViewerServer(root) as taken:
        port = int(taken.origin.rsplit(":", 1)[1])
        with pytest.raises(InvalidArgumentError, match=rf"127.0.0.1:{port} is in use"):
            view(str(root), port=port, browser=False, print_url=pytest.fail)


@needs_chromium
@pytest.mark.slow
def test_the_page_takes_its_address_and_the_catalog_as_text_never_as_markup(
    browser, root, tmp_path
):
    """What the page is given is input: a catalog's or a store's names with markup in them
    are listed as text (no script runs); a catalog entry without a path, a URL with
    credentials or a query, one of no store scheme, and an episode or step that is not a
    number each get their message, which shows no credential (nor does the page)."""
    evil = '<img src=x onerror="window.pwned=1">'
    hostile = tmp_path / "hostile"
    shutil.copytree(root / STORES["dqn-replay"], hostile / "Pong" / "1.zarr")
    group = hostile / "Pong" / "1.zarr" / "zarr.json"
    meta = json.loads(group.read_text())
    meta["attributes"]["atari_zarr"]["game"] = evil
    group.write_text(json.dumps(meta))
    entry = {"path": "Pong/1.zarr", "game": evil, "run": evil, "kind": evil, "transitions": evil}
    (hostile / "catalog.json").write_text(json.dumps({"format": 1, "stores": [entry]}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "catalog.json").write_text(json.dumps({"stores": [{"game": "x"}]}))

    def opened(page: Page) -> dict:
        settle(page)
        return page.evaluate(
            "({state: document.body.dataset.state, kind: document.getElementById('error')"
            ".dataset.kind || null, error: document.getElementById('error').textContent,"
            " text: document.body.innerText, input: document.getElementById('store-url').value,"
            " images: document.querySelectorAll('img').length, pwned: window.pwned || 0})"
        )

    with ViewerServer(hostile) as server, ViewerServer(tmp_path / "broken") as broken:
        got = opened(browser.open(server.url()))
        assert got["state"] == "ready" and got["kind"] is None, got
        assert f"{evil} / {evil}" in got["text"] and got["images"] == 0
        got = opened(browser.open(server.url(path="Pong/1.zarr", episode=0, step=0)))
        assert got["state"] == "ready" and f"{evil} run" in got["text"] and got["images"] == 0
        assert got["pwned"] == 0  # no element was made of the names: no handler of theirs

        got = opened(browser.open(broken.url()))
        assert got["kind"] == "not-zarr" and 'found store 0: {"game":"x"}' in got["error"]
        for store in (
            server.store_url.replace("http://", "http://alice:hunter2@"),
            f"{server.store_url}?X-Goog-Signature=hunter2",
        ):
            got = opened(browser.open(server.url(store)))
            assert got["kind"] == "argument" and "Make the store public" in got["error"], got
            assert "hunter2" not in got["text"] + got["input"], got
        got = opened(browser.open(server.url("javascript:window.pwned=1")))
        assert got["kind"] == "argument" and "expected https://" in got["error"], got
        for hash_, said in (("&episode=abc", "episode=abc is not"), ("&step=", "step= is not")):
            page = browser.open(server.url() + "&path=Pong/1.zarr" + hash_)
            got = opened(page)
            assert got["kind"] == "argument" and said in got["error"], got


@needs_chromium
@pytest.mark.slow
def test_the_page_keeps_only_the_chunks_it_shows_lately(browser, root):
    """Shown one after another, every episode's frames pass through the page; it keeps
    the chunks it used last (``cachedChunks``, fewer than the store's), not all it has
    shown, and reads again, byte for byte, one it let go."""
    path = STORES["dqn-replay"]
    ds = AtariZarrDataset(str(root / path))
    table = ds.episode_table
    kept = "atariZarrViewer.view.store.arrays.observation.chunks.size"
    with ViewerServer(root / path) as server:
        page = browser.open(server.url(episode=0, step=0))
        assert settle(page) == "ready"
        limit = page.evaluate("atariZarrViewer.cachedChunks || 16")
        assert limit < math.ceil(len(ds) / 16)  # the store has more chunks of frames
        for episode in range(len(table)):
            last = int(table["first_row"][episode] + table["length"][episode] - 1)
            page.evaluate(f"document.querySelector('tr[data-episode=\"{episode}\"]').click()")
            page.wait_for(f"{FRAME}.dataset.episode === '{episode}' && {STATE} === 'ready'", SETTLE)
            page.evaluate(
                "(() => { const s = document.getElementById('seek'); s.value = s.max;"
                " s.dispatchEvent(new Event('input')); })()"
            )
            page.wait_for(f"{FRAME}.dataset.row === '{last}' && {STATE} === 'ready'", SETTLE)
            assert page.evaluate(kept) <= limit
        page.evaluate("document.querySelector('tr[data-episode=\"0\"]').click()")
        page.wait_for(f"{FRAME}.dataset.row === '0' && {STATE} === 'ready'", SETTLE)
        assert shown(page)["frameSha256"] == sha(ds.episode(0)["observation"].numpy()[0])
