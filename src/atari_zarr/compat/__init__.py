"""Drop-ins for other libraries' data code, reading converted stores.

* :mod:`atari_zarr.compat.decision_transformer`: kzl/decision-transformer's Atari
  ``create_dataset`` and ``StateActionReturnDataset``.
"""
