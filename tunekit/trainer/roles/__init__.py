"""One file per role: actor, critic, reference, reward. Rollout backends live in ``trainer/rollout``."""
