"""`dflash serve`: ExecuTorch's OpenAI-compatible server over dflash_runner workers, driven as users drive it
(ExecuTorch's own contract suite, the official `openai` client, raw HTTP), on loopback ports the tests pick."""

import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import executorch.examples.llm_server as llm_server
import httpx
import openai
import pytest

from dflash_et import cli
from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.prompts import builtin_prompts
from dflash_et.data.tool_chats import declaration, tool_chat
from dflash_et.runtime.cpp_runner import CppEngine
from dflash_et.runtime.engine import Engine
from dflash_et.errors import UserError
from dflash_et.serve import Pool, Worker, chat_format, make_pool, openai_errors
from executorch.examples.llm_server.python.openai_transcript import OpenAITranscriptState
from executorch.examples.llm_server.python.protocol import ChatMessage
from executorch.examples.llm_server.python.server import build_app
from executorch.examples.llm_server.python.tool_parsers import (GemmaToolCallDetector, HermesDetector,
                                                                QwenFunctionCallDetector)

from tests.tiny_programs import TOOL_ROOM, build_programs, built_once

CONTRACT = Path(llm_server.__file__).parent / "conformance" / "test_openai_contract.py"
MODEL = "dflash-et"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(programs: Path, runner: Path, log: Path, *flags: str):
    """`dflash serve` in a process of its own, until the block ends: its base URL and process id."""
    port = free_port()
    with open(log, "w") as out:
        server = subprocess.Popen([str(Path(sys.executable).parent / "dflash"), "serve", "--programs", str(programs),
                                   "--port", str(port), *flags], stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "DFLASH_RUNNER": str(runner)})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(600):
            assert server.poll() is None, log.read_text()
            try:
                urllib.request.urlopen(f"{url}/models", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError(f"the server did not come up:\n{log.read_text()}")
        yield url, server.pid
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            raise


@pytest.fixture(scope="module")
def programs(trained_pair, tmp_path_factory) -> Path:
    """The trained pair's programs with room for a tool-calling request (TOOL_ROOM), where the other tests' programs
    hold 128. The workers call `target` and `draft` alone: no stock `forward`."""
    def build(root: Path) -> None:
        build_programs(trained_pair, root, max_seq_len=TOOL_ROOM, stock_forward=False)

    return built_once(tmp_path_factory, "serve-programs", build) / "programs"


@pytest.fixture(scope="module")
def server(programs, runner, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with served(programs, runner, log) as (url, _):
        yield url, log


FAMILIES = ["programs", "gemma_programs", "hybrid_programs"]  # the built-in pair's, a Gemma 4 pair's, a Qwen3.5 pair's


@pytest.fixture(scope="module", params=FAMILIES)
def family_server(request, tmp_path_factory):
    """(url, log, programs) of `dflash serve` on each family's programs: the built-in pair's server, or one on the
    Gemma 4 or hybrid pair's (tests/conftest.py); each target was trained to call the tools a request declares."""
    if request.param == "programs":
        url, log = request.getfixturevalue("server")
        yield url, log, request.getfixturevalue("programs")
        return
    programs = request.getfixturevalue(request.param)[0]
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with served(programs, request.getfixturevalue("runner"), log) as (url, _):
        yield url, log, programs


def generated(programs: Path, capsys, prompt: str, max_tokens: int) -> str:
    """What `dflash generate` prints for `prompt`, greedy."""
    cli.main(["generate", "--prompt", prompt, "--programs", str(programs), "--max-new-tokens", str(max_tokens),
              "--json"])
    return json.loads(capsys.readouterr().out)["text"]


def plain_text(programs: Path, messages: list[dict], max_tokens: int, tools: list[dict] | None = None) -> str:
    """Greedy plain decoding of a conversation (what greedy DFlash must give), as text with the special tokens the
    worker writes (all but the end of the turn: the server's filters and parsers read them)."""
    tok, engine = tokenizer(programs), Engine(programs)
    tokens = engine.ar(encode_chat(tok, messages, tools), max_tokens).tokens
    return tok.decode([t for t in tokens if t not in engine.eos_ids])


def context(programs: Path) -> int:
    """The programs' KV cache length (export.max_seq_len)."""
    return json.loads((programs / "export.json").read_text())["config"]["max_seq_len"]


def turn_stats(log: Path) -> list[dict]:
    """The server's per-request warm-resume lines (ExecuTorch's llm_turn_stats), parsed."""
    lines = re.findall(r"llm_turn_stats (.*)", log.read_text())
    return [dict(field.split("=", 1) for field in line.split()) for line in lines]


def test_executorch_contract_suite_passes(family_server, tmp_path):
    """ExecuTorch's language-neutral OpenAI contract suite against `dflash serve` on each family's programs: all of
    it, whose tool-call test asks for the weather through a declared tool (the small targets learned to call the
    tools a request declares in their family's format, data.tool_chats), and the server parses the call as
    ExecuTorch's server for the family does."""
    url, _, _ = family_server
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    run = subprocess.run([sys.executable, "-m", "pytest", str(CONTRACT), "-q", "-p", "no:cacheprovider", "-rs"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OPENAI_BASE_URL": url, "OPENAI_MODEL": MODEL})
    assert run.returncode == 0 and "7 passed" in run.stdout and "skipped" not in run.stdout, \
        run.stdout + run.stderr


def a_declared_call(programs: Path) -> tuple[list[dict], list[dict], object]:
    """(messages, tools, parsed): the first of a fixed list of first-turn tool requests that plain greedy decoding of
    the small trained target answers with one call to a declared tool, parsed as ExecuTorch's Hermes parser parses it.
    Which requests the small target gets right depends on the host's rounding in its training (one host's target
    called an undeclared `define_word` for the Oslo question), so the test tries them in order rather than one."""
    tok, engine, rng = tokenizer(programs), Engine(programs), random.Random(0)
    requests = [([{"role": "user", "content": "Is it raining in Oslo? Use the tool."}],
                 [declaration("get_time", "Get the local time in a city.", "city"),
                  declaration("get_weather", "Get the current weather for a city.", "city")])]
    requests += [chat[:2] for chat in (tool_chat(rng) for _ in range(24)) if len(chat[0]) == 1]
    seen = []
    for messages, tools in requests:
        ids = encode_chat(tok, messages, tools)
        if len(ids) + 2 * 64 > engine.max_context_len:  # the call, its result and the answer must fit after it
            continue
        written = tok.decode(engine.ar(ids, 64).tokens, skip_special_tokens=True)
        parsed = HermesDetector().detect_and_parse(written, {t["function"]["name"]: t["function"]["parameters"]
                                                             for t in tools})
        if len(parsed.calls) == 1:
            return messages, tools, parsed
        seen.append(written)
    pytest.fail(f"the trained target wrote no call to a declared tool in the {len(seen)} requests that fit: {seen!r}")


def test_a_tool_call_comes_back_as_tool_calls_and_its_result_is_answered(server, programs):
    """A request declaring tools gets what plain greedy decoding of the same messages and tools writes, parsed
    as ExecuTorch's Hermes parser parses it: a call to a declared tool as OpenAI `tool_calls` (finish_reason
    tool_calls). Sent back with the tool's result, the next reply is plain greedy decoding's of that conversation
    (the server renders the call and the result as the chat template does), as content."""
    url, _ = server
    client = openai.OpenAI(base_url=url, api_key="none")
    messages, tools, parsed = a_declared_call(programs)
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=64, temperature=0)
    [call] = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and call.type == "function" and call.id
    assert (call.function.name, json.loads(call.function.arguments)) == (parsed.calls[0].name,
                                                                         json.loads(parsed.calls[0].arguments))
    messages += [reply.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "light rain, 12 C"}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=24, temperature=0)
    assert not answer.choices[0].message.tool_calls
    assert answer.choices[0].message.content == plain_text(programs, messages, 24, tools)


def test_the_openai_client_gets_what_dflash_generate_prints(server, programs, capsys):
    """Greedy, streamed and not, each reply is `dflash generate`'s text for the same prompt and length."""
    url, _ = server
    client = openai.OpenAI(base_url=url, api_key="none")
    for row in builtin_prompts(3):
        expected = generated(programs, capsys, row["prompt"], 24)
        messages = [{"role": "user", "content": row["prompt"]}]
        whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
        stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0,
                                                stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert whole.choices[0].message.content == expected == streamed
        assert whole.usage.completion_tokens == chunks[-1].usage.completion_tokens <= 24
        assert whole.usage.prompt_tokens == len(encode_chat(tokenizer(programs), row["prompt"]))


def test_a_conversation_reuses_its_cache_and_answers_as_from_scratch(family_server):
    """Three turns of one session on each family's programs: turns 2 and 3 run only their new tokens (the worker's
    accounting: the assistant header and preamble the server splices back, Qwen3's empty think block or Gemma 4's
    empty thought channel, are what the worker read), and each reply is plain greedy decoding's of the prompt the
    server built, in which its earlier replies are the ids it generated (ExecuTorch's OpenAITranscriptState), as
    the family's content filter shows it. The same turns without a session (the history re-rendered by the
    template) answer as plain greedy decoding of `encode_chat`, what `dflash generate` reads; after a reset the
    session's next turn runs all of its prompt. (Replies of 8 tokens, so that all turns fit the programs.)"""
    url, log, programs = family_server
    client = openai.OpenAI(base_url=url, api_key="none")
    tok, engine = tokenizer(programs), Engine(programs)
    template, serving = chat_format(programs)
    shown = serving.get("content_filter") or (lambda text: text)
    transcript, session = OpenAITranscriptState(template), "conversation-1"
    messages = []
    for turn, text in enumerate(["Ada has 3 apples and buys 4 more.", "And then she eats two.", "Write it as code."]):
        messages.append({"role": "user", "content": text})
        chat = [ChatMessage(**m) for m in messages]
        prompt = transcript.build_prompt_input(session_id=session, messages=chat, rendered_prompt=template.render(chat),
                                               tools=None, template_kwargs={})
        segments = prompt.segments or [{"text": prompt.text}]
        ids = [i for seg in segments for i in seg.get("ids") or tok.encode(seg["text"], add_special_tokens=False)]
        plain = [t for t in engine.ar(ids, 8).tokens if t not in engine.eos_ids]
        assert not set(plain) & set(tok.all_special_ids), "a special token in the reply stops the server; other words"
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                               stream=turn == 1, extra_body={"session_id": session})
        content = "".join(c.choices[0].delta.content or "" for c in reply if c.choices) if turn == 1 \
            else reply.choices[0].message.content
        assert content == shown(tok.decode(plain)), turn
        transcript.record_assistant_turn(session_id=session, content=content, tool_calls=None, prior_turns=turn,
                                         generated_token_ids=plain, preamble=template.generation_preamble({}))
        messages.append({"role": "assistant", "content": content})
    stats = [s for s in turn_stats(log) if s["session_id"] == session]
    assert [s["reason"] for s in stats[1:]] == ["exact_prefix", "exact_prefix"], stats
    for before, s in zip(stats, stats[1:]):  # all of the turn before is reused: its prompt and its reply
        assert int(s["reused_prompt_tokens"]) >= int(before["prompt_tokens"]) and int(s["prefilled_prompt_tokens"]) > 0
        assert int(s["reused_prompt_tokens"]) + int(s["prefilled_prompt_tokens"]) == int(s["prompt_tokens"])
    urllib.request.urlopen(urllib.request.Request(f"{url}/sessions/{session}/reset", method="POST"))
    client.chat.completions.create(model=MODEL, messages=messages[:1], max_tokens=8, extra_body={"session_id": session})
    assert turn_stats(log)[-1]["reused_prompt_tokens"] == "0", turn_stats(log)[-1]
    for turn in (1, 3, 5):
        cold = client.chat.completions.create(model=MODEL, messages=messages[:turn], max_tokens=8, temperature=0)
        assert cold.choices[0].message.content == shown(plain_text(programs, messages[:turn], 8)), turn


def test_each_family_is_served_in_its_own_chat_format(tmp_path):
    """What the server takes from each built-in family's chat template: the assistant header (the generation
    prompt's first line) and the preamble after it that a warm resume splices back, Gemma 4's channel filter
    (the visible answer is what lies outside its thought channel) and the parser of the calls it writes."""
    from dflash_et.checkpoints import builtin, families

    expected = {"qwen3": ("<|im_start|>assistant\n", "<think>\n\n</think>\n\n", HermesDetector),
                "gemma4": ("<|turn>model\n", "<|channel>thought\n<channel|>", GemmaToolCallDetector),
                "qwen3_5": ("<|im_start|>assistant\n", "<think>\n\n</think>\n\n", QwenFunctionCallDetector)}
    for name, family in families.builtins().items():
        builtin.build_tokenizer(**family.builtin.tokenizer).save_pretrained(tmp_path / name)
        template, serving = chat_format(tmp_path / name)
        header, preamble, parser = expected[name]
        assert (template.assistant_header(), template.generation_preamble({}), serving["tool_detector_cls"]) == \
            (header, preamble, parser), name
        shown = serving.get("content_filter")
        assert (shown("<|channel>thought\nplans<channel|>The answer.") == "The answer.") if name == "gemma4" else \
            shown is None, name


def post(url: str, body: bytes | dict) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/chat/completions", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server):
    url, _ = server
    hi = [{"role": "user", "content": "hi"}]
    cases = {
        b"{not json": (400, "invalid_request"),
        json.dumps({"model": MODEL}).encode(): (400, "invalid_request"),  # no messages
        json.dumps({"model": "gpt-4", "messages": hi}).encode(): (404, "model_not_found"),
        json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "word " * 400}]}).encode():
            (400, "context_length_exceeded"),
        json.dumps({"model": MODEL, "messages": hi, "max_tokens": 500}).encode(): (400, "context_length_exceeded"),
        json.dumps({"model": MODEL, "messages": hi, "temperature": 9}).encode(): (400, "invalid_value"),
    }
    for body, (status, code) in cases.items():
        got, answer = post(url, body)
        assert (got, answer["error"]["code"]) == (status, code) and answer["error"]["message"], (body, answer)
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{url}/completions/none")
    assert missing.value.code == 404 and json.loads(missing.value.read())["error"]["code"] == "not_found"
    assert post(url, {"model": MODEL, "messages": hi, "max_tokens": 4})[0] == 200


SLOW_WORKER = r"""
import json, os, sys, time
control = int(os.environ["EXECUTORCH_LLM_WORKER_CONTROL_FD"])
os.set_blocking(control, False)
print(json.dumps({"ready": True, "max_named_sessions": 4, "supports_cancel": True}), flush=True)
for line in sys.stdin:
    request, cancelled = json.loads(line), False
    for step in range(request["max_new_tokens"] if request["max_new_tokens"] > 0 else 200):
        print(json.dumps({"token": f" w{step}"}), flush=True)
        time.sleep(0.02)
        try:
            cancelled = int.from_bytes(os.read(control, 8), "little") == request["cancel_request_id"]
        except BlockingIOError:
            pass
        if cancelled:
            break
    print(f"slow worker: {'cancelled' if cancelled else 'finished'} after {step + 1} steps", file=sys.stderr, flush=True)
    print(json.dumps({"done": True, "prompt_tokens": 3, "completion_tokens": step + 1, "finish_reason": "stop",
                      "cancelled": cancelled}), flush=True)
"""


def test_a_client_that_leaves_mid_stream_cancels_its_generation(programs, tmp_path):
    """Through `dflash serve` with a scripted worker slow enough to leave mid-reply (a token each 20 ms): the
    worker gets the cancellation frame and stops, and the next request is served."""
    fake = tmp_path / "dflash_runner"
    fake.write_text(f"#!{sys.executable}\n{SLOW_WORKER}")
    fake.chmod(0o755)
    log = tmp_path / "server.log"
    with served(programs, fake, log) as (url, _):
        port = int(url.split(":")[2].split("/")[0])
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            received = b""
            while b"w3" not in received:
                received += s.recv(4096)
        for _ in range(100):
            if "slow worker:" in log.read_text():
                break
            time.sleep(0.05)
        assert re.search(r"slow worker: cancelled after \d+ steps", log.read_text()), log.read_text()
        status, answer = post(url, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert status == 200 and answer["choices"][0]["message"]["content"].startswith(" w0"), answer


def test_a_client_that_leaves_mid_stream_does_not_stop_the_server(server):
    url, _ = server
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
                       "max_tokens": 100, "stream": True}).encode()
    port = int(url.split(":")[2].split("/")[0])
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            assert s.recv(64).startswith(b"HTTP/1.1 200")
    assert post(url, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})[0] == 200


def worker_pids(server_pid: int) -> list[int]:
    """The server's dflash_runner children."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == server_pid and "dflash_runner" in (stat.parent / "cmdline").read_text():
                pids.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def test_a_worker_that_dies_is_replaced(programs, runner, tmp_path):
    log = tmp_path / "server.log"
    with served(programs, runner, log, "--workers", "2") as (url, pid):
        before = worker_pids(pid)
        assert len(before) == 2
        for worker in before:
            os.kill(worker, signal.SIGKILL)
        time.sleep(0.5)
        hi = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert [post(url, hi)[0] for _ in range(3)] == [200, 200, 200]
        after = worker_pids(pid)
        assert len(after) >= 1 and not set(after) & set(before)
    assert "is gone; starting another" in log.read_text()


def test_serve_refuses_what_it_cannot_serve_in_one_line(programs, runner, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(programs, bare)
    (bare / "chat_template.jinja").unlink()
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    no_draft = tmp_path / "no-draft"
    shutil.copytree(programs, no_draft)
    (no_draft / "draft.pte").unlink()
    for args, message in (((tmp_path, runner), r"export.json is missing: rebuild it \(`dvc repro package`"),
                          ((bare, runner), "has no chat template to render chats with"),
                          ((programs, runner, 0), "--workers must be at least 1"),
                          ((no_draft, runner), r"the C\+\+ worker did not start .+; run `.+ --worker")):
        with pytest.raises(UserError, match=message):
            make_pool(*args)
    for flags, message in ((["--programs", str(programs.parent / "nowhere")], "export.json"),
                           (["--lookup", "--block-size", "ar"], "--lookup and --block-size ar are two ways")):
        run = subprocess.run([str(Path(sys.executable).parent / "dflash"), "serve", *flags], capture_output=True,
                             text=True, env={**os.environ, "DFLASH_RUNNER": str(runner)})
        assert run.returncode == 1 and run.stderr.startswith("error: ") and message in run.stderr, run.stderr


# ------------------------------------------------------------------------------------- the worker itself


@contextmanager
def worker(programs: Path, runner: Path, *flags: str):
    """dflash_runner --worker with a cancellation pipe, as ExecuTorch's spawn_worker starts it: its ready line, a
    function that sends one request and returns (token texts, last message), and the pipe's write end."""
    read, write = os.pipe()
    process = subprocess.Popen([str(runner), "--programs", str(programs), "--worker", "--threads", "1", *flags],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "EXECUTORCH_LLM_WORKER_CONTROL_FD": str(read)}, pass_fds=(read,))
    os.close(read)

    def ask(request: dict | str) -> tuple[list[str], dict]:
        process.stdin.write((request if isinstance(request, str) else json.dumps(request)) + "\n")
        process.stdin.flush()
        tokens = []
        while "token" in (message := json.loads(process.stdout.readline())):
            tokens.append(message["token"])
        return tokens, message
    try:
        yield json.loads(process.stdout.readline()), ask, write
    finally:
        process.stdin.close()
        assert process.wait(timeout=30) == 0
        os.close(write)


@pytest.mark.parametrize("flags", [(), ("--ar",), ("--block-size", "4"), ("--lookup",)],
                         ids=["auto", "ar", "block-4", "lookup-auto"])
def test_the_worker_resumes_a_conversation_from_its_cache_exactly(programs, runner, flags):
    """Turn 2 starts with turn 1's prompt and reply: only the rest is run (exact_prefix), and both turns give
    plain greedy decoding's tokens of their whole prompt, streamed, with the draft's proposals or lookup's."""
    tok, engine = tokenizer(programs), Engine(programs)
    eos = set(engine.eos_ids)
    first = encode_chat(tok, "Ada has 3 apples and buys 4 more.")
    rest = "<|im_end|>\n<|im_start|>user\nAnd then she eats two.<|im_end|>\n<|im_start|>assistant\n"
    with worker(programs, runner, *flags) as (ready, ask, _):
        assert ready["ready"] and ready["supports_cancel"] and ready["max_context_len"] == context(programs)
        text, done = ask({"prompt_segments": [{"ids": first}], "max_new_tokens": 12, "session_id": "s"})
        plain = engine.ar(first, 12).tokens
        assert done["generated_token_ids"] == [t for t in plain if t not in eos]
        assert "".join(text) == tok.decode(plain, skip_special_tokens=True)
        assert (done["session_reset_reason"], done["reused_prompt_tokens"]) == ("new", 0)
        held = first + plain[:-1]
        second = first + done["generated_token_ids"] + tok.encode(rest, add_special_tokens=False)
        _, again = ask({"prompt_segments": [{"ids": first + done["generated_token_ids"]}, {"text": rest}],
                        "max_new_tokens": 12, "session_id": "s"})
        assert again["generated_token_ids"] == [t for t in engine.ar(second, 12).tokens if t not in eos]
        assert (again["session_reset_reason"], again["reused_prompt_tokens"], again["prefilled_prompt_tokens"]) == \
            ("exact_prefix", len(held), len(second) - len(held))
        ask({"op": "reset", "session_id": "s"})
        _, cold = ask({"prompt_segments": [{"ids": second}], "max_new_tokens": 12, "session_id": "s"})
        assert cold["generated_token_ids"] == again["generated_token_ids"]
        assert (cold["session_reset_reason"], cold["prefilled_prompt_tokens"]) == ("new", len(second))


@pytest.mark.parametrize("family", ["gemma_programs", "hybrid_programs"])
def test_a_worker_whose_caches_cannot_go_back_runs_a_prompt_that_leaves_them_anew(request, runner, family):
    """Gemma 4's sliding layers keep a ring of their window (export.sliding_cache ring) and a hybrid's DeltaNet
    layers one running state: neither can go back far into what it holds, so a prompt that shares only the chat
    template's opening with the last generation is run whole ("mismatch", nothing reused), and answered as plain
    greedy decoding answers it; one that goes on past all of it still resumes (exact_prefix)."""
    programs = request.getfixturevalue(family)[0]
    tok, engine = tokenizer(programs), Engine(programs)
    eos = set(engine.eos_ids)
    first, other = (encode_chat(tok, text) for text in ("Tell me a long story about a cat.", "And a dog?"))
    with worker(programs, runner) as (_, ask, _):
        _, done = ask({"prompt_segments": [{"ids": first}], "max_new_tokens": 24})
        _, again = ask({"prompt_segments": [{"ids": other}], "max_new_tokens": 8})
        assert (again["session_reset_reason"], again["reused_prompt_tokens"]) == ("mismatch", 0)
        assert again["generated_token_ids"] == [t for t in engine.ar(other, 8).tokens if t not in eos]
        longer = other + again["generated_token_ids"] + tok.encode("more", add_special_tokens=False)
        _, on = ask({"prompt_segments": [{"ids": longer}], "max_new_tokens": 8})
        assert on["session_reset_reason"] == "exact_prefix" and on["reused_prompt_tokens"] > len(other)
        assert on["generated_token_ids"] == [t for t in engine.ar(longer, 8).tokens if t not in eos]


def test_the_worker_stops_at_a_cancellation_or_a_stop_string(programs, runner):
    tok = tokenizer(programs)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Tell me about tea."}], tokenize=False,
                                     add_generation_prompt=True, enable_thinking=False)
    # blocks of 2: auto's rounds depend on this machine's speed, and a stop string found only in the last round
    # (CI's draft emitted "Tell me about tea."'s reply in few long rounds) cuts nothing
    with worker(programs, runner, "--block-size", "2") as (_, ask, control):
        whole, done = ask({"prompt": prompt, "max_new_tokens": 40, "cancel_request_id": 1})
        assert not done["cancelled"] and done["completion_tokens"] > 8 and len(whole) >= 3
        os.write(control, (2).to_bytes(8, "little"))  # before its request: read when it starts, as a client may
        _, cancelled = ask({"prompt": prompt, "max_new_tokens": 40, "cancel_request_id": 2})
        assert cancelled["cancelled"] and cancelled["completion_tokens"] == 1 and not cancelled["generated_token_ids"]
        stop = whole[len(whole) // 2][:6]  # text of a step with steps after it
        cut, stopped = ask({"prompt": prompt, "max_new_tokens": 40, "stop": [stop], "cancel_request_id": 3})
        assert stop in "".join(cut) and "".join(whole).startswith("".join(cut))
        assert stopped["finish_reason"] == "stop" and stopped["completion_tokens"] < done["completion_tokens"]
        plain = done["generated_token_ids"]  # counted up to the token whose text completes the stop string
        assert stopped["completion_tokens"] == next(n for n in range(1, len(plain) + 1)
                                                    if stop in tok.decode(plain[:n], skip_special_tokens=True))
        assert not stopped["generated_token_ids"] and not stopped["cancelled"]
        assert "".join(ask({"prompt": prompt, "max_new_tokens": 40, "cancel_request_id": 4})[0]) == "".join(whole)


def test_the_worker_answers_bad_requests_with_codes_and_goes_on(programs, runner):
    with worker(programs, runner, "--ar") as (_, ask, _):
        for request, code in [("not json", "invalid_request"), ("[1]", "invalid_request"),
                              ({"op": "fly", "session_id": "a"}, "invalid_request"),
                              ({"op": "open"}, "invalid_request"),
                              ({"prompt": "word " * 400}, "context_length_exceeded"),
                              ({"prompt_segments": []}, "invalid_request"),
                              ({"prompt_segments": [{"ids": [10**9]}]}, "invalid_request"),
                              ({"prompt_segments": [{"image": "x"}]}, "invalid_request"),
                              ({"prompt": "hi", "temperature": "hot"}, "invalid_request"),
                              ({"max_new_tokens": 3}, "invalid_request")]:
            tokens, answer = ask(request)
            assert not tokens and answer.get("code") == code and answer["error"], (request, answer)
        assert ask({"op": "close", "session_id": "never-opened"})[1] == {"closed": True, "session_id": "never-opened"}
        assert ask({"prompt": "hi", "max_new_tokens": 3})[1]["done"]


def test_conversations_that_never_close_evict_the_idlest_and_stay_exact(programs, runner):
    """200 conversations that never close on one worker (it keeps 64 names): each is answered with plain greedy
    decoding's tokens, none is refused, the newest one's turn 2 resumes from the cache, and an evicted one's turn 2
    is prefilled anew and as exact."""
    tok, engine = tokenizer(programs), Engine(programs)
    eos = set(engine.eos_ids)
    prompts = [encode_chat(tok, f"Count to {i}.") for i in range(200)]
    with worker(programs, runner, "--ar") as (ready, ask, _):
        assert ready["max_named_sessions"] == 64
        answers = [ask({"prompt_segments": [{"ids": p}], "max_new_tokens": 2, "session_id": f"c{i}"})[1]
                   for i, p in enumerate(prompts)]
        assert all(a.get("done") for a in answers), next(a for a in answers if not a.get("done"))
        for i in (0, 63, 64, 199):
            assert answers[i]["generated_token_ids"] == [t for t in engine.ar(prompts[i], 2).tokens if t not in eos]
        for i, reason in ((199, "exact_prefix"), (0, "mismatch")):  # c0: only the chat template's opening is reused
            turn2 = prompts[i] + answers[i]["generated_token_ids"] + tok.encode(
                "<|im_end|>\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
            _, again = ask({"prompt_segments": [{"ids": turn2}], "max_new_tokens": 4, "session_id": f"c{i}"})
            assert again["session_reset_reason"] == reason
            assert again["generated_token_ids"] == [t for t in engine.ar(turn2, 4).tokens if t not in eos]


# --------------------------------------------------------------- faults a real worker is too quick to show

FAKE_WORKER = r"""
import json, sys, time
print(json.dumps({"ready": True, "max_named_sessions": 64}), flush=True)
sessions = set()  # as ExecuTorch's own worker: a 65th session is refused
for line in sys.stdin:
    request = json.loads(line)
    if "op" in request:
        if request["op"] == "open" and request["session_id"] not in sessions and len(sessions) == 64:
            print(json.dumps({"error": "all 64 sessions are open", "code": "capacity_exhausted"}), flush=True)
            continue
        (sessions.add if request["op"] == "open" else sessions.discard)(request["session_id"])
        print(json.dumps({request["op"] + ("ed" if request["op"] == "open" else "d" if request["op"] == "close"
                                             else ""): True}), flush=True)
        continue
    print(json.dumps({"token": "Hello"}), flush=True)
    if "die" in request["prompt"]:
        sys.exit(3)
    time.sleep(0 if "fast" in request["prompt"] else 0.3)
    print(json.dumps({"done": True, "prompt_tokens": 3, "completion_tokens": 1, "finish_reason": "stop"}), flush=True)
"""


@pytest.fixture
def fake_app(programs, tmp_path):
    """ExecuTorch's app over a Pool of scripted workers: one that answers slowly, or dies mid-request."""
    script = tmp_path / "worker.py"
    script.write_text(FAKE_WORKER)
    chat = chat_format(programs)

    def app(workers: int, queue: int):
        pool = Pool(lambda: Worker([sys.executable, str(script)], chat, MODEL, 128), workers, queue)
        return pool, openai_errors(build_app(pool, MODEL))
    return app


def ask(app, content: str, stream: bool = False, session: str | None = None, done: list | None = None):
    """One chat request to `app`; its response is appended to `done` as soon as it is whole."""
    async def one():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            reply = await client.post("/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": content}], "stream": stream},
                headers={"X-ExecuTorch-Session-Id": session} if session else {})
        if done is not None:
            done.append(reply)
        return reply
    return one()


def test_past_the_queue_requests_get_503_and_none_is_lost(fake_app):
    pool, app = fake_app(workers=1, queue=1)

    async def burst():
        return await asyncio.gather(*(ask(app, f"q{i}") for i in range(3)))
    replies = asyncio.run(burst())
    pool.close()
    statuses = sorted(r.status_code for r in replies)
    assert statuses == [200, 200, 503], [r.text for r in replies]
    busy = next(r for r in replies if r.status_code == 503).json()["error"]
    assert busy["code"] == "server_overloaded" and "retry" in busy["message"]
    assert all(r.json()["choices"][0]["message"]["content"] == "Hello" for r in replies if r.status_code == 200)


def test_streamed_requests_with_sessions_count_from_acceptance(fake_app):
    """16 streamed requests, each its own session, at once against 1 worker and a queue of 4: exactly 5 are
    served (whole streams), the other 11 are refused with 503 before any served stream ends, and once the burst is
    over the bound is free again."""
    pool, app = fake_app(workers=1, queue=4)
    done = []

    async def burst():
        return await asyncio.gather(*(ask(app, f"q{i}", stream=True, session=f"s{i}", done=done) for i in range(16)))
    replies = asyncio.run(burst())
    assert sorted(r.status_code for r in replies) == [200] * 5 + [503] * 11, [r.text for r in replies]
    assert [r.status_code for r in done[:11]] == [503] * 11
    for r in replies:
        if r.status_code == 200:
            events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]" and "".join(
                json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == "Hello"
    assert sum(w.load for w in pool._workers) == 0
    again = asyncio.run(ask(app, "after", stream=True, session="s0"))
    pool.close()
    assert again.status_code == 200


def test_conversations_that_never_close_are_all_served_in_bounded_state(fake_app):
    """200 conversations, one turn each and none closed, on a worker that keeps 64 sessions and refuses a 65th (as
    ExecuTorch's own does): every one is answered, the pool closes the sessions idle longest and its map stays
    within what the worker keeps; a session evicted long ago is served again."""
    pool, app = fake_app(workers=1, queue=4)

    async def conversations():
        return [await ask(app, f"fast {i}", session=f"c{i}") for i in range(200)]
    replies = asyncio.run(conversations())
    assert [r.status_code for r in replies] == [200] * 200, next(r.text for r in replies if r.status_code != 200)
    assert list(pool._sessions) == [f"c{i}" for i in range(136, 200)]
    again = asyncio.run(ask(app, "fast again", session="c0"))
    pool.close()
    assert again.status_code == 200 and "c0" in pool._sessions and len(pool._sessions) == 64


def test_a_worker_dying_mid_request_is_an_error_then_a_new_worker_serves(fake_app):
    pool, app = fake_app(workers=1, queue=4)

    async def turns():
        died = await ask(app, "please die")
        streamed = await ask(app, "die while streaming", stream=True)
        after = await ask(app, "hello")
        return died, streamed, after
    died, streamed, after = asyncio.run(turns())
    pool.close()
    assert died.status_code == 500 and died.json()["error"]["type"] == "server_error"
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "error" in json.loads(events[-2])
    assert after.status_code == 200 and after.json()["choices"][0]["message"]["content"] == "Hello"


# ------------------------------------------------------------------------------------------------ load


def test_32_concurrent_requests_all_answered_exactly(programs, runner, tmp_path):
    """32 greedy requests at once, half streamed, with 1 and with 2 workers: every one answered with plain greedy
    decoding's text, none lost, the server up after; prints requests/s, latency and tokens/s."""
    rows = builtin_prompts(32)
    expected = [plain_text(programs, [{"role": "user", "content": r["prompt"]}], 16) for r in rows]
    for workers in (1, 2):
        with served(programs, runner, tmp_path / f"load-{workers}.log", "--workers", str(workers)) as (url, _):
            client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0)

            async def one(i: int):
                t0 = time.perf_counter()
                messages = [{"role": "user", "content": rows[i]["prompt"]}]
                if i % 2:
                    stream = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                                                  temperature=0, stream=True)
                    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                else:
                    reply = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                                                 temperature=0)
                    text = reply.choices[0].message.content
                return text, time.perf_counter() - t0

            async def burst():
                t0 = time.perf_counter()
                out = await asyncio.gather(*(one(i) for i in range(32)))
                return out, time.perf_counter() - t0
            answers, seconds = asyncio.run(burst())
            assert [a for a, _ in answers] == expected
            latency = sorted(s for _, s in answers)
            tokens = sum(len(tokenizer(programs).encode(a, add_special_tokens=False)) for a, _ in answers)
            print(f"\n{workers} worker(s): {32 / seconds:.1f} requests/s, p50 {1000 * latency[15]:.0f} ms, "
                  f"p95 {1000 * latency[30]:.0f} ms, {tokens / seconds:.0f} tokens/s")
            assert post(url, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})[0] \
                == 200


@pytest.mark.bench
def test_served_decoding_keeps_the_runners_speed(programs, runner, tmp_path):
    """One stream at a time, greedy, auto, the same prompts and cost curve: decoding tokens/s while serving (the
    worker's own count, its tokens streamed through the server to the `openai` client) against the C++ runner's
    command line (a process a prompt), the two taking turns prompt by prompt (this VM's speed drifts by a third
    within minutes), then against the runner's loop kept warm (CppEngine, alone: two runtimes' thread pools
    side by side slow each other); end to end as the client sees it (request to last token); time to the first
    token and to start; a 3-turn conversation's prefill with its session's cache and without.
    Programs: $DFLASH_BENCH_PROGRAMS (artifacts/programs after `make repro`, with $DFLASH_BENCH_CURVE
    reports/cost_curve.json), else the tests' tiny pair."""
    programs = Path(os.environ.get("DFLASH_BENCH_PROGRAMS", programs))
    curve = os.environ.get("DFLASH_BENCH_CURVE")
    curve_flag = ["--cost-curve", curve] if curve else []
    rows, max_tokens = builtin_prompts(int(os.environ.get("DFLASH_BENCH_PROMPTS", "12"))), 128
    tok, log = tokenizer(programs), tmp_path / "server.log"
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    t0 = time.perf_counter()
    with served(programs, runner, log, *curve_flag) as (url, _):
        startup = time.perf_counter() - t0
        client = openai.OpenAI(base_url=url, api_key="none")
        cli, end_to_end, first_token = [], [], []
        for row in rows * 2:
            out = json.loads(subprocess.run([str(runner), "--programs", str(programs), "--prompt", row["prompt"],
                                             "--json", "--max-new-tokens", str(max_tokens), *curve_flag],
                                            capture_output=True, text=True, check=True).stdout)
            cli.append((len(out["tokens"]) - 1) / sum(r["total_s"] for r in out["rounds"]))
            t0 = time.perf_counter()
            stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": row["prompt"]}],
                                                    max_tokens=max_tokens, temperature=0, stream=True,
                                                    stream_options={"include_usage": True})
            first, usage = None, None
            for chunk in stream:
                first = first or (chunk.choices and chunk.choices[0].delta.content and time.perf_counter())
                usage = chunk.usage or usage
            end_to_end.append(usage.completion_tokens / (time.perf_counter() - t0))
            first_token.append(first - t0)
        serving = [float(s["decode_tok_s"]) for s in turn_stats(log)]
        for reuse in (True, False):  # a 3-turn conversation: with its session's cache, and reset before each turn
            session, messages = f"bench-{reuse}", []
            for row in rows[:3]:
                if not reuse:
                    urllib.request.urlopen(urllib.request.Request(f"{url}/sessions/{session}/reset", method="POST"))
                messages.append({"role": "user", "content": row["prompt"]})
                reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=64, temperature=0,
                                                       extra_body={"session_id": session})
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            turns = [s for s in turn_stats(log) if s["session_id"] == session]
            print(f"\n{'with its cache' if reuse else 'reset each turn'}: turns 2 and 3 prefilled " + ", ".join(
                f"{t['prefilled_prompt_tokens']} of {t['prompt_tokens']} tokens in {t['prefill_ms']} ms" for t in turns[1:]))
    with CppEngine(programs, runner, cost_curve=Path(curve) if curve else None) as engine:
        loop = [engine.dflash(encode_chat(tok, row["prompt"]), max_tokens, "auto") for row in rows * 2]
    warm = [(len(g.tokens) - 1) / sum(r.total_s for r in g.rounds) for g in loop]
    warm_end = [len(g.tokens) / (g.prefill_s + sum(r.total_s for r in g.rounds)) for g in loop]
    ratios = [s / c for s, c in zip(serving, cli)]
    print(f"{programs}, {len(rows)} prompts twice, one stream, median tokens/s: decoding while serving "
          f"{median(serving):.0f}, the runner's command line {median(cli):.0f} (a process a prompt; served/command "
          f"line per prompt: median {median(ratios):.2f}), its loop kept warm {median(warm):.0f} (after); end to end "
          f"{median(end_to_end):.0f} served, {median(warm_end):.0f} in the loop; first token after "
          f"{1000 * median(first_token):.0f} ms; server up after {startup:.1f} s")
    assert len(serving) == 2 * len(rows) and median(ratios) >= 0.9


def test_the_tool_parser_is_the_one_the_chat_template_writes_calls_for():
    """Each family's calls in the words its chat template renders them (Gemma 4, Qwen3.5, Qwen3 / built-in)."""
    from dflash_et.checkpoints.builtin import CHAT_TEMPLATE
    from dflash_et.serve import tool_parser
    gemma = "{{- '<|tool_call>call:' + function['name'] + '{' }}"
    qwen35 = "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
    assert [tool_parser(t) for t in (gemma, qwen35, CHAT_TEMPLATE, "")] == [
        GemmaToolCallDetector, QwenFunctionCallDetector, HermesDetector, HermesDetector]
