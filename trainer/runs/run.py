"""`sao train`: set up a run directory, the learner on every rank and the rollout pipeline on rank 0, and train.

Rank 0 runs an asyncio loop: the coordinator keeps episodes in flight while the learner step runs in a worker
thread (torch releases the GIL), so generation and training overlap. Every learner action is a command that
rank 0 broadcasts and all ranks execute in the same order (train / save / export / stop), which keeps the
collective DeepSpeed calls in lockstep.
"""

from __future__ import annotations

import asyncio
import copy
import random
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sao.agent.engines.protocols import EngineError
from sao.agent.engines.registry import InProcessArgs, ServeArgs, engine_spec
from sao.agent.engines.vllm_check import check_servers
from sao.agent.records import Trajectory
from sao.core import memory
from sao.core.jsonl import append_jsonl, write_json_atomic
from sao.envs.registration import preflight
from sao.eval.view.formats import TOKEN_RECORDS
from sao.trainer import distributed as dist_utils
from sao.trainer.config import Config, ConfigError, load_config, resumed_config, save_config
from sao.trainer.learn.learner import Learner
from sao.trainer.learn.token_records import drop_records_after, token_record, write_token_records
from sao.trainer.rollout.env_tasks import load_env_tasks
from sao.trainer.rollout.ledger import Ledger, replay
from sao.trainer.rollout.pipeline import Coordinator, Counters, Item, TaskSource
from sao.trainer.rollout.runner import episode_runner
from sao.trainer.rollout.versions import Lineage
from sao.trainer.runs.commands import Command, Export, PushWeights, Save, Saved, Stop, Train
from sao.trainer.runs.metrics import MetricsWriter, plot_run
from sao.trainer.runs.progress import TrainProgress
from sao.trainer.runs.run_folder import (
    checkpoint_paths,
    commit_checkpoint,
    latest_checkpoint,
    latest_state,
    refuse_existing_run,
)
from sao.trainer.runs.stopping import EXIT_RESUMABLE, ServerWatch, StopRequest, next_batch_or_stop


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state().tolist(),
    }


def _set_rng_state(s: dict[str, Any]) -> None:
    py = s["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = s["numpy"]
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(torch.tensor(s["torch"], dtype=torch.uint8))


def prepare_run_dir(cfg: Config, resume: str | None) -> tuple[Config, Path, dict[str, Any] | None]:
    """Check the run dir before any work: a new run needs a fresh dir; a resume needs the same config."""
    if resume is None:
        run_dir = Path(cfg.run.dir)
        refuse_existing_run(run_dir, "train", "trajectories.jsonl")
        return cfg, run_dir, None
    run_dir = Path(resume)
    saved = resumed_config(cfg, resume)
    saved.run.total_steps = cfg.run.total_steps
    saved.run.dir = str(run_dir)
    return saved, run_dir, latest_state(run_dir)


def _allowed_ids(cfg: Config, tokenizer: Any) -> list[int] | None:
    words = cfg.rollout.action_vocab
    if not words:
        return None
    ids = []
    for w in words:
        toks = tokenizer.encode(str(w), add_special_tokens=False)
        if len(toks) != 1:
            raise ConfigError(f"rollout.action_vocab: {w!r} is {len(toks)} tokens; use words that are one token")
        ids.append(int(toks[0]))
    return ids


@dataclass
class _Session:
    """What rank 0's training loop runs with; ``Trainer._close`` releases it."""

    ledger: Ledger
    metrics: MetricsWriter
    engine: Any
    coord: Coordinator


class Trainer:
    """Everything one rank needs; ``run()`` trains until ``run.total_steps``."""

    def __init__(self, cfg: Config, run_dir: Path, state: dict[str, Any] | None, cluster: Any = None) -> None:
        """``cluster``: on rank 0 of ``cluster.backend=ray``, the placed engines and rollout workers
        (``sao.trainer.cluster.ray_backend.RayPlacement``); None: this process makes its own engine and runner."""
        from sao.trainer.learn.models import load_actor, load_critic, load_tokenizer

        self.cfg, self.run_dir, self.state = cfg, run_dir, state
        self.rank0 = dist_utils.rank() == 0
        _seed_all(cfg.run.seed)
        self.tokenizer = load_tokenizer(cfg)
        self.allowed = _allowed_ids(cfg, self.tokenizer)
        actor = load_actor(cfg)
        critic = load_critic(cfg, actor) if cfg.algorithm.critic else None
        self.engine_spec = engine_spec(cfg.rollout.engine)
        # An in-process engine samples from its own copy, taken before DeepSpeed partitions (ZeRO-3) the actor.
        in_process = self.engine_spec.placement == "in_process" and self.rank0
        self.engine_model = copy.deepcopy(actor).eval() if in_process else None
        self.cluster = cluster
        self._broadcast: Any = None  # rollout.weight_sync=broadcast: sao.trainer.cluster.weights.BroadcastSync
        self._server: Any = None  # a server engine without rollout.vllm_urls: the run's own server
        allowed = torch.tensor(self.allowed, dtype=torch.long) if self.allowed else None
        self.learner = Learner(cfg, actor, critic, int(self.tokenizer.pad_token_id), allowed=allowed)
        self.step, self.version = 0, 0
        self.warmup_done = 0  # critic-only warm-up batches trained (trainer.critic_warmup_steps)
        if state is not None:
            self.learner.load(Path(state["_dir"]))
            self.step, self.version = int(state["step"]), int(state["version"])
            self.warmup_done = int(state.get("critic_warmup_done", cfg.trainer.critic_warmup_steps))
            self.learner.baseline.load_state_dict(state["baseline"])
            _set_rng_state(state["rng"])
        self.checkpoint_failures = 0
        self._saved_step = self.step if state is not None else -1
        self.stopped: StopRequest | None = None  # every rank: why the run stopped before its last step
        self._watch: ServerWatch | None = None  # rank 0: the servers of rollout.vllm_urls, while the loop runs

    # -- commands executed by every rank in the same order ----------------------------------------------------
    def execute(self, cmd: Command) -> Any:
        """Run one command on this rank (rank 0 gets its result: metrics, ``Saved``, push timings)."""
        match cmd:
            case Train(trajs, policy, episodes):
                return self.learner.train_step(list(trajs), policy=policy, episodes=list(episodes) or None)
            case Export(out, critic):
                engine = self.learner.critic if critic else self.learner.actor
                assert engine is not None, "Export(critic=True) on an algorithm without a critic"
                sd = self.learner.gathered_state(engine)
                if sd is not None:
                    if critic:
                        engine.module.save(Path(out), state=sd)
                    else:
                        engine.module.save_pretrained(Path(out), state_dict=sd, safe_serialization=True)
                return None
            case Save(out):
                if not self.learner.params_finite():
                    return Saved(False)  # the last good checkpoint stays the latest
                try:
                    self.learner.save(Path(out))
                except (OSError, RuntimeError) as e:  # disk full (torch.save reports ENOSPC as a RuntimeError), ...
                    return Saved(False, f"{type(e).__name__}: {e}")  # the caller drops the partial folder
                return Saved(True)
            case PushWeights(plan):
                from sao.trainer.cluster.weights import push_command

                return push_command(
                    self.learner.actor.module, self._broadcast, plan, self.cfg.deepspeed.zero_stage == 3
                )
            case Stop(run_dir):
                if self.cfg.run.param_digest:
                    self._write_digest(Path(run_dir))
                return None
        raise TypeError(f"not a learner command: {cmd!r}")

    def _write_digest(self, run_dir: Path) -> None:
        import hashlib

        out: dict[str, str] = {}
        for name, eng in (("actor", self.learner.actor), ("critic", self.learner.critic)):
            if eng is None:
                continue
            sd = dist_utils.full_state_dict(eng.module, self.cfg.deepspeed.zero_stage, all_ranks=True)
            assert sd is not None
            h = hashlib.sha256()
            for k, v in sorted(sd.items()):
                h.update(k.encode())
                h.update(v.float().numpy().tobytes())
            out[name] = h.hexdigest()
        d = run_dir / "param_digest"
        d.mkdir(parents=True, exist_ok=True)
        write_json_atomic(d / f"rank{dist_utils.rank()}.json", out, indent=None)

    def follow(self) -> None:
        """Ranks > 0: execute rank 0's commands until it says stop."""
        # SIGTERM goes to every rank; rank 0 turns it into a checkpoint and a stop command that all ranks execute.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            cmd = dist_utils.broadcast_object(None)
            self.execute(cmd)
            memory.trim_heap()  # as rank 0 does after each step: the freed heap would otherwise stay resident
            if isinstance(cmd, Stop):
                if cmd.reason is not None:  # rank 0 stopped the run: this rank exits as rank 0 does
                    self.stopped = StopRequest()
                    self.stopped.request(cmd.reason, cmd.exit_code)
                return

    def lead(self, cmd: Command) -> Any:
        """Rank 0: every rank executes ``cmd`` (a no-op broadcast with one rank); returns rank 0's result."""
        dist_utils.broadcast_object(cmd)
        return self.execute(cmd)

    # -- rank 0 -----------------------------------------------------------------------------------------------
    def _make_engine(self) -> Any:
        """``rollout.engine``'s engine (its registry entry builds it): on the trainer's copy of the actor, or a client
        of the servers (``rollout.vllm_urls``, else one this run starts on the current weights)."""
        r, spec = self.cfg.rollout, self.engine_spec
        if self.cluster is not None:
            return self.cluster.make_engine()
        if spec.in_process is not None:
            allowed = tuple(self.allowed or ())
            return spec.in_process(InProcessArgs(self.engine_model, self.tokenizer, self.version, allowed))
        assert spec.connect is not None, "config validation admits in-process or server engines only"
        urls = list(r.vllm_urls)
        if not urls:
            assert spec.serve is not None, "config validation refuses a server engine with no URLs and no serve"
            weights = self.run_dir / "weights" / f"v{self.version:06d}"
            self.lead(Export(str(weights)))
            self.tokenizer.save_pretrained(weights)
            log = str(self.run_dir / "vllm.log")
            self._server = spec.serve(ServeArgs(str(weights), log_path=log, max_model_len=r.max_context_tokens))
            urls = [self._server.url]
        return spec.connect(urls, ())

    async def _sync_weights(self, engine: Any) -> float:
        if self.cfg.rollout.weight_sync == "broadcast":
            from sao.trainer.cluster.weights import BroadcastSync

            if self._broadcast is None:
                self._broadcast = BroadcastSync.for_config(self.cfg, self.learner.actor.module)
            return float((await self._broadcast.sync(engine, self.version, self.lead))["sync_s"])
        t0 = time.perf_counter()
        out = self.run_dir / "weights" / f"v{self.version:06d}"
        await asyncio.to_thread(self.lead, Export(str(out)))
        await engine.update_weights(str(out), self.version)
        olds = sorted((self.run_dir / "weights").glob("v*"))[:-2]  # the engine may still read the previous one
        for old in olds:
            shutil.rmtree(old, ignore_errors=True)
        return time.perf_counter() - t0

    def _save(self, coord: Coordinator) -> None:
        """Write ``checkpoints/step_N`` atomically: into a hidden partial folder, fsynced, renamed when complete, then
        ``latest``. A failed write (disk full, ...) drops the partial folder and is counted (``checkpoint_failures``):
        the previous checkpoint stays the latest and loadable, and the run goes on."""
        import logging

        ckpt, partial = checkpoint_paths(self.run_dir, self.step)
        try:
            res = self.lead(Save(str(partial)))
            if not res.saved and res.error is not None:
                raise OSError(res.error)
        except OSError as e:
            self._checkpoint_failed(partial, e)
            return
        if not res.saved:
            logging.getLogger(__name__).warning(
                "step %d: the weights hold NaN/inf, checkpoint not written; the latest stays %s",
                self.step,
                latest_checkpoint(self.run_dir),
            )
            shutil.rmtree(partial, ignore_errors=True)
            return
        state = {
            "step": self.step,
            "version": self.version,
            "critic_warmup_done": self.warmup_done,
            "cursor": coord.cursor,
            "seq": coord.seq,
            "buffer_uids": [u for i in coord.buffer for u in i.uids],
            "baseline": self.learner.baseline.state_dict(),
            "rng": _rng_state(),
            "counters": {
                "generated": coord.counters.generated,
                "trained": coord.counters.trained,
                "dropped_stale": coord.counters.dropped_stale,
                "infra_error": coord.counters.infra_error,
                "episodes_trained": coord.counters.episodes_trained,
            },
        }
        try:
            commit_checkpoint(partial, ckpt, state, self.cfg.run.keep_checkpoints)
        except OSError as e:
            self._checkpoint_failed(partial, e)
            return
        self._saved_step = self.step

    def _checkpoint_failed(self, partial: Path, e: OSError) -> None:
        from sao.core.console import say

        self.checkpoint_failures += 1
        shutil.rmtree(partial, ignore_errors=True)
        free = shutil.disk_usage(partial.parent).free / 2**20  # torch.save reports ENOSPC without saying so
        say(
            f"step {self.step}: checkpoint not written ({e}; {free:.0f} MiB free there); the latest stays "
            f"{latest_checkpoint(self.run_dir)}"
        )

    async def lead_run(self) -> dict[str, Any]:
        """Rank 0: set up the rollouts, train until ``run.total_steps``, then write the final weights. A stop request
        (SIGTERM, the run's vLLM server dying, the given servers not answering, the rollout side gone:
        ``trainer.runs.stopping``) ends the loop between steps with a checkpoint and no final weights; ``self.stopped``
        then says why, on every rank."""
        stop = StopRequest()
        stop.install()
        r = self.cfg.rollout
        if self.engine_spec.placement == "server" and r.vllm_urls and r.server_grace_s > 0:
            self._watch = ServerWatch(r.vllm_urls, r.server_grace_s, stop)
        try:
            session = await self._setup()
            try:
                if self._watch is not None:
                    self._watch.start()
                last = await self._loop(session, stop)
                if stop.reason is not None and self.step > self._saved_step:
                    await asyncio.to_thread(self._save, session.coord)
            finally:
                if self._watch is not None:
                    await self._watch.close()
                await self._close(session)
        finally:
            stop.uninstall()
        if stop.reason is not None:
            self.lead(Stop(str(self.run_dir), stop.reason, stop.exit_code))
            self.stopped = stop
            return last
        await self._finish()
        return last

    async def _setup(self) -> _Session:
        """Ledger and metrics (replayed on resume), the inference engine, and the coordinator, started."""
        cfg, t, spec = self.cfg, self.cfg.trainer, self.cfg.algorithm
        ledger = Ledger(self.run_dir / "trajectories.jsonl")
        metrics = MetricsWriter(self.run_dir, cfg.run.tensorboard, cfg.run.wandb_project)
        acc, pending = replay(ledger.path, resume_from=None if self.state is None else self.step)
        lineage = Lineage(acc.aliases)
        if self.state is not None:
            # versions are never reused: the restored weights go on under an id above every one the run used, so
            # a pending trajectory of the discarded branch keeps its true lag (sao.trainer.rollout.versions)
            resumed, self.version = self.version, max(acc.max_version, self.version) + 1
            lineage = Lineage({**acc.aliases, self.version: resumed})
            ledger.resume(self.step, resumed, self.version)
            metrics.truncate_after(self.step)
            drop_records_after(self.run_dir / TOKEN_RECORDS, self.step)
        if self.engine_spec.placement == "server" and cfg.rollout.vllm_urls:
            # servers the run did not start: their model and logprob mode are read, not assumed
            await check_servers(cfg.rollout.vllm_urls, tokenizer=self.tokenizer, temperature=cfg.rollout.temperature,
                                max_context_tokens=cfg.rollout.max_context_tokens, model=cfg.model.path)  # fmt: skip
        engine = self._make_engine()
        if self.state is not None and self.version > 0:
            await self._sync_weights(engine)
        runner: Any = (
            self.cluster.runner  # episodes on the Ray rollout workers
            if self.cluster is not None
            else episode_runner(cfg, engine, self.tokenizer)
        )
        coord = Coordinator(
            runner,
            TaskSource(load_env_tasks(cfg), cfg.run.seed),
            ledger,
            concurrency=cfg.rollout.concurrency,
            buffer_size=max(cfg.rollout.buffer_size, t.batch_size),
            max_staleness=t.max_staleness if spec.max_staleness is None else spec.max_staleness,
            group_size=t.group_size if spec.grouped else 1,
            synchronous=spec.synchronous,
            staleness_policy=t.staleness_policy,
            sync_every=t.sync_every,
            batch_size=t.batch_size,
            infra_stall_s=cfg.rollout.infra_stall_s,
            cursor=max(int(self.state["cursor"]) if self.state else 0, acc.max_task_index + 1),
            seq=acc.max_seq + 1,
            lineage=lineage,
        )
        coord.version = self.version
        coord.counters = Counters.from_accounting(acc)  # before restore: what it drops adds to them
        coord.restore(list(pending.values()), self.step)
        if coord.synchronous:
            coord.allow_next_batch(max(0, t.batch_size - len(coord.buffer)))
        coord.start()
        return _Session(ledger, metrics, engine, coord)

    async def _loop(self, s: _Session, stop: StopRequest) -> dict[str, Any]:
        """Batch -> train step -> version + 1 -> weight sync -> metrics -> checkpoint, until the last step."""
        cfg, t, coord = self.cfg, self.cfg.trainer, s.coord
        progress = TrainProgress(cfg.run.total_steps, self.step, enabled=cfg.run.progress)
        t_run = time.perf_counter()
        gen0 = coord.counters.generated
        last: dict[str, Any] = {}
        try:
            if not await self._critic_warmup(s, stop):
                return last
            while self.step < cfg.run.total_steps:
                t0 = time.perf_counter()
                server = self._server
                batch = await next_batch_or_stop(coord, t.batch_size, self.step + 1, stop, server)
                if batch is None:
                    break
                items: list[Item] = batch
                t1 = time.perf_counter()
                m = await asyncio.to_thread(self.lead, Train.of(items))
                t2 = time.perf_counter()
                self.step += 1
                self._write_token_records(items)
                coord.trained(items, self.step)
                self.version += 1
                coord.version = self.version
                sync_s = 0.0
                if self.version % t.sync_every == 0:
                    try:
                        sync_s = await self._sync_weights(s.engine)
                    except EngineError:
                        stop.check_server(self._server)
                        if self._watch is not None:
                            await self._watch.check_now()
                        if stop.reason is None:
                            raise  # the servers are up and still refused: not a fault a resume fixes
                if coord.synchronous:
                    coord.allow_next_batch(t.batch_size)
                # the step's freed activations and weight copies go back to the system: without this the resident
                # set grew ~0.4-0.5 GB a step on SmolLM2 while live memory stayed flat (sao.core.memory)
                memory.trim_heap()
                t3 = time.perf_counter()
                last = self._step_metrics(m, items, coord, t0, t1, t2, t3, sync_s, t_run, gen0)
                s.metrics.write(self.step, last)
                progress.update(self.step, last)
                if self.step % cfg.run.save_every == 0 or self.step == cfg.run.total_steps:
                    await asyncio.to_thread(self._save, coord)
                if cfg.run.export_every and self.step % cfg.run.export_every == 0:
                    await self._export_policy(self.run_dir / "policies" / f"step_{self.step:04d}")
        finally:
            progress.close()
        return last

    def _write_token_records(self, items: list[Item]) -> None:
        """The learner's per-token records of this step (``trainer.token_records``), with the rows' ledger uids."""
        loss = self.cfg.algorithm.policy_loss
        rows = [(uid, row) for i in items for uid, row in zip(i.uids, i.rows, strict=True)]  # as Train.of lays them
        recs = [token_record(self.step, self.version, loss, *rows[r.row], r) for r in self.learner.token_rows]
        write_token_records(self.run_dir / TOKEN_RECORDS, recs)

    async def _critic_warmup(self, s: _Session, stop: StopRequest) -> bool:
        """``trainer.critic_warmup_steps`` critic-only batches before the first policy step (the policy and its
        version stay put, so nothing goes stale and no weights are synced). Each is logged to
        ``critic_warmup.jsonl``. False: a stop was requested meanwhile (the caller checkpoints the critic and the
        count reached; a resume goes on from there)."""
        t, coord = self.cfg.trainer, s.coord
        n = t.critic_warmup_steps
        while self.warmup_done < n:
            t0 = time.perf_counter()
            batch = await next_batch_or_stop(coord, t.batch_size, 0, stop, self._server)
            if batch is None:
                return False
            m = await asyncio.to_thread(self.lead, Train.of(batch, policy=False))
            coord.trained(batch, 0)
            self.warmup_done += 1
            memory.trim_heap()
            rec = {
                "critic_warmup_step": self.warmup_done,
                "of": n,
                "episodes": len(batch),
                "rows": sum(len(i.rows) for i in batch),
                "success_rate": float(np.mean([_solved(i.rows[-1]) for i in batch])),
                "step_s": time.perf_counter() - t0,
                **m,
            }
            append_jsonl(self.run_dir / "critic_warmup.jsonl", [rec])
            if self.rank0 and self.cfg.run.progress:
                ev = m.get("explained_variance", float("nan"))
                from sao.core.console import say  # above the progress line, not through it

                say(f"critic warm-up {self.warmup_done}/{n}: explained variance {ev:.3f}")
        return True

    async def _close(self, s: _Session) -> None:
        await s.coord.stop()
        await s.engine.close()
        server = self._server
        if server is not None:
            server.stop()
        s.ledger.close()
        s.metrics.close()

    async def _export_policy(self, out: Path) -> None:
        """The current policy in HF format with its tokenizer (``run.export_every``)."""
        await asyncio.to_thread(self.lead, Export(str(out)))
        self.tokenizer.save_pretrained(out)

    async def _finish(self) -> None:
        """Final actor (+ critic) weights and tokenizer in RUN_DIR/final, the digest, the plots."""
        # The versioned weight dirs only fed the engine; final/ and the checkpoints hold what lasts.
        shutil.rmtree(self.run_dir / "weights", ignore_errors=True)
        final = self.run_dir / "final"
        await asyncio.to_thread(self.lead, Export(str(final / "actor")))
        self.tokenizer.save_pretrained(final / "actor")
        if self.learner.critic is not None:
            await asyncio.to_thread(self.lead, Export(str(final / "critic"), critic=True))
        self.lead(Stop(str(self.run_dir)))
        if self.cfg.run.plot:
            plot_run(self.run_dir)

    def _step_metrics(
        self,
        m: dict[str, Any],
        items: list[Item],
        coord: Coordinator,
        t0: float,
        t1: float,
        t2: float,
        t3: float,
        sync_s: float,
        t_run: float,
        gen0: int,
    ) -> dict[str, Any]:
        trajs = [r for i in items for r in i.rows]
        outcomes = [i.rows[-1] for i in items]  # every row carries its episode's outcome; the last one reads it
        lags = coord.counters.lags or [0]
        elapsed = max(t3 - t_run, 1e-9)
        c = coord.counters
        out = {
            "version": self.version,
            "reward_mean": float(np.mean([tr.reward for tr in outcomes])),
            "success_rate": float(np.mean([_solved(tr) for tr in outcomes])),
            "policy_lag_mean": float(np.mean(lags)),
            "policy_lag_max": int(max(lags)),
            "batch_episodes": len(items),
            "batch_rows": len(trajs),
            "dropped_stale": c.dropped_stale,
            "dropped_stale_episodes": c.episodes_dropped_stale,
            "infra_errors": c.infra_error,
            "infra_error_episodes": c.episodes_infra_error,
            "generated": c.generated,
            "generated_episodes": c.episodes_generated,
            "trained_rows": c.trained,
            "trained_episodes": c.episodes_trained,
            "buffer": len(coord.buffer),
            "trajectories_per_s": (c.generated - gen0) / elapsed,
            "trained_tokens_per_s": float(m.get("trained_tokens", 0.0)) / max(t2 - t1, 1e-9),
            "trainer_idle_frac": (t1 - t0) / max(t3 - t0, 1e-9),
            "step_s": t3 - t0,
            "weight_sync_s": sync_s,
            "checkpoint_failures": self.checkpoint_failures,
            "action_tokens_mean": float(np.mean([sum(len(s.token_ids) for s in tr.action_segments) for tr in trajs])),
            "rss_gib": memory.rss_bytes() / 2**30,  # after the step (heap trimmed): flat across steps
            "peak_rss_gib": memory.take_peak_rss() / 2**30,  # the highest during this step (learner, sync, rollouts)
        }
        drift = [float(tr.info["render_drift"]) for tr in trajs if "render_drift" in tr.info]
        if drift:  # agent token ids vs a fresh chat-template render (sao.agent.loop); > 0 means the model saw drift
            out["render_drift"] = float(np.mean(drift))
        out.update(m)
        return out


def _solved(outcome: Trajectory) -> bool:
    """Whether an episode (its row that carries the outcome) solved its task."""
    return bool(outcome.info.get("solved", outcome.reward > 0))


def train(config_path: str | None, overrides: list[str] | None = None, resume: str | None = None) -> Path:
    """Validate, then train. ``config_path`` may be None with ``resume`` (the run's saved config is used)."""
    if config_path is None and resume is None:
        raise ConfigError("give a config file (sao train configs/toy.yaml) or --resume RUN_DIR")
    if config_path is None:
        config_path = str(Path(resume or "") / "config.yaml")
    cfg = load_config(config_path, overrides)
    preflight(cfg.env.id, cfg.env.kwargs)  # a bad env id or kwargs fail here, before any stage, model or episode
    if cfg.stages:  # collect / sft / eval / train in one run (configs/quickstart.yaml)
        from sao.trainer.runs.stages import run_stages

        return run_stages(cfg, resume, train)
    cfg, run_dir, state = prepare_run_dir(cfg, resume)
    if resume is not None and state is None:
        raise ConfigError(f"--resume {resume!r}: no complete checkpoint in {run_dir}/checkpoints; start a new run")
    if cfg.cluster.backend == "ray":
        from sao.core.console import say
        from sao.trainer.cluster.ray_backend import TrainerRankLost, run_on_ray

        try:
            last = run_on_ray(cfg, run_dir, state, Trainer)
        except TrainerRankLost as e:
            say(
                f"{e}; the run cannot go on without it. The latest checkpoint is {latest_checkpoint(run_dir)}: "
                f"continue with `sao train --resume {run_dir}` (steps after it are trained again from it)"
            )
            raise SystemExit(EXIT_RESUMABLE) from e
        if last.get("stopped"):
            _stopped(run_dir, int(last["step"]), str(last["stopped"]), int(last["exit_code"]), tell=True)
        return run_dir
    dist_utils.init_distributed()
    trainer = Trainer(cfg, run_dir, state)
    if trainer.rank0:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.yaml")
        asyncio.run(trainer.lead_run())
    else:
        trainer.follow()
    dist_utils.barrier()
    if trainer.stopped is not None:
        reason = trainer.stopped.reason or ""
        _stopped(run_dir, trainer.step, reason, trainer.stopped.exit_code, tell=trainer.rank0)
    return run_dir


def _stopped(run_dir: Path, step: int, reason: str, exit_code: int, *, tell: bool) -> None:
    """A clean stop's end, local or under Ray: say why and how to go on (rank 0 only), exit with its code."""
    from sao.core.console import say

    if tell:
        say(
            f"stopped at step {step}: {reason}; the latest checkpoint is {latest_checkpoint(run_dir)}. "
            f"Continue with `sao train --resume {run_dir}`"
        )
    raise SystemExit(exit_code)
