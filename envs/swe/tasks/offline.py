"""Cached sets of offline SWE tasks: ``ensure_offline_tasks()`` (tests, evals, demos) and the named task sets of
the SWE training job (``task_set(name, split)``, ``env.tasks: swe-offline:NAME``).

The task records are cached as JSONL in ``<cache>/swe/tasks/`` under a key of (packages, count, seed, recipe);
images are rebuilt from the records when the Docker host lost them (e.g. a fresh CI daemon with a restored cache):
repo image from the cached sdist + wheels, task image = repo image + the reverse of the fix patch. Cold: a couple of
minutes (downloads, two repo images, mutation search, gold verification); warm: seconds.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the submodules by their path: ``from sao.envs.swe.tasks import ...`` would import the package, whose __init__
# imports this module (an import circle)
import sao.envs.swe.tasks.fetch as fetch
import sao.envs.swe.tasks.images as images
from sao.core.console import say
from sao.envs.swe.tasks.builder import BuildConfig, build_tasks
from sao.envs.swe.tasks.instance import HINTS, load_instances, with_location_hint
from sao.envs.swe.tasks.mutations import OPERATORS
from sao.sandboxes.images import require_base_image

# The two fastest suites among the offline sdists measured here (six: ~2 s, toolz: ~5 s for the whole suite).
DEFAULT_PACKAGES = ("six==1.17.0", "toolz==1.2.0")
TASKS_RECIPE_VERSION = "1"


def _log(msg: str) -> None:
    say(f"[sao tasks] {msg}")


def ensure_task_images(records: list[dict[str, Any]]) -> None:
    """Rebuild any missing image of our offline ``records`` from the cached sdists/wheels (no-op when present), on
    the offline base image (``require_base_image``: made by the setup step, an error naming it when missing)."""
    for rec in records:
        if images.image_exists(rec["image"]):
            continue
        meta = rec.get("sao_mutation") or {}
        if "sdist" not in meta or "repo_image" not in meta:
            raise ValueError(
                f"task {rec['instance_id']}: image {rec['image']} is missing and the record is not an offline "
                "SAO task (no sao_mutation.sdist); pull or build its image"
            )
        spec = fetch.SdistSpec.parse(meta["sdist"])
        sdist = fetch.fetch_sdist(spec)
        wheels = fetch.fetch_wheels(spec, sdist)
        deps = [*fetch.ALWAYS_TEST_DEPS, *fetch.KNOWN_TEST_DEPS.get(spec.name, [])]
        repo = images.ensure_repo_image(spec, sdist, wheels, require_base_image(), deps)
        if repo != meta["repo_image"]:
            raise RuntimeError(
                f"task {rec['instance_id']}: its repo image was {meta['repo_image']} but this machine builds {repo} "
                "(different wheels or recipe); rebuild the tasks with `sao tasks build`"
            )
        _log(f"rebuilding task image {rec['image']}")
        tag = images.ensure_task_image(repo, rec["patch"])
        if tag != rec["image"]:
            raise RuntimeError(f"task {rec['instance_id']}: rebuilt image tag {tag} differs from {rec['image']}")
        head = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", tag, "git", "-C", "/testbed", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout.strip()
        if head != rec["base_commit"]:
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
            raise RuntimeError(
                f"task {rec['instance_id']}: the rebuilt image has HEAD {head or '?'} instead of base_commit "
                f"{rec['base_commit']}; rebuild the tasks with `sao tasks build` (or clear {fetch.swe_cache()})"
            )


def ensure_offline_tasks(
    n_per_package: int = 2,
    packages: tuple[str, ...] = DEFAULT_PACKAGES,
    seed: int = 0,
    workers: int = 2,
    min_per_package: int | None = None,
    operators: tuple[str, ...] = OPERATORS,
) -> list[dict[str, Any]]:
    """``n_per_package`` validated tasks from each sdist in ``packages``, built once and cached, images ensured.
    With ``min_per_package`` a package whose candidate bugs run out keeps what it found (at least that many);
    ``operators``: the bug families searched."""
    parts: list[Any] = [TASKS_RECIPE_VERSION, images.IMAGE_RECIPE_VERSION, sorted(packages), n_per_package, seed]
    if tuple(operators) != OPERATORS:  # every family: the key sets built before this option had
        parts.append(sorted(operators))
    key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]
    folder = fetch.swe_cache() / "tasks"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"offline-{key}.jsonl"
    # One builder at a time per cache (pytest sessions of several people or tools may start together).
    with open(folder / f".offline-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            partial = Path(f"{path}.partial")
            partial.unlink(missing_ok=True)
            cfg = BuildConfig(
                sdists=list(packages), bugs=n_per_package, out=partial, seed=seed, workers=workers,
                operators=tuple(operators),
            )  # fmt: skip
            records = build_tasks(cfg)
            counts = {p: sum(r["sao_mutation"]["sdist"] == p for r in records) for p in packages}
            need = n_per_package if min_per_package is None else min(min_per_package, n_per_package)
            short = [p for p, n in counts.items() if n < need]
            if short:
                raise RuntimeError(f"offline task build found too few bugs for {short} ({counts})")
            partial.rename(path)
        records = load_instances(path)
        ensure_task_images(records)
    return records


@dataclass(frozen=True)
class TaskSet:
    """A named set of offline tasks for a training job, split by the file or the function holding the bug.

    ``packages`` / ``bugs``: the sdists and the bugs wanted from each (``min_bugs``: fewer are kept when a package
    runs out of candidates, down to this many); ``held_out_paths``: source files (repo-relative) whose bugs form the
    ``heldout`` split, so training never sees those files nor their bugs; ``held_out_functions``: the share of the
    other functions (by a fixed hash of path and qualified name) whose bugs are held out too, so training sees the
    files (and their test files) but never those functions nor their bugs; ``operators``: the bug families kept
    (``mutations.OPERATORS``; narrower for a small model); ``hint``: what each problem statement also says of where
    the bug is (``instance.with_location_hint``: "function" names the function and its file, "line" its line too;
    easier tasks for a small model; "" nothing).
    """

    packages: tuple[str, ...]
    bugs: int
    held_out_paths: tuple[str, ...] = ()
    min_bugs: int | None = None
    operators: tuple[str, ...] = OPERATORS
    held_out_functions: float = 0.0
    hint: str = ""

    def __post_init__(self) -> None:
        if self.hint not in HINTS:
            raise ValueError(f"TaskSet hint {self.hint!r}: choose one of {HINTS}")

    def held_out(self, mutation: dict[str, Any]) -> bool:
        """Whether the bug described by ``mutation`` (a record's ``sao_mutation``) is in the ``heldout`` split."""
        if mutation["path"] in self.held_out_paths:
            return True
        key = f"{mutation['path']}::{mutation.get('function', '')}".encode()
        return int(hashlib.sha256(key).hexdigest()[:8], 16) < self.held_out_functions * (1 << 32)


TASK_SETS: dict[str, TaskSet] = {
    # The CI smoke: the four tasks the other SWE tests build (cached in CI): toolz trains, six is held out.
    "smoke": TaskSet(DEFAULT_PACKAGES, 2, held_out_paths=("six.py",)),
    # configs/swe_quickstart.yaml (docs/swe_job.md): the families whose fix is a local rewrite of the line that holds
    # the bug (flip a comparison, swap the arguments back, undo an and/or swap or a shifted constant); a third of the
    # functions of both packages held out; each issue names the function, the file and the line the failure comes
    # from (never the fix). The families that need code the task never shows (a removed branch, the value a
    # `return None` replaced) are left out: SmolLM2-135M resolved 0/16 held-out tasks with them in; naming no place
    # it resolved 0/23 (it grepped for functions nothing had named); naming the function 0/34 (it found the function
    # in 30 of 34 but copied a line that was not the bug's, or none, into its edit).
    "quickstart": TaskSet(
        DEFAULT_PACKAGES,
        80,
        min_bugs=6,
        operators=("comparison_flip", "off_by_one", "swapped_args", "bool_op_swap"),
        held_out_functions=1 / 3,
        hint="line",
    ),
}
SPLITS = ("train", "heldout")


def task_set(name: str, split: str = "train") -> list[dict[str, Any]]:
    """The ``split`` (``train`` / ``heldout``) of task set ``name``: built on first use (minutes), then cached."""
    if name not in TASK_SETS:
        raise ValueError(f"unknown SWE task set {name!r}; choose from {', '.join(sorted(TASK_SETS))}")
    if split not in SPLITS:
        raise ValueError(f"SWE task set {name!r}: unknown split {split!r}; choose from {', '.join(SPLITS)}")
    ts = TASK_SETS[name]
    records = ensure_offline_tasks(ts.bugs, ts.packages, min_per_package=ts.min_bugs, operators=ts.operators)
    picked = [
        r
        for r in records
        if r["sao_mutation"]["operator"] in ts.operators and ts.held_out(r["sao_mutation"]) == (split == "heldout")
    ]
    if not picked:
        raise RuntimeError(
            f"SWE task set {name!r} has no {split} tasks; widen its packages, held_out_paths or held_out_functions"
        )
    return _unique_issues([with_location_hint(r, ts.hint) if ts.hint else r for r in picked], name)


def _unique_issues(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """``records`` without those whose problem statement repeats an earlier one's (two bugs whose tests fail
    alike): an agent, the demonstrator or a grader of its prompt could not tell them apart. Each drop is logged."""
    seen: dict[str, str] = {}
    out = []
    for r in records:
        key = r["problem_statement"].strip()
        if key in seen:
            _log(f"task set {name!r}: dropping {r['instance_id']}: its problem statement repeats {seen[key]}'s")
            continue
        seen[key] = r["instance_id"]
        out.append(r)
    return out
