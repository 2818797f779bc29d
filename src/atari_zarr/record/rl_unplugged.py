"""ALE play recorded as RL Unplugged's shards, as TensorFlow writes them, without it.

:func:`write_rlu_run` plays real ALE episodes with a seeded random policy
(:func:`played_episodes`) and writes them as ``{root}/{game}/run_{run}-{i:05d}-of-{N:05d}``:
GZIP files of TFRecords (framing and masked CRC-32C written here, not by the
reader), one ``tf.train.Example`` per episode
(:func:`~atari_zarr.sources.rl_unplugged.example.encode_episode`), one
PNG per step. This is what the demo converts; the test kit
(``tests/kit``: ``atari_zarr_testkit.rl_unplugged``) adds to it the transitions a perfect
converter returns, and bad input.

Examples
--------
>>> import gzip, tempfile
>>> from atari_zarr.sources.rl_unplugged.tfrecord import iter_records
>>> run = write_rlu_run(tempfile.mkdtemp())
>>> sorted(p.rsplit("/", 1)[1] for p in run.paths.values())
['run_1-00000-of-00003', 'run_1-00002-of-00003']
>>> with gzip.open(run.paths[0]) as stream:
...     len(list(iter_records(stream, run.paths[0])))
2
"""

from __future__ import annotations

import functools
import gzip
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import google_crc32c
import numpy as np

from atari_zarr.sources.rl_unplugged.example import Episode, encode_episode
from atari_zarr.sources.rl_unplugged.files import shard_name
from atari_zarr.sources.rl_unplugged.png import encode_frame

__all__ = [
    "TERMINAL_STEP_REWARD",
    "Played",
    "WrittenEpisode",
    "WrittenRun",
    "frame_records",
    "played_episodes",
    "write_rlu_run",
    "write_shard",
]

#: The terminal step's action and reward are not real; these stand-ins are
#: recognisable, so a converter that keeps them fails the comparison with the truth.
TERMINAL_STEP_REWARD = -9.0


# -- the files ---------------------------------------------------------------------------
def _masked(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def frame_records(records: Sequence[bytes]) -> bytes:
    """``records`` framed as an uncompressed TFRecord stream (length, CRCs, data).

    Examples
    --------
    >>> frame_records([b"abc"]).hex()  # the bytes tf.io.TFRecordWriter writes
    '0300000000000000b099490e6162636e57f121'
    """
    parts = []
    for data in records:
        length = struct.pack("<Q", len(data))
        parts += [length, struct.pack("<I", _masked(length)), data]
        parts.append(struct.pack("<I", _masked(bytes(data))))
    return b"".join(parts)


def write_shard(path: str | os.PathLike[str], records: Sequence[bytes]) -> None:
    """Write ``records`` as one GZIP TFRecord file, as ``TFRecordWriter(options="GZIP")`` does."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(gzip.compress(frame_records(records), compresslevel=6, mtime=0))


# -- playing -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Played:
    """One episode of ALE play: ``frames`` has one more frame than there are actions."""

    frames: np.ndarray  # (n + 1, 84, 84): the observation before each action, then the last
    actions: np.ndarray  # (n,) int64, index into the game's minimal action set
    rewards: np.ndarray  # (n,) float32, ALE's reward over the 4 skipped frames
    terminated: bool  # the game ended after the last action (not the cap, not a cut)


@functools.lru_cache(maxsize=8)
def played_episodes(
    game: str, seed: int, lengths: tuple[int | None, ...], cap: int = 400
) -> tuple[Played, ...]:
    """Play one episode per entry of ``lengths`` with a seeded random policy (cached).

    ``None`` plays until the game ends (or ``cap`` steps); a number plays that many
    steps (fewer if the game ends first). DQN's preprocessing applies
    (:func:`~atari_zarr.ale.make_dqn_env`).
    """
    from atari_zarr.ale import make_dqn_env, quiet_ale

    quiet_ale()
    env = make_dqn_env(game, max_episode_steps=None)
    rng = np.random.default_rng(seed)
    episodes = []
    try:
        obs, _ = env.reset(seed=seed)
        for length in lengths:
            frames: list[np.ndarray] = [obs]
            actions: list[int] = []
            rewards: list[float] = []
            terminated = False
            limit = cap if length is None else length
            while len(actions) < limit and not terminated:
                action = int(rng.integers(env.action_space.n))
                obs, reward, terminated, _, _ = env.step(action)
                frames.append(obs)
                actions.append(action)
                rewards.append(reward)
            episodes.append(
                Played(
                    frames=np.stack(frames).astype(np.uint8),
                    actions=np.array(actions, np.int64),
                    rewards=np.array(rewards, np.float32),
                    terminated=bool(terminated),
                )
            )
            obs, _ = env.reset()
    finally:
        env.close()
    return tuple(episodes)


# -- the run ---------------------------------------------------------------------------------
@dataclass
class WrittenEpisode:
    """One Example as written, and what it means.

    ``observations``, ``actions``, ``unclipped_rewards``, ``clipped_rewards`` and
    ``discounts`` are the Example's lists (terminal step included);
    ``observations`` are frames, not PNGs.
    """

    shard: int
    checkpoint_idx: int
    episode_idx: int
    observations: np.ndarray
    actions: np.ndarray
    unclipped_rewards: np.ndarray
    clipped_rewards: np.ndarray
    discounts: np.ndarray
    terminal: bool

    @property
    def real_steps(self) -> int:
        """Steps with a real action and reward."""
        return len(self.actions) - 1 if self.terminal else len(self.actions)

    @property
    def episode_return(self) -> float:
        """Sum of the unclipped rewards of the real steps (float32)."""
        return float(np.float32(self.unclipped_rewards[: self.real_steps].sum(dtype=np.float32)))

    @property
    def clipped_episode_return(self) -> float:
        """Sum of the clipped rewards of the real steps (float32)."""
        return float(np.float32(self.clipped_rewards[: self.real_steps].sum(dtype=np.float32)))

    def example(self) -> Episode:
        """The Example's contents, PNG-encoded."""
        return Episode(
            checkpoint_idx=self.checkpoint_idx,
            episode_idx=self.episode_idx,
            episode_return=self.episode_return,
            clipped_episode_return=self.clipped_episode_return,
            observations=[encode_frame(f) for f in self.observations],
            actions=self.actions,
            unclipped_rewards=self.unclipped_rewards,
            clipped_rewards=self.clipped_rewards,
            discounts=self.discounts,
        )


@dataclass
class WrittenRun:
    """A written run: where its shards are, and the episodes they hold."""

    root: str
    game: str
    run: int
    num_shards: int
    present: tuple[int, ...]
    paths: dict[int, str]
    episodes: list[WrittenEpisode] = field(default_factory=list)

    @property
    def game_dir(self) -> str:
        """``{root}/{game}``, the directory holding the shards."""
        return f"{self.root}/{self.game}"

    def episodes_of(self, shard: int) -> list[WrittenEpisode]:
        """The episodes of shard ``shard``, in file order."""
        return [e for e in self.episodes if e.shard == shard]


def write_rlu_run(
    root: str | os.PathLike[str],
    game: str = "Asterix",
    run: int = 1,
    *,
    num_shards: int = 3,
    present: Sequence[int] = (0, 2),
    episodes_per_shard: int | Mapping[int, int] = 2,
    seed: int = 0,
    cut_length: int = 30,
) -> WrittenRun:
    """Write shards of real ALE play under ``{root}/{game}`` as RL Unplugged has them.

    What the demo (``atari-zarr demo --source-kind rl-unplugged``) converts, and
    what the test kit's ``atari_zarr_testkit.rl_unplugged.write_fixture_rlu``
    writes (adding the transitions a converter must give).

    In each present shard, every episode but the last is played until the game
    ends (a terminal episode: ``discounts[-1] == 0``, and the last step holds only
    the terminal frame, with a stand-in action and reward of
    :data:`TERMINAL_STEP_REWARD`); the last is cut after about ``cut_length``
    steps (every step real). The played episodes are cached per process.

    Parameters
    ----------
    root : str or path
        Local directory; shards go to ``{root}/{game}/run_{run}-{i:05d}-of-{num_shards:05d}``.
    game : str
        ALE game. Asterix's random play ends in 200 to 320 steps and scores 50 a
        time, outside the clipping range.
    run : int
        Run number in the file names.
    num_shards : int
        The ``-of-N`` of the names.
    present : sequence of int
        Shards written; the others are missing, as a gap in the source.
    episodes_per_shard : int or mapping
        Examples per shard (the last of each is cut); a mapping gives them by shard
        index, and a present shard it leaves out holds one short cut episode (about
        a quarter of ``cut_length``): a complete run at little cost.
    seed : int
        Seeds the policy and the environment.
    cut_length : int
        Steps of a cut episode (each shard's own length varies by a few steps).

    Returns
    -------
    WrittenRun
    """
    root = str(root).rstrip("/") or "/"
    present = tuple(sorted(set(int(i) for i in present)))
    counts = [
        episodes_per_shard.get(i, 1)
        if isinstance(episodes_per_shard, Mapping)
        else episodes_per_shard
        for i in present
    ]
    starts = np.r_[0, np.cumsum(counts)].astype(int).tolist()
    short = [
        isinstance(episodes_per_shard, Mapping) and i not in episodes_per_shard for i in present
    ]
    plan: list[int | None] = []
    for k, count in enumerate(counts):
        cut = max(4, cut_length // 4) + k % 4 if short[k] else cut_length + 3 * k
        plan += [None] * (count - 1) + [cut]
    played = played_episodes(game, seed, tuple(plan))
    rng = np.random.default_rng(seed)
    fixture = WrittenRun(
        root=root, game=game, run=run, num_shards=num_shards, present=present, paths={}
    )
    episode_idx = 0
    for k, shard in enumerate(present):
        records = []
        for p in played[starts[k] : starts[k + 1]]:
            n = len(p.actions)
            unclipped = p.rewards
            if p.terminated:
                # the file's last step is the terminal frame alone
                observations = p.frames
                actions = np.append(p.actions, rng.integers(0, 4)).astype(np.int64)
                unclipped = np.append(unclipped, TERMINAL_STEP_REWARD)
                discounts = np.append(np.ones(n, np.float32), 0.0)
            else:
                observations = p.frames[:n]
                actions = p.actions
                discounts = np.ones(n, np.float32)
            unclipped = unclipped.astype(np.float32)
            episode = WrittenEpisode(
                shard=shard,
                checkpoint_idx=shard,
                episode_idx=episode_idx,
                observations=observations,
                actions=actions,
                unclipped_rewards=unclipped,
                clipped_rewards=np.clip(unclipped, -1, 1).astype(np.float32),
                discounts=discounts.astype(np.float32),
                terminal=p.terminated,
            )
            fixture.episodes.append(episode)
            records.append(encode_episode(episode.example()))
            episode_idx += 1
        path = f"{root}/{game}/{shard_name(run, shard, num_shards)}"
        write_shard(path, records)
        fixture.paths[shard] = path
    return fixture
