"""Build offline SWE tasks from a PyPI sdist: baseline run, AST mutations, validation, instance records.

Design: the bug lives in the task image. Each task image is the package's repo image with the mutation applied and
its repository made anew from the buggy tree (one commit, nothing of the fixed code left: ``images``), so
``/testbed`` HEAD (= ``base_commit``) is the buggy state and ``patch`` (the fix) is the reverse of the mutation.
The official harness and ``SWEEnv`` both just start the task image; nothing is applied at reset.

A candidate bug is kept only if, run on the test files that mention the mutated function, at least one baseline-
passing test fails with the bug and passes without it, and it breaks at most ``max_f2p`` tests. ``PASS_TO_PASS`` is
the other baseline-passing tests of the files holding the failing ones; the eval script runs only those files.
With ``verify`` each kept task is graded once with its gold patch through ``sao.envs.swe.grading`` (must resolve).
Every task image is audited (``audit``): one that would let the agent read the fix stops the build.
"""

from __future__ import annotations

import hashlib
import random
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# the submodules by their path: ``from sao.envs.swe.tasks import ...`` would import the package, whose __init__
# imports this module (an import circle)
import sao.envs.swe.tasks.audit as audit
import sao.envs.swe.tasks.fetch as fetch
import sao.envs.swe.tasks.images as images
import sao.envs.swe.tasks.instance as instance
from sao.core.console import eta_text, say
from sao.envs.swe.tasks.mutations import OPERATORS, Mutation, is_valid, mutations
from sao.envs.swe.tasks.runner import FAILING, BuilderContainer, failure_excerpts
from sao.sandboxes.docker import get_client
from sao.sandboxes.images import require_base_image


@dataclass
class BuildConfig:
    """What ``sao tasks build`` builds. ``bugs`` is per sdist."""

    sdists: list[str]
    bugs: int = 5
    out: Path | None = None
    max_candidates: int = 200
    workers: int = 2
    seed: int = 0
    operators: tuple[str, ...] = OPERATORS
    max_f2p: int = 20
    max_test_files: int = 3
    verify: bool = True
    extra_test_deps: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.bugs < 1:
            raise ValueError(f"bugs={self.bugs}: ask for at least 1 bug per sdist")
        if not 1 <= self.workers <= 8:
            raise ValueError(f"workers={self.workers}: use 1..8 builder containers (2 on a 2-core machine)")
        if not self.sdists:
            raise ValueError("no sdist given; pass e.g. --sdist click==8.5.1")
        for spec in self.sdists:
            fetch.SdistSpec.parse(spec)
        unknown = set(self.operators) - set(OPERATORS)
        if unknown:
            raise ValueError(f"unknown mutation operators {sorted(unknown)}; choose from {', '.join(OPERATORS)}")


@dataclass
class _Candidate:
    mutation: Mutation
    test_files: list[str]


Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    say(f"[sao tasks] {msg}")


def _relevant_tests(mut: Mutation, tests: dict[str, str], limit: int) -> list[str]:
    """Test files that mention the mutated function or its enclosing function/class (dunders skipped), files
    naming more of them and files named after the module first."""
    names = [p for p in mut.function.split(".") if not (p.startswith("__") and p.endswith("__"))]
    stem = Path(mut.path).stem.lstrip("_")
    words = [re.compile(rf"\b{re.escape(n)}\b") for n in names]
    scored = [(sum(bool(w.search(text)) for w in words), f) for f, text in tests.items()]
    hits = [(n, f) for n, f in scored if n]
    hits.sort(key=lambda x: (-x[0], stem not in Path(x[1]).stem, x[1]))
    return [f for _, f in hits[:limit]]


def _candidates(sources: dict[str, str], tests: dict[str, str], cfg: BuildConfig) -> list[_Candidate]:
    """Round-robin over operators, shuffled by seed, so a small budget still yields varied bugs."""
    rng = random.Random(cfg.seed)
    by_op: dict[str, list[_Candidate]] = {op: [] for op in cfg.operators}
    for path, text in sorted(sources.items()):
        try:
            muts = list(mutations(text, path, cfg.operators, validate=False))
        except SyntaxError:
            continue
        memo: dict[str, list[str]] = {}
        for m in muts:
            if m.function not in memo:
                memo[m.function] = _relevant_tests(m, tests, cfg.max_test_files)
            files = memo[m.function]
            if files:
                by_op[m.operator].append(_Candidate(m, files))
    for lst in by_op.values():
        rng.shuffle(lst)
    out: list[_Candidate] = []
    while any(by_op.values()):
        for op in cfg.operators:
            if by_op[op]:
                out.append(by_op[op].pop())
    return out


@dataclass
class _Found:
    mutation: Mutation
    fix_patch: str
    f2p: list[str]
    p2p: list[str]
    eval_files: list[str]
    excerpts: list[tuple[str, list[str]]]


def _try(box: BuilderContainer, cand: _Candidate, baseline: dict[str, str], cfg: BuildConfig) -> _Found | None:
    """Apply one mutation in ``box``; return the task if it meets the keep rule. Always leaves the tree clean."""
    m = cand.mutation
    if not is_valid(m.source):
        return None
    try:
        box.write(m.path, m.source)
        # One run: a survivor needs the whole files anyway, and --maxfail stops early on bugs that break too much.
        run = box.pytest(cand.test_files, f"--tb=short --maxfail={cfg.max_f2p + 1}", timeout=180)
        if run.exit_code != 1:  # 0: survived; 2+: collection/usage error; 124: timeout
            return None
        f2p = sorted(t for t, s in run.status.items() if s in FAILING and baseline.get(t) == "PASSED")
        if not 1 <= len(f2p) <= cfg.max_f2p:
            return None
        eval_files = sorted({t.split("::")[0] for t in f2p})
        p2p = sorted(
            t
            for t, s in baseline.items()
            if s == "PASSED" and t.split("::")[0] in eval_files and t not in f2p and run.status.get(t) == "PASSED"
        )
        # Every baseline-passing test of the eval files must be accounted for (F2P or still passing).
        expected = {t for t, s in baseline.items() if s == "PASSED" and t.split("::")[0] in eval_files}
        if expected != set(f2p) | set(p2p):
            return None
        fix_patch = box.check("git diff -R --src-prefix=b/ --dst-prefix=a/")  # -R swaps the prefixes back
        return _Found(m, fix_patch, f2p, p2p, eval_files, failure_excerpts(run.output))
    finally:
        box.reset()


def _record(spec: fetch.SdistSpec, task_image: str, base_commit: str, found: _Found) -> dict[str, Any]:
    digest = hashlib.sha256(found.fix_patch.encode()).hexdigest()[:8]
    m = found.mutation
    return {
        "instance_id": f"pypi__{spec.slug}-{spec.version}-{digest}",
        "repo": f"pypi/{spec.name}",
        "version": spec.version,
        "base_commit": base_commit,
        "environment_setup_commit": base_commit,
        "problem_statement": instance.problem_statement(spec.name, found.f2p, found.excerpts),
        "hints_text": "",
        "patch": found.fix_patch,
        "test_patch": "",
        "FAIL_TO_PASS": found.f2p,
        "PASS_TO_PASS": found.p2p,
        "image": task_image,
        "eval_script": instance.eval_script(base_commit, found.eval_files),
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "sao_mutation": {"operator": m.operator, "path": m.path, "function": m.function, "description": m.description},
    }


def _repo_image(spec: fetch.SdistSpec, cfg: BuildConfig, log: Log, t0: float) -> str:
    """The package's repo image: its sdist and wheels fetched, the image built on the offline base image."""
    sdist = fetch.fetch_sdist(spec)
    wheels = fetch.fetch_wheels(spec, sdist, cfg.extra_test_deps)
    test_deps = [*fetch.ALWAYS_TEST_DEPS, *fetch.KNOWN_TEST_DEPS.get(spec.name, []), *cfg.extra_test_deps]
    repo_image = images.ensure_repo_image(spec, sdist, wheels, require_base_image(), test_deps)
    log(f"{spec}: repo image {repo_image} ready ({time.monotonic() - t0:.0f}s)")
    return repo_image


def _baseline(
    box: BuilderContainer, spec: fetch.SdistSpec, log: Log
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(test -> status of the unmutated tree, source files, test files); an sdist without a passing test fails."""
    src_files, test_files = box.tracked_python_files()
    if not test_files:
        raise RuntimeError(f"{spec}: the sdist ships no test files (test_*.py); pick a package that does")
    base = box.pytest(test_files, "-q --tb=no", timeout=1800)
    baseline = base.status
    n_pass = sum(s == "PASSED" for s in baseline.values())
    log(f"{spec}: baseline {n_pass} passing of {len(baseline)} tests in {base.seconds:.0f}s")
    if n_pass == 0:
        raise RuntimeError(f"{spec}: no test passes in the baseline run:\n{base.output[-2000:]}")
    return baseline, {f: box.read(f) for f in src_files}, {f: box.read(f) for f in test_files}


class _Search:
    """The workers' shared search over the candidates, in order: one task per (path, function), ``cfg.bugs`` in
    all. A found bug is verified by the worker that found it; a drop frees its slot so the search goes on."""

    def __init__(
        self, spec: fetch.SdistSpec, cfg: BuildConfig, client: Any, repo_image: str, baseline: dict[str, str],
        cands: list[_Candidate], log: Log,
    ) -> None:  # fmt: skip
        self.spec, self.cfg, self.client, self.repo_image, self.log = spec, cfg, client, repo_image, log
        self.baseline, self.queue = baseline, list(cands)
        self.records: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.taken: set[tuple[str, str]] = set()
        self.tried = self.pending = 0
        self.t_search = time.monotonic()

    def run(self, boxes: list[BuilderContainer]) -> list[dict[str, Any]]:
        with ThreadPoolExecutor(len(boxes)) as pool:
            for fut in [pool.submit(self.work, b) for b in boxes]:
                fut.result()
        return self.records

    def finish(self, f: _Found) -> dict[str, Any] | None:
        """The task record of a found bug: its task image built and audited, its gold patch verified."""
        from sao.envs.swe.grading import grade_patch

        spec, client = self.spec, self.client
        task_image = images.ensure_task_image(self.repo_image, f.fix_patch)
        rec = _record(spec, task_image, _head_of(client, task_image), f)
        rec["sao_mutation"].update({"sdist": str(spec), "repo_image": self.repo_image})
        found = audit.audit_image(client, rec)
        own = [f"/testbed/{f.mutation.path}"]
        repeated = found["copies_of_the_fix"] == own
        # the fixed lines standing elsewhere in the very file the bug is in (code the package itself repeats) are
        # not a leak of the recipe, but a task the agent could solve by copying: dropped like a failed candidate,
        # unless the image leaks the fix in another way too
        leaks = audit.problems({**found, "copies_of_the_fix": []} if repeated else found, rec)
        if repeated and not leaks:
            where = f.mutation.path
            self.log(f"{spec}: dropping {rec['instance_id']}: the fixed lines also stand elsewhere in {where}")
            return None
        if leaks:  # the recipe is broken for this package: every task would hand the agent its fix
            raise images.ImageBuildError(f"task image {task_image} lets the agent read the fix: {'; '.join(leaks)}")
        if self.cfg.verify and not grade_patch(rec, rec["patch"]).resolved:
            self.log(f"{spec}: dropping {rec['instance_id']}: its gold patch did not resolve it in a fresh container")
            return None
        return rec

    def _full(self) -> bool:
        return len(self.records) + self.pending >= self.cfg.bugs

    def work(self, box: BuilderContainer) -> None:
        cfg = self.cfg
        while True:
            with self.lock:
                if self._full() or not self.queue:
                    return
                cand = self.queue.pop(0)
                key = (cand.mutation.path, cand.mutation.function)
                if key in self.taken:
                    continue
                self.tried += 1
            res = _try(box, cand, self.baseline, cfg)
            with self.lock:
                if res is None or key in self.taken or self._full():
                    continue
                self.taken.add(key)
                self.pending += 1
            rec = None
            try:
                rec = self.finish(res)
            finally:
                with self.lock:
                    self.pending -= 1
                    if rec is not None:
                        self.records.append(rec)
                        if cfg.out is not None:
                            instance.append_instance(cfg.out, rec)
                        self.log(
                            f"{self.spec}: task {len(self.records)}/{cfg.bugs} after {self.tried} tries: "
                            f"{res.mutation.operator} in {res.mutation.function}, {len(res.f2p)} failing test(s); "
                            + eta_text(time.monotonic() - self.t_search, len(self.records), cfg.bugs)
                        )


def build_for_sdist(spec_text: str, cfg: BuildConfig, client: Any, log: Log = _stderr) -> list[dict[str, Any]]:
    spec = fetch.SdistSpec.parse(spec_text)
    t0 = time.monotonic()
    repo_image = _repo_image(spec, cfg, log, t0)
    boxes = [BuilderContainer(client, repo_image) for _ in range(cfg.workers)]
    try:
        baseline, sources, tests = _baseline(boxes[0], spec, log)
        cands = _candidates(sources, tests, cfg)[: cfg.max_candidates]
        log(f"{spec}: {len(cands)} candidate mutations to try")
        records = _Search(spec, cfg, client, repo_image, baseline, cands, log).run(boxes)
    finally:
        for b in boxes:
            b.close()
    log(f"{spec}: {len(records)} task(s) in {time.monotonic() - t0:.0f}s")
    return records


def _head_of(client: Any, image: str) -> str:
    out = client.containers.run(image, ["git", "-C", "/testbed", "rev-parse", "HEAD"], remove=True, network_mode="none")
    return str(out.decode().strip())


def build_tasks(cfg: BuildConfig, log: Log = _stderr) -> list[dict[str, Any]]:
    """Build ``cfg.bugs`` validated tasks for each sdist in ``cfg.sdists`` (appending to ``cfg.out`` as made). Needs a
    Docker daemon and the offline base image (``sao tasks build`` makes both first: ``sao.core.setup``); a missing one
    is an error naming the setup step."""
    import docker

    get_client()  # a daemon that does not answer: SandboxUnavailableError naming the setup step that starts one
    client = docker.from_env(timeout=1800)
    try:
        out: list[dict[str, Any]] = []
        for s in cfg.sdists:
            out += build_for_sdist(s, cfg, client, log)
        return out
    finally:
        client.close()
