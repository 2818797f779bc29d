"""Where stores and sources live: paths and URLs (:mod:`~atari_zarr.storage.paths`), the
deadline and error translation of every remote call (:mod:`~atari_zarr.storage.deadline`),
file systems bound by it (:mod:`~atari_zarr.storage.filesystem`), zarr stores
(:mod:`~atari_zarr.storage.remote`) and the byte-range cache (:mod:`~atari_zarr.storage.cache`).
It knows bytes, not the store format: opening a store (:mod:`~atari_zarr.opening`) and the
catalog of stores (:mod:`~atari_zarr.catalog`) sit above it."""
