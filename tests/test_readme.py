"""The README's quick start is exactly what the scripts and CI run."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

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
    assert "bash scripts/test.sh" in ci
    # the demo's pictures, as the README names them
    assert "atari-zarr-demo/frames.png" in README and "atari-zarr-demo/returns.png" in README


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
    assert any(dep.startswith("fake-gcs-server") for dep in extras["notebook"])
