"""The gateway's router config: HAProxy, routing each OpenAI request by the `model` of its body (docs/gateway.md).

One text holds everything, keys included (it reaches the node on stdin, and lives in a Docker volume only root
reads). Every value from outside is written as a HAProxy string of `\\xHH` escapes, so no key or model name can end a
string, expand an environment variable or start a comment. The answers HAProxy makes itself are OpenAI's error
shapes: 401 without the key, 404 for a route or a model it does not serve, 502/503/504 naming the model whose server
fails. Only the models list and the `INFERENCE` paths pass, and only `OPEN` answers without the key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Optional, Sequence

# The OpenAI routes clients POST to, besides GET /v1/models[/<model>]; everything else is refused (docs/gateway.md).
INFERENCE = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
OPEN = ("/health/liveliness", "/health/readiness")  # without a key
# The largest request body routed: HAProxy reads the `model` from the buffered body, and a stream holds two buffers
# of this size at most (64 streams: 256 MiB). 2 MiB is a prompt of some 400k tokens.
BODY_LIMIT = 2 * 1024 * 1024
CONFIG_PATH = "/cfg/haproxy.cfg"  # in the router's container, on its volume
# A reload's old process keeps its streams until they end, or this long.
DRAIN = "30m"


@dataclass(frozen=True)
class Backend:
    model: str  # the served name clients ask for
    host: str
    port: int
    stack: str
    key: Optional[str]  # the model stack's own API key, sent in place of the gateway's


def quoted(value: str) -> str:
    """`value` as a HAProxy double-quoted string: every byte that quoting, an environment variable, a comment or an
    escape would read, and every byte outside printable ASCII, as `\\xHH`."""
    out = []
    for ch in value:
        plain = " " <= ch <= "~" and ch not in SPECIAL
        out.append(ch if plain else "".join(f"\\x{b:02x}" for b in ch.encode()))
    return '"' + "".join(out) + '"'


SPECIAL = set("\"'\\$#%")


def log_format(value: str) -> str:
    """A literal in a log-format string (set-header, lf-string): `%` doubled."""
    return value.replace("%", "%%")


def error(message: str, kind: str, code: Optional[str], param: Optional[str] = None) -> str:
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


def model_card(model: str) -> dict:
    return {"id": model, "object": "model", "created": 0, "owned_by": "spark-vllm"}


@dataclass(frozen=True)
class RouterConfig:
    text: str
    digest: str  # which config a router serves: its liveness answer carries it, so a reload is seen to have taken


def render(port: int, gateway_key: str, backends: Sequence[Backend]) -> RouterConfig:
    body = "\n".join([*_global(), *_frontend(port, gateway_key, backends),
                      *(line for i, b in enumerate(backends) for line in _backend(i, b))]) + "\n"
    stamp = hashlib.sha256(body.encode()).hexdigest()[:16]
    return RouterConfig(body.replace(STAMP, stamp), stamp)


STAMP = "@DIGEST@"


def _global() -> list[str]:
    return [
        "global",
        "    master-worker",
        "    log stdout format raw local0 info",  # one line a request, to `docker logs`
        f"    tune.bufsize {BODY_LIMIT}",
        f"    hard-stop-after {DRAIN}",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option http-buffer-request",  # the body, whose `model` routes, is read before the route is chosen
        # On a reload (SIGUSR2 to the master) the new process takes the old one's listening sockets, and the old one
        # answers a kept-alive connection's next request with `Connection: close` instead of closing it under a
        # client that may be sending.
        "    option idle-close-on-response",
        "    timeout connect 3s",
        "    timeout http-request 60s",
        "    timeout http-keep-alive 60s",
        "    timeout client 15m",  # between two reads of a long generation
        "    timeout server 15m",
        "    retries 0",  # a dead model answers 503 at once (a retry waits 1 s)
        "    http-reuse safe",  # keep-alive to the model servers
        "",
    ]


def _answer(status: int, body: str, condition: str, lf: bool = False) -> str:
    kind = "lf-string" if lf else "string"
    return f"    http-request return status {status} content-type application/json {kind} {quoted(body)} {condition}"


def _frontend(port: int, gateway_key: str, backends: Sequence[Backend]) -> list[str]:
    names = " ".join(quoted(b.model) for b in backends)
    listing = json.dumps({"object": "list", "data": [model_card(b.model) for b in backends]})
    lines = [
        "frontend openai",
        f"    bind :{port}",
        "    acl keyed req.fhdr(authorization) -m str " + quoted(f"Bearer {gateway_key}"),
        "    acl inference path " + " ".join(INFERENCE),
        _answer(200, json.dumps({"status": "alive", "config": STAMP}), "if { path /health/liveliness }"),
    ]
    for i, b in enumerate(backends):  # readiness: every route's server passes its health check
        lines.append(_answer(503, json.dumps({"status": "not ready", "down": b.model}),
                             f"if {{ path /health/readiness }} !{{ srv_is_up(be_{i}/vllm) }}"))
    lines += [
        _answer(200, json.dumps({"status": "ready", "routes": len(backends)}), "if { path /health/readiness }"),
        _answer(401, error("Incorrect or missing API key: send the gateway's key as `Authorization: Bearer "
                                "<key>`.", "invalid_request_error", "invalid_api_key"), "unless keyed"),
        _answer(200, listing, "if METH_GET { path /v1/models }"),
    ]
    for b in backends:
        lines.append(_answer(200, json.dumps(model_card(b.model)),
                             f"if METH_GET {{ path,url_dec -m str {quoted('/v1/models/' + b.model)} }}"))
    lines += [
        _answer(404, error("Not found: this gateway serves GET /v1/models and POST " + ", ".join(INFERENCE) + ".",
                           "invalid_request_error", "not_found"), "unless METH_POST inference"),
        "    http-request set-var(txn.got) req.body_len",
        _answer(413, error(f"The request body is larger than the gateway's {BODY_LIMIT // 1024 // 1024} MiB.",
                           "invalid_request_error", "request_too_large"), "if { req.body_size,sub(txn.got) gt 0 }"),
        "    http-request set-var(txn.model) req.body,json_query('$.model')",
        _answer(400, error("The request names no model: set `model`.", "invalid_request_error", None, "model"),
                "unless { var(txn.model) -m found }"),
        _answer(404, log_format(error("The model `@MODEL@` does not exist: this gateway serves "
                                           + ", ".join(b.model for b in backends) + ".",
                                      "invalid_request_error", "model_not_found", "model")).replace(
                    "@MODEL@", "%[var(txn.model),json(utf8s)]"),
                f"unless {{ var(txn.model) -m str {names} }}" if backends else "", lf=True),
        *(f"    use_backend be_{i} if {{ var(txn.model) -m str {quoted(b.model)} }}" for i, b in enumerate(backends)),
        "",
    ]
    return lines


def _backend(i: int, b: Backend) -> list[str]:
    url = f"http://{b.host}:{b.port}"
    lines = [f"backend be_{i}", "    option httpchk GET /health"]
    if b.key is None:
        lines.append("    http-request del-header authorization")  # the gateway's key stays with the gateway
    else:
        lines.append(f"    http-request set-header authorization {quoted(log_format('Bearer ' + b.key))}")
    for status, what in ((502, "answered badly"), (503, "does not answer"), (504, "timed out")):
        lines.append(f"    http-error status {status} content-type application/json string " + quoted(error(
            f"The model `{b.model}` is unavailable: its server at {url} (stack {b.stack}) {what}.",
            "service_unavailable", "model_unavailable", "model")))
    # The checked server tells readiness whether the model answers; requests go to it, or, while its check says it
    # is down, to the same address unchecked: a model back up is answered at once, not at its next check.
    lines += [f"    server vllm {b.host}:{b.port} check inter 2s fall 2 rise 1",
              f"    server vllm-unchecked {b.host}:{b.port} backup", ""]
    return lines
