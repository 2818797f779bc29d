"""One error contract: every error raised on purpose is an exported AtariZarrError.

That the command line prints each as one line with exit code 1 is tested with the
commands (tests/test_cli.py, tests/record/test_collector.py).
"""

from __future__ import annotations

import builtins
import inspect

import pytest

import atari_zarr
from atari_zarr import errors

ERROR_CLASSES = [
    getattr(errors, name)
    for name in errors.__all__
    if inspect.isclass(getattr(errors, name)) and issubclass(getattr(errors, name), Exception)
]
BUILTIN_ERRORS = {
    cls
    for cls in vars(builtins).values()
    if inspect.isclass(cls) and issubclass(cls, Exception) and cls is not Exception
}


def test_every_error_class_is_listed():
    defined = {
        obj
        for obj in vars(errors).values()
        if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == errors.__name__
    }
    assert defined == set(ERROR_CLASSES)
    assert len(ERROR_CLASSES) >= 15


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_every_error_is_exported_and_a_builtin_too(cls):
    assert getattr(atari_zarr, cls.__name__) is cls
    assert cls.__name__ in atari_zarr.__all__
    assert issubclass(cls, errors.AtariZarrError)
    if cls is not errors.AtariZarrError:
        assert set(cls.__mro__) & BUILTIN_ERRORS, f"{cls.__name__} subclasses no built-in error"
