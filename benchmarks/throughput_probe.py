"""Instruments for `sao bench throughput`, installed inside a variant's own process: where its time and CPU go.

- :func:`time_learner_phases`: wraps the learner's phases so each step's metrics row also carries their wall
  times: ``time_values_s`` (the critic's values for the advantages; where a critic trains, the first of the K
  critic steps shares their forward and is counted here), ``time_old_logp_s`` (an old-policy recompute, GRPO's PPO
  clip), ``time_actor_s`` (the actor's optimizer step(s), recompute included), ``time_critic_s`` (the other critic
  steps) and ``time_learner_s`` (the whole ``train_step``), and ``learner_end``
  (wall clock at the step's end, to cut the sampler's series at step boundaries).
- :class:`CpuSampler`: a thread that reads, every ``period_s``, the CPU seconds used so far by this process (the
  trainer: learner, agent loop, sandbox client), by its child processes by kind (the vLLM server and its engine
  core; anything else), by the Docker sandboxes this process created (their cgroup's ``cpuacct``; containers are
  found by the ``sao.owner_pid`` label), and by the whole machine (``/proc/stat``: other jobs included).
  Processes and containers keep the last value read before they ended, so their figures are lower bounds
  (by at most one period of their CPU).

Bench code only: the product's classes are wrapped in the bench's spawned process, never in a user's run.
"""

from __future__ import annotations

import functools
import os
import resource
import threading
import time
from pathlib import Path
from typing import Any

# the values phase: alone, or (critic algorithms) fused with the first critic step, whose time it then holds
_PHASES = {"_critic_values": "values", "_values_with_critic_step": "values", "_policy_steps": "actor",
           "_critic_steps": "critic"}  # fmt: skip


def time_learner_phases() -> None:
    """Wrap ``sao.trainer.learn.learner.Learner`` (idempotent) so that ``train_step`` returns its phase timings too."""
    import torch

    from sao.trainer.learn.learner import Learner

    if getattr(Learner, "_bench_phase_timers", False):
        return
    acc: dict[str, float] = {}

    def sync() -> None:
        # CUDA kernels run behind the Python thread: without a sync a phase's GPU work lands in the next phase
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            torch.cuda.synchronize()

    def timed(label: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(self: Any, *a: Any, **k: Any) -> Any:
            sync()
            t0 = time.perf_counter()
            out = fn(self, *a, **k)
            sync()
            if label != "values" or self.critic is not None:  # without a critic the values phase does no work
                acc[label] = acc.get(label, 0.0) + time.perf_counter() - t0
            return out

        return wrapper

    for meth, label in _PHASES.items():
        setattr(Learner, meth, timed(label, getattr(Learner, meth)))
    logp = Learner._logp

    @functools.wraps(logp)
    def logp_timed(self: Any, *a: Any, **k: Any) -> Any:
        if torch.is_grad_enabled():  # the actor's loss forward: counted in "actor"
            return logp(self, *a, **k)
        t0 = time.perf_counter()
        try:
            return logp(self, *a, **k)
        finally:
            acc["old_logp"] = acc.get("old_logp", 0.0) + time.perf_counter() - t0

    step = Learner.train_step

    @functools.wraps(step)
    def train_step(self: Any, trajs: Any, *a: Any, **k: Any) -> dict[str, float]:
        acc.clear()
        sync()
        t0 = time.perf_counter()
        m = step(self, trajs, *a, **k)
        sync()
        m["time_learner_s"] = time.perf_counter() - t0
        for label in (*_PHASES.values(), "old_logp"):
            m[f"time_{label}_s"] = acc.get(label, 0.0)
        m["learner_end"] = time.time()
        return m

    Learner._logp = logp_timed  # type: ignore[method-assign]
    Learner.train_step = train_step  # type: ignore[method-assign]
    Learner._bench_phase_timers = True  # type: ignore[attr-defined]


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (not idle, not waiting for I/O) since boot, all cores."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _container_cpu_s(cid: str) -> float | None:
    """A container's CPU seconds from its cgroup (v1 ``cpuacct`` with the cgroupfs or systemd driver, or v2)."""
    for p, scale, key in (
        (f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage", 1e-9, None),
        (f"/sys/fs/cgroup/cpuacct/system.slice/docker-{cid}.scope/cpuacct.usage", 1e-9, None),
        (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat", 1e-6, "usage_usec"),
        (f"/sys/fs/cgroup/docker/{cid}/cpu.stat", 1e-6, "usage_usec"),
    ):
        try:
            text = Path(p).read_text()
        except OSError:
            continue
        if key is None:
            return int(text.strip()) * scale
        for line in text.splitlines():
            name, _, val = line.partition(" ")
            if name == key:
                return int(val) * scale
    return None


class CpuSampler:
    """Cumulative CPU seconds by part, sampled by a daemon thread (see the module docstring)."""

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = period_s
        self.samples: list[dict[str, float]] = []
        self._procs: dict[int, tuple[str, float]] = {}
        self._containers: dict[str, float] = {}
        self._listed: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-cpu-sampler", daemon=True)
        self._docker: Any = None

    @property
    def containers_measured(self) -> bool:
        """False when containers were found but none of their cgroups could be read (sandbox CPU unknown, not 0);
        a container listed before its cgroup exists or after it is gone is not a failure."""
        return not self._listed or bool(self._containers)

    def start(self) -> CpuSampler:
        try:
            import docker

            self._docker = docker.from_env()
        except Exception:  # no Docker here (e.g. the simulated-latency configs): sandboxes count as 0
            self._docker = None
        self.samples.append(self.sample())
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, float]]:
        self._stop.set()
        self._thread.join(timeout=10)
        self.samples.append(self.sample())
        if self._docker is not None:
            self._docker.close()
        return self.samples

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.samples.append(self.sample())
            except Exception:  # a process or container that ended between listing and reading it
                continue

    def sample(self) -> dict[str, float]:
        import psutil

        ru = resource.getrusage(resource.RUSAGE_SELF)
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            children = []
        for p in children:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    kind = "vllm" if "vllm" in " ".join(p.cmdline()) or p.name().startswith("VLLM") else "other"
            except psutil.Error:
                continue
            cpu = t.user + t.system + t.children_user + t.children_system
            prev = self._procs.get(p.pid)
            # vLLM's engine core renames itself; once a vllm process, always one
            self._procs[p.pid] = (prev[0] if prev and prev[0] == "vllm" else kind, max(cpu, prev[1] if prev else 0.0))
        if self._docker is not None:
            try:
                found = self._docker.containers.list(filters={"label": f"sao.owner_pid={os.getpid()}"})
            except Exception:
                found = []
            for c in found:
                self._listed.add(c.id)
                cpu = _container_cpu_s(c.id)
                if cpu is None:
                    continue
                self._containers[c.id] = max(cpu, self._containers.get(c.id, 0.0))
        return {
            "t": time.time(),
            "trainer": ru.ru_utime + ru.ru_stime,
            "vllm": sum(c for k, c in self._procs.values() if k == "vllm"),
            "other_children": sum(c for k, c in self._procs.values() if k != "vllm"),
            "sandboxes": sum(self._containers.values()),
            "machine": _machine_busy_s(),
        }


CPU_PARTS = ("trainer", "vllm", "sandboxes", "other_children", "machine")


def cores_used(samples: list[dict[str, float]], t0: float, t1: float) -> dict[str, float]:
    """Mean cores busy per part between wall-clock times ``t0`` and ``t1`` (the samples nearest inside them)."""
    inside = [s for s in samples if t0 <= s["t"] <= t1]
    if len(inside) < 2:
        inside = samples[:1] + samples[-1:] if len(samples) >= 2 else []
    if len(inside) < 2 or inside[-1]["t"] <= inside[0]["t"]:
        return {k: float("nan") for k in CPU_PARTS} | {"window_s": 0.0}
    a, b = inside[0], inside[-1]
    span = b["t"] - a["t"]
    return {k: (b[k] - a[k]) / span for k in CPU_PARTS} | {"window_s": span}
