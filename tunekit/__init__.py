"""tunekit: find the cheapest RL post-training configuration that still learns."""

__version__ = "0.1.0"
