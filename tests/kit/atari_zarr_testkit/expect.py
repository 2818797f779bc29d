"""What readers must return, computed the slow, obvious way from a fixture's ground truth.

The tests compare every reader (random access, the stream, windows, the drop-ins)
with these, never with another reader of the package.

Examples
--------
>>> obs = np.arange(4, dtype=np.uint8)[:, None, None] * np.ones((1, 2, 2), np.uint8)
>>> episode = np.array([0, 0, 1, 1])
>>> done = np.array([False, True, False, True])
>>> o, n = expected_stacks(obs, episode, done, np.array([2]), 2)
>>> o[0, :, 0, 0].tolist(), n[0, :, 0, 0].tolist()  # stack at an episode start; next after
([0, 2], [2, 3])
>>> expected_return_to_go(np.array([1.0, 2.0, 3.0, 4.0]), episode).tolist()
[3.0, 2.0, 7.0, 4.0]
"""

from __future__ import annotations

import numpy as np

__all__ = ["expected_return_to_go", "expected_stacks"]


def expected_stacks(
    observation: np.ndarray,
    episode: np.ndarray,
    done: np.ndarray,
    rows: np.ndarray,
    k: int,
    final: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Observation and next-observation stacks of ``rows``, one frame at a time.

    Frames of another episode are zeros; the frame after a row that ends its
    episode is ``final[episode]`` when ``final`` is given, zeros otherwise. With
    ``k == 1`` the stacks are single frames (``(B, H, W)``).
    """
    zero = np.zeros_like(observation[0])
    n = len(observation)
    obs, nxt = [], []
    for r in np.asarray(rows).tolist():

        def same(j: int, r: int = r) -> bool:
            return 0 <= j < n and episode[j] == episode[r]

        obs.append([observation[j] if same(j) else zero for j in range(r - k + 1, r + 1)])
        stack = [observation[j] if same(j) else zero for j in range(r - k + 2, r + 1)]
        if done[r]:
            stack.append(zero if final is None else final[episode[r]])
        else:
            stack.append(observation[r + 1])
        nxt.append(stack)
    o, x = np.array(obs), np.array(nxt)
    return (o[:, 0], x[:, 0]) if k == 1 else (o, x)


def expected_return_to_go(reward: np.ndarray, episode: np.ndarray) -> np.ndarray:
    """The sum of the rewards from each row to its episode's last row (float64)."""
    out = np.zeros(len(reward))
    for r in range(len(reward) - 1, -1, -1):
        later = r + 1 < len(reward) and episode[r + 1] == episode[r]
        out[r] = reward[r] + (out[r + 1] if later else 0.0)
    return out
