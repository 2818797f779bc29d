"""The wheel holds the product, and a fresh venv with it runs the TorchRL drop-in's call.

``python -m build`` makes the wheel from this checkout's sources (no isolation: nothing is
fetched).
It is installed with ``[torchrl]``, the extra the migration guide names, into a new venv
from the wheelhouse ``scripts/setup.sh test`` filled (``.wheelhouse``: the wheels of the
declared dependencies, fetched at set-up), with ``--no-index``: only what the wheel
declares is installed, and the test talks to nothing but loopback. The venv then runs
the README's call, ``AtariDQNExperienceReplay("Pong/4", batch_size=...)``, against RL
Unplugged's public layout on fake-gcs-server, as a first use on a new machine does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WHEELHOUSE = REPO / ".wheelhouse"
#: what only the test kit has: servers, proxies, fault injectors and the browser driver
KIT_WORDS = ("FakeGCSServer", "CountingProxy", "MotoS3Server", "LocalStore.set =", "DevTools")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # from a copy of what the wheel is made of: a build directory left in the checkout
    # by an older build would add its files to the wheel
    tree = tmp_path_factory.mktemp("checkout")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, tree / name)
    shutil.copytree(
        REPO / "src",
        tree / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so", "*.pyd"),
    )
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)],
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    [built] = out.glob("atari_zarr-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_holds_the_product_and_no_test_kit(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        sources = {n: zf.read(n).decode() for n in names if n.endswith(".py")}
    packages = {n.split("/")[0] for n in names if not n.endswith(".dist-info/")}
    assert {p for p in packages if not p.endswith(".dist-info")} == {"atari_zarr"}, packages
    assert "atari_zarr/read/dataset.py" in sources and "atari_zarr/torchrl.py" in sources
    # the compiled chunk loop, built for every Python from 3.11 (the stable ABI)
    assert [n for n in names if n.startswith("atari_zarr/storage/_chunk_loop.")], names
    assert "-cp311-abi3-" in wheel.name, wheel.name
    # the episode viewer: its page and bundled script, the package data
    assert {"atari_zarr/viewer/index.html", "atari_zarr/viewer/viewer.js"} <= set(names)
    assert not [n for n in names if "/testing/" in n or "testkit" in n]
    found = [f"{n}: {w}" for n, text in sources.items() for w in KIT_WORDS if w in text]
    assert not found, found


DROP_IN = """
import sys
from atari_zarr.torchrl import AtariZarrExperienceReplay as AtariDQNExperienceReplay

dataset = AtariDQNExperienceReplay("Pong/4", batch_size=32)
sample = dataset.sample()
assert sample.shape == (32,), sample.shape
assert sample["observation"].shape[-2:] == (84, 84), sample["observation"].shape
assert sample.get_non_tensor("metadata")["dataset_id"] == "Pong/4"
print("drop-in", sample.shape[0], sys.prefix)
from atari_zarr.storage import blosc  # the base install decodes with c-blosc2
assert blosc.blosc_decoder_name() == "blosc2", blosc.blosc_decoder_name()
assert blosc.libblosc2_decoder() is not None  # and off the GIL beside a loop
from atari_zarr.storage.chunk_loop import chunk_loop  # the wheel's compiled loop
assert chunk_loop() is not None
"""


@pytest.mark.slow
def test_a_fresh_venv_with_the_wheel_runs_the_torchrl_drop_in(
    wheel: Path, rlu_public, tmp_path: Path
) -> None:
    if not any(WHEELHOUSE.glob("torch-*.whl")):
        pytest.fail(
            f"{WHEELHOUSE}: no wheels of the dependencies; expected the wheelhouse that "
            "`bash scripts/setup.sh test` fills. Run it, then the tests again."
        )
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    quiet = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip = [str(python), "-m", "pip", "install", "--quiet", "--no-index"]
    install = subprocess.run(
        [*pip, "--find-links", str(WHEELHOUSE), f"{wheel}[torchrl]"],
        env=quiet,
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        env=quiet,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "atari-zarr-testkit" not in listed and "atari_zarr_testkit" not in listed
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "STORAGE_EMULATOR_HOST": rlu_public.proxy.endpoint_url,
        "ATARI_ZARR_HOME": str(tmp_path / "home"),
        # the emulator has no gRPC control plane for gcsfs to probe (the harness only)
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "OMP_NUM_THREADS": "1",
    }
    run = subprocess.run(
        [str(python), "-c", DROP_IN],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"drop-in 32 {env_dir}" in run.stdout, run.stdout
    assert (tmp_path / "home").exists()
