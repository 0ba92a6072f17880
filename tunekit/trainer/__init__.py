"""The minimal PPO/GRPO trainer that probes run."""
