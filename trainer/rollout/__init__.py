"""The rollout side of a run: the coordinator (episodes in flight, buffer, staleness), episode runner, ledger."""
