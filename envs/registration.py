"""Registers the SAO envs with Gymnasium, finds envs in the user's installed packages, and makes each env once early.

Importing ``envs`` runs this module: it only records ids and ``"module:Class"`` strings, so it imports no env code.
New envs register the same way with ``register_env`` (see docs/register_env.md). An installed package makes its
envs known through the ``sao.envs`` entry-point group (the plugin convention Gymnasium used for ``gym.envs``): each
entry point names a module (registering on import) or a function (called once) that calls ``register_env`` or
``gymnasium.register``. ``load_plugin_envs`` loads them; ``list_envs``, ``check_envs`` and ``preflight`` call it.
An env id may also be written ``"module:sao/Name-v0"``: the module is imported first (Gymnasium's own form).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable
from types import ModuleType
from typing import Any

import gymnasium

from sao.core.registry import unknown_name
from sao.sandboxes.backend import check_backend
from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.protocols import SandboxUnavailableError

NAMESPACE = "sao"
PLUGIN_GROUP = "sao.envs"
BUILTIN = "sao"

_DESCRIPTIONS: dict[str, str] = {}
_ORIGINS: dict[str, str] = {}  # env id -> "sao" or the distribution whose entry point registered it
_plugin_errors: list[str] = []
_plugins_loaded = False
_loading: str | None = None  # the distribution whose entry point is being loaded


class EnvSetupError(ValueError):
    """An env id that is not registered, or an env its kwargs cannot construct; the message says how to fix it."""


def register_env(
    env_id: str,
    entry_point: str | Callable[..., gymnasium.Env[Any, Any]],
    description: str,
    *,
    nondeterministic: bool = False,
    **kwargs: Any,
) -> None:
    """Register ``env_id`` (``"sao/Name-v0"``); ``kwargs`` become the constructor's defaults.

    ``entry_point`` is ``"module:Class"`` (imported only at ``gymnasium.make``: registration stays cheap) or the
    class itself.
    Registering an id again replaces it (so re-importing a module that registers is harmless).
    """
    if gymnasium.registry.get(env_id) is not None:
        del gymnasium.registry[env_id]
    gymnasium.register(id=env_id, entry_point=entry_point, nondeterministic=nondeterministic, kwargs=kwargs)
    _DESCRIPTIONS[env_id] = description.strip().splitlines()[0] if description.strip() else ""
    _ORIGINS[env_id] = _loading or _ORIGINS.get(env_id) or _caller_origin(entry_point)


def _caller_origin(entry_point: str | Callable[..., Any]) -> str:
    module = entry_point.split(":", 1)[0] if isinstance(entry_point, str) else getattr(entry_point, "__module__", "")
    top = module.split(".", 1)[0]
    return BUILTIN if top == "envs" else (top or "?")


def load_plugin_envs(*, force: bool = False) -> list[str]:
    """Load every ``sao.envs`` entry point of the installed packages once; return the load errors (also kept
    for ``plugin_errors``). A broken plugin is reported, not fatal: the other envs stay usable."""
    global _plugins_loaded, _loading
    if _plugins_loaded and not force:
        return list(_plugin_errors)
    _plugins_loaded = True
    _plugin_errors.clear()
    importlib.invalidate_caches()
    for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        dist = ep.dist.name if ep.dist is not None else ep.value.split(":", 1)[0]
        before = set(gymnasium.registry)
        _loading = dist
        try:
            target = ep.load()
            if callable(target) and not isinstance(target, ModuleType):
                target()
        except Exception as e:
            _plugin_errors.append(f"entry point {ep.name} = {ep.value} ({dist}): {type(e).__name__}: {e}")
        finally:
            _loading = None
        for env_id in set(gymnasium.registry) - before:
            _ORIGINS.setdefault(env_id, dist)
    return list(_plugin_errors)


def plugin_errors() -> list[str]:
    """Errors from loading ``sao.envs`` entry points (empty when all loaded)."""
    return list(_plugin_errors)


def resolve_env_id(env_id: str) -> str:
    """``"module:sao/Name-v0"`` -> import ``module`` (it registers), return ``"sao/Name-v0"``; plain ids unchanged."""
    module, sep, name = env_id.partition(":")
    if not sep:
        return env_id
    global _loading
    _loading = module.split(".", 1)[0]
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise EnvSetupError(
            f"env id {env_id!r}: cannot import module {module!r} ({e}); install the package that holds it "
            "(pip install -e .) or fix the module name before the ':'"
        ) from e
    finally:
        _loading = None
    return name


def list_envs() -> list[tuple[str, str]]:
    """``(id, one-line description)`` for every ``sao/`` env and every env from a plugin, sorted by id."""
    load_plugin_envs()
    out = []
    for env_id, spec in gymnasium.registry.items():
        if spec.namespace == NAMESPACE or env_id in _DESCRIPTIONS or _ORIGINS.get(env_id, BUILTIN) != BUILTIN:
            out.append((env_id, _DESCRIPTIONS.get(env_id, f"entry point {spec.entry_point}")))
    return sorted(out)


def env_origin(env_id: str) -> str:
    """Where ``env_id`` comes from: ``"sao"`` for the built-in envs, else the package that registered it."""
    return _ORIGINS.get(env_id, "?")


def preflight(env_id: str, kwargs: dict[str, Any] | None = None) -> None:
    """Make the env once and close it, before any episode: a bad id or bad kwargs fail now, with the env's own
    error in the message, instead of as one infra error per episode later. An env with a ``sandbox_cfg`` (a
    ``SandboxConfig``) has its backend checked too: a stopped Docker daemon fails here, not as n infra errors."""
    load_plugin_envs()
    name = resolve_env_id(env_id)
    if gymnasium.registry.get(name) is None:
        raise EnvSetupError(
            unknown_name("env id", name, [i for i, _ in list_envs()])
            + f". An env from your own package needs a {PLUGIN_GROUP!r} entry point, or the 'module:{name}' form "
            "naming the module that registers it (docs/register_env.md)"
        )
    try:
        env = gymnasium.make(name, **(kwargs or {}))
    except Exception as e:
        # Gymnasium re-raises the constructor's error with the kwargs appended: show the constructor's own words.
        own = e.__cause__ if isinstance(e.__cause__, type(e)) else e
        raise EnvSetupError(
            f"env {name!r} cannot be made with kwargs {kwargs or {}}: {type(own).__name__}: {own}; fix env.kwargs "
            "(the env's constructor raised this)"
        ) from e
    try:
        cfg = getattr(env.unwrapped, "sandbox_cfg", None)
        if isinstance(cfg, SandboxConfig):
            try:
                check_backend(cfg)
            except SandboxUnavailableError as e:
                raise EnvSetupError(f"env {name!r} cannot reach its sandbox backend: {e}") from e
    finally:
        env.close()


def _register_builtins() -> None:
    register_env(
        "sao/PythonTool-v0",
        "sao.envs.python_tool:PythonToolEnv",
        "Math problems solved with a sandboxed notebook-like python tool, graded by math-verify on the last \\boxed{}.",
        # Tool timings in info and sandbox wall clocks differ between identical runs.
        nondeterministic=True,
    )
    register_env(
        "sao/OnlineWriting-v0",
        "sao.envs.online_writing:OnlineWritingEnv",
        "Short writing tasks scored by a deterministic style judge whose preferred style shifts every N episodes.",
        # The judge's style depends on a shared episode counter, not only on the seed.
        nondeterministic=True,
    )
    register_env(
        "sao/TokenGame-v0",
        "sao.envs.token_game:TokenGameEnv",
        "Toy multi-turn game: answer each turn with the symbol the shown one determines (learning tests).",
    )
    register_env(
        "sao/SWE-v0",
        "sao.envs.swe.env:SWEEnv",
        "SWE-bench-format repo repair in a Docker sandbox (bash, editor, submit), graded by the swebench harness.",
        nondeterministic=True,
    )


_register_builtins()
