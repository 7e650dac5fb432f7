"""``UnicodeText``: a Gymnasium space of arbitrary unicode strings up to a length (the text envs' action/obs space).

``gymnasium.spaces.Text`` only admits characters from a fixed charset, so an observation holding a traceback with
a non-ASCII character, or an action in another script, would fall outside it. This space admits any ``str`` no
longer than ``max_length``; ``sample`` draws short strings from a mixed ASCII/unicode alphabet.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.spaces import Space

_SAMPLE_ALPHABET = tuple("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;!?{}()<>/\n_-éλ中→")


class UnicodeText(Space[str]):
    """Any Python ``str`` with ``len(s) <= max_length``."""

    def __init__(self, max_length: int = 1 << 20, seed: int | np.random.Generator | None = None) -> None:
        if max_length < 1:
            raise ValueError(f"UnicodeText.max_length must be >= 1, got {max_length}")
        self.max_length = int(max_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string of 1..min(64, max_length) characters from a small mixed alphabet."""
        if mask is not None or probability is not None:
            raise ValueError("UnicodeText.sample takes no mask or probability")
        n = int(self.np_random.integers(1, min(64, self.max_length) + 1))
        idx = self.np_random.integers(0, len(_SAMPLE_ALPHABET), size=n)
        return "".join(_SAMPLE_ALPHABET[i] for i in idx)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnicodeText) and other.max_length == self.max_length

    def __hash__(self) -> int:
        return hash(("UnicodeText", self.max_length))
