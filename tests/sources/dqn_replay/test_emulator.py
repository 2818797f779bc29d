"""The dopamine buffer emulator writes checkpoints as batch_rl logged them."""

from __future__ import annotations

import numpy as np

from atari_zarr.sources.dqn_replay.emulator import STACK_SIZE, DopamineLoggedBuffer
from atari_zarr.sources.dqn_replay.files import RunSource


def play(buffer: DopamineLoggedBuffer, lengths: list[int]) -> None:
    k = 0
    for episode, length in enumerate(lengths):
        for step in range(length):
            frame = np.full((84, 84), k % 250 + 1, np.uint8)
            buffer.add(frame, 1, 1.0, step == length - 1, episode, step)
            k += 1


def test_padding_logs_and_the_final_log(tmp_path):
    logs = tmp_path / "Pong" / "1" / "replay_logs"
    buffer = DopamineLoggedBuffer(str(logs), 8, np.random.default_rng(0))
    play(buffer, [4, 2])
    # 3 padding rows + 4 real (logged at add_count 7), then 3 padding + 2 real
    assert buffer.add_count == 2 * (STACK_SIZE - 1) + 6 == 12
    assert sorted(buffer.contents) == [0]
    buffer.log_final()
    src = RunSource(str(tmp_path / "Pong" / "1"), "Pong", "1")
    assert src.suffixes == [0, 1]
    assert src.read_add_count(0) == 7  # logged when add_count % 8 == 7
    assert src.read_add_count(1) == 12 % 8  # the final log: add_count reset to the cursor
    small = src.read_small(0)
    # rows 0..2 are padding: all zero; row 3 is the first real one
    assert small.action[:3].tolist() == [0, 0, 0] and small.action[3] == 1
    assert not src.read_observation_rows(0, 8, [0, 1, 2]).any()


def test_a_call_that_steps_over_the_log_point_logs_nothing(tmp_path):
    """One add() that pads and adds 4 rows can skip add_count % C == C - 1: a missed log."""
    buffer = DopamineLoggedBuffer(str(tmp_path), 8, np.random.default_rng(0))
    play(buffer, [1])  # add_count 4 after padding + 1 real row (terminal)
    play(buffer, [1])  # padding to 7 inside the call, then 8: the check sees 8, no log
    assert buffer.add_count == 8 and buffer.contents == {}
