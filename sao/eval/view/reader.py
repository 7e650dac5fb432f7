"""What `sao view` reads: a run folder (a training run, a staged run's stage folders, a `sao eval` / `sao collect`
out folder, a `sao serve --gateway` out folder), re-read on every request from where the last read stopped.

A ``Source`` is one folder with episodes (``trajectories.jsonl``) and/or per-step metrics (``metrics.jsonl``) and
per-token records (``token_records.jsonl``); a ``Run`` is the folder given and its sources (itself and its direct
subfolders: a staged run's ``NN_stage``). Every file is read through a ``LineIndex`` (byte offsets), so a live run
costs only its new lines and an episode is one seek.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sao.eval.scores import paired_difference
from sao.eval.view.episodes import Episode, EpisodeTable, Query, select, solved_by_task
from sao.eval.view.formats import (
    CRITIC_WARMUP,
    METRICS,
    REPORT,
    STAGE_DONE,
    SUMMARY,
    TOKEN_RECORDS,
    TRAJECTORIES,
    TokenRecord,
)
from sao.eval.view.index import LineIndex

Decode = Callable[[list[int]], list[str]]
"""Token ids -> one text piece per id (the viewer's tokenizer, ``Decoder``)."""


class Source:
    """One folder's episodes, metrics and token records, indexed incrementally."""

    def __init__(self, root: Path, folder: Path, prefix: str = "") -> None:
        self.folder = folder
        self.name = prefix + (folder.relative_to(root).as_posix() if folder != root else ".")
        self._traj = LineIndex(folder / TRAJECTORIES)
        self._metrics = LineIndex(folder / METRICS)
        self._warmup = LineIndex(folder / CRITIC_WARMUP)
        self._tokens = LineIndex(folder / TOKEN_RECORDS)
        self.table = EpisodeTable()
        self.metrics: list[dict[str, Any]] = []
        self.warmup: list[dict[str, Any]] = []
        self.token_lines: dict[str, list[int]] = {}  # ledger uid -> its lines in token_records.jsonl
        self._lock = threading.Lock()
        self._memo: tuple[Any, list[Episode]] | None = None

    def refresh(self) -> None:
        """Read what was appended since the last refresh (a replaced file: all of it again)."""
        with self._lock:
            self._traj.refresh(self._add_episode, self._new_table)
            for index, rows in ((self._metrics, self.metrics), (self._warmup, self.warmup)):
                index.refresh(_appender(rows), rows.clear)
            self._tokens.refresh(self._add_token_record, self.token_lines.clear)

    def _new_table(self) -> None:
        self.table = EpisodeTable()

    def _add_episode(self, n: int, rec: Any) -> None:
        if isinstance(rec, dict):
            self.table.add(n, rec)

    def _add_token_record(self, n: int, rec: Any) -> None:
        if isinstance(rec, dict) and rec.get("uid") is not None:
            self.token_lines.setdefault(str(rec["uid"]), []).append(n)

    def recorded(self, ep: Episode) -> bool:
        return ep.uid is not None and ep.uid in self.token_lines

    def describe(self) -> dict[str, Any]:
        done = self.folder / STAGE_DONE
        return {
            "name": self.name,
            "episodes": len(self.table.episodes),
            "ledger": self.table.ledger,
            "steps": len(self.metrics),
            "recorded": len(self.token_lines),
            "done": _json_file(done),
        }

    def page(self, q: Query, search: str = "", decode: Decode | None = None, budget_s: float = 2.0) -> dict[str, Any]:
        """One page of the filtered, sorted list. With ``search`` (text in actions and observations) the episodes
        are decoded in list order from ``q.offset`` until a page is found or ``budget_s`` runs out; ``next`` is the
        offset to continue from (None at the end)."""
        hits = self._select(q)
        if not search:
            items = hits[q.offset : q.offset + q.limit]
            nxt = q.offset + q.limit if q.offset + q.limit < len(hits) else None
            return {"total": len(hits), "items": [self._row(e) for e in items], "next": nxt, "searched": None}
        needle, i, t0 = search.lower(), q.offset, time.monotonic()
        found: list[Episode] = []
        while i < len(hits) and len(found) < q.limit and time.monotonic() - t0 < budget_s:
            if needle in self._text(hits[i], decode).lower():
                found.append(hits[i])
            i += 1
        return {"total": len(hits), "items": [self._row(e) for e in found], "next": i if i < len(hits) else None,
                "searched": i - q.offset}  # fmt: skip

    def _select(self, q: Query) -> list[Episode]:
        """``select`` over the table, kept while the table and the token records are unchanged (paging is free)."""
        key = (dataclasses.replace(q, offset=0, limit=0), id(self.table), self.table.changes, len(self._tokens))
        if self._memo is None or self._memo[0] != key:
            self._memo = (key, select(self.table.episodes, q, self.recorded))
        return self._memo[1]

    def _row(self, e: Episode) -> dict[str, Any]:
        return {**dataclasses.asdict(e), "recorded": self.recorded(e)}

    def _text(self, e: Episode, decode: Decode | None) -> str:
        segs = self.trajectory(e.line).get("segments") or []
        ids = [t for s in segs if s.get("kind") != "prompt" for t in s.get("token_ids") or ()]
        return "".join(decode(ids)) if decode is not None else " ".join(map(str, ids))

    def trajectory(self, line: int) -> dict[str, Any]:
        rec = self._traj.line(line)
        return rec.get("trajectory") or {} if rec.get("type") == "trajectory" else rec

    def episode(self, line: int, decode: Decode | None) -> dict[str, Any]:
        """One episode in full: its summary, its segments with one text piece per token, its outcome and info, and
        the token records of the steps that trained it (oldest first)."""
        if not 0 <= line < len(self._traj):
            raise KeyError(f"no episode at line {line} of {self.name}/{TRAJECTORIES}")
        traj = self.trajectory(line)
        eps = self.table.episodes
        k = bisect.bisect_left(eps, line, key=lambda e: e.line)  # episodes are in line order
        ep = eps[k] if k < len(eps) and eps[k].line == line else None
        segments = []
        for s in traj.get("segments") or []:
            ids = [int(t) for t in s.get("token_ids") or ()]
            text = decode(ids) if decode is not None else [f"<{t}>" for t in ids]
            segments.append({"kind": s.get("kind"), "version": s.get("policy_version"), "reward": s.get("reward"),
                             "ids": ids, "text": text})  # fmt: skip
        return {
            "summary": None if ep is None else self._row(ep),
            "segments": segments,
            "reward": traj.get("reward"),
            "status": traj.get("status"),
            "info": traj.get("info") or {},
            "timings": traj.get("timings") or {},
            "token_records": self.token_records(ep.uid if ep is not None else None),
        }

    def token_records(self, uid: str | None) -> list[TokenRecord]:
        if uid is None:
            return []
        return [self._tokens.line(n) for n in self.token_lines.get(uid, [])]


def _appender(rows: list[dict[str, Any]]) -> Callable[[int, Any], None]:
    def add(_: int, rec: Any) -> None:
        if isinstance(rec, dict):
            rows.append(rec)

    return add


def _json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class Run:
    """The folder(s) `sao view` was given, and their sources (found again on every ``sources()`` call: a staged
    run adds a folder per stage as it goes). With several folders (two runs side by side) a source's name starts with
    its run's folder name."""

    def __init__(self, *roots: Path) -> None:
        for root in roots:
            if not root.is_dir():
                raise ValueError(f"{str(root)!r} is not a folder; pass a run folder (sao train / eval --out / serve)")
        if not roots:
            raise ValueError("pass at least one run folder")
        self.roots = list(roots)
        self.root = roots[0]
        self._sources: dict[str, Source] = {}

    def sources(self) -> list[Source]:
        for root in self.roots:
            prefix = f"{root.resolve().name}/" if len(self.roots) > 1 else ""
            for f in [root, *sorted(p for p in root.iterdir() if p.is_dir())]:
                if any((f / n).is_file() for n in (TRAJECTORIES, METRICS)):
                    s = self._sources.get(f.as_posix())
                    if s is None:
                        s = self._sources[f.as_posix()] = Source(root, f, prefix)
                    s.refresh()
        return list(self._sources.values())

    def source(self, name: str) -> Source:
        for s in self.sources():
            if s.name == name:
                return s
        raise KeyError(f"no source {name!r} in {', '.join(map(str, self.roots))}; /api/run lists the sources")

    def compare(self, a: str, b: str) -> dict[str, Any]:
        """Two sources' episodes task by task (e.g. the evals before and after RL): solved in each, the paired
        difference over the tasks both ran (mean, standard error, count), and the tasks gained and lost."""
        before, after = solved_by_task(self.source(a).table.episodes), solved_by_task(self.source(b).table.episodes)
        mean, se, n = paired_difference(before, after)
        common = sorted(set(before) & set(after))
        return {
            "a": a, "b": b, "n": n, "mean": None if n == 0 else mean, "se": None if n < 2 else se,
            "solved_a": sum(before[t] for t in common), "solved_b": sum(after[t] for t in common),
            "gained": [t for t in common if after[t] > before[t]], "lost": [t for t in common if after[t] < before[t]],
            "only_a": len(set(before) - set(after)), "only_b": len(set(after) - set(before)),
        }  # fmt: skip

    def describe(self) -> dict[str, Any]:
        """The run(s): names, sources, and per run the summary of a staged run or the report of an eval."""
        runs = [{"name": r.resolve().name, "path": str(r), "summary": _json_file(r / SUMMARY),
                 "report": _json_file(r / REPORT)} for r in self.roots]  # fmt: skip
        return {
            "name": " vs ".join(str(r["name"]) for r in runs),
            "sources": [s.describe() for s in self.sources()],
            "runs": runs,
            "model": self.tokenizer(),
        }

    def tokenizer(self) -> str | None:
        """The first tokenizer one of the runs names (``tokenizer_source``)."""
        return next((t for t in map(tokenizer_source, self.roots) if t), None)


def tokenizer_source(run: Path) -> str | None:
    """The tokenizer a run's token ids decode with, as its files name it: ``config.yaml`` (``model.tokenizer``,
    else ``model.path``; SmolLM2 for a ``tiny:`` model), else the ``model`` of ``summary.json`` / ``report.json``
    (a ``kind:`` prefix of an eval's model spec dropped)."""
    cfg = run / "config.yaml"
    if cfg.is_file():
        from sao.core.config import load_yaml

        model = load_yaml(cfg).get("model") or {}
        src = model.get("tokenizer") or model.get("path")
        if src:
            return "smollm2" if str(src).startswith("tiny:") else str(src)
    for name in (SUMMARY, REPORT):
        data = _json_file(run / name)
        model = data.get("model") if isinstance(data, dict) else None
        if isinstance(model, str) and model:
            return _model_source(model)
    return None


def _model_source(model: str) -> str:
    """A summary's model (an engine spec such as ``local:DIR``, or a path) -> what a tokenizer loads from."""
    from sao.agent.engines.registry import ModelSpecError, parse_model_spec, spec_forms

    try:
        spec = parse_model_spec(model)
    except ModelSpecError:  # e.g. the model directory is gone: keep the target of a registered local form
        kind, sep, rest = model.partition(":")
        local = sep and kind in {f.kind for f in spec_forms()} and "://" not in rest
        return rest if local else model
    return spec.path or spec.model or model


class Decoder:
    """Token ids -> text pieces with a tokenizer loaded on first use (one piece per id, cached per id)."""

    def __init__(self, source: str | None) -> None:
        self.source = source
        self.error: str | None = None if source else "the run names no model; pass --tokenizer"
        self._tok: Any = None
        self._cache: dict[int, str] = {}
        self._lock = threading.Lock()

    def load(self) -> Any:
        """The tokenizer (loaded once; None when it cannot be: ``error`` says why)."""
        with self._lock:
            if self._tok is None and self.error is None and self.source:
                from sao.agent.engines.registry import ModelSpecError, load_tokenizer

                try:
                    self._tok = load_tokenizer(self.source)
                except ModelSpecError as e:
                    self.error = str(e)
        return self._tok

    def __call__(self, ids: list[int]) -> list[str]:
        tok = self.load()
        if tok is None:
            return [f"<{t}>" for t in ids]
        missing = sorted({t for t in ids if t not in self._cache})
        if missing:
            for t, text in zip(missing, tok.batch_decode([[t] for t in missing]), strict=True):
                self._cache[t] = text
        return [self._cache[t] for t in ids]
