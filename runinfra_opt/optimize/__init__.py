"""The optimizer: profile, simulate, predict, confirm, decide."""
