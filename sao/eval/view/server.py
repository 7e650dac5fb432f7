"""The `sao view` web app: a JSON API over a ``Run`` and the static page that draws it (``static/``, no CDN).

API (every call re-reads what the run appended since the last one):
- ``GET /api/run``: the run, its sources (folders with episodes or metrics) and a staged run's summary or an
  eval's report;
- ``GET /api/metrics?source=S``: the per-step metrics (and critic warm-up steps) of a source;
- ``GET /api/episodes?source=S&...``: one page of the episode list (``Query``'s fields, and ``q`` for text in
  actions and observations);
- ``GET /api/episode?source=S&line=N``: one episode, one text piece per token, with its per-token records;
- ``GET /api/compare?a=S1&b=S2``: two sources task by task (solved before / after, paired difference).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from sao.eval.view.episodes import Query
from sao.eval.view.reader import Decoder, Run, Source

STATIC = Path(__file__).parent / "static"


def make_app(run_dirs: list[Path], tokenizer: str | None = None) -> FastAPI:
    """The app over ``run_dirs`` (one run, or several side by side); token text decodes with ``tokenizer`` (default:
    the runs' model)."""
    run = Run(*run_dirs)
    decode = Decoder(tokenizer or run.tokenizer())
    threading.Thread(target=decode.load, name="tokenizer", daemon=True).start()  # ready before the first episode
    app = FastAPI(title="sao view", docs_url=None, redoc_url=None, openapi_url=None)

    def find(name: str) -> Source:
        try:
            return run.source(name)
        except KeyError as e:
            raise HTTPException(404, str(e)) from e

    @app.get("/api/run")
    def get_run() -> dict[str, Any]:
        return {**run.describe(), "tokenizer": decode.source, "tokenizer_error": decode.error}

    @app.get("/api/metrics")
    def get_metrics(source: str = ".") -> dict[str, Any]:
        s = find(source)
        return {"metrics": s.metrics, "critic_warmup": s.warmup}

    @app.get("/api/compare")
    def get_compare(a: str, b: str) -> dict[str, Any]:
        try:
            return run.compare(a, b)
        except KeyError as e:
            raise HTTPException(404, str(e)) from e

    @app.get("/api/episodes")
    def get_episodes(
        source: str = ".", ending: str = "", fate: str = "", task: str = "", step: str = "",
        reward_min: float | None = None, reward_max: float | None = None, recorded: bool = False,
        sort: str = "line", desc: bool = False, offset: int = 0, limit: int = 50, q: str = "",
    ) -> dict[str, Any]:  # fmt: skip
        query = Query(ending, fate, task, step, reward_min, reward_max, recorded, sort, desc, max(offset, 0),
                      min(max(limit, 1), 500))  # fmt: skip
        try:
            return find(source).page(query, q, decode)
        except ValueError as e:
            raise HTTPException(400, str(e)) from e

    @app.get("/api/episode")
    def get_episode(line: int, source: str = ".") -> dict[str, Any]:
        try:
            return find(source).episode(line, decode)
        except KeyError as e:
            raise HTTPException(404, str(e)) from e

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    return app


def serve(run_dirs: list[Path], host: str = "127.0.0.1", port: int = 8765, tokenizer: str | None = None) -> None:
    """Serve the page until interrupted (uvicorn prints nothing but errors; the caller prints the URL)."""
    import uvicorn

    uvicorn.run(make_app(run_dirs, tokenizer), host=host, port=port, log_level="warning")
