"""The end-to-end demo behind ``atari-zarr demo``: real Atari play, converted, read back, plotted.

1. A seeded random policy plays a real ALE game (``make_dqn_env``: DQN Replay's
   preprocessing) and every transition goes through :class:`DopamineLoggedBuffer`,
   which writes the checkpoint files exactly as the dataset has them (circular
   buffer, padding rows, full-buffer logs, a final partial log).
2. :func:`atari_zarr.convert` turns the run into a Zarr v3 store.
3. :class:`AtariZarrDataset` reads it back; ``frames.png`` shows sampled frames with
   their action and reward, ``returns.png`` the episode returns and lengths.

With ``source_kind="rl-unplugged"`` step 1 writes RL Unplugged shards instead
(:func:`record_rlu_run`: GZIP TFRecords of ``tf.train.Example`` episodes with one
PNG per step, a shard missing in the middle), and step 2 converts them with the
same :func:`atari_zarr.convert`: a scan task and a write task per shard.

Needs the ``collect`` extra (ale-py, gymnasium, opencv) for the recording and the
``plot`` extra (matplotlib) for the pictures; ``pip install 'atari-zarr[all]'``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr

from atari_zarr.ale import game_action_names, quiet_ale
from atari_zarr.conversion.converter import convert
from atari_zarr.episodes import episode_table
from atari_zarr.errors import import_optional
from atari_zarr.info import format_info, store_info
from atari_zarr.layout import REWARD, TERMINATED, get_array
from atari_zarr.progress import progress_bar
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.record.rl_unplugged import write_rlu_run
from atari_zarr.sources.dqn_replay.emulator import LOGS_DIR, DopamineLoggedBuffer
from atari_zarr.sources.registry import DQN_REPLAY, RL_UNPLUGGED, get_kind
from atari_zarr.storage.remote import open_zarr_store

__all__ = [
    "DemoResult",
    "RecordedRun",
    "plot_frames",
    "plot_returns",
    "record_rlu_run",
    "record_run",
    "run_demo",
]

log = logging.getLogger("atari_zarr")

#: The game the demo plays by default: short random-policy episodes, so even a
#: few thousand steps hold a dozen of them.
DEFAULT_GAME = "Breakout"
#: The game of the RL Unplugged demo: its random play scores 50 a time, so the
#: clipped rewards (1) and the source's unclipped ones (50) differ.
DEFAULT_RLU_GAME = "Asterix"


@dataclass
class RecordedRun:
    """What :func:`record_run` wrote: where, how much, and the game's action names."""

    url: str
    steps: int
    episodes: int
    checkpoints: int
    action_names: list[str]
    scores: list[float] = field(default_factory=list)  # unclipped game scores per finished episode
    #: RL Unplugged: the run's shard indices written, and its number of shards.
    shards: list[int] = field(default_factory=list)
    num_shards: int = 0
    terminated: int = 0  # episodes that ended in a terminal state (the rest were cut)


def record_run(
    root: str,
    game: str = DEFAULT_GAME,
    run: str = "1",
    *,
    steps: int = 3000,
    capacity: int = 1000,
    seed: int = 0,
    progress: bool = False,
) -> RecordedRun:
    """Play ``game`` with a seeded random policy into DQN Replay checkpoint files.

    The files land in ``{root}/{game}/{run}/replay_logs/``. As in DQN Replay,
    rewards are clipped to [-1, 1], actions are indices into the game's minimal
    action set, and the frame that ends an episode is not stored.

    Parameters
    ----------
    root : str
        Dataset root (local path or fsspec URL).
    game : str
        ALE game name.
    run : str
        Run name.
    steps : int
        Agent steps (transitions) to record.
    capacity : int
        Replay capacity; small values give several checkpoints and wraps (the
        dataset used 1,000,000).
    seed : int
        Seeds the environment, the policy and the buffer's uninitialised memory.
    progress : bool
        Show a tqdm progress bar.

    Returns
    -------
    RecordedRun

    Examples
    --------
    >>> import tempfile
    >>> rec = record_run(tempfile.mkdtemp(), "Pong", steps=120, capacity=50)
    >>> rec.steps, rec.checkpoints, rec.action_names[:2]
    (120, 3, ['NOOP', 'FIRE'])
    """
    from atari_zarr.ale import make_dqn_env

    env = make_dqn_env(game)  # first: fails fast, before writing anything, without ale-py
    rng = np.random.default_rng(seed)
    url = f"{str(root).rstrip('/')}/{game}/{run}"
    buffer = DopamineLoggedBuffer(f"{url}/{LOGS_DIR}", capacity, rng)
    bar = progress_bar(steps, f"play {game}", unit="step", enabled=progress)
    try:
        names = list(env.unwrapped.get_action_meanings())
        frame, _ = env.reset(seed=seed)
        episode, step, score, scores = 0, 0, 0.0, []
        for _ in range(steps):
            action = int(rng.integers(env.action_space.n))
            nxt, reward, terminated, truncated, _ = env.step(action)
            score += float(reward)
            end = bool(terminated or truncated)
            # DQN clips rewards before storing; a time-limit end is stored as terminal.
            buffer.add(frame, action, float(np.clip(reward, -1.0, 1.0)), end, episode, step)
            step += 1
            if end:
                scores.append(score)
                episode, step, score = episode + 1, 0, 0.0
                nxt, _ = env.reset()
            frame = nxt
            bar.update(1)
    finally:
        env.close()
        bar.close()
    buffer.log_final()
    return RecordedRun(
        url=url,
        steps=steps,
        episodes=episode + (1 if step else 0),
        checkpoints=len(buffer.contents),
        action_names=names,
        scores=scores,
    )


def record_rlu_run(
    root: str,
    game: str = DEFAULT_RLU_GAME,
    *,
    shards: int = 5,
    episodes_per_shard: int = 2,
    seed: int = 0,
) -> RecordedRun:
    """Play ``game`` with a seeded random policy into RL Unplugged shards.

    The files land in ``{root}/{game}/run_1-{i:05d}-of-{shards:05d}``, written by
    :func:`atari_zarr.record.rl_unplugged.write_rlu_run`: one GZIP TFRecord per
    present shard, one ``tf.train.Example`` per episode, one PNG per step. In each
    shard every episode but the last plays until the game ends (a terminal
    episode); the last is cut after about 30 steps. The shard in the middle is left
    out, as a gap in the source.

    Parameters
    ----------
    root : str
        Dataset root (a local directory).
    game : str
        ALE game name.
    shards : int
        The run's number of shards (``-of-N``); at least 2.
    episodes_per_shard : int
        Episodes (Examples) per shard.
    seed : int
        Seeds the environment and the policy.

    Returns
    -------
    RecordedRun

    Examples
    --------
    >>> import tempfile
    >>> rec = record_rlu_run(tempfile.mkdtemp(), shards=3, episodes_per_shard=1)
    >>> rec.shards, rec.num_shards, rec.episodes, rec.url.rsplit("/", 1)[-1]
    ([0, 2], 3, 2, 'Asterix')
    """
    if shards < 2:
        raise ValueError(f"shards must be at least 2 (one is left out as a gap), not {shards}")
    names = game_action_names(game)  # first: fails fast, before writing anything, without ale-py
    present = [i for i in range(shards) if i != shards // 2]
    fixture = write_rlu_run(
        root,
        game,
        num_shards=shards,
        present=present,
        episodes_per_shard=episodes_per_shard,
        seed=seed,
    )
    episodes = fixture.episodes
    return RecordedRun(
        url=fixture.game_dir,
        steps=sum(e.real_steps for e in episodes),
        episodes=len(episodes),
        checkpoints=len(present),
        action_names=names,
        scores=[float(e.unclipped_rewards[: e.real_steps].sum()) for e in episodes],
        shards=present,
        num_shards=shards,
        terminated=sum(bool(e.terminal) for e in episodes),
    )


def _pyplot() -> Any:
    matplotlib = import_optional("matplotlib", extra="plot", purpose="the demo's pictures")
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def plot_frames(
    ds: AtariZarrDataset,
    path: str | Path,
    *,
    action_names: list[str] | None = None,
    n: int = 24,
    seed: int = 0,
) -> Path:
    """Save a grid of ``n`` sampled transitions: frame, row, action and reward.

    Parameters
    ----------
    ds : AtariZarrDataset
        The store to sample from.
    path : str or Path
        PNG to write.
    action_names : list of str, optional
        Names of the action indices (``env.unwrapped.get_action_meanings()``).
    n : int
        Frames to show.
    seed : int
        Seeds the sample.

    Returns
    -------
    Path
    """
    plt = _pyplot()
    gen = torch.Generator().manual_seed(seed)
    # A uniform sample rarely holds a reward or an episode end; show a few of each.
    group = zarr.open_group(open_zarr_store(ds.url, ds.storage_options, read_only=True), mode="r")
    rewards = np.asarray(get_array(group, REWARD, ds.url)[:])
    flags = (rewards != 0) | np.asarray(get_array(group, TERMINATED, ds.url)[:])
    notable = torch.from_numpy(np.flatnonzero(flags))
    notable = notable[torch.randperm(len(notable), generator=gen)[: n // 4]]
    rest = torch.randperm(len(ds), generator=gen)
    rest = rest[~torch.isin(rest, notable)][: max(0, min(n, len(ds)) - len(notable))]
    rows = torch.cat([notable, rest]).sort().values
    batch = ds[rows]
    cols = 6
    nrows = max(1, -(-len(rows) // cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(cols * 1.9, nrows * 2.25), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for k, ax in enumerate(axes.flat[: len(rows)]):
        item = batch[k]
        action = int(item["action"])
        name = action_names[action] if action_names and action < len(action_names) else str(action)
        reward = float(item["next", "reward"])
        end = " end" if bool(item["next", "done"]) else ""
        ax.imshow(item["observation"].numpy(), cmap="gray", vmin=0, vmax=255)
        ax.set_title(
            f"#{int(item['index'])} ep {int(item['episode'])}\n{name} r={reward:+g}{end}",
            fontsize=8,
        )
    game, run = ds.game or "?", ds.run or "?"
    fig.suptitle(f"{game}/{run}: {len(rows)} of {len(ds):,} transitions (84x84 grayscale)")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_returns(ds: AtariZarrDataset, path: str | Path) -> Path:
    """Save a plot of every episode's return and length, from the store's metadata.

    Parameters
    ----------
    ds : AtariZarrDataset
        The store.
    path : str or Path
        PNG to write.

    Returns
    -------
    Path
    """
    plt = _pyplot()
    table = episode_table(ds.metadata)
    if table is None or table.returns is None:  # no usable table: nothing to plot
        lengths, terminated, returns = np.zeros(0, np.int64), np.zeros(0, bool), np.zeros(0)
    else:
        lengths, terminated, returns = table.length, table.terminated, table.returns
    ids = np.arange(len(returns))
    colors = np.where(terminated, "tab:blue", "tab:orange")
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    ax1.bar(ids, returns, color=colors)
    ax1.set_ylabel("return (clipped rewards)")
    mean = f"mean {returns.mean():.2f}" if returns.size else "no episodes"
    ax1.set_title(
        f"{ds.game}/{ds.run}: {len(returns)} episodes, {mean} "
        f"(blue: ended, orange: cut by the end of the data or a gap)",
        fontsize=9,
    )
    ax2.bar(ids, lengths, color=colors)
    ax2.set_ylabel("length (transitions)")
    ax2.set_xlabel("episode")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


@dataclass
class DemoResult:
    """What :func:`run_demo` produced."""

    store: str
    frames_png: Path
    returns_png: Path
    info: dict[str, Any]
    batch: Any
    seconds: float


def run_demo(
    dest: str = "atari-zarr-demo",
    *,
    game: str | None = None,
    steps: int = 3000,
    capacity: int = 1000,
    seed: int = 0,
    scheduler: str | None = None,
    progress: bool = True,
    echo: bool = True,
    source_kind: str = DQN_REPLAY,
    shards: int = 5,
) -> DemoResult:
    """Record real play in a source's format, convert it, read it back, plot it.

    Parameters
    ----------
    dest : str
        Output directory: ``source/`` receives the source files, ``stores/`` the
        converted store, and the two PNGs go to the directory itself.
    game : str, optional
        ALE game to play (default: Breakout for DQN Replay, Asterix for RL Unplugged).
    steps : int
        Transitions to record (DQN Replay).
    capacity : int
        Replay capacity of the emulated buffer (DQN Replay; the dataset used 1,000,000).
    seed : int
        Seeds the play and the sampled frames.
    scheduler : str or None
        Dask scheduler of the conversion (see :func:`atari_zarr.convert`; None: the
        active ``dask.distributed`` client, else threads).
    progress : bool
        Show progress bars.
    echo : bool
        Print what happens (the CLI does; tests do not).
    source_kind : str
        ``"dqn-replay"`` (checkpoint files of dopamine's logged replay buffer) or
        ``"rl-unplugged"`` (GZIP TFRecord shards of PNG frames, :func:`record_rlu_run`).
    shards : int
        The RL Unplugged run's number of shards; the one in the middle is left out.

    Returns
    -------
    DemoResult

    Examples
    --------
    >>> import tempfile
    >>> result = run_demo(tempfile.mkdtemp(), steps=200, capacity=80, progress=False, echo=False)
    >>> result.info["transitions"], result.frames_png.name, result.returns_png.exists()
    (200, 'frames.png', True)
    """
    kind = get_kind(source_kind).name  # an unknown kind fails before anything is written
    _pyplot()  # fail before the work, not after it, when matplotlib is missing
    if not echo:
        quiet_ale()
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    source = out / "source"
    stores = out / "stores"

    def say(text: str) -> None:
        if echo:
            print(text, flush=True)

    t0 = time.perf_counter()
    if kind == RL_UNPLUGGED:
        game = game or DEFAULT_RLU_GAME
        missing = shards // 2
        say(
            f"1/4 playing {game} (random policy, seed {seed}) into RL Unplugged shards "
            f"run_1-xxxxx-of-{shards:05d} under {source}: GZIP TFRecords, one tf.train.Example "
            f"per episode, one PNG per step; shard {missing} left out as a gap"
        )
        rec = record_rlu_run(str(source), game, shards=shards, seed=seed)
        say(
            f"    {rec.episodes} episodes ({rec.terminated} terminal, "
            f"{rec.episodes - rec.terminated} cut), {rec.steps:,} steps in "
            f"{len(rec.shards)} shards, written without TensorFlow"
        )
        say(f"2/4 converting to {stores} (a Dask graph: a scan and a write task per shard)")
    else:
        game = game or DEFAULT_GAME
        say(
            f"1/4 playing {game} ({steps:,} steps, random policy, seed {seed}) into DQN Replay "
            f"checkpoints (capacity {capacity:,}) under {source}"
        )
        rec = record_run(
            str(source), game, steps=steps, capacity=capacity, seed=seed, progress=progress
        )
        say(
            f"    {rec.episodes} episodes, {rec.checkpoints} checkpoints "
            f"written as dopamine's logged replay buffer writes them"
        )
        say(f"2/4 converting to {stores} (a Dask graph: one task per checkpoint)")
    [done] = convert(
        str(source),
        str(stores),
        overwrite=True,
        progress=progress,
        scheduler=scheduler,
        source_kind=kind if kind == RL_UNPLUGGED else None,
    )
    info = store_info(done.url)
    say("    " + format_info(info).replace("\n", "\n    "))
    say("3/4 reading it back")
    ds = AtariZarrDataset(done.url)
    batch = ds.sample(32, generator=torch.Generator().manual_seed(seed))
    say(f"    {ds!r}")
    say(
        f"    a batch of 32 TED transitions: observation {tuple(batch['observation'].shape)}, "
        f"next/reward {tuple(batch['next', 'reward'].shape)}"
    )
    if kind == RL_UNPLUGGED:
        say(
            f"    final_observation keeps the terminal frame of the {rec.terminated} terminal "
            f"episodes, next/unclipped_reward the source's rewards before clipping"
        )
    say("4/4 plotting")
    frames_png = plot_frames(ds, out / "frames.png", action_names=rec.action_names, seed=seed)
    returns_png = plot_returns(ds, out / "returns.png")
    seconds = time.perf_counter() - t0
    say(f"    sampled frames:  {frames_png}")
    say(f"    episode returns: {returns_png}")
    say(f"done in {seconds:.1f} s. Open the store with AtariZarrDataset({done.url!r}),")
    say("or explore it in notebooks/explore.ipynb.")
    return DemoResult(done.url, frames_png, returns_png, info, batch, seconds)
