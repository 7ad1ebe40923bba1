"""`dflash serve`: the programs behind an OpenAI-compatible HTTP API, for the chat front-ends, evaluation harnesses
and agents that speak it.

ExecuTorch's own server does the HTTP side (executorch.examples.llm_server: FastAPI routes, request checks, the
chat template, tool-call parsing, streaming, usage, sessions); this module gives it what it lacks for DFlash:
dflash_runner workers (`--worker`, runner/worker/worker.h: the JSONL protocol its worker_client speaks, DFlash auto
by default), more than one of them, a bounded queue, workers restarted when they die, and errors in the OpenAI
shape for requests its routes cannot parse. One worker holds one conversation's caches: a session's requests go to
the worker that served it before, so a second turn runs only its new tokens.
"""

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from executorch.examples.llm_server.python.chat_template import ChatTemplate
from executorch.examples.llm_server.python.errors import APIError
from executorch.examples.llm_server.python.server import build_app
from executorch.examples.llm_server.python.serving_chat import ServingChat
from executorch.examples.llm_server.python.session_runtime import SessionRuntime
from executorch.examples.llm_server.python.tool_parsers import (GemmaToolCallDetector, HermesDetector,
                                                                QwenFunctionCallDetector)
from executorch.examples.llm_server.python.worker_client import WorkerError, spawn_worker
from executorch.examples.models.gemma4_31b.serve import _GEMMA_CHANNEL_SPECIALS, _strip_gemma_channels
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from dflash_et.data.chat import tokenizer
from dflash_et.errors import UserError
from dflash_et.runtime.programs import export_summary

logger = logging.getLogger("dflash_et.serve")


class Busy(APIError):
    """Every worker busy and the queue full: retry later (OpenAI answers overload with 503 too)."""

    def __init__(self, workers: int, queue: int):
        super().__init__(503, f"all {workers} workers are busy and {queue} requests wait; retry later",
                         "server_error", "server_overloaded")


def tool_parser(chat_template: str) -> type:
    """ExecuTorch's parser for the calls a target writes, told by how its chat template renders a call: Gemma 4's
    `<|tool_call>call:NAME{..}`, Qwen3.5's XML `<function=NAME><parameter=..>`, else the Hermes JSON of Qwen3 and
    the built-in target (`<tool_call>{"name": .., "arguments": ..}`)."""
    if "<|tool_call>" in chat_template:
        return GemmaToolCallDetector
    return QwenFunctionCallDetector if "<function=" in chat_template else HermesDetector


def chat_format(programs: Path) -> tuple[ChatTemplate, dict]:
    """The target's chat template as ExecuTorch's server reads it (Qwen3 thinking off, as `dflash generate`), and
    ServingChat's settings for its family, told by what the template writes (ExecuTorch's servers set them by hand
    per model): the assistant header is the first line of the generation prompt (the rest, Qwen3's empty think
    block or Gemma 4's empty thought channel, is the preamble a warm resume splices back); a target with Gemma 4's
    channels gets ExecuTorch's Gemma server's content filter (the visible answer is outside them) and the
    generation prompt after a tool's response; the tool parser is `tool_parser`'s."""
    tok, probe = tokenizer(programs), [{"role": "user", "content": "?"}]
    if tok.chat_template is None:
        raise UserError(f"{programs} has no chat template to render chats with; `dflash serve` needs the target's "
                        "own, which the package stage copies beside the programs when the target has one")
    closed, opened = (tok.apply_chat_template(probe, tokenize=False, add_generation_prompt=add, enable_thinking=False)
                      for add in (False, True))
    generation = opened[len(closed):] if opened.startswith(closed) else ""
    header = generation[:generation.find("\n") + 1] or generation
    channels = "<|channel>" in tok.get_vocab()
    template = ChatTemplate(str(programs), default_template_kwargs={"enable_thinking": False},
                            **({"assistant_header": header} if header else {}),
                            append_generation_prompt_after_tool_response=channels)
    serving = dict(tool_detector_cls=tool_parser(template.chat_template_str() or ""))
    if channels:
        serving.update(content_filter=_strip_gemma_channels, content_filter_specials=_GEMMA_CHANNEL_SPECIALS)
    return template, serving


class Worker:
    """One dflash_runner --worker process and ExecuTorch's OpenAI adapter over it."""

    def __init__(self, command: list[str], chat: tuple[ChatTemplate, dict], model_id: str, max_context: int):
        try:
            client = spawn_worker(command)
        except (WorkerError, OSError) as e:
            raise UserError(f"the C++ worker did not start ({e}); run `{' '.join(command)}` to see why") from None
        self.runtime = SessionRuntime(client)
        self.sessions = client.max_named_sessions  # the named sessions it keeps at once
        template, serving = chat
        self.chat = ServingChat(self.runtime, template, model_id, max_context=max_context, **serving)
        self.load = 0  # requests running or waiting on it

    @property
    def healthy(self) -> bool:
        return self.runtime.healthy


class Held:
    """One accepted request's place in its worker's load, given back once: when its answer is returned, or for a
    stream when the stream ends, is closed (the client left: closing it cancels the generation in the worker), or is
    dropped unread."""

    def __init__(self, worker: Worker):
        self.worker, self._held = worker, True
        worker.load += 1

    def release(self) -> None:
        if self._held:
            self._held = False
            self.worker.load -= 1

    def stream(self, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        return HeldStream(chunks, self)


class HeldStream:
    """A streamed answer that gives its place back when it ends, is closed, or is garbage (never read)."""

    def __init__(self, chunks: AsyncIterator[str], held: Held):
        self._chunks, self._held = chunks, held

    def __aiter__(self) -> "HeldStream":
        return self

    async def __anext__(self) -> str:
        try:
            return await self._chunks.__anext__()
        except BaseException:
            self._held.release()
            raise

    async def aclose(self) -> None:
        self._held.release()
        await self._chunks.aclose()

    def __del__(self) -> None:
        self._held.release()


class Pool:
    """What ExecuTorch's routes call (`create`, `close_session`, `reset_session`, `healthy`), spread over workers:
    a request goes to the worker its session used before (its cache holds the conversation), else to the least
    loaded; past `workers + queue` requests at once, streamed or not, counted from acceptance, it is refused (503)
    at once; a worker found dead is replaced before it gets the next request (the requests it held were answered
    with an error). A worker keeps as many sessions as it says it can: a new one past that closes the one idle
    longest (clients that never close would fill it, and the adapter's transcripts grow with every session); that
    session's next turn is prefilled anew, slower and never wrong."""

    def __init__(self, start: Callable[[], Worker], workers: int, queue: int):
        self._start, self._queue = start, queue
        self._workers = [start() for _ in range(workers)]
        self._restarting = [asyncio.Lock() for _ in range(workers)]
        self._sessions: OrderedDict[str, int] = OrderedDict()  # session: its worker, idle longest first

    @property
    def healthy(self) -> bool:
        return any(w.healthy for w in self._workers)

    async def create(self, req):
        if sum(w.load for w in self._workers) >= len(self._workers) + self._queue:
            raise Busy(len(self._workers), self._queue)
        i = self._pick(req.session_id)
        held = Held(self._workers[i])  # counted from acceptance: nothing awaited since the check
        try:
            worker = await self._healthy(i)
            if worker is not held.worker:  # replaced while it waited: the new one carries the count
                held.release()
                held = Held(worker)
            for idle in self._evicted(i):
                await worker.chat.close_session(idle)
            result = await worker.chat.create(req)
        except BaseException:
            held.release()
            raise
        if req.stream:
            return held.stream(result)
        held.release()
        return result

    def _pick(self, session_id: str | None) -> int:
        """The worker that served the session before, else the least loaded."""
        if session_id is not None and session_id in self._sessions:
            self._sessions.move_to_end(session_id)
            return self._sessions[session_id]
        i = min(range(len(self._workers)), key=lambda j: self._workers[j].load)
        if session_id is not None:
            self._sessions[session_id] = i
        return i

    def _evicted(self, i: int) -> list[str]:
        """The sessions of worker `i` past what it keeps, idle longest first, taken out of the map at once (before
        any await, so that two requests never evict the same one)."""
        mine = [s for s, w in self._sessions.items() if w == i]
        idle = mine[:max(0, len(mine) - self._workers[i].sessions)] if self._workers[i].sessions > 0 else []
        for session in idle:
            del self._sessions[session]
        return idle

    async def _healthy(self, i: int) -> Worker:
        """Worker `i`, replaced first if it died."""
        if not self._workers[i].healthy:
            async with self._restarting[i]:
                if not self._workers[i].healthy:
                    logger.warning("worker %d is gone; starting another", i)
                    await asyncio.to_thread(self._workers[i].runtime.close_worker)
                    self._workers[i] = await asyncio.to_thread(self._start)
        return self._workers[i]

    async def close_session(self, session_id: str) -> None:
        await self._workers[self._sessions.pop(session_id, 0)].chat.close_session(session_id)

    async def reset_session(self, session_id: str) -> None:
        await self._workers[self._sessions.get(session_id, 0)].chat.reset_session(session_id)

    def close(self) -> None:
        for w in self._workers:
            w.runtime.close_worker()


def _error(status: int, message: str, kind: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status_code=status)


def openai_errors(app: FastAPI) -> FastAPI:
    """Requests ExecuTorch's routes cannot parse (malformed JSON, wrong fields) and unknown paths answered in the
    OpenAI error shape, not FastAPI's `{"detail": ...}`."""

    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        return _error(400, f"invalid request: {where + ': ' if where else ''}{first.get('msg', 'unreadable body')}",
                      "invalid_request_error", "invalid_request")

    async def http(request: Request, e: HTTPException) -> JSONResponse:
        return _error(e.status_code, str(e.detail), "invalid_request_error", "not_found" if e.status_code == 404
                      else "http_error")

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http)
    return app


def worker_command(programs: Path, runner: Path, threads: int, block_size: str, cost_curve: Path | None,
                   lookup: bool = False) -> list[str]:
    """dflash_runner as a worker: `block_size` ar (plain decoding), auto or a number, with the draft's proposals or
    (`lookup`) lookup proposals."""
    mode = ["--ar"] if block_size == "ar" else ["--lookup"] * lookup + ["--block-size", block_size]
    curve = ["--cost-curve", str(cost_curve)] if cost_curve else []
    return [str(runner), "--programs", str(programs), "--worker", "--threads", str(threads), *mode, *curve]


def make_pool(programs: Path, runner: Path, workers: int = 1, queue: int = 32, block_size: str = "auto",
              cost_curve: Path | None = None, model_id: str = "dflash-et", threads: int = 0, lookup: bool = False
              ) -> Pool:
    """The workers over `programs`, with its chat format (`chat_format`) and context length, each on `threads`
    threads (0: its share of the cores)."""
    if workers < 1 or queue < 0:
        raise UserError(f"--workers must be at least 1 and --queue at least 0, got {workers} and {queue}")
    config = export_summary(programs)["config"]
    chat = chat_format(programs)
    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    command = worker_command(programs, runner, threads, block_size, cost_curve, lookup)
    return Pool(lambda: Worker(command, chat, model_id, config["max_seq_len"]), workers, queue)


def serve(pool: Pool, model_id: str, host: str, port: int) -> None:
    """ExecuTorch's app over `pool` until interrupted; the workers stop with it."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        uvicorn.run(openai_errors(build_app(pool, model_id)), host=host, port=port, log_level="info")
    finally:
        pool.close()
