"""The one TED-batch builder: which frames a batch needs, stacks as views, the TensorDict.

Every reader of this package (random access, the epoch stream, windows) builds its
batches here, so a transition looks the same whichever way it was read.

**Items.** A batch holds ``B`` items; an item is ``L`` consecutive rows of one
episode starting at row ``s`` (``L = 1``: a transition; ``L = K``: a window). With
``frame_stack = k``, the item's observations are the ``k``-frame stacks ending at
rows ``s .. s + L - 1`` and its next observations the stacks one step later.

**Distinct frames, stacks as views.** These ``L`` stacks and ``L`` next stacks
hold only ``L + k`` distinct frames: rows ``s - k + 1 .. s + L``, the last being
the frame after the item's last row. :class:`FramePlan` says which rows those are
and which of them exist: frames before the episode's first row are zeros (as
dopamine stacks them), and so is the frame after a row that ends its episode
(DQN Replay never stored it) unless the store keeps it in ``final_observation``.
The reader gathers each distinct frame once into a :class:`FrameBuffer`, and the
stacks are strided views of it (``torch.as_strided``): a ``[B, K, 4, 84, 84]``
window batch costs the memory traffic of ``[B, K + 4, 84, 84]``. Views are not
contiguous; call ``.contiguous()`` where a contiguous tensor is needed.

**Padding.** A window of an episode shorter than ``K`` (``pad=True``) has ``valid
< K`` real rows; the rest are zeros, with ``mask`` False and ``index`` -1.

Examples
--------
>>> plan = FramePlan(starts=np.array([10, 20]), length=1, stack=2,
...                  first=np.array([10, 0]), last_done=np.array([False, True]), n_rows=100)
>>> plan.rows.tolist(), plan.valid.tolist()
([[9, 10, 11], [19, 20, 21]], [[False, True, True], [True, True, False]])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from atari_zarr.read.pool import BufferPool

__all__ = [
    "STEP_ENTRIES",
    "STEP_FIELDS",
    "FrameBuffer",
    "FramePlan",
    "assemble_batch",
    "collate_batch",
    "item_fields",
    "step_entry",
    "step_fields",
    "step_value",
    "step_values",
    "steps_before_by_store",
    "ted_batch",
    "ted_tensordict",
]


#: The per-step values every gatherer hands :func:`assemble_batch`, with their dtypes
#: (``first``: the first row of the step's episode); windows add ``return_to_go``.
STEP_FIELDS: dict[str, Any] = {
    "action": np.int64,
    "reward": np.float32,
    "terminated": bool,
    "truncated": bool,
    "episode": np.int64,
    "first": np.int64,
}
WINDOW_FIELDS: dict[str, Any] = {"return_to_go": np.float32}


def step_fields(window: bool) -> dict[str, Any]:
    """The per-step fields of a batch and their dtypes (:data:`STEP_FIELDS`, and for
    windows ``return_to_go``)."""
    return {**STEP_FIELDS, **WINDOW_FIELDS} if window else STEP_FIELDS


class FramePlan:
    """The distinct frames of a batch of items: their rows and which of them exist.

    Parameters
    ----------
    starts : numpy.ndarray
        ``(B,)`` first row of each item.
    length : int
        ``L``, rows per item.
    stack : int
        ``k``, frames per observation.
    first : numpy.ndarray
        ``(B,)`` first row of each item's episode.
    last_done : numpy.ndarray of bool
        ``(B,)`` the item's last real row ends its episode.
    n_rows : int or numpy.ndarray
        Rows of the store (no frame at or after it), or ``(B,)`` rows of each item's
        store (a batch of several stores).
    valid : numpy.ndarray, optional
        ``(B,)`` real rows of each item (``<= L``; default all ``L``).

    Attributes
    ----------
    rows : numpy.ndarray
        ``(B, L + k)`` int64, rows ``s - k + 1 .. s + L``.
    valid : numpy.ndarray
        ``(B, L + k)`` bool, the frames that exist (the others are zeros).
    next_pos : numpy.ndarray
        ``(B,)`` position of the frame after each item's last real row.
    """

    def __init__(
        self,
        *,
        starts: np.ndarray,
        length: int,
        stack: int,
        first: np.ndarray,
        last_done: np.ndarray,
        n_rows: int | np.ndarray,
        valid: np.ndarray | None = None,
    ) -> None:
        starts = np.asarray(starts, dtype=np.int64)
        # one bound, or one per item: a column against the (B, L + k) rows
        bound = np.asarray(n_rows, dtype=np.int64)
        end = bound if bound.ndim == 0 else bound[:, None]
        first = np.asarray(first, dtype=np.int64)
        #: ``(B,)`` first row of each item.
        self.starts = starts
        self.last_done = np.asarray(last_done, dtype=bool)
        self.length, self.stack = int(length), int(stack)
        k, width = self.stack, self.length + self.stack
        self.rows = starts[:, None] + np.arange(1 - k, self.length + 1, dtype=np.int64)[None, :]
        if valid is None:
            # every row of an item exists: frames before the episode are padding, the
            # frame after the last row exists unless that row ends the episode
            self.real = np.full(len(starts), self.length, dtype=np.int64)
            self.next_pos = np.full(len(starts), width - 1, dtype=np.int64)
            ok = np.ones(self.rows.shape, dtype=bool) if k == 1 else self.rows >= first[:, None]
            ok[:, -1] = ~self.last_done
            if starts.size and (self.rows[:, -1] >= bound).any():
                ok[:, -1] &= self.rows[:, -1] < bound
            self.valid = ok
            return
        self.real = np.asarray(valid, dtype=np.int64)
        self.next_pos = self.real + (k - 1)
        pos = np.arange(width, dtype=np.int64)[None, :]
        ok = (self.rows >= first[:, None]) & (pos < self.next_pos[:, None])
        nxt = (pos == self.next_pos[:, None]) & ~self.last_done[:, None]
        self.valid = (ok | nxt) & (self.rows < end)

    @property
    def padded(self) -> bool:
        """True when some item has fewer real rows than ``L``."""
        return bool((self.real < self.length).any())


class FrameBuffer:
    """A batch's distinct frames, gathered once, and the observation stacks as views.

    Parameters
    ----------
    pool : BufferPool
        Where the memory comes from.
    batch, length, stack : int
        ``B``, ``L`` and ``k``.
    frame_shape : tuple of int
        Shape of one frame (``(84, 84)``).

    Notes
    -----
    The frames live in one array; :meth:`flat` gives, for a ``(B, L + k)`` array
    of per-frame values, the same values in the order of that array's rows, so a
    gather (``np.take(..., out=buffer.frames)``) fills every distinct frame in one
    pass. Single transitions without stacking keep observations and next
    observations in two contiguous blocks (the layout of earlier releases).
    """

    def __init__(
        self, pool: BufferPool, batch: int, length: int, stack: int, frame_shape: tuple[int, ...]
    ) -> None:
        self.batch, self.length, self.stack = batch, length, stack
        self.frame_shape = tuple(frame_shape)
        self.width = length + stack
        # two contiguous blocks [2, B]: observation and next observation
        self._columns = length == 1 and stack == 1
        shape = (2, batch) if self._columns else (batch, self.width)
        self.array = pool.take((*shape, *self.frame_shape))
        #: Every frame, one per row, in memory order (gather into this).
        self.frames = self.array.reshape(-1, *self.frame_shape)

    def flat(self, per_frame: np.ndarray) -> np.ndarray:
        """``(B, L + k)`` values as one array in the order of :attr:`frames`."""
        return per_frame.T.ravel() if self._columns else per_frame.ravel()

    def zero_missing(self, exists: np.ndarray) -> None:
        """Zero the frames whose ``(B, L + k)`` flag in ``exists`` is False (frames that
        do not exist: before an episode, after its end or its store's last row)."""
        flat = self.flat(exists)
        if not flat.all():
            self.frames[~flat] = 0

    def views(self, window: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Observation and next observation: ``[B, (L,) (k,) *frame]`` views of the frames.

        The ``L`` dimension is there for windows (``window``, default ``L > 1``).
        """
        t = torch.from_numpy(self.array)
        b, length, k = self.batch, self.length, self.stack
        window = length > 1 if window is None else window
        if self._columns:
            obs, nxt = t[0], t[1]
        elif length == 1:  # a transition: [B, k, *frame]
            obs, nxt = t[:, :k], t[:, 1:]
        elif k == 1:  # a window of single frames: [B, L, *frame]
            return t[:, :length], t[:, 1:]
        else:
            # a window of stacks: [B, L, k, *frame], stack t is frames t .. t + k - 1
            sb, sj, *rest = t.stride()
            shape = (b, length, k, *self.frame_shape)
            stride = (sb, sj, sj, *rest)
            return (
                torch.as_strided(t, shape, stride, 0),
                torch.as_strided(t, shape, stride, sj),
            )
        if window:  # a window of one step
            return obs.unsqueeze(1), nxt.unsqueeze(1)
        return obs, nxt


#: The per-step entries of a TED item, each with the step values it is made of
#: (:func:`step_entry`): ``ted_batch`` builds them all, a lazy reader one at a time.
STEP_ENTRIES: dict[str | tuple[str, str], tuple[str, ...]] = {
    "action": ("action",),
    "episode": ("episode",),
    "index": ("index",),
    "done": (),
    "terminated": (),
    "truncated": (),
    ("next", "reward"): ("reward",),
    ("next", "terminated"): ("terminated",),
    ("next", "truncated"): ("truncated",),
    ("next", "done"): ("terminated", "truncated"),
}


def step_value(
    key: str | tuple[str, str], steps: Mapping[str, np.ndarray], shape: tuple[int, ...]
) -> np.ndarray:
    """The values of entry ``key`` of :data:`STEP_ENTRIES` of a batch of ``shape``, from
    its step values, as a NumPy array (:func:`step_entry` is its tensor).

    Ids are int64; rewards and flags get a trailing dimension of 1, as TorchRL's losses
    expect; ``done``, ``terminated`` and ``truncated`` at the top are False (a stored
    state is never final).

    Examples
    --------
    >>> steps = {"terminated": np.array([False, True]), "truncated": np.array([True, False])}
    >>> step_value(("next", "done"), steps, (2,)).flatten().tolist()
    [True, True]
    >>> step_value("done", {}, (2,)).shape
    (2, 1)
    """
    col = (*shape, 1)
    if not isinstance(key, tuple):
        if key in ("done", "terminated", "truncated"):
            return np.zeros(col, dtype=bool)
        return np.asarray(steps[key], dtype=np.int64).reshape(shape)
    name = key[1]
    if name == "reward":
        return np.array(steps[name], dtype=np.float32, copy=True).reshape(col)
    if name == "done":
        return step_value(("next", "terminated"), steps, shape) | step_value(
            ("next", "truncated"), steps, shape
        )
    return np.ascontiguousarray(steps[name], dtype=bool).reshape(col)


def step_entry(
    key: str | tuple[str, str], steps: Mapping[str, np.ndarray], shape: tuple[int, ...]
) -> torch.Tensor:
    """The entry ``key`` of :data:`STEP_ENTRIES` of a batch of ``shape``: the tensor of
    :func:`step_value`.

    Examples
    --------
    >>> step_entry("done", {}, (2,)).shape
    torch.Size([2, 1])
    """
    return torch.from_numpy(step_value(key, steps, shape))


def step_values(steps: Mapping[str, np.ndarray], shape: tuple[int, ...]) -> dict[Any, np.ndarray]:
    """Every entry of :data:`STEP_ENTRIES` (:func:`step_value`), by key: what
    :func:`ted_tensordict` takes. Computed once for many items, the values of a batch
    of them are slices along the first axis.

    Examples
    --------
    >>> values = step_values({"action": [1, 2], "reward": [0.0, 1.0], "terminated": [0, 1],
    ...                       "truncated": [0, 0], "episode": [0, 0], "index": [5, 6]}, (2,))
    >>> values["next", "done"][1:].tolist(), values["index"][1:].tolist()
    ([[True]], [6])
    """
    return {key: step_value(key, steps, shape) for key in STEP_ENTRIES}


def ted_batch(
    observation: torch.Tensor,
    next_observation: torch.Tensor,
    *,
    action: np.ndarray,
    reward: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    episode: np.ndarray,
    index: np.ndarray,
    extra: dict[str, Any] | None = None,
) -> TensorDict:
    """The TED TensorDict of a batch; its batch size is the leading shape of ``action``.

    Per-step arrays have shape ``(B,)`` (transitions) or ``(B, K)`` (windows).
    Rewards and flags get a trailing dimension of 1, as TorchRL's losses expect;
    ``done``, ``terminated`` and ``truncated`` at the top are False (a stored state
    is never final). ``extra`` entries are added at the top as they are (arrays are
    turned into tensors).

    Examples
    --------
    >>> z = torch.zeros(2, 84, 84, dtype=torch.uint8)
    >>> td = ted_batch(z, z, action=np.array([1, 2]), reward=np.array([0.0, 1.0], np.float32),
    ...                terminated=np.array([False, True]), truncated=np.zeros(2, bool),
    ...                episode=np.array([0, 0]), index=np.array([5, 6]))
    >>> td["next", "done"].flatten().tolist(), td["done"].shape
    ([False, True], torch.Size([2, 1]))
    """
    shape = tuple(np.shape(action))
    steps = {
        "action": action,
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
        "episode": episode,
        "index": index,
    }
    return ted_tensordict(observation, next_observation, step_values(steps, shape), extra)


def ted_tensordict(
    observation: torch.Tensor,
    next_observation: torch.Tensor,
    values: Mapping[Any, np.ndarray],
    extra: dict[str, Any] | None = None,
) -> TensorDict:
    """The TED TensorDict of a batch from its frames and its :func:`step_values` (or
    slices of them, all of one batch size): the layout :func:`ted_batch` builds.

    Examples
    --------
    >>> z = torch.zeros(2, 84, 84, dtype=torch.uint8)
    >>> values = step_values({"action": [1, 2], "reward": [0.0, 1.0], "terminated": [0, 1],
    ...                       "truncated": [0, 0], "episode": [0, 0], "index": [5, 6]}, (2,))
    >>> td = ted_tensordict(z, z, values)
    >>> td["next", "done"].flatten().tolist(), td.batch_size
    ([False, True], torch.Size([2]))
    """
    size = torch.Size(values["action"].shape)
    entries: dict[str, Any] = {"observation": observation}
    nxt: dict[str, Any] = {"observation": next_observation}
    for key in STEP_ENTRIES:
        if isinstance(key, tuple):
            nxt[key[1]] = torch.from_numpy(values[key])
        else:
            entries[key] = torch.from_numpy(values[key])
    entries["next"] = _tensordict(nxt, size)
    for key, value in (extra or {}).items():
        entries[key] = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    return _tensordict(entries, size)


def _tensordict(entries: dict[str, Any], size: torch.Size) -> TensorDict:
    """A TensorDict of entries whose shapes are known to be right.

    The shapes are ours, built above: tensordict's checks of every entry would cost
    about a fifth of a batch's Python time, so its unchecked constructor is used.
    """
    return TensorDict._new_unsafe(entries, batch_size=size)  # type: ignore[no-any-return]


def item_fields(
    rows: np.ndarray, exists: np.ndarray | None, steps: dict[str, np.ndarray], *, window: bool
) -> dict[str, Any]:
    """Per-step fields of a batch of items, shaped and padded: ``ted_batch`` arguments.

    ``rows`` and ``exists`` are ``(B, L)`` (``exists`` None: every position is real);
    ``steps`` holds flat ``(B * L,)`` values per name (taken at an existing row where
    the position is padding). Padding positions become zeros (False flags), ``index``
    -1; with ``window``, ``mask`` says which positions are real, and the fields keep
    their ``(B, L)`` shape (else ``(B,)``).
    """
    b, length = rows.shape
    shape = (b, length) if window else (b,)
    out: dict[str, Any] = {}
    for name, values in steps.items():
        arr = values.reshape(shape)
        if exists is not None:
            arr = np.where(exists.reshape(shape), arr, np.zeros((), dtype=arr.dtype))
        out[name] = arr
    index = rows if exists is None else np.where(exists, rows, -1)
    out["index"] = index.reshape(shape)
    if window:
        out["mask"] = np.ones((b, length), dtype=bool) if exists is None else exists.copy()
    return out


def assemble_batch(
    plan: FramePlan,
    buffer: FrameBuffer,
    steps: dict[str, np.ndarray],
    *,
    window: bool,
    steps_before: Any,
    finals: tuple[np.ndarray, np.ndarray] | None = None,
) -> TensorDict:
    """The one assembly of a TED batch, whichever way its frames and steps were read.

    Parameters
    ----------
    plan : FramePlan
        The batch's items (``plan.starts``, ``plan.real``) and frames.
    buffer : FrameBuffer
        Every distinct frame of ``plan``, gathered (frames that do not exist are
        zeroed here).
    steps : dict of numpy.ndarray
        Flat ``(B * L,)`` values per position: ``action``, ``reward``,
        ``terminated``, ``truncated``, ``episode``, ``first`` (the first row of the
        position's episode) and, for windows, ``return_to_go``; a padding position
        holds the values of its item's first row.
    window : bool
        The window layout (``[B, L]``, with ``return_to_go``, ``timestep``,
        ``fragment`` and ``mask``); else transitions ``[B]``.
    steps_before : callable
        ``steps_before(episodes) -> (steps, fragment)``: the steps each episode
        played before its first stored row (:meth:`StoreReader.steps_before
        <atari_zarr.read.store.StoreReader.steps_before>`).
    finals : (items, frames), optional
        Kept frames after an episode's end, one per item of ``items``, placed after
        each such item's last real row.
    """
    buffer.zero_missing(plan.valid)
    if finals is not None and len(finals[0]):
        items, frames = finals
        which = np.full((buffer.batch, buffer.width), -1, dtype=np.int64)
        which[items, plan.next_pos[items]] = np.arange(len(items))
        flat = buffer.flat(which)
        at = np.flatnonzero(flat >= 0)
        buffer.frames[at] = frames[flat[at]]
    obs, nxt = buffer.views(window)
    starts, length = plan.starts, plan.length
    rows = starts[:, None] + np.arange(length, dtype=np.int64)[None, :]
    exists = None if not plan.padded else np.arange(length)[None, :] < plan.real[:, None]
    first = steps.pop("first")
    if window:
        safe = rows if exists is None else np.where(exists, rows, starts[:, None])
        before, steps["fragment"] = steps_before(steps["episode"])
        steps["timestep"] = safe.ravel() - first + before
    else:
        steps.pop("return_to_go", None)
    fields = item_fields(rows, exists, steps, window=window)
    extras: dict[str, Any] = {
        k: fields.pop(k) for k in ("return_to_go", "timestep", "fragment", "mask") if k in fields
    }
    if window:
        extras["return_to_go"] = np.ascontiguousarray(extras["return_to_go"], np.float32)[..., None]
        extras["timestep"] = np.ascontiguousarray(extras["timestep"], dtype=np.int64)
    if plan.padded and length > 1:
        # observations are views of shared frames: a padded position still shows the
        # episode's last frames (or its final one); copy and zero them, so padding is
        # zeros everywhere
        pad = torch.from_numpy(~extras["mask"])
        obs, nxt = obs.clone(), nxt.clone()
        obs[pad] = 0
        nxt[pad] = 0
    return ted_batch(obs, nxt, extra=extras, **fields)


def steps_before_by_store(
    steps_before: Mapping[int, Callable[..., Any]] | Sequence[Callable[..., Any]],
    which: np.ndarray,
) -> Any:
    """``assemble_batch``'s ``steps_before`` for a batch whose item ``i`` is of store
    ``which[i]``: each store's episodes asked of its own ``steps_before[g]`` (a list
    of every store's, or a mapping of those the batch touches).

    Examples
    --------
    >>> one = lambda e: (e * 10, e > 0)
    >>> two = lambda e: (e * 0 + 7, e < 0)
    >>> fn = steps_before_by_store([one, two], np.array([1, 0]))
    >>> [x.tolist() for x in fn(np.array([3, 4, 5, 6]))]  # windows of 2 steps
    [[7, 7, 50, 60], [False, False, True, True]]
    >>> steps_before_by_store({5: one}, np.array([5, 5])) is one
    True
    """
    which = np.asarray(which, dtype=np.int64)
    if len(steps_before) == 1:  # one store: its own, whatever its number
        return next(
            iter(steps_before.values() if isinstance(steps_before, Mapping) else steps_before)
        )

    def by_store(episodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        of = np.repeat(which, len(episodes) // max(len(which), 1))
        steps = np.zeros(len(episodes), dtype=np.int64)
        fragment = np.zeros(len(episodes), dtype=bool)
        for g in np.unique(of).tolist():
            sel = of == g
            steps[sel], fragment[sel] = steps_before[g](episodes[sel])
        return steps, fragment

    return by_store


def collate_batch(batch: Any) -> Any:
    """``collate_fn`` for ``DataLoader`` over the datasets of this package.

    A batch from ``__getitems__`` is already a :class:`~tensordict.TensorDict` and is
    returned as is; a list of single items (a dataset without ``__getitems__``) is
    stacked.

    Examples
    --------
    >>> td = TensorDict({"a": torch.arange(3)}, batch_size=[3])
    >>> collate_batch(td) is td
    True
    >>> collate_batch([td[0], td[1]])["a"].tolist()
    [0, 1]
    """
    from tensordict import TensorDictBase

    if isinstance(batch, TensorDictBase):
        return batch
    return torch.stack(list(batch))
