"""Supervised fine-tuning of the actor on demonstrations: the run and its data."""
