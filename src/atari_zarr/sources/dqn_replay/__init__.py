"""The DQN Replay source: dopamine's circular-buffer checkpoints (``replay_logs/``)."""
