"""Shared bottom layer: cache locations and small helpers every SAO package may import."""
