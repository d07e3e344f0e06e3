"""What llama-benchy (scripts/bench-serve) reads besides the endpoint, for the lab: a book, served on loopback in
place of Project Gutenberg (a documented stand-in: the lab reaches no outside address), and a tokenizer for the
vLLM double's words (a WordLevel tokenizer.json, which the `tokenizers` package reads as it reads a model's)."""

from __future__ import annotations

import functools
import json
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

WORDS = [f"w{i}" for i in range(500)]


def write(folder: Path) -> Path:
    """The book (200000 words) and tokenizer.json in `folder`; returns the tokenizer's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "book.txt").write_text(" ".join(WORDS[(i * 7919) % len(WORDS)] for i in range(200_000)))
    tokenizer = folder / "tokenizer.json"
    tokenizer.write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "unk_token": "[UNK]",
                  "vocab": {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}}}))
    return tokenizer


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class BookServer:
    """`folder` over HTTP on 127.0.0.1, in a thread, while the `with` block runs; `url` is the book's."""

    def __init__(self, folder: Path):
        handler = functools.partial(_Quiet, directory=str(folder))
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/book.txt"

    def __enter__(self) -> "BookServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
