"""Readers of source datasets (the DQN Replay checkpoints)."""
