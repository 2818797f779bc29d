"""Drop-ins for other libraries' data code, reading converted stores.

* :mod:`atari_zarr.compat.torchrl`: TorchRL's ``AtariDQNExperienceReplay`` (public path
  :mod:`atari_zarr.torchrl`), its storages (:mod:`atari_zarr.compat.torchrl_storage`) and
  ``preprocess`` into a compressed store (:mod:`atari_zarr.compat.preprocess`);
* :mod:`atari_zarr.compat.decision_transformer`: kzl/decision-transformer's Atari
  ``create_dataset`` and ``StateActionReturnDataset``;
* :mod:`atari_zarr.compat.d3rlpy`: d3rlpy's ``get_atari`` and ``get_atari_transitions``.
"""
