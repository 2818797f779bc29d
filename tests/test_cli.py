"""The command line, through the installed entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import zarr
from atari_zarr_testkit.gcs import FakeGCSServer

from atari_zarr import AtariZarrDataset
from atari_zarr.cli import main
from atari_zarr.layout import FINAL_OBSERVATION, UNCLIPPED_REWARD, create_store
from atari_zarr.storage.remote import open_zarr_store


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "atari_zarr", *args], capture_output=True, text=True, timeout=300
    )


def test_convert_then_info(pong_run, source_root, dest_root):
    res = run_cli("convert", str(source_root), str(dest_root), "--no-progress")
    assert res.returncode == 0, res.stderr
    assert "Pong/1:" in res.stdout and "transitions" in res.stdout
    store = dest_root / "Pong" / "1.zarr"
    res = run_cli("info", str(store))
    assert res.returncode == 0, res.stderr
    assert "transitions" in res.stdout and "complete" in res.stdout
    res = run_cli("info", str(store), "--json")
    info = json.loads(res.stdout)
    assert info["transitions"] == len(pong_run.truth())


def test_errors_are_one_line_with_exit_code(tmp_path):
    res = run_cli("convert", str(tmp_path / "missing"), str(tmp_path / "out"))
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    assert res.stderr.startswith("atari-zarr convert: error: ")
    assert "missing does not exist" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_existing_store_and_bad_options(pong_run, source_root, dest_root, capsys):
    assert main(["convert", str(source_root), str(dest_root), "-q"]) == 0
    assert main(["convert", str(source_root), str(dest_root), "-q"]) == 1
    assert "Pass --overwrite" in capsys.readouterr().err
    assert main(["convert", str(source_root), str(dest_root), "-q", "--overwrite"]) == 0
    assert main(["convert", str(source_root), str(dest_root), "-q", "--checkpoints", "x"]) == 1
    assert "not a suffix or a range" in capsys.readouterr().err
    assert main(["convert", str(source_root), str(dest_root), "-q", "-s", "novalue"]) == 1
    assert "is not KEY=VALUE" in capsys.readouterr().err
    assert main(["convert", str(source_root), str(dest_root), "--games", "../x"]) == 1
    assert "is not a plain name" in capsys.readouterr().err
    # -v after the verb, as -q: the same as before it
    assert main(["ls", str(dest_root), "-v"]) == 0 and main(["-v", "ls", str(dest_root)]) == 0
    assert "Pong/1" in capsys.readouterr().out
    # an order for a fraction nobody asked for is not ignored silently
    for verb in (["convert", str(source_root), str(dest_root / "f")], ["pull", "Pong/1"]):
        assert main([*verb, "-q", "--fraction-order", "random"]) == 1
        err = capsys.readouterr().err
        assert "--fraction-order random orders the episodes --fraction takes" in err
        assert len(err.strip().splitlines()) == 1


def test_usage_errors_exit_2():
    res = run_cli("convert")
    assert res.returncode == 2
    assert "usage:" in res.stderr
    res = run_cli("--help")
    assert res.returncode == 0
    for verb in ("convert", "info", "demo", "ls"):
        assert verb in res.stdout


def _one_line_error(res: subprocess.CompletedProcess, verb: str) -> str:
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"atari-zarr {verb}: error: ")
    return lines[0]


def _incomplete_store(url: str, rows: int = 10) -> None:
    """A store whose writer stopped before the completion marker (as after a crash)."""
    store = open_zarr_store(url, None, read_only=False)
    create_store(
        store,
        rows,
        {
            "kind": "dqn-replay",
            "game": "Pong",
            "run": "2",
            "command": "atari-zarr convert SRC DEST --runs 2",
        },
    )


def test_info_errors_name_the_store(tmp_path):
    missing = tmp_path / "Pong" / "9.zarr"
    line = _one_line_error(run_cli("info", str(missing)), "info")
    assert f"{missing} does not exist" in line and "atari-zarr ls" in line

    (tmp_path / "plain").mkdir()
    line = _one_line_error(run_cli("info", str(tmp_path / "plain")), "info")
    assert "exists but is not a Zarr store" in line and "found none" in line

    zarr.open_group(str(tmp_path / "other.zarr"), mode="w", attributes={"x": 1})
    line = _one_line_error(run_cli("info", str(tmp_path / "other.zarr")), "info")
    assert "not an atari_zarr store" in line and "['x']" in line

    line = _one_line_error(run_cli("info", str(tmp_path), "-s", "token"), "info")
    assert "'token' is not KEY=VALUE" in line


def test_info_shows_an_incomplete_store(tmp_path):
    _incomplete_store(str(tmp_path / "Pong" / "2.zarr"))
    res = run_cli("info", str(tmp_path / "Pong" / "2.zarr"))
    assert res.returncode == 0, res.stderr
    assert "INCOMPLETE: atari-zarr convert SRC DEST --runs 2" in res.stdout
    assert "transitions  10" in res.stdout


def test_ls_local(pong_run, source_root, dest_root):
    assert main(["-q", "convert", str(source_root), str(dest_root)]) == 0
    _incomplete_store(str(dest_root / "Pong" / "2.zarr"), rows=7)
    (dest_root / "Pong" / "3.zarr").mkdir()  # a crash before anything was written
    (dest_root / "notes").mkdir()
    n = len(pong_run.truth())

    res = run_cli("ls", str(dest_root))
    assert res.returncode == 0, res.stderr
    header, *lines = res.stdout.strip().splitlines()
    assert header.split() == ["STORE", "TRANSITIONS", "EPISODES", "SIZE", "STATUS"]
    assert len(lines) == 3
    assert lines[0].startswith(str(dest_root / "Pong" / "1.zarr"))
    assert f"{n:,}" in lines[0] and lines[0].endswith("complete")
    assert lines[1].split()[1] == "7" and lines[1].endswith("incomplete")
    assert lines[2].endswith("not a store")

    res = run_cli("ls", str(dest_root), "--json", "--no-size")
    rows = json.loads(res.stdout)
    assert [(r["run"], r["status"], r["transitions"]) for r in rows] == [
        ("1", "complete", n),
        ("2", "incomplete", 7),
        ("3", "not a store", None),
    ]
    assert all(r["stored_bytes"] is None for r in rows)

    # -q after the verb or before it: only the URLs
    for args in (("ls", str(dest_root), "-q"), ("-q", "ls", str(dest_root))):
        res = run_cli(*args)
        assert res.stdout.split() == [r["url"] for r in rows]

    # a store itself, and an empty directory
    res = run_cli("ls", str(dest_root / "Pong" / "1.zarr"), "-q")
    assert res.stdout.split() == [str(dest_root / "Pong" / "1.zarr")]
    res = run_cli("ls", str(dest_root / "notes"))
    assert res.returncode == 0 and res.stdout.strip() == "no stores found"

    line = _one_line_error(run_cli("ls", str(dest_root / "missing")), "ls")
    assert "missing does not exist" in line


def test_ls_remote(pong_run, source_root):
    with FakeGCSServer() as server:
        server.create_bucket("atari")
        opts = [f"--storage-option={k}={v}" for k, v in server.storage_options().items()]
        res = run_cli("convert", str(source_root), "gs://atari/stores", "-q", *opts)
        assert res.returncode == 0, res.stderr
        res = run_cli("ls", "gs://atari", "--json", *opts)
        assert res.returncode == 0, res.stderr
        [row] = json.loads(res.stdout)
        assert row["url"] == "gs://atari/stores/Pong/1.zarr"
        assert row["status"] == "complete" and row["transitions"] == len(pong_run.truth())
        assert row["stored_bytes"] > 0
        line = _one_line_error(run_cli("info", "gs://atari/stores/Pong/7.zarr", *opts), "info")
        assert "gs://atari/stores/Pong/7.zarr does not exist" in line


def _run_blocking(module: str, *args: str) -> subprocess.CompletedProcess:
    """Run the CLI in a Python where importing ``module`` fails, as when it is not installed."""
    code = (
        f"import sys; sys.modules[{module!r}] = None; "
        f"from atari_zarr.cli import main; sys.exit(main({list(args)!r}))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_missing_optional_dependency_prints_install_hint(tmp_path):
    line = _one_line_error(_run_blocking("matplotlib", "demo", str(tmp_path / "d")), "demo")
    assert "pip install 'atari-zarr[plot]'" in line
    line = _one_line_error(_run_blocking("ale_py", "demo", str(tmp_path / "d")), "demo")
    assert "pip install 'atari-zarr[collect]'" in line
    assert not (tmp_path / "d" / "source").exists()  # failed before writing anything


@pytest.mark.slow
def test_demo_end_to_end(tmp_path):
    from matplotlib.image import imread

    dest = tmp_path / "demo"
    res = run_cli("demo", str(dest), "--steps", "1500", "--no-progress")
    assert res.returncode == 0, res.stderr
    for name in ("frames.png", "returns.png"):
        assert str(dest / name) in res.stdout
        picture = imread(dest / name)
        assert picture.ndim == 3 and picture.shape[0] > 300 and picture.std() > 0.05
    store = dest / "stores" / "Breakout" / "1.zarr"
    ds = AtariZarrDataset(str(store))
    assert len(ds) == 1500  # every recorded step, once
    assert ds.metadata["conversion"]["capacity"] == 1000
    assert len(ds.metadata["conversion"]["checkpoints"]) >= 2  # wrapped, several logs
    frames = ds.read_frames(np.arange(0, 1500, 100))
    assert frames.std() > 10  # real screens, not the fixtures' flat frames
    assert set(np.unique(ds[:]["action"].numpy())) <= {0, 1, 2, 3}  # Breakout's minimal set
    info = json.loads(run_cli("info", str(store), "--json").stdout)
    assert info["episodes"] == len(ds.metadata["episodes"]["length"]) >= 2
    assert sum(ds.metadata["episodes"]["length"]) == 1500


@pytest.mark.slow
def test_demo_of_rl_unplugged_end_to_end(tmp_path):
    from matplotlib.image import imread

    dest = tmp_path / "demo"
    res = run_cli("demo", str(dest), "--source-kind", "rl-unplugged", "--shards", "3")
    assert res.returncode == 0, res.stderr
    assert "into RL Unplugged shards run_1-xxxxx-of-00003" in res.stdout
    assert "shard 1 left out as a gap" in res.stdout and "(rl-unplugged, format v1)" in res.stdout
    for name in ("frames.png", "returns.png"):
        assert str(dest / name) in res.stdout
        picture = imread(dest / name)
        assert picture.ndim == 3 and picture.shape[0] > 300 and picture.std() > 0.05
    shards = sorted(p.name for p in (dest / "source" / "Asterix").iterdir())
    assert shards == ["run_1-00000-of-00003", "run_1-00002-of-00003"]
    ds = AtariZarrDataset(str(dest / "stores" / "Asterix" / "1.zarr"))
    meta = ds.metadata
    assert meta["kind"] == "rl-unplugged" and meta["source"]["shards_missing"] == [1]
    assert len(ds) == sum(meta["episodes"]["length"]) > 100
    assert ds.read_frames(np.arange(0, len(ds), 50)).std() > 10  # real screens
    group = zarr.open_group(str(dest / "stores" / "Asterix" / "1.zarr"), mode="r")
    final = np.asarray(group[FINAL_OBSERVATION][:])
    ended = np.asarray(meta["episodes"]["terminated"], bool)
    assert len(final) == len(ended) and ended.any() and final[ended].std() > 10
    unclipped = np.asarray(group[UNCLIPPED_REWARD][:])
    assert unclipped.max() == 50.0 and float(ds[:]["next", "reward"].max()) == 1.0  # Asterix


def test_demo_quiet_prints_nothing(tmp_path):
    res = run_cli("demo", str(tmp_path / "d"), "--steps", "300", "--capacity", "100", "-q")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "" and res.stderr == ""  # no progress bars, no emulator banner
    assert (tmp_path / "d" / "frames.png").stat().st_size > 0
    res = run_cli("ls", str(tmp_path / "d"), "--json")
    [row] = json.loads(res.stdout)
    assert (row["game"], row["transitions"], row["status"]) == ("Breakout", 300, "complete")


def test_collect_takes_the_env_ids_collect_takes(tmp_path):
    """One parser of env ids: what `collect()` accepts, `atari-zarr collect --env` accepts."""
    dest = tmp_path / "pong.zarr"
    res = run_cli(
        "collect", "--env", "PongNoFrameskip-v4", "--steps", "20", "--seed", "1", "-q", str(dest)
    )
    assert res.returncode == 0, res.stderr
    ds = AtariZarrDataset(str(dest))
    assert len(ds) == 20 and ds.metadata["game"] == "Pong"
    assert ds.metadata["env"]["env_id"] == "ALE/Pong-v5"  # DQN Replay's settings, whatever the id
    assert ds.metadata["command"] == (
        f"atari-zarr collect {dest} --env PongNoFrameskip-v4 --steps 20 --seed 1 --overwrite"
    )


def test_collect_with_a_bad_env_id_is_one_line(tmp_path):
    dest = tmp_path / "x.zarr"
    line = _one_line_error(
        run_cli("collect", "--env", "ALE/NotAGame-v5", "--steps", "20", str(dest)), "collect"
    )
    assert "'ALE/NotAGame-v5' is not an Atari game or env id" in line
    assert (
        "expected a game such as 'Pong'" in line and "https://ale.farama.org/environments/" in line
    )
    assert not dest.exists()  # refused before writing anything


def test_unwritable_destination_is_one_line(pong_run, source_root, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert main(["convert", str(source_root), str(blocker / "stores"), "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("atari-zarr convert: error: creating ")
    assert "Not a directory" in err and "Choose another destination" in err
    assert len(err.splitlines()) == 1


def test_unknown_protocol_and_missing_backend_are_one_line(capsys, monkeypatch):
    assert main(["ls", "nosuchproto://bucket/x"]) == 1
    err = capsys.readouterr().err.strip()
    assert "the protocol 'nosuchproto' is not known to fsspec" in err
    monkeypatch.setitem(sys.modules, "adlfs", None)  # Azure's back end, never installed here
    assert main(["ls", "abfs://container/x"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("atari-zarr ls: error: abfs://container/x: ")
    assert "pip install adlfs" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_pull_shows_bytes_and_transitions_and_prints_the_line_that_loads_it(
    public_copy, tmp_path, capsys
):
    assert main(["pull", "asterix", "--fraction", "0.0004", "--scheduler", "synchronous"]) == 0
    out, err = capsys.readouterr()
    url = tmp_path / "home" / "subsets" / "fraction-0.0004-played" / "Asterix" / "1.zarr"
    assert f"-> {url}" in out
    assert 'get_atari_transitions("asterix", fraction=0.0004, index=0)' in out
    assert "scan Asterix/1" in err and "MB read" in err and "transitions" in err
    # a whole run: the line printed loads it, from the cache, the network untouched
    assert main(["pull", "Pong/4", "--scheduler", "synchronous", "--no-progress"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == f"Pong/4 -> {tmp_path / 'home' / 'Pong' / '4.zarr'}"
    public_copy.proxy.reset()
    namespace: dict = {}
    exec(out[1].replace("; ", "; dataset = ", 1), namespace)  # the line, as printed
    dataset = namespace["dataset"]
    assert dataset.origin == "cache" and len(dataset) > 0 and public_copy.proxy.requests == 0
    # quiet: the path alone; errors: one line
    assert main(["pull", "Pong/4", "-q"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "home" / "Pong" / "4.zarr")
    assert main(["pull", "Pong/9", "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "runs 1 to 5 of Pong" in err


def test_ls_available_lists_what_pull_can_fetch(public_copy, capsys):
    assert main(["ls", "--available"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["dataset", "shards", "size", "cached"]
    rows = {line.split()[0]: line for line in out[1:-1]}
    assert len(rows) == 230 and "21.00 GiB" in rows["Pong/1"] and " 49 " in rows["Carnival/2"]
    assert out[-1].startswith("230 runs of 46 games")
    assert public_copy.proxy.requests == 0  # TFDS's figures: nothing listed
    assert main(["ls", "--available", "--source-sizes", "--json"]) == 0
    listed = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["Asterix/1"]["source_bytes"] == sum(public_copy.bytes["Asterix/1"].values())
    assert main(["ls"]) == 1
    assert "--available" in capsys.readouterr().err


def test_q_after_any_verb_and_a_closed_pipe_is_no_traceback(pong_store):
    """`info STORE -q` as `-q info STORE` (the reference says either); a reader that
    leaves early (`| head`, `| true`) is not an error with a traceback."""
    from atari_zarr.cli import build_parser

    res = run_cli("info", pong_store.url, "-q")
    assert res.returncode == 0 and res.stdout.strip(), res.stderr
    assert res.stdout == run_cli("-q", "info", pong_store.url).stdout
    parser = build_parser()
    verbs = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    assert all("-q" in p._option_string_actions for p in verbs.values())  # noqa: SLF001
    for args in (["ls", "--available"], ["info", pong_store.url, "--episodes"]):
        pipe = subprocess.run(
            f"{sys.executable} -m atari_zarr {' '.join(args)} | true",
            shell=True,  # noqa: S602 - the pipe is the point; the arguments are ours
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert "Traceback" not in pipe.stderr and "BrokenPipeError" not in pipe.stderr, pipe.stderr


def test_other_libraries_log_only_with_v(pong_store):
    """gcsfs logs each failed round of retries with a traceback: the CLI shows other
    libraries' records only with -v, and its own warnings always."""
    script = (
        "import logging, sys\n"
        "import atari_zarr.cli as cli\n"
        "real = cli._cmd_info\n"
        "def noisy(args):\n"
        "    logging.getLogger('gcsfs').error('a retry round')\n"
        "    logging.getLogger('atari_zarr').warning('our own warning')\n"
        "    return real(args)\n"
        "cli._VERBS = tuple((b, noisy if c is real else c) for b, c in cli._VERBS)\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    runs = {
        flag: subprocess.run(
            [sys.executable, "-c", script, *flag, "info", pong_store.url],
            capture_output=True,
            text=True,
            timeout=300,
        )
        for flag in ((), ("-v",))
    }
    quiet, loud = runs[()], runs[("-v",)]
    assert quiet.returncode == 0, quiet.stderr
    assert "our own warning" in quiet.stderr and "a retry round" not in quiet.stderr
    assert "a retry round" in loud.stderr


def test_ls_available_passes_s_to_the_cache_and_source_options_to_the_source(
    pong_store, capsys
) -> None:
    """`ls --available --home URL -s …` sent ``-s`` to the source, so a cache in a bucket
    was never found: ``-s`` is the cache's, ``--source-storage-option`` the source's."""
    import fsspec

    with FakeGCSServer() as gcs:
        gcs.create_bucket("cache")
        fs = fsspec.filesystem("gs", skip_instance_cache=True, **gcs.storage_options())
        fs.put(pong_store.url, "cache/home/Pong/1.zarr", recursive=True)
        options = [f"-s{k}={v}" for k, v in gcs.storage_options().items()]
        assert main(["ls", "--available", "--home", "gs://cache/home", *options, "--json"]) == 0
    rows = {r["id"]: r["cached"] for r in json.loads(capsys.readouterr().out)}
    assert rows["Pong/1"] is True and rows["Pong/2"] is False


def test_view_serves_the_page_and_the_store_until_stopped(pong_store, tmp_path):
    """``atari-zarr view STORE --no-browser`` prints the page's URL, opened on the store,
    and serves both on loopback (ranges answered) until it is stopped; a store that is
    not there is a one-line error."""
    import shutil
    import signal
    import urllib.request
    from pathlib import Path

    from atari_zarr.explore.viewer import page_path

    command = [sys.executable, "-m", "atari_zarr", "view", pong_store.url, "--no-browser", "-q"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None
            url = process.stdout.readline().strip()
            page, _, where = url.partition("#")
            assert page.startswith("http://127.0.0.1:") and page.endswith("/index.html"), url
            store = where.removeprefix("store=")
            with urllib.request.urlopen(page, timeout=60) as answer:
                assert answer.read() == page_path().read_bytes()
            request = urllib.request.Request(f"{store}/zarr.json", headers={"Range": "bytes=0-9"})
            with urllib.request.urlopen(request, timeout=60) as answer:
                assert answer.status == 206
                assert answer.read() == (Path(pong_store.url) / "zarr.json").read_bytes()[:10]
        finally:
            process.send_signal(signal.SIGINT)
            _, errors = process.communicate(timeout=60)  # a hang guard
    assert process.returncode == 0 and "Traceback" not in errors, errors
    # a root never indexed: its stores are listed for the page, as catalog.json has them
    root = tmp_path / "root"
    shutil.copytree(pong_store.url, root / "Pong" / "1.zarr")
    with subprocess.Popen(
        [*command[:4], str(root), *command[5:]], stdout=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None
            store = process.stdout.readline().strip().partition("#store=")[2]
            with urllib.request.urlopen(f"{store}/catalog.json", timeout=60) as answer:
                listed = json.loads(answer.read())
        finally:
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=60)
    assert [e["path"] for e in listed["stores"]] == ["Pong/1.zarr"]
    assert not (root / "catalog.json").exists()  # nothing is written to the root
    res = run_cli("view", str(tmp_path / "nothing"), "--no-browser")
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1
    assert "nothing does not exist: expected a store" in res.stderr


def test_view_on_a_port_in_use_is_a_one_line_error(pong_store):
    """``atari-zarr view --port P`` where another program listens on P: one line that
    names the port, not the socket's traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = run_cli("view", pong_store.url, "--port", str(port), "--no-browser")
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"127.0.0.1:{port} is in use" in res.stderr


@pytest.mark.parametrize(
    ("flag", "verb"),
    [
        ("--source-storage-option", ["pull", "Pong/1"]),
        ("--storage-option", ["pull", "Pong/1"]),
        ("--reader-option", ["card", "ROOT"]),
    ],
)
def test_a_malformed_option_pair_names_the_option_typed(flag, verb, capsys) -> None:
    """``--source-storage-option =x`` was reported as ``--storage-option '=x'``."""
    assert main([*verb, flag, "=x"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} '=x' is not KEY=VALUE" in err, err
    assert f"e.g. {flag} token=anon" in err, err


def test_paths_with_control_characters_are_printed_escaped(pong_store, tmp_path, capsys) -> None:
    """A newline in a path (``--home``, ROOT) was printed raw, splitting the line, and
    an escape sequence reached the terminal: the CLI prints them escaped."""
    import shutil

    root = tmp_path / "a\nb\x1b[31m"
    shutil.copytree(pong_store.url, root / "Pong" / "1.zarr")
    assert main(["ls", "-q", "--no-size", str(root)]) == 0
    out = capsys.readouterr().out
    assert out == f"{tmp_path}/a\\nb\\x1b[31m/Pong/1.zarr\n", out
    assert main(["ls", "--no-size", str(root)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and f"{tmp_path}/a\\nb\\x1b[31m/Pong/1.zarr" in out, out
    assert main(["ls", str(tmp_path / "gone\x1b[2J\u202e")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "\u202e" not in err, err
    assert "gone\\x1b[2J\\u202e does not exist" in err, err
