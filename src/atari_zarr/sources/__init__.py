"""Readers of source datasets: one subpackage per kind, and the registry of kinds.

``dqn_replay/`` reads DQN Replay's checkpoints, ``rl_unplugged/`` RL Unplugged's
TFRecord shards; :mod:`atari_zarr.sources.registry` says what each kind gives the
converter.
"""
