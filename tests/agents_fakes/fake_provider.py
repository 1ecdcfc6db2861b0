"""A scripted, offline model provider: Chat Completions, Responses and Anthropic Messages.

A small :mod:`http.server` on 127.0.0.1 (random port) that answers every model request with
the next step of a *script*, in the wire format of the endpoint that was called, with or
without server-sent-event streaming, and records every request it got. Tests point the
built-in loop (``base_url``), Claude Code (``ANTHROPIC_BASE_URL``) and Codex (a custom model
provider in ``config.toml``) at it, so whole agent runs happen without a network or a model.

Endpoints (matched on the path's end, with or without a ``/v1`` prefix; queries ignored):
``POST /chat/completions``, ``POST /responses``, ``POST /messages``,
``POST /messages/count_tokens``, ``GET /models``.

A script is a JSON/YAML mapping (see :class:`Script`)::

    {"models": ["fake-model"],          # only requests for these models consume steps
     "steps": [
       {"text": "Let me look at the task."},
       {"tool_calls": [{"name": "run_tests", "arguments": {}}], "text": "optional text"},
       {"error": 429, "retry_after": 0.01},          # an HTTP error (429, 500, 529, ...)
       {"malformed": "tool_arguments"},              # body | empty | tool_arguments | stream
       {"json": {"score": 3}},   # a structured answer: text, or a call of the forced tool /
                                 # of a tool named structured_output / StructuredOutput
       {"text": "done", "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read": 100,
                                  "cache_write_5m": 20, "cache_write_1h": 0}, "delay_s": 0.5}
     ],
     "exhausted": {"text": "Done."}}     # the reply once the steps are used up

Error and malformed steps consume one step each, so ``[{"error": 429}, {"text": "hi"}]`` makes
a client with retries see one 429, then "hi". Requests for models outside ``models`` (an agent
CLI's background calls to a small model) get ``filler`` and consume nothing. Usage reported is
the step's ``usage`` or, by default, ``input = len(request JSON) // 4`` and
``output = len(reply text + arguments) // 4 + 1`` (deterministic).

Usage (tests)::

    from agents_fakes.fake_provider import FakeProvider
    with FakeProvider({"steps": [{"text": "hello"}]}) as fp:
        backend = get_backend("openai", "fake-model", base_url=fp.base_url + "/v1")
        ...
        fp.requests      # [RecordedRequest(path=..., body=..., step=0, status=200, ...)]

Command line (in tests/): ``python -m agents_fakes.fake_provider SCRIPT.json [--port N]`` serves until
interrupted and prints the base URL.
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StepUsage(BaseModel):
    """Token usage a step reports, in disjoint buckets (rendered per API: Chat and Responses
    report ``prompt/input`` tokens that include the cache buckets)."""

    model_config = ConfigDict(extra="forbid")
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0
    reasoning_tokens: int = 0


class FakeToolCall(BaseModel):
    """One tool call of a scripted reply; ``id`` is generated when omitted. ``namespace``
    (Responses API only) names a tool namespace, as Codex uses for MCP servers (``mcp__d2k``)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: dict = Field(default_factory=dict)
    id: str | None = None
    namespace: str | None = None


class Step(BaseModel):
    """One scripted reply (or failure)."""

    model_config = ConfigDict(extra="forbid")
    text: str | None = None
    tool_calls: list[FakeToolCall] = Field(default_factory=list)
    json_answer: Any = Field(default=None, alias="json")
    error: int | None = Field(default=None, ge=400, le=599)
    error_message: str | None = None
    retry_after: float | None = None
    malformed: Literal["body", "empty", "tool_arguments", "stream"] | None = None
    usage: StepUsage | None = None
    delay_s: float = 0.0


class Script(BaseModel):
    """A list of steps served in order, plus what to answer outside them."""

    model_config = ConfigDict(extra="forbid")
    steps: list[Step] = Field(default_factory=list)
    models: list[str] | None = None
    exhausted: Step = Field(default_factory=lambda: Step(text="Done."))
    filler: Step = Field(default_factory=lambda: Step(text="ok"))


class RecordedRequest(BaseModel):
    """A request the server got. ``step`` is the script index it consumed (None: filler,
    exhausted or not a model call)."""

    method: str
    path: str
    api: str
    model: str | None = None
    stream: bool = False
    body: Any = None
    headers: dict = Field(default_factory=dict)
    step: int | None = None
    status: int = 200
    time: float = 0.0


_KEEP_HEADERS = ("user-agent", "anthropic-version", "anthropic-beta", "x-stainless-lang", "content-type")


def load_script(script: Script | dict | list | str | Path) -> Script:
    """A :class:`Script` from a model, a mapping, a list of steps, or a JSON/YAML file.

    Raises:
        pydantic.ValidationError: the script is malformed (names the bad field).
        FileNotFoundError: no such file.
    """
    if isinstance(script, Script):
        return script
    if isinstance(script, (str, Path)):
        text = Path(script).read_text()
        if str(script).endswith((".yaml", ".yml")):
            import yaml

            script = yaml.safe_load(text)
        else:
            script = json.loads(text)
    if isinstance(script, list):
        script = {"steps": script}
    return Script.model_validate(script)


class FakeProvider:
    """The fake provider server. Start with :meth:`start` (or a ``with`` block).

    Attributes:
        base_url: ``http://127.0.0.1:<port>`` (append ``/v1`` for OpenAI clients; Anthropic
            clients and Claude Code take it as is).
        requests: every request received, in order (:class:`RecordedRequest`).
    """

    def __init__(self, script: Script | dict | list | str | Path | None = None, *, host: str = "127.0.0.1",
                 port: int = 0):
        self.script = load_script(script if script is not None else [])
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._next = 0
        self._ids = itertools.count(1)
        self._host, self._port = host, port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> FakeProvider:
        """Bind and serve on a background thread; returns self."""
        handler = type("Handler", (_Handler,), {"provider": self})
        self._server = ThreadingHTTPServer((self._host, self._port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-provider", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake provider is not started")
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}"

    # ---- script --------------------------------------------------------------------------------
    @property
    def steps_used(self) -> int:
        """How many script steps have been consumed."""
        return min(self._next, len(self.script.steps))

    def model_requests(self) -> list[RecordedRequest]:
        """Requests that consumed a script step."""
        return [r for r in self.requests if r.step is not None]

    def _take(self, model: str | None) -> tuple[int | None, Step]:
        with self._lock:
            if self.script.models is not None and model not in self.script.models:
                return None, self.script.filler
            if self._next < len(self.script.steps):
                i = self._next
                self._next += 1
                return i, self.script.steps[i]
            return None, self.script.exhausted

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):04d}"

    def record(self, req: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(req)


# ---- rendering ------------------------------------------------------------------------------------

def _usage_of(step: Step, body: Any, text: str, calls: list[FakeToolCall]) -> StepUsage:
    if step.usage is not None:
        return step.usage
    out_len = len(text) + sum(len(json.dumps(c.arguments)) for c in calls)
    return StepUsage(input_tokens=len(json.dumps(body)) // 4, output_tokens=out_len // 4 + 1)


def _reply_parts(step: Step, body: dict, api: str) -> tuple[str, list[FakeToolCall]]:
    text = step.text or ""
    calls = list(step.tool_calls)
    if step.json_answer is not None:
        forced = (body.get("tool_choice") or {}) if api == "messages" else {}
        names = [t.get("name") or (t.get("function") or {}).get("name") or "" for t in body.get("tools") or []
                 if isinstance(t, dict)]
        output_tool = next((n for n in names if n.replace("_", "").lower() == "structuredoutput"), None)
        if isinstance(forced, dict) and forced.get("type") == "tool":
            calls.append(FakeToolCall(name=forced["name"], arguments=step.json_answer))
        elif output_tool:  # an agent CLI's structured-output tool (Claude Code: StructuredOutput)
            calls.append(FakeToolCall(name=output_tool, arguments=step.json_answer))
        else:
            text = json.dumps(step.json_answer)
    return text, calls


def _sse(event: str | None, data: Any) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    provider: FakeProvider  # set by FakeProvider.start

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (a killed agent CLI): nothing to answer

    # ---- plumbing --------------------------------------------------------------------------
    def _send_json(self, status: int, obj: Any, headers: dict | None = None) -> None:
        data = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", self.provider.new_id("req_"))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _api(self, path: str) -> str | None:
        p = path.split("?", 1)[0].rstrip("/")
        for suffix, api in (("/chat/completions", "chat"), ("/responses", "responses"),
                            ("/messages/count_tokens", "count_tokens"), ("/messages", "messages"),
                            ("/models", "models")):
            if p.endswith(suffix):
                return api
        return None

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        api = self._api(self.path)
        self.provider.record(RecordedRequest(method="GET", path=self.path, api=api or "unknown", time=time.time()))
        if api == "models":
            models = self.provider.script.models or ["fake-model"]
            self._send_json(200, {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "fake",
                                                               "created": 0} for m in models], "models": []})
        else:
            self._send_json(404, {"error": {"message": f"no such endpoint {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        api = self._api(self.path)
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {"_unparsed": raw[:2000].decode(errors="replace")}
        headers = {k: v for k, v in self.headers.items() if k.lower() in _KEEP_HEADERS}
        model = body.get("model") if isinstance(body, dict) else None
        stream = bool(body.get("stream")) if isinstance(body, dict) else False
        rec = RecordedRequest(method="POST", path=self.path, api=api or "unknown", model=model, stream=stream,
                              body=body, headers=headers, time=time.time())
        if api in (None, "models"):
            self.provider.record(rec)
            self._send_json(404, {"error": {"message": f"no such endpoint {self.path}", "type": "not_found"}})
            return
        if api == "count_tokens":
            self.provider.record(rec)
            self._send_json(200, {"input_tokens": len(raw) // 4})
            return
        idx, step = self.provider._take(model)
        rec.step = idx
        rec.status = step.error or 200
        self.provider.record(rec)
        if step.delay_s:
            time.sleep(step.delay_s)
        if step.error:
            self._error(api, step)
            return
        if step.malformed in ("body", "empty"):
            self.send_response(200)
            data = b'{"id": "broken", "choices": [' if step.malformed == "body" else b"{}"
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        text, calls = _reply_parts(step, body, api)
        usage = _usage_of(step, body, text, calls)
        bad_args = step.malformed == "tool_arguments"
        broken = step.malformed == "stream"
        render = {"chat": self._chat, "responses": self._responses, "messages": self._messages}[api]
        render(body, model or "fake-model", text, calls, usage, stream, bad_args, broken)

    def _error(self, api: str, step: Step) -> None:
        status = step.error or 500
        msg = step.error_message or {429: "rate limited", 529: "Overloaded", 500: "internal error",
                                     503: "service unavailable"}.get(status, "error")
        headers = {"retry-after": str(step.retry_after)} if step.retry_after is not None else {}
        if api == "messages":
            etype = {429: "rate_limit_error", 529: "overloaded_error", 400: "invalid_request_error"}.get(status, "api_error")
            self._send_json(status, {"type": "error", "error": {"type": etype, "message": msg}}, headers)
        else:
            self._send_json(status, {"error": {"message": msg, "type": "server_error" if status >= 500 else "rate_limit",
                                               "code": str(status)}}, headers)

    # ---- Chat Completions ----------------------------------------------------------------------
    def _chat(self, body, model, text, calls, usage: StepUsage, stream, bad_args, broken) -> None:
        p = self.provider
        cid = p.new_id("chatcmpl-")
        tcs = [{"id": c.id or p.new_id("call_"), "type": "function",
                "function": {"name": c.name, "arguments": '{"broken": ' if bad_args else json.dumps(c.arguments)}}
               for c in calls]
        finish = "tool_calls" if tcs else "stop"
        prompt = usage.input_tokens + usage.cache_read + usage.cache_write_5m + usage.cache_write_1h
        u = {"prompt_tokens": prompt, "completion_tokens": usage.output_tokens,
             "total_tokens": prompt + usage.output_tokens,
             "prompt_tokens_details": {"cached_tokens": usage.cache_read,
                                       "cache_write_tokens": usage.cache_write_5m + usage.cache_write_1h},
             "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens}}
        created = int(time.time())
        if not stream:
            msg: dict = {"role": "assistant", "content": text or None}
            if tcs:
                msg["tool_calls"] = tcs
            self._send_json(200, {"id": cid, "object": "chat.completion", "created": created, "model": model,
                                  "choices": [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}],
                                  "usage": u})
            return
        self._start_sse()

        def chunk(delta: dict, finish_reason=None, usage_=None, choices=True) -> bytes:
            c = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}] if choices else []}
            if usage_ is not None:
                c["usage"] = usage_
            return _sse(None, c)

        out = [chunk({"role": "assistant", "content": ""})]
        if broken:
            out.append(b"data: {not json\n\n")
        for i in range(0, len(text), 40):
            out.append(chunk({"content": text[i:i + 40]}))
        for k, tc in enumerate(tcs):
            args = tc["function"]["arguments"]
            out.append(chunk({"tool_calls": [{"index": k, "id": tc["id"], "type": "function",
                                              "function": {"name": tc["function"]["name"], "arguments": ""}}]}))
            out.append(chunk({"tool_calls": [{"index": k, "function": {"arguments": args}}]}))
        out.append(chunk({}, finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            out.append(chunk({}, usage_=u, choices=False))
        out.append(b"data: [DONE]\n\n")
        self.wfile.write(b"".join(out))

    # ---- Responses ------------------------------------------------------------------------------
    def _responses(self, body, model, text, calls, usage: StepUsage, stream, bad_args, broken) -> None:
        p = self.provider
        rid = p.new_id("resp_")
        items: list[dict] = []
        if text:
            items.append({"type": "message", "id": p.new_id("msg_"), "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": text, "annotations": []}]})
        for c in calls:
            items.append({"type": "function_call", "id": p.new_id("fc_"), "call_id": c.id or p.new_id("call_"),
                          "name": c.name, "arguments": '{"broken": ' if bad_args else json.dumps(c.arguments),
                          "status": "completed", **({"namespace": c.namespace} if c.namespace else {})})
        total_in = usage.input_tokens + usage.cache_read + usage.cache_write_5m + usage.cache_write_1h
        u = {"input_tokens": total_in,
             "input_tokens_details": {"cached_tokens": usage.cache_read,
                                      "cache_write_tokens": usage.cache_write_5m + usage.cache_write_1h},
             "output_tokens": usage.output_tokens,
             "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
             "total_tokens": total_in + usage.output_tokens}
        base = {"id": rid, "object": "response", "created_at": int(time.time()), "model": model,
                "parallel_tool_calls": True, "tool_choice": body.get("tool_choice", "auto"), "tools": [],
                "error": None, "incomplete_details": None, "instructions": None, "metadata": {},
                "temperature": 1.0, "top_p": 1.0, "text": {"format": {"type": "text"}}}
        final = {**base, "status": "completed", "output": items, "usage": u}
        if not stream:
            self._send_json(200, final)
            return
        self._start_sse()
        seq = itertools.count()
        out = []

        def ev(etype: str, **data) -> None:
            out.append(_sse(etype, {"type": etype, "sequence_number": next(seq), **data}))

        ev("response.created", response={**base, "status": "in_progress", "output": [], "usage": None})
        ev("response.in_progress", response={**base, "status": "in_progress", "output": [], "usage": None})
        if broken:
            out.append(b"event: response.output_item.added\ndata: {not json\n\n")
        for i, item in enumerate(items):
            if item["type"] == "message":
                ev("response.output_item.added", output_index=i, item={**item, "status": "in_progress", "content": []})
                part = {"type": "output_text", "text": "", "annotations": []}
                ev("response.content_part.added", item_id=item["id"], output_index=i, content_index=0, part=part)
                ev("response.output_text.delta", item_id=item["id"], output_index=i, content_index=0, delta=text,
                   logprobs=[])
                ev("response.output_text.done", item_id=item["id"], output_index=i, content_index=0, text=text,
                   logprobs=[])
                ev("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                   part={**part, "text": text})
            else:
                ev("response.output_item.added", output_index=i, item={**item, "status": "in_progress", "arguments": ""})
                ev("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                   delta=item["arguments"])
                ev("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                   arguments=item["arguments"], name=item["name"])
            ev("response.output_item.done", output_index=i, item=item)
        ev("response.completed", response=final)
        self.wfile.write(b"".join(out))

    # ---- Anthropic Messages ---------------------------------------------------------------------
    def _messages(self, body, model, text, calls, usage: StepUsage, stream, bad_args, broken) -> None:
        p = self.provider
        mid = p.new_id("msg_fake_")
        content: list[dict] = []
        if text:
            content.append({"type": "text", "text": text})
        for c in calls:
            content.append({"type": "tool_use", "id": c.id or p.new_id("toolu_"), "name": c.name,
                            "input": "{broken" if bad_args and not stream else c.arguments})
        stop = "tool_use" if calls else "end_turn"
        u = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
             "cache_read_input_tokens": usage.cache_read,
             "cache_creation_input_tokens": usage.cache_write_5m + usage.cache_write_1h,
             "cache_creation": {"ephemeral_5m_input_tokens": usage.cache_write_5m,
                                "ephemeral_1h_input_tokens": usage.cache_write_1h}}
        msg = {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
               "stop_reason": stop, "stop_sequence": None, "usage": u}
        if not stream:
            self._send_json(200, msg)
            return
        self._start_sse()
        out = [_sse("message_start", {"type": "message_start",
                                      "message": {**msg, "content": [], "stop_reason": None,
                                                  "usage": {**u, "output_tokens": 1}}})]
        if broken:
            out.append(b"event: content_block_start\ndata: {not json\n\n")
        for i, block in enumerate(content):
            if block["type"] == "text":
                out.append(_sse("content_block_start", {"type": "content_block_start", "index": i,
                                                        "content_block": {"type": "text", "text": ""}}))
                out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                        "delta": {"type": "text_delta", "text": block["text"]}}))
            else:
                out.append(_sse("content_block_start", {"type": "content_block_start", "index": i,
                                                        "content_block": {**block, "input": {}}}))
                partial = '{"broken": ' if bad_args else json.dumps(block["input"])
                out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                        "delta": {"type": "input_json_delta", "partial_json": partial}}))
            out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": i}))
        out.append(_sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                          "usage": u}))
        out.append(_sse("message_stop", {"type": "message_stop"}))
        self.wfile.write(b"".join(out))


def main(argv: list[str] | None = None) -> None:
    """Serve a script until interrupted; print the base URL; optionally dump the requests."""
    ap = argparse.ArgumentParser(prog="python -m agents_fakes.fake_provider", description=__doc__.split("\n")[0])
    ap.add_argument("script", help="JSON or YAML script")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--record", help="write the received requests here (JSON) on exit")
    a = ap.parse_args(argv)
    fp = FakeProvider(a.script, port=a.port).start()
    print(fp.base_url, flush=True)

    def on_term(signum, frame):  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        fp.stop()
        if a.record:
            Path(a.record).write_text(json.dumps([r.model_dump() for r in fp.requests], indent=1))


if __name__ == "__main__":
    main()
