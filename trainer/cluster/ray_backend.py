"""``cluster.backend: ray``: Ray places every role of a training run; SAO adds no scheduler of its own.

Roles, each a Ray actor with the resources its ``cluster.*_resources`` entry asks for:

- ``TrainerRank`` x ``cluster.trainer_ranks``: one DeepSpeed world across the actors (gloo on CPU, NCCL on GPU;
  ``MASTER_ADDR`` is rank 0's node). Rank 0 runs the usual loop (``trainer.runs.run.Trainer.lead_run``; ``run_on_ray``
  is handed the ``Trainer`` class by ``trainer.runs.run.train``, the layer above), the others follow its commands,
  exactly as under torchrun.
- ``EngineHost`` x ``cluster.engines``: starts a server of ``rollout.engine`` (its registry entry's ``serve``: for
  ``vllm``, a vLLM server with the SAO worker extension) on its node, from a model directory local to that node
  (``tiny:*`` models are written there from the same seed as the trainer's). Engines whose entry declares no Ray
  engine actor take their servers from ``rollout.vllm_urls``.
- ``RolloutWorker`` x ``cluster.rollout_workers`` (spread over the nodes): plays episodes against the engines (the
  entry's ``connect``) with
  sandboxes from its node's sandbox host. Rank 0 hands each episode to the least busy live worker; a worker that
  dies turns its episodes into ``infra_error`` records and is not used again.
- ``SandboxHost``, one per node that has rollout workers (``cluster.sandbox_resources``, pinned to the node):
  the node's Docker engine and its warm pool; runs the sandbox calls of the node's episodes
  (``sao.trainer.cluster.sandbox_host``). Ray restarts a dead one up to ``cluster.sandbox_host_restarts`` times; the
  episodes that were using it are infra errors.

Weights reach the engines through ``rollout.weight_sync`` (``broadcast`` needs no filesystem shared by the nodes;
``checkpoint`` does). The run directory lives on rank 0's node. It runs on an existing cluster
(``cluster.address``; ``ray start --head`` / ``ray start --address=...``, Slurm or KubeRay: docs/scale.md) or on
a local Ray instance when the address is null. Actors are named ``sao-trainer-<i>``, ``sao-engine-<i>``,
``sao-rollout-<i>``, ``sao-sandbox-<i>`` in the Ray namespace ``sao``. Every actor is owned by the driver (``sao
train``): if the driver dies, Ray ends them all (an engine's vLLM server is ended by a watchdog process).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sao.agent.engines.registry import engine_spec
from sao.agent.episodes import Episode, infra_error_trajectory
from sao.agent.records import Trajectory
from sao.trainer.cluster.engine_host import EngineHostImpl
from sao.trainer.cluster.sandbox_host import RemoteSandbox, SandboxHostClient, SandboxHostImpl, episode_sandboxes
from sao.trainer.config import Config
from sao.trainer.rollout.runner import episode_runner

NAMESPACE = "sao"


def _options(resources: dict[str, Any], name: str, max_restarts: int = 0) -> dict[str, Any]:
    out = {k: v for k, v in resources.items() if k in ("num_cpus", "num_gpus", "memory", "resources")}
    return {**out, "name": name, "namespace": NAMESPACE, "max_restarts": max_restarts}


class RolloutWorkerImpl:
    """Plays episodes on this node against the engine URLs, with sandboxes from the node's sandbox host."""

    def __init__(self, cfg_dict: dict[str, Any], urls: list[str]) -> None:
        from sao.trainer.config import config_from_dict
        from sao.trainer.learn.models import load_tokenizer

        cfg = config_from_dict(cfg_dict)
        connect = engine_spec(cfg.rollout.engine).connect
        assert connect is not None, "config validation admits only server engines under cluster.backend=ray"
        self.engine: Any = connect(urls, ())  # set_version: every server engine's client tags generations with it
        self.runner = episode_runner(cfg, self.engine, load_tokenizer(cfg))
        self.sandboxes: SandboxHostClient | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._opening = asyncio.Lock()  # episodes arrive concurrently: open the pools once

    async def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    async def attach_sandbox_host(self, host: Any, name: str) -> None:
        """Take this node's sandboxes from ``host`` (before the first episode)."""
        self.sandboxes = SandboxHostClient(host, name)

    async def _open(self) -> None:
        from sao.sandboxes.pool import use_pools

        async with self._opening:
            if self._stack is not None:
                return
            stack = contextlib.AsyncExitStack()
            if self.sandboxes is not None:
                await stack.enter_async_context(use_pools(self.sandboxes))
            await stack.enter_async_context(self.runner)
            self._stack = stack

    async def run_one(self, episode: Episode) -> list[Trajectory]:
        import dataclasses

        import ray

        if self._stack is None:
            await self._open()
        boxes: list[RemoteSandbox] = []
        episode_sandboxes.set(boxes)  # this call's own context: the sandboxes of this episode only
        rows = await self.runner.run_one(episode)
        info: dict[str, Any] = {"ray_node": ray.get_runtime_context().get_node_id()}
        lost = next((b.failed for b in boxes if b.failed), None)
        if lost is not None and rows[-1].status != "infra_error":  # e.g. the env's teardown swallowed the error
            rows = [infra_error_trajectory(rows[-1].task_id, rows[-1].env_id, lost, with_traceback=False)]
            info["episode"], info["seed"] = episode.index, episode.seed
        if self.sandboxes is not None and self.sandboxes.lost is not None:
            info["sandbox_host_lost"] = self.sandboxes.lost
        return [dataclasses.replace(t, info={**t.info, **info}) for t in rows]

    async def set_version(self, version: int) -> None:
        self.engine.set_version(version)

    async def close(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
        await self.engine.close()


class RayRolloutRunner:
    """Rank 0's episode runner: each episode goes to the least busy live ``RolloutWorker``."""

    def __init__(self, workers: list[Any], names: list[str], env_id: str) -> None:
        self.workers, self.names, self.env_id = list(workers), list(names), env_id
        self.busy = [0] * len(self.workers)
        self.dead: set[int] = set()

    async def run_one(self, episode: Episode) -> list[Trajectory] | Trajectory:
        """The episode's rows from the least busy live worker (one infra-error record when none can play it)."""
        import ray

        live = [i for i in range(len(self.workers)) if i not in self.dead]
        task_id = episode.tid
        if not live:
            # not a hot loop: with every worker gone (e.g. the job's driver died and Ray is ending its actors) the
            # coordinator would otherwise write thousands of these records a second
            await asyncio.sleep(1.0)
            return infra_error_trajectory(task_id, self.env_id, "no live rollout worker left", with_traceback=False)
        i = min(live, key=lambda j: self.busy[j])
        self.busy[i] += 1
        try:
            got: list[Trajectory] | Trajectory = await self.workers[i].run_one.remote(episode)
            last = got[-1] if isinstance(got, list) else got
            if last.info.get("sandbox_host_lost"):  # its node has no sandboxes any more: the other nodes go on
                self.dead.add(i)
            return got
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
            self.dead.add(i)
            msg = f"rollout worker {self.names[i]} died: {type(e).__name__}"
            return infra_error_trajectory(task_id, self.env_id, msg, with_traceback=False)
        finally:
            self.busy[i] -= 1

    def set_version(self, version: int) -> None:
        for i, w in enumerate(self.workers):
            if i not in self.dead:
                w.set_version.remote(version)


class RayEngineClient:
    """Rank 0's client of the Ray-placed engines (``client``: the engine entry's ``connect`` on their URLs): after
    each weight sync it tells the rollout workers the version the servers now serve (their own clients tag
    generations with it; a late notice tags older, never newer)."""

    def __init__(self, client: Any, runner: RayRolloutRunner) -> None:
        self.client, self.runner = client, runner

    @property
    def version(self) -> int:
        return int(self.client.version)

    @property
    def sync_world_size(self) -> int:
        return int(self.client.sync_world_size)

    async def generate(self, prompt_ids: list[int], sampling: Any) -> Any:
        return await self.client.generate(prompt_ids, sampling)

    async def update_weights(self, checkpoint_dir: str, version: int) -> None:
        await self.client.update_weights(checkpoint_dir, version)
        self.runner.set_version(self.version)

    async def receive_weights(self, plan: Any) -> None:
        await self.client.receive_weights(plan)
        self.runner.set_version(self.version)

    async def close(self) -> None:
        await self.client.close()


class RayPlacement:
    """What rank 0's ``Trainer`` uses instead of local parts: the engines' client and the remote runner."""

    def __init__(self, urls: list[str], workers: list[Any], names: list[str], env_id: str, engine: str) -> None:
        self.urls, self.engine = urls, engine
        self.runner = RayRolloutRunner(workers, names, env_id)

    def make_engine(self) -> RayEngineClient:
        connect = engine_spec(self.engine).connect
        assert connect is not None, "config validation admits only server engines under cluster.backend=ray"
        return RayEngineClient(connect(self.urls, ()), self.runner)


class TrainerRankImpl:
    """One rank of the trainer's DeepSpeed world; ``make_trainer`` is ``trainer.runs.run.Trainer``."""

    def __init__(self, make_trainer: Callable[..., Any]) -> None:
        self.make_trainer = make_trainer

    def node_ip(self) -> str:
        import ray

        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]

    def free_port(self) -> int:
        from sao.trainer.cluster.weights import free_port

        return free_port()

    def train(
        self,
        cfg_dict: dict[str, Any],
        run_dir: str,
        state: dict[str, Any] | None,
        rank: int,
        world: int,
        master: tuple[str, int],
        placement: tuple[list[str], list[Any], list[str]] | None,
    ) -> dict[str, Any]:
        import asyncio

        from sao.trainer import distributed as dist_utils
        from sao.trainer.config import config_from_dict, save_config

        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK="0",  # Ray gives each GPU actor its own CUDA_VISIBLE_DEVICES: its GPU is device 0
            MASTER_ADDR=master[0],
            MASTER_PORT=str(master[1]),
        )
        cfg = config_from_dict(cfg_dict)
        dist_utils.init_distributed()
        rank0 = dist_utils.rank() == 0
        assert placement is not None or not rank0
        cluster = None
        if rank0 and placement is not None:
            cluster = RayPlacement(*placement, env_id=cfg.env.id, engine=cfg.rollout.engine)
        trainer = self.make_trainer(cfg, Path(run_dir), state, cluster=cluster)
        last: dict[str, Any] = {}
        if trainer.rank0:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            save_config(cfg, Path(run_dir) / "config.yaml")
            last = asyncio.run(trainer.lead_run())
        else:
            trainer.follow()
        dist_utils.barrier()
        stopped = trainer.stopped
        return {
            "step": trainer.step,
            "stopped": None if stopped is None else stopped.reason,
            "exit_code": 0 if stopped is None else stopped.exit_code,
            **last,
        }


class TrainerRankLost(RuntimeError):
    """A trainer rank's actor died (its process killed, its node gone): the DeepSpeed world cannot go on without
    it, and nothing it held since the last checkpoint can be saved. The run ends resumable (exit 75): ``sao train
    --resume`` restarts every rank from the latest complete checkpoint, which the rename-on-complete writer keeps
    whole whatever moment the rank died at."""

    def __init__(self, rank: int, cause: str) -> None:
        super().__init__(f"trainer rank {rank} (sao-trainer-{rank}) died: {cause}")
        self.rank = rank


_RANK_DEATH_GRACE_S = 30.0  # after a rank's own error: how long to look for a peer's death that caused it


def _wait_for_ranks(refs: list[Any]) -> list[dict[str, Any]]:
    """Every rank's result; the first rank to die raises ``TrainerRankLost`` at once (the others, stuck in a
    collective with it, are not waited for). A rank's own exception is re-raised unless a peer died meanwhile
    (a collective broken by the dead peer raises in the live ranks first)."""
    import ray
    from ray.exceptions import RayActorError, WorkerCrashedError

    def lost(ref: Any, e: Exception) -> TrainerRankLost:
        return TrainerRankLost(refs.index(ref), f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(done[0])
        except (RayActorError, WorkerCrashedError) as e:
            raise lost(done[0], e) from e
        except Exception:
            ended, _ = ray.wait(pending, num_returns=len(pending), timeout=_RANK_DEATH_GRACE_S) if pending else ([], [])
            for ref in ended:
                try:
                    ray.get(ref)
                except (RayActorError, WorkerCrashedError) as e:
                    raise lost(ref, e) from e
                except Exception:  # that rank's own error; the first one is raised below
                    continue
            raise
    return [dict(r) for r in ray.get(refs)]


def _place_sandbox_hosts(cfg: Config, host_cls: Any, workers: list[Any]) -> list[Any]:
    """One sandbox host on each node that got rollout workers, pinned there; each worker attached to its node's."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    c = cfg.cluster
    nodes = ray.get([w.node_id.remote() for w in workers])
    hosts: dict[str, tuple[Any, str]] = {}
    for node in dict.fromkeys(nodes):
        name = f"sao-sandbox-{len(hosts)}"
        opts = _options(c.sandbox_resources, name, max_restarts=c.sandbox_host_restarts)
        pin = NodeAffinitySchedulingStrategy(node, soft=False)
        handle = host_cls.options(**opts, scheduling_strategy=pin, max_concurrency=1000).remote(cfg.rollout.concurrency)
        hosts[node] = (handle, name)
    ray.get([w.attach_sandbox_host.remote(*hosts[n]) for w, n in zip(workers, nodes, strict=True)])
    return [h for h, _ in hosts.values()]


def _connect(cfg: Config) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address=cfg.cluster.address, namespace=NAMESPACE, include_dashboard=False, log_to_driver=True)


def run_on_ray(
    cfg: Config, run_dir: Path, state: dict[str, Any] | None, make_trainer: Callable[..., Any]
) -> dict[str, Any]:
    """Place the roles, train, then stop every actor this run started; returns rank 0's last metrics with ``step``,
    ``stopped`` (a clean stop's reason, or None) and its ``exit_code``. A trainer rank that dies raises
    ``TrainerRankLost`` (``trainer.runs.run.train`` exits 75 on it). ``make_trainer``: ``trainer.runs.run.Trainer``
    (each trainer rank builds one), handed in by ``trainer.runs.run.train``."""
    import ray

    _connect(cfg)
    c = cfg.cluster
    cfg_dict = cfg.to_dict()
    # Ray's actor classes and handles are dynamic: typed as Any here.
    trainer_cls: Any = ray.remote(TrainerRankImpl)
    engine_cls: Any = ray.remote(EngineHostImpl)
    worker_cls: Any = ray.remote(RolloutWorkerImpl)
    host_cls: Any = ray.remote(SandboxHostImpl)
    actors: list[Any] = []
    engines: list[Any] = []
    hosts: list[Any] = []
    try:
        ranks: list[Any] = [
            trainer_cls.options(**_options(c.trainer_resources, f"sao-trainer-{i}")).remote(make_trainer)
            for i in range(c.trainer_ranks)
        ]
        actors += ranks
        master = (c.advertise_host or ray.get(ranks[0].node_ip.remote()), ray.get(ranks[0].free_port.remote()))
        urls = list(cfg.rollout.vllm_urls)
        if not urls:
            engines = [
                engine_cls.options(**_options(c.engine_resources, f"sao-engine-{i}")).remote() for i in range(c.engines)
            ]
            actors += engines
            urls = ray.get([e.start.remote(cfg_dict, c.advertise_host) for e in engines])
        names = [f"sao-rollout-{i}" for i in range(c.rollout_workers)]
        workers = [
            worker_cls.options(
                **_options(c.rollout_resources, n), scheduling_strategy="SPREAD", max_concurrency=1000
            ).remote(cfg_dict, urls)
            for n in names
        ]
        actors += workers
        hosts = _place_sandbox_hosts(cfg, host_cls, workers)
        actors += hosts
        refs = [
            r.train.remote(
                cfg_dict, str(run_dir), state, i, c.trainer_ranks, master, (urls, workers, names) if i == 0 else None
            )
            for i, r in enumerate(ranks)
        ]
        return _wait_for_ranks(refs)[0]
    finally:
        for h in hosts:
            try:
                ray.get(h.shutdown.remote(), timeout=60)  # its containers, leased ones too
            except Exception:  # a dead host's containers are reaped by the next pool on that Docker engine
                pass
        for e in engines:
            try:
                ray.get(e.stop.remote(), timeout=60)
            except Exception:  # a dead engine actor took its server's process group with it
                pass
        for a in actors:
            ray.kill(a)
