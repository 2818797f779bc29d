"""Rows of a storage as a TensorDict whose entries are read when asked: :class:`LazyRows`.

TorchRL's slice samplers find trajectories with ``storage[:][key]``: the whole storage as
a TensorDict, of which they read one entry (``episode``, ``("next", "done")``). A
TensorDict holds its entries, so a storage over a 50 M-transition store would read every
frame (hundreds of GB) to hand over one column. A :class:`LazyRows` is that TensorDict
with its entries read on first access instead: ``rows[key]``, ``rows.get(key)`` and
``key in rows.keys()`` read nothing but the entry asked for. Everything else a
TensorDict does (indexing it, its items, ``to_tensordict()``, pickling, printing a
read one) reads every entry first, so it behaves as the TensorDict it stands for.

This module needs ``tensordict`` (the ``torchrl`` extra).

Examples
--------
>>> import torch
>>> calls = []
>>> def ones():
...     calls.append("b")
...     return torch.ones(3)
>>> rows = LazyRows.of(3, {"a": lambda: torch.zeros(3), ("next", "b"): ones})
>>> sorted(rows.keys()), calls
(['a', 'next'], [])
>>> rows["next", "b"].tolist(), calls
([1.0, 1.0, 1.0], ['b'])
>>> rows.to_tensordict()["a"].tolist()
[0.0, 0.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict import TensorDict
from tensordict._td import _StringKeys

__all__ = ["LazyRows"]


def _as_is(td: TensorDict) -> TensorDict:
    return td


#: What reads one entry: called once, on first access.
Reader = Callable[[], Any]


class LazyRows(TensorDict):
    """A TensorDict whose entries are read on first access (see the module docstring).

    Build one with :meth:`of`; TensorDict's own operations on it give plain TensorDicts.
    """

    # TensorDict keeps its entries in ``self._tensordict``; every operation but the
    # lookups below goes through this property, which reads what is still pending.
    @property  # type: ignore[override]
    def _tensordict(self) -> Any:
        self._read_pending()
        return self.__dict__["_entries"]

    @_tensordict.setter
    def _tensordict(self, value: Any) -> None:
        self.__dict__["_entries"] = value

    @classmethod
    def of(
        cls,
        batch_size: int | torch.Size,
        readers: Mapping[str | tuple[str, ...], Reader],
        entries: Mapping[str, Any] | None = None,
    ) -> LazyRows:
        """Rows of ``batch_size`` whose entry ``key`` is ``readers[key]()``, read when asked.

        Nested keys (``("next", "reward")``) become a nested :class:`LazyRows`;
        ``entries`` are held from the start (a non-tensor such as TorchRL's metadata).
        """
        size = torch.Size([batch_size]) if isinstance(batch_size, int) else batch_size
        top: dict[str, Reader] = {}
        nested: dict[str, dict[str | tuple[str, ...], Reader]] = {}
        for key, reader in readers.items():
            if isinstance(key, tuple) and len(key) > 1:
                nested.setdefault(key[0], {})[key[1:] if len(key) > 2 else key[1]] = reader
            else:
                top[key[0] if isinstance(key, tuple) else key] = reader
        rows = cls.__new__(cls)
        TensorDict.__init__(rows, {}, batch_size=size)
        held = rows.__dict__["_entries"]
        for name, inner in nested.items():
            held[name] = cls.of(size, inner)
        for name, value in (entries or {}).items():
            held[name] = value
        rows.__dict__["_pending"] = top
        return rows

    @classmethod
    def _new_unsafe(cls, *args: Any, **kwargs: Any) -> TensorDict:
        # what TensorDict's operations build from these rows is a plain TensorDict
        return TensorDict._new_unsafe(*args, **kwargs)

    def _read_pending(self) -> None:
        pending = self.__dict__.get("_pending")
        while pending:
            key, reader = next(iter(pending.items()))
            self.__dict__["_entries"][key] = reader()
            del pending[key]

    def _get_str(self, key: Any, default: Any, **kwargs: Any) -> Any:
        held = self.__dict__["_entries"]
        if key in held:
            return held[key]
        pending = self.__dict__.get("_pending") or {}
        if key in pending:
            held[key] = pending.pop(key)()
            return held[key]
        return self._default_get(key, default)

    def keys(self, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return super().keys(*args, **kwargs)
        return _StringKeys([*self.__dict__["_entries"], *(self.__dict__.get("_pending") or {})])

    def is_read(self) -> bool:
        """Whether every entry, nested ones included, has been read."""
        if self.__dict__.get("_pending"):
            return False
        held = self.__dict__["_entries"].values()
        return all(value.is_read() for value in held if isinstance(value, LazyRows))

    def __reduce_ex__(self, protocol: Any) -> Any:
        # pickled as the plain TensorDict it stands for (its readers stay behind)
        return _as_is, (self.to_tensordict(),)

    def __repr__(self) -> str:
        if self.is_read():
            return super().__repr__()
        keys = sorted(str(k) for k in self.keys())
        return f"LazyRows(keys={keys}, batch_size={self.batch_size}, entries read when asked)"
