"""The rollout side of a run: the coordinator (episodes in flight, buffer, staleness), the rollout stack, the ledger."""
