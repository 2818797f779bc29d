"""The README's quick start is exactly what the scripts and CI run."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def _quick_start_commands() -> list[str]:
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the Quick start section has no ```bash block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_is_the_two_scripts():
    assert _quick_start_commands() == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    for script in ("demo.sh", "test.sh", "setup.sh"):
        assert (ROOT / "scripts" / script).is_file()


def test_scripts_do_what_the_readme_says():
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    assert "scripts/setup.sh all" in demo and "atari-zarr demo" in demo
    test = (ROOT / "scripts" / "test.sh").read_text()
    assert "scripts/setup.sh test" in test and "pytest" in test
    ci = (ROOT / ".ci" / "run").read_text()
    # CI runs the README's command (the suite without the slow tests), then the slow ones
    commands = [line.split("#", 1)[0].strip() for line in ci.splitlines()]
    assert "bash scripts/test.sh" in commands and "bash scripts/test.sh --slow" in commands
    assert '-m "not slow"' in test and "--slow) select=(-m slow)" in test
    # the demo's pictures, as the README names them
    assert "atari-zarr-demo/frames.png" in README and "atari-zarr-demo/returns.png" in README


def test_the_browser_is_installed_alone_and_the_readme_says_so():
    """The tests' one system package is Debian's chromium, without its ~100 recommends."""
    script = (ROOT / "scripts" / "chromium.sh").read_text()
    installs = [line for line in script.splitlines() if "apt-get install" in line]
    assert installs and all("--no-install-recommends" in line for line in installs), installs
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "chromium" in quick and "--no-install-recommends" in quick
    assert "Nothing is downloaded but the Python packages" not in README


def test_scripts_are_valid_bash():
    for script in [*sorted((ROOT / "scripts").glob("*.sh")), ROOT / ".ci" / "run"]:
        res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, (script, res.stderr)


def test_cli_table_lists_every_verb():
    from atari_zarr.cli import build_parser

    parser = build_parser()
    verbs = next(a for a in parser._actions if a.dest == "command").choices
    table = README.split("## Command line", 1)[1].split("\n## ", 1)[0]
    for verb in verbs:
        assert f"| `{verb}" in table, f"README's command table lacks `{verb}`"


def test_extras_install_what_the_demo_and_notebook_import():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    all_extras = extras["all"][0]
    for needed in ("collect", "plot", "notebook", "cloud"):
        assert needed in all_extras
    # an installed user runs the notebook: no test server is part of its extra
    assert not any(dep.startswith("fake-gcs-server") for dep in extras["notebook"])


def test_the_readme_fits_on_a_few_screens_and_names_the_docs_script():
    assert len(README.splitlines()) <= 250
    assert "bash scripts/docs.sh" in README
    assert (ROOT / "scripts" / "docs.sh").is_file()


#: Every section the README had before the documentation site, and the page holding it now.
MOVED = {
    "What it is": "index.md",
    "Quick start": "getting-started.md",
    "Your loader, working again": "getting-started.md",
    "What the demo does": "getting-started.md",
    "Pull from the public copy": "guides/pull.md",
    "Convert": "guides/convert.md",
    "From RL Unplugged": "guides/convert.md",
    "In parallel, resumable, verifiable": "guides/convert.md",
    "Read": "guides/read.md",
    "Train in epochs, straight from a bucket": "guides/stream.md",
    "Sequences: windows for Decision Transformers and their successors": "guides/windows.md",
    "Migrating from the Decision Transformer: `create_dataset`": "guides/migrate-decision-transformer.md",
    "Record new data": "guides/record.md",
    "Remote stores and hosting": "guides/remote.md",
    "Host a dataset": "guides/remote.md",
    "What the reader and the command line guarantee": "guarantees.md",
    "Migrating from TorchRL: `AtariDQNExperienceReplay`": "guides/migrate-torchrl.md",
    "Without TorchRL: DataLoader, frame stacks, several games": "guides/migrate-torchrl.md",
    "Migrating from d3rlpy: `get_atari`, `get_atari_transitions`": "guides/migrate-d3rlpy.md",
    "Command line": "cli.md",
    "See the data": "guides/see.md",
    "Notebook": "guides/see.md",
    "Benchmarks": "benchmarks/index.md",
    "Conversion": "benchmarks/conversion.md",
    "Conversion from RL Unplugged": "benchmarks/conversion-rlu.md",
    "Random access against TorchRL and Lance": "benchmarks/random.md",
    "Remote reading": "benchmarks/remote.md",
    "Streaming an epoch, and random access over a network": "benchmarks/stream.md",
    "From nothing to a first batch: a pull": "benchmarks/pull.md",
    "Windows for sequence models": "benchmarks/windows.md",
    "`preprocess` of the TorchRL drop-in": "benchmarks/preprocess.md",
    "Development": "development.md",
    "Limitations": "limitations.md",
}


def test_every_section_the_readme_dropped_has_a_page():
    for title, page in MOVED.items():
        text = (ROOT / "docs" / page).read_text()
        assert re.search(rf"^#+ {re.escape(title)}$", text, re.M), (title, page)


def test_every_page_the_readme_links_exists():
    for target in re.findall(r"\]\(([^)#:]+\.(?:md|ipynb))\)", README):
        assert (ROOT / target).is_file(), target


def test_setup_never_asks_pypi_for_torch():
    """scripts/setup.sh got the CPU build of torch only because this machine holds one;
    elsewhere, PyPI's torch is a CUDA build of some 5.8 GB. torch's wheel comes from the
    machine's own wheels (--no-index) or PyTorch's CPU index, never from PyPI; only then
    are its dependencies resolved (torch already there)."""
    script = (ROOT / "scripts" / "setup.sh").read_text()
    joined = script.replace("\\\n", " ")
    fetches = [
        line
        for line in joined.splitlines()
        if "pip install" in line or "pip download" in line
        if "TORCH" in line or "torch==" in line
    ]
    assert fetches
    first = [line for line in fetches if "--no-deps" in line]
    assert first and all(
        "--no-index" in line or '--index-url "$CPU_INDEX"' in line for line in first
    )
    assert "CPU_INDEX=https://download.pytorch.org/whl/cpu" in script
    # each resolution with dependencies comes after the wheel is there
    for line in fetches:
        if "--no-deps" not in line:
            assert joined.index(line) > joined.index(first[0])


def _python_blocks(section: str) -> list[str]:
    text = README.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", text, re.S)


def _unbound_names(code: str) -> tuple[set[str], set[str]]:
    """The names ``code`` uses, and those of them it never binds (imports, assignments)."""
    import ast
    import builtins

    tree = ast.parse(code)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.alias):
            bound.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used, used - bound


def test_the_loader_snippets_use_no_undefined_name():
    """The Decision Transformer's line used names it never defined."""
    _, unbound = _unbound_names("\n".join(_python_blocks("Your loader, working again")))
    assert not unbound, sorted(unbound)


def test_the_read_snippet_imports_collate_batch_from_where_it_is():
    """The Read section named ``collate_fn=collate_batch`` without saying where it is
    imported from: its snippet builds the DataLoader, and imports every name it uses
    from where the package has it."""
    import ast

    [block] = _python_blocks("Read")
    used, unbound = _unbound_names(block)
    assert {"DataLoader", "collate_batch"} <= used and not unbound, sorted(unbound)
    imports = [n for n in ast.parse(block).body if isinstance(n, ast.Import | ast.ImportFrom)]
    namespace: dict = {}
    exec(compile(ast.Module(body=imports, type_ignores=[]), "README.md", "exec"), namespace)
    from atari_zarr.read.batch import collate_batch

    assert namespace["collate_batch"] is collate_batch


@pytest.mark.slow
def test_the_read_snippet_runs_on_what_the_demo_wrote(tmp_path, monkeypatch):
    """The Read section opened ./stores/Pong/1.zarr, which the demo never writes: it runs,
    as written, in the directory the demo ran in."""
    from atari_zarr.demo import run_demo

    run_demo(str(tmp_path / "atari-zarr-demo"), steps=2000, progress=False, echo=False)
    monkeypatch.chdir(tmp_path)
    [block] = _python_blocks("Read")
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert tuple(namespace["batch"]["observation"].shape) == (256, 4, 84, 84)
    assert tuple(next(iter(namespace["loader"]))["observation"].shape) == (256, 4, 84, 84)
