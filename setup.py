"""The compiled part of atari-zarr; everything else is declared in pyproject.toml.

The chunk loop (``src/atari_zarr/storage/_chunk_loop.c``, called through ctypes by
``atari_zarr.storage.chunk_loop``) checks and decodes many chunks in one call with the
GIL released. It uses Python's stable ABI, so one wheel serves every Python from 3.11.
Where no compiler is found the install goes on without it, and chunks decode one call
each.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "atari_zarr.storage._chunk_loop",
            sources=["src/atari_zarr/storage/_chunk_loop.c"],
            py_limited_api=True,
            define_macros=[("Py_LIMITED_API", "0x030B0000")],
            optional=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
