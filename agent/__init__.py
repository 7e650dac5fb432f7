"""The agent layer: the episode loop, inference engines and the trajectory records they emit."""
