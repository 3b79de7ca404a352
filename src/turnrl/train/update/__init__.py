"""The update core every trainer shares: the PPO-clip update (ppo.py), its loss and
aggregation weights (loss.py), mini-batches, the SFT warm start, and the checks and
measurements around an update (credit_check, info_gain, mismatch, memory,
legacy_pipeline). See docs/architecture.md."""
