"""The learner side of a run: batches, models, DeepSpeed engines, the training step, value pretraining."""
