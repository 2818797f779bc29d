"""Recording new Atari play into stores.

ALE's envs, made the way DQN Replay was recorded, live in :mod:`atari_zarr.ale`;
``writer`` appends steps and episodes to a new store (for any recorder), and
``collector`` is the gymnasium wrapper and :func:`~atari_zarr.record.collector.collect`.
"""
