"""Where stores and sources live: paths and URLs (:mod:`~atari_zarr.storage.paths`), the
deadline and error translation of every remote call (:mod:`~atari_zarr.storage.deadline`),
file systems bound by it (:mod:`~atari_zarr.storage.filesystem`), zarr stores
(:mod:`~atari_zarr.storage.remote`), the byte-range cache (:mod:`~atari_zarr.storage.cache`)
and the one catalog of stores (:mod:`~atari_zarr.storage.catalog`)."""
