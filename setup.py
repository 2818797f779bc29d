"""The compiled part of atari-zarr; everything else is declared in pyproject.toml.

The chunk loop (``src/atari_zarr/storage/_chunk_loop.c``, called through ctypes by
``atari_zarr.storage.chunk_loop``) checks and decodes many chunks in one call with the
GIL released, and gathers many rows on several threads at once. It uses Python's stable
ABI, so one wheel serves every Python from 3.11. Where no compiler is found the install
goes on without it: chunks decode one call each, and rows are gathered by NumPy.
"""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "atari_zarr.storage._chunk_loop",
            sources=["src/atari_zarr/storage/_chunk_loop.c"],
            py_limited_api=True,
            define_macros=[("Py_LIMITED_API", "0x030B0000")],
            # the row gather's threads (part of libc on glibc 2.34 and later)
            libraries=[] if sys.platform == "win32" else ["pthread"],
            optional=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
