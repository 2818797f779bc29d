"""The floors of docs/architecture.md hold: imports point down, no two modules import each other."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import atari_zarr

ROOT = Path(atari_zarr.__file__).parent

#: Floors from the bottom up; a module may import its own floor's and lower floors' modules.
FLOORS = [
    {
        "errors",
        "redaction",
        "codec_chain",
        "fingerprints",
        "shard_format",
        "npy_format",
        "arguments",
        "resources",
        "place",
        "ale",
        "forks",
        "progress",
        "commands",
        "_version",
    },
    {"storage"},
    # the store format sits above where bytes live: storage/ knows no array name
    {"layout", "episodes", "subsets", "catalog", "opening"},
    {"sources"},
    # seeing the data: frames, curves and cards of opened stores, below every reader
    {"explore"},
    {"conversion", "read", "record"},
    {"pull"},
    {"compat"},
    {"verify", "info", "demo", "torchrl", "grain", "listing", "publish"},
    {"cli", "__main__"},
]
#: The floor of the paths through a store: its packages do not import each other.
PATHS = 5
# what the floors' own lines allow (docs/architecture.md): nothing
ALLOWED: set[tuple[str, str]] = set()


def modules() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports (anywhere in it)."""
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        name = ".".join(parts)
        if not name:
            continue  # the package root
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("atari_zarr.")
            ):
                found.add(node.module.removeprefix("atari_zarr."))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("atari_zarr."):
                        found.add(alias.name.removeprefix("atari_zarr."))
        graph[name] = {m for m in found if m != name}
    return graph


def floor(name: str) -> int:
    top = name.split(".")[0]
    return next(i for i, f in enumerate(FLOORS) if top in f)


def test_imports_point_down_the_floors():
    wrong = []
    for name, deps in modules().items():
        for dep in deps:
            if (name, dep) in ALLOWED:
                continue
            if floor(dep) > floor(name):
                wrong.append(f"{name} (floor {floor(name)}) imports {dep} (floor {floor(dep)})")
            elif (
                floor(dep) == floor(name) == PATHS
                and dep.split(".")[0] != name.split(".")[0]
                and (name, dep) not in ALLOWED
            ):
                wrong.append(f"{name} imports {dep}, another path through a store")
    assert not wrong, wrong


def test_the_package_holds_no_test_kit():
    """The test kit lives with the tests (``tests/kit``): nothing in ``src/`` names it,
    not even a doctest, and no test server, proxy or fault injector is in the package."""
    named = [
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*.py")
        if "import atari_zarr_testkit" in path.read_text()
        or "from atari_zarr_testkit" in path.read_text()
    ]
    assert not named, named
    assert not (ROOT / "testing").exists()
    kit = {"FakeGCSServer", "CountingProxy", "MotoS3Server", "LocalStore.set ="}
    found = [
        f"{path.relative_to(ROOT)}: {word}"
        for path in ROOT.rglob("*.py")
        for word in kit
        if word in path.read_text()
    ]
    assert not found, found


def test_no_import_cycles():
    graph = modules()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if dep not in graph:
                continue
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep] if dep in path else [node, dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_outside_sources_a_kind_is_reached_through_the_registry():
    """Only the registry (and the contract, and the writers the demo plays into) is
    imported from ``sources/`` by the rest of the package: each kind owns its adapter.
    The recorder of RL Unplugged shards writes that kind's format with its encoders."""
    wrong = []
    for name, deps in modules().items():
        if name.startswith("sources"):
            continue
        for dep in deps:
            if name == "record.rl_unplugged" and dep.startswith("sources.rl_unplugged."):
                continue
            if dep.startswith("sources.") and dep not in (
                "sources.registry",
                "sources.kind",
                "sources.dqn_replay.emulator",
            ):
                wrong.append(f"{name} imports {dep}")
    assert not wrong, wrong


def test_the_registry_is_a_list_of_kinds():
    """``sources/registry`` imports each kind's ``kind`` module and nothing else of a kind."""
    deps = modules()["sources.registry"]
    kinds = {d for d in deps if d.startswith(("sources.dqn_replay", "sources.rl_unplugged"))}
    assert kinds == {"sources.dqn_replay.kind", "sources.rl_unplugged.kind"}, kinds


@pytest.mark.parametrize(
    "module", ["atari_zarr", "atari_zarr.storage.paths", "atari_zarr.errors", "atari_zarr.pull"]
)
def test_light_modules_import_no_converter_dask_or_torch(module: str) -> None:
    """The package and its light modules cost their own imports only: the converter,
    dask and torch come when first used (`atari_zarr.convert` still works)."""
    code = (
        f"import sys, {module}\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'torch')\n"
        "               or m.startswith(('atari_zarr.conversion', 'atari_zarr.sources')))\n"
        "print(heavy)\n"
        "import atari_zarr\n"
        "assert callable(atari_zarr.convert) and atari_zarr.ConvertedStore.__name__\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


#: ``read/``'s inner floors as docs/architecture.md draws them, top down: a module imports
#: the modules of the lines below its own, and of its own line those to its right.
READ_LINES = [
    ["mixing", "dataset", "windows", "core"],
    ["stream", "units", "member", "store", "arrays"],
    ["step_axis", "columns", "chunks", "batch"],
    [
        "options",
        "budget",
        "chunk_cache",
        "pool",
        "epoch",
        "items",
        "indexing",
        "mixture",
        "episode_index",
    ],
]


def _read_modules() -> dict[str, set[str]]:
    return {
        name.removeprefix("read."): {d.removeprefix("read.") for d in deps if d.startswith("read.")}
        for name, deps in modules().items()
        if name.startswith("read.")
    }


def test_read_imports_point_down_its_inner_floors():
    """Within ``read/``, every import points down the lines of its picture (or right
    along a line), and every module of ``read/`` is on one of them."""
    place = {m: (row, col) for row, line in enumerate(READ_LINES) for col, m in enumerate(line)}
    graph = _read_modules()
    assert set(graph) == set(place), set(graph) ^ set(place)
    wrong = [
        f"read.{name} imports read.{dep}"
        for name, deps in graph.items()
        for dep in deps
        if not (
            place[dep][0] > place[name][0]
            or (place[dep][0] == place[name][0] and place[dep][1] > place[name][1])
        )
    ]
    assert not wrong, wrong


def test_the_read_picture_and_table_match_the_imports():
    """docs/architecture.md draws ``read/``'s lines as READ_LINES has them, and its table
    lists, for each module of ``read/``, exactly the modules of ``read/`` it imports."""
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    for line in READ_LINES:
        drawn = " ─► ".join(line[:3]) if line[0] != "options" else " ".join(line)
        assert drawn in doc, drawn
    section = doc[doc.index("## `read/`") :]
    graph = _read_modules()
    wrong = []
    for row in section.splitlines():
        m = re.match(r"^\| `(\w+)` \| .* \| (.*) \|$", row)
        if not m or m.group(1) not in graph:
            continue
        listed = set(re.findall(r"`(\w+)`", m.group(2))) & set(graph)
        if listed != graph[m.group(1)]:
            name = m.group(1)
            wrong.append(f"{name}: table {sorted(listed)}, imports {sorted(graph[name])}")
    assert not wrong, wrong


def test_the_drop_ins_open_through_one_door_and_read_through_the_dataset():
    """Every drop-in opens what its loader asks for with ``pull.open_request`` (which
    checks the root's catalog entry, once) and reads the store through the public
    ``AtariZarrDataset``: none resolves on its own or reaches for ``StoreReader``, and no
    module of ``compat/`` for the chunk reader or the engine (a preprocessed group is read
    through ``read.arrays.GroupRows``)."""
    graph = modules()
    for name in ("compat.torchrl", "compat.d3rlpy", "compat.decision_transformer"):
        text = (ROOT / Path(*name.split("."))).with_suffix(".py").read_text()
        assert "open_request(" in text, f"{name} does not open through pull.open_request"
        assert "resolve(" not in text, f"{name} resolves on its own"
    for name in sorted(n for n in graph if n.startswith("compat.")):
        inner = {"read.store", "read.chunks", "storage.engine"} & graph[name]
        assert not inner, f"{name} imports {sorted(inner)}, not a front door"
