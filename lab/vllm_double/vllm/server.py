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
_ROUTES = {"/health": "GET", "/version": "GET", "/v1/models": "GET", "/v1/chat/completions": "POST"}


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


def chat_completion(config: ApiConfig, request: dict) -> dict:
    """A deterministic reply derived from the request, in the OpenAI response shape."""
    model = request.get("model") or config.served_model_names[0]
    if model not in config.served_model_names:
        raise _ApiError(HTTPStatus.NOT_FOUND, f"The model `{model}` does not exist.", "model")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise _ApiError(HTTPStatus.BAD_REQUEST, "messages must be a non-empty list of objects", "messages")
    if request.get("stream"):
        raise _ApiError(HTTPStatus.BAD_REQUEST, "stream=true is not supported by the vLLM test double",
                        "stream")
    max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise _ApiError(HTTPStatus.BAD_REQUEST, "max_tokens must be a positive integer", "max_tokens")

    prompt_tokens = sum(len(_text_of(m).split()) for m in messages)
    if prompt_tokens + (max_tokens or 0) > config.max_model_len:
        raise _ApiError(
            HTTPStatus.BAD_REQUEST,
            f"This model's maximum context length is {config.max_model_len} tokens. However, you "
            f"requested {prompt_tokens + (max_tokens or 0)} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens or 0} in the completion). Please reduce the length of the messages or completion.")
    last_user = next((_text_of(m) for m in reversed(messages) if m.get("role") == "user"), "")
    words = f"[{model}] {last_user}".split()
    finish_reason = "stop"
    if max_tokens is not None and len(words) > max_tokens:
        words, finish_reason = words[:max_tokens], "length"
    digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
    return {
        "id": f"chatcmpl-{digest[:32]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": " ".join(words), "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish_reason,
        }],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                  "total_tokens": prompt_tokens + len(words)},
    }


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
            if path == "/v1/models":
                return self._send(HTTPStatus.OK, models_list(self.config))
            try:
                request = json.loads(body or b"null")
            except ValueError as err:
                raise _ApiError(HTTPStatus.BAD_REQUEST, f"Invalid JSON body: {err}") from None
            if not isinstance(request, dict):
                raise _ApiError(HTTPStatus.BAD_REQUEST, "The request body must be a JSON object")
            response = chat_completion(self.config, request)
            if self.config.log_requests:
                logger.info("Added request %s.", response["id"])
            return self._send(HTTPStatus.OK, response)
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
        _uvicorn(config, "info", "Shutting down")
        _uvicorn(config, "info", "Waiting for application shutdown.")
        _uvicorn(config, "info", "Application shutdown complete.")
        _uvicorn(config, "info", f"Finished server process [{pid}]")
        self.httpd.server_close()
