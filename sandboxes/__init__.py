"""Isolated execution for agent commands: Docker containers (default) and bubblewrap, pooled and limited."""
