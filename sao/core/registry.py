"""One shape for the name -> entry tables (training algorithms and their parts, engines): ``add`` / ``register``
refuse a taken name, ``get`` names the nearest registered names, ``names`` / ``values`` list them in registration
order. The env table is Gymnasium's own (``gymnasium.register``: a re-registered id replaces the old one, which
re-importing a module relies on); its lookups raise the same "unknown ..." error through ``unknown_name``."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


def unknown_name(kind: str, name: str, known: Sequence[str]) -> str:
    """``unknown engine 'vlm' (did you mean 'vllm'?); registered: hf, vllm``."""
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {kind} {name!r}{hint}; registered: {', '.join(known)}"


class Registry(Generic[T]):
    """A named table of entries; registering a taken name or looking up an unknown one raises ``ValueError``.
    ``describe`` names an entry in the duplicate-name error (default: its repr)."""

    def __init__(self, kind: str, describe: Callable[[T], str] = repr) -> None:
        self.kind, self._describe = kind, describe
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        if not name or not isinstance(name, str):
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise ValueError(
                f"{self.kind} {name!r} is already registered ({self._describe(self._entries[name])}); pick another name"
            )
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """``@REG.register("name")`` on the entry."""

        def decorator(entry: T) -> T:
            return self.add(name, entry)

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(unknown_name(self.kind, name, self.names())) from None

    def names(self) -> list[str]:
        return list(self._entries)

    def values(self) -> list[T]:
        return list(self._entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self._entries
