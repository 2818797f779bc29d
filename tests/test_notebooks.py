"""The notebooks: committed without outputs, and executed end to end on demo data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from atari_zarr_testkit.browser import HeadlessChromium, find_chromium

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS] == ["explore.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name} has outputs; strip them before committing "
                f"(jupyter nbconvert --clear-output --inplace {path})"
            )


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    from atari_zarr.demo import run_demo

    return run_demo(
        str(tmp_path_factory.mktemp("demo")), steps=2000, progress=False, echo=False
    ).store


@pytest.fixture
def this_python_kernel(tmp_path, monkeypatch):
    """A kernelspec that runs this interpreter, so a clean venv needs no `ipykernel install`."""
    spec = tmp_path / "jupyter" / "kernels" / "atari-zarr-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "atari-zarr tests",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "atari-zarr-test"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, demo_store, this_python_kernel, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("ATARI_ZARR_STORE", demo_store)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb,
        kernel_name=this_python_kernel,
        timeout=300,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    warnings = [
        o.text
        for o in outputs
        if o.output_type == "stream" and o.name == "stderr" and "Warning" in o.text
    ]
    assert not warnings, warnings
    pictures = [o for o in outputs if "image/png" in o.get("data", {})]
    # grid, strip, histograms, learning curve, actions, a window, stream throughput, brightness
    assert len(pictures) == 8
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "torch.Size([12]) torch.Size([12, 4, 84, 84]) False" in text  # a window of views
    assert "stream, one epoch:" in text
    # the store by its last parts: no directory of the machine that ran it
    assert "store        .../stores/Breakout/1.zarr" in text
    shown = [
        o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
        for o in outputs
    ]
    assert not [t for t in shown if str(Path(demo_store).parents[2]) in t]
    assert not [t for t in shown if "A.L.E" in t or "Powered by Stella" in t]  # ALE's banner
    assert "['Breakout/1'] found with 1 request" in text  # the bucket's catalog
    assert "checkpoint  episodes    mean  median" in text  # the learning curve's table
    # the player, as the notebook shows it, plays in a real browser
    [player_html] = [
        o["data"]["text/html"]
        for o in outputs
        if "atari-zarr-player" in o.get("data", {}).get("text/html", "")
    ]
    if find_chromium() is not None:
        from atari_zarr import AtariZarrDataset
        from tests.explore.test_player import check_player_in_browser

        ds = AtariZarrDataset(demo_store)
        longest = int(ds.episode_table["length"].to_numpy().argmax())
        page = tmp_path / "notebook-player.html"
        page.write_text(f"<!doctype html><html><body>{player_html}</body></html>")
        with HeadlessChromium() as browser:
            check_player_in_browser(
                browser, page, int(ds.episode_table["length"][longest]),
                ds.episode(longest)["observation"].numpy()[0],
            )
    # the remote cell: opening and 8 frames cost far less than the store
    lines = {line.split(":")[0].strip(): line for line in text.splitlines() if "bytes" in line}
    store_bytes, opened, frames = (
        int(lines[key].split(":")[1].split("bytes")[0].replace(",", ""))
        for key in (
            "store in the bucket",
            "open (metadata, step arrays)",
            "8 consecutive transitions",
        )
    )
    assert 0 < frames < store_bytes / 5 and 0 < opened < store_bytes
