"""Faults a test injects where the machine would raise them: a disk that fills up.

:func:`full_disk_after` makes the ``n``-th chunk or shard written to a local Zarr store
fail with ``ENOSPC``, as a full disk fails the write, naming the object.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from typing import Any

__all__ = ["full_disk_after"]


@contextlib.contextmanager
def full_disk_after(n: int) -> Iterator[list[str]]:
    """Within the block, the ``n``-th chunk object a local store writes raises ``ENOSPC``;
    yields the keys of the chunk objects written (or tried)."""
    from zarr.storage import LocalStore

    real = LocalStore.set
    calls: list[str] = []

    async def full_disk(self: Any, key: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        if "/c/" in key:
            calls.append(key)
            if len(calls) == n:
                raise OSError(errno.ENOSPC, "No space left on device", f"{self.root}/{key}")
        return await real(self, key, value, *args, **kwargs)

    LocalStore.set = full_disk  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        LocalStore.set = real  # type: ignore[method-assign]
