"""The SAO trainer: batches, algorithms, DeepSpeed actor/critic, the async rollout pipeline."""
