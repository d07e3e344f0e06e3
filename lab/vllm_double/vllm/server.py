"""The OpenAI-compatible HTTP API (stdlib, threaded) with vLLM's and uvicorn's start-up lines.

The socket is bound before the model loads (as vLLM does, so a taken port fails fast) and
starts listening only once loading is done: until then connections are refused.
"""

import hashlib
import hmac
import json
import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vllm import __version__
from vllm.logger import init_logger

logger = init_logger(__name__)

_UVICORN_LEVELS = {"trace": 5, "debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_ROUTES = {"/health": "GET", "/version": "GET", "/metrics": "GET", "/v1/models": "GET",
           "/v1/chat/completions": "POST", "/v1/completions": "POST"}
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest default, as OpenAI's; chat has none


@dataclass
class ApiConfig:
    served_model_names: list
    model_tag: str
    max_model_len: int
    api_key: str = None
    uvicorn_log_level: str = "info"
    access_log: bool = True
    log_requests: bool = True
    created: int = field(default_factory=lambda: int(time.time()))
    stats: "Stats" = field(default_factory=lambda: Stats())


class Stats:
    """The counters /metrics reports, under vLLM's metric names."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = {}  # finished_reason -> count

    def finished(self, prompt_tokens: int, generation_tokens: int, reason: str) -> None:
        with self.lock:
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generation_tokens
            self.success[reason] = self.success.get(reason, 0) + 1

    def prometheus(self, model_names: list) -> str:
        """Prometheus text exposition (version 0.0.4), one series per served model name."""
        with self.lock:
            series = [("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                       [({}, self.running)]),
                      ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                       [({}, 0)]),
                      ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                       [({}, self.prompt_tokens)]),
                      ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                       [({}, self.generation_tokens)]),
                      ("vllm:request_success_total", "counter", "Count of successfully processed requests.",
                       [({"finished_reason": r}, n) for r, n in sorted(self.success.items())])]
        lines = []
        for name, kind, help_text, samples in series:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            for labels, value in samples:
                for model in model_names:
                    pairs = {"model_name": model, **labels}
                    shown = ",".join(f'{k}="{v}"' for k, v in pairs.items())
                    lines.append(f"{name}{{{shown}}} {float(value)}")
        return "\n".join(lines) + "\n"


def _uvicorn(config: ApiConfig, level: str, message: str) -> None:
    """uvicorn's console format ("INFO:     message") on stderr, filtered by its log level."""
    if _UVICORN_LEVELS[level] >= _UVICORN_LEVELS[config.uvicorn_log_level]:
        name = level.upper()
        print(f"{name}:{' ' * (8 - len(name))} {message}", file=sys.stderr, flush=True)


class _ApiError(Exception):
    def __init__(self, status: HTTPStatus, message: str, param=None):
        super().__init__(message)
        self.status, self.param = status, param


def _text_of(message: dict) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def _check_model(config: ApiConfig, request: dict) -> str:
    model = request.get("model") or config.served_model_names[0]
    if model not in config.served_model_names:
        raise _ApiError(HTTPStatus.NOT_FOUND, f"The model `{model}` does not exist.", "model")
    return model


def _max_tokens(request: dict, default=None):
    max_tokens = request.get("max_completion_tokens", request.get("max_tokens", default))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise _ApiError(HTTPStatus.BAD_REQUEST, "max_tokens must be a positive integer", "max_tokens")
    return max_tokens


def _answer(config: ApiConfig, model: str, prompt: str, prompt_tokens: int, max_tokens, what: str):
    """(words, finish_reason): the deterministic answer `[MODEL] PROMPT`, cut at max_tokens."""
    if prompt_tokens + (max_tokens or 0) > config.max_model_len:
        raise _ApiError(
            HTTPStatus.BAD_REQUEST,
            f"This model's maximum context length is {config.max_model_len} tokens. However, you "
            f"requested {prompt_tokens + (max_tokens or 0)} tokens ({prompt_tokens} in the {what}, "
            f"{max_tokens or 0} in the completion). Please reduce the length of the {what} or completion.")
    words = f"[{model}] {prompt}".split()
    if max_tokens is not None and len(words) > max_tokens:
        return words[:max_tokens], "length"
    return words, "stop"


# The engine core: a process of its own, as vLLM's (`VLLM::EngineCore` in its command line), that every completion
# goes through and /health does not. SIGSTOP it and completions hang while /health answers; kill it and the API
# server exits, as vLLM's does on EngineDeadError. It ends when its parent does (its stdin closes).
_ENGINE_LOOP = "import sys\nfor line in sys.stdin:\n    sys.stdout.write(line)\n    sys.stdout.flush()\n"


class EngineCore:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", _ENGINE_LOOP, "VLLM::EngineCore"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lock = threading.Lock()
        self.stopping = False  # set by the server's own shutdown: a step cut short by it is no death

    def step(self) -> bool:
        """One round trip; False when the engine core is dead."""
        with self.lock:
            try:
                self.proc.stdin.write("step\n")
                self.proc.stdin.flush()
                return self.proc.stdout.readline() == "step\n"
            except (BrokenPipeError, ValueError):
                return False

    def stop(self) -> None:
        self.stopping = True
        self.proc.kill()
        self.proc.wait()


def _digest(request: dict) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:32]


@dataclass
class Generation:
    """One request's answer, sent whole or as server-sent events."""
    kind: str  # "chat" or "completion"
    id: str
    model: str
    words: list
    finish_reason: str
    prompt_tokens: int
    stream: bool = False
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.words),
                "total_tokens": self.prompt_tokens + len(self.words)}

    def whole(self) -> dict:
        text = " ".join(self.words)
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                      "logprobs": None, "finish_reason": self.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason,
                      "stop_reason": None}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": self.usage()}

    def chunks(self):
        """The stream's events, as vLLM sends them: (for chat) the role first, then one word an event,
        then the finish reason, then (with stream_options.include_usage) the usage; `[DONE]` is the caller's."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"

        def event(choice, usage=None):
            out = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                   "choices": [choice] if choice else []}
            if self.include_usage:
                out["usage"] = usage
            return out

        def choice(text, finish=None, first=False):
            if self.kind == "chat":
                delta = {"role": "assistant", "content": text} if first else {"content": text}
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}

        if self.kind == "chat":
            yield event(choice("", first=True))
        for i, word in enumerate(self.words):
            text = word if i == 0 else " " + word
            last = i == len(self.words) - 1
            yield event(choice(text, self.finish_reason if last else None))
        if not self.words:
            yield event(choice("", self.finish_reason))
        if self.include_usage:
            yield event(None, self.usage())


def _stream_flags(request: dict):
    stream = request.get("stream", False)
    if not isinstance(stream, bool):
        raise _ApiError(HTTPStatus.BAD_REQUEST, "stream must be true or false", "stream")
    options = request.get("stream_options") or {}
    if options and not stream:
        raise _ApiError(HTTPStatus.BAD_REQUEST, "Stream options can only be defined when `stream=True`.",
                        "stream_options")
    return stream, bool(options.get("include_usage"))


def chat_generation(config: ApiConfig, request: dict) -> Generation:
    model = _check_model(config, request)
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise _ApiError(HTTPStatus.BAD_REQUEST, "messages must be a non-empty list of objects", "messages")
    stream, include_usage = _stream_flags(request)
    max_tokens = _max_tokens(request)
    prompt_tokens = sum(len(_text_of(m).split()) for m in messages)
    last_user = next((_text_of(m) for m in reversed(messages) if m.get("role") == "user"), "")
    words, finish = _answer(config, model, last_user, prompt_tokens, max_tokens, "messages")
    return Generation("chat", f"chatcmpl-{_digest(request)}", model, words, finish, prompt_tokens, stream,
                      include_usage)


def completion_generation(config: ApiConfig, request: dict) -> Generation:
    model = _check_model(config, request)
    prompt = request.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _ApiError(HTTPStatus.BAD_REQUEST, "prompt must be a string (the vLLM test double takes one prompt)",
                        "prompt")
    stream, include_usage = _stream_flags(request)
    max_tokens = _max_tokens(request, _COMPLETIONS_DEFAULT_MAX_TOKENS)
    prompt_tokens = len(prompt.split())
    words, finish = _answer(config, model, prompt, prompt_tokens, max_tokens, "prompt")
    return Generation("completion", f"cmpl-{_digest(request)}", model, words, finish, prompt_tokens, stream,
                      include_usage)


def chat_completion(config: ApiConfig, request: dict) -> dict:
    """A deterministic reply derived from the request, in the OpenAI response shape."""
    return chat_generation(config, request).whole()


def models_list(config: ApiConfig) -> dict:
    return {"object": "list", "data": [{
        "id": name,
        "object": "model",
        "created": config.created,
        "owned_by": "vllm",
        "root": config.model_tag,
        "parent": None,
        "max_model_len": config.max_model_len,
    } for name in config.served_model_names]}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # As uvicorn does: without it, a response's body waits behind its headers for the client's delayed ACK (~40 ms).
    disable_nagle_algorithm = True

    def version_string(self) -> str:
        return "uvicorn"

    @property
    def config(self) -> ApiConfig:
        return self.server.api_config

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if path.startswith("/v1") and not self._authorized():  # checked before routing, as in vLLM
            return self._send(HTTPStatus.UNAUTHORIZED, {"error": "Unauthorized"})
        if path not in _ROUTES:
            return self._send(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})
        if _ROUTES[path] != method:
            return self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"detail": "Method Not Allowed"})
        try:
            if path == "/health":
                return self._send(HTTPStatus.OK, None)
            if path == "/version":
                return self._send(HTTPStatus.OK, {"version": __version__})
            if path == "/metrics":
                return self._send_text(HTTPStatus.OK, self.config.stats.prometheus(self.config.served_model_names),
                                       "text/plain; version=0.0.4; charset=utf-8")
            if path == "/v1/models":
                return self._send(HTTPStatus.OK, models_list(self.config))
            try:
                request = json.loads(body or b"null")
            except ValueError as err:
                raise _ApiError(HTTPStatus.BAD_REQUEST, f"Invalid JSON body: {err}") from None
            if not isinstance(request, dict):
                raise _ApiError(HTTPStatus.BAD_REQUEST, "The request body must be a JSON object")
            build = chat_generation if path == "/v1/chat/completions" else completion_generation
            generation = build(self.config, request)
            if not self.server.engine.step():
                if self.server.engine.stopping:  # shutting down: the request is aborted, unanswered
                    self.close_connection = True
                    return None
                logger.error("EngineCore encountered an issue. See stack trace for the root cause.")
                threading.Thread(target=self.server.shutdown, daemon=True).start()
                self.server.engine_dead = True
                return self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": {
                    "message": "EngineCore encountered an issue.", "type": "EngineDeadError", "param": None,
                    "code": 500}})
            if self.config.log_requests:
                logger.info("Added request %s.", generation.id)
            self.config.stats.finished(generation.prompt_tokens, len(generation.words), generation.finish_reason)
            if generation.stream:
                return self._send_events(generation)
            return self._send(HTTPStatus.OK, generation.whole())
        except _ApiError as err:
            return self._send(err.status, {"error": {
                "message": str(err), "type": err.status.phrase.replace(" ", "") + "Error",
                "param": err.param, "code": err.status.value}})

    def _authorized(self) -> bool:
        if not self.config.api_key:
            return True
        expected = f"Bearer {self.config.api_key}".encode()
        return hmac.compare_digest(self.headers.get("Authorization", "").encode(), expected)

    def _send(self, status: HTTPStatus, payload) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        if payload is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, status: HTTPStatus, text: str, content_type: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_events(self, generation: Generation) -> None:
        """Server-sent events in HTTP/1.1 chunked encoding, as uvicorn sends vLLM's streams."""
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        for event in generation.chunks():
            chunk(f"data: {json.dumps(event)}\n\n".encode())
        chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def log_request(self, code="-", size="-"):
        if self.config.access_log:
            status = HTTPStatus(int(code)) if str(code).isdigit() else None
            text = f"{status.value} {status.phrase}" if status else str(code)
            client = f"{self.client_address[0]}:{self.client_address[1]}"
            _uvicorn(self.config, "info", f'{client} - "{self.requestline}" {text}')

    def log_message(self, format, *args):  # malformed requests: uvicorn logs them as warnings
        _uvicorn(self.config, "warning", format % args)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 2048  # uvicorn's backlog: socketserver's 5 drops connections that arrive together

    def server_bind(self):
        # HTTPServer.server_bind would resolve the host name (a DNS query); nothing needs it.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class ApiServer:
    """Binds at construction (before loading); serve() listens and blocks until SIGTERM/SIGINT."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        try:
            self.httpd = _HTTPServer((host, port), _Handler, bind_and_activate=False)
            self.httpd.server_bind()
        except OSError as err:
            raise OSError(err.errno, f"{err.strerror}: cannot bind {host}:{port}") from None

    def serve(self, config: ApiConfig) -> None:
        self.httpd.api_config = config
        self.httpd.engine, self.httpd.engine_dead = EngineCore(), False
        stopping = threading.Event()

        def watch_engine():  # vLLM's API server watches its engine core and shuts down when it dies
            self.httpd.engine.proc.wait()
            if not stopping.is_set():
                logger.error("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.")
                self.httpd.engine_dead = True
                self.httpd.shutdown()

        threading.Thread(target=watch_engine, daemon=True).start()
        self.httpd.server_activate()
        logger.info("Starting vLLM API server 0 on http://%s:%d", self.host, self.port)
        logger.info("Available routes are:")
        for route, method in _ROUTES.items():
            logger.info("Route: %s, Methods: %s", route, method)
        pid = os.getpid()
        _uvicorn(config, "info", f"Started server process [{pid}]")
        _uvicorn(config, "info", "Waiting for application startup.")
        _uvicorn(config, "info", "Application startup complete.")

        def stop(signum, _frame):  # shutdown() blocks until serve_forever returns: not here
            threading.Thread(target=self.httpd.shutdown, daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.httpd.serve_forever(poll_interval=0.5)
        stopping.set()
        _uvicorn(config, "info", "Shutting down")
        _uvicorn(config, "info", "Waiting for application shutdown.")
        _uvicorn(config, "info", "Application shutdown complete.")
        _uvicorn(config, "info", f"Finished server process [{pid}]")
        self.httpd.server_close()
        self.httpd.engine.stop()
        if self.httpd.engine_dead:
            sys.exit(1)
