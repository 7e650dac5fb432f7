"""Harnesses: what plays an episode, SAO's own loop or an outside agent behind the gateway (``registry``)."""
