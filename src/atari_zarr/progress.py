"""Progress bars: one way to show them, and none when they are turned off.

Examples
--------
>>> bar = progress_bar(10, "plan Pong/1", unit="ckpt", enabled=False)
>>> bar.update(3); bar.close()
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["ProgressBar", "progress_bar"]


class ProgressBar(Protocol):
    """What callers use of a bar: ``update(n)`` and ``close()``."""

    def update(self, n: float = 1) -> Any: ...

    def close(self) -> None: ...


class _NoBar:
    """The bar of ``enabled=False``: accepts the calls, shows nothing."""

    def update(self, n: float = 1) -> None:
        return None

    def close(self) -> None:
        return None

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def progress_bar(
    total: float | None, desc: str, *, unit: str, enabled: bool, initial: float = 0
) -> Any:
    """A tqdm bar (notebook-aware) when ``enabled``, otherwise one that shows nothing.

    Parameters
    ----------
    total : float or None
        Units of work in all (None: unknown).
    desc : str
        Label, e.g. ``"write Pong/1"``.
    unit : str
        Name of one unit (``"ckpt"``, ``"row"``, ``"step"``).
    enabled : bool
        False for the silent bar (``progress=False``, ``--quiet``).
    initial : float
        Work already done (a resumed conversion).

    Returns
    -------
    ProgressBar
        Also a context manager that closes the bar.
    """
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=True)
