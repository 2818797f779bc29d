"""Recording new Atari play into stores.

``envs`` makes ALE envs the way DQN Replay was recorded and parses env ids,
``writer`` appends steps and episodes to a new store (for any recorder), and
``collector`` is the gymnasium wrapper and :func:`~atari_zarr.record.collector.collect`.
"""
