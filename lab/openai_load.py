"""Load through the real `openai` client, for the gateway's figures (tests/e2e/test_gateway.py and bench/run):
streamed chat completions many at once, or one at a time, timed from the request to the stream's end.

In the lab the model is the vLLM double: the figures measure the path (client, router, network), not a GPU.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import openai


@dataclass(frozen=True)
class Load:
    requests: int
    at_once: int
    wall_s: float
    p50_ms: float
    p99_ms: float
    failed: int

    def line(self) -> str:
        return (f"{self.requests} streams, {self.at_once} at once: {self.wall_s:.2f} s, p50 {self.p50_ms:.1f} ms, "
                f"p99 {self.p99_ms:.1f} ms, {self.failed} failed")


def client(base_url: str, key: str) -> openai.OpenAI:
    """No retry: a failure counts. The client's pool keeps up to 100 connections alive, more than any test asks."""
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)


def stream(c: openai.OpenAI, model: str) -> float:
    """Seconds from the request to the end of one streamed chat completion of 16 tokens."""
    start = time.perf_counter()
    chunks = list(c.chat.completions.create(model=model, messages=[{"role": "user", "content": "count"}],
                                            max_tokens=16, stream=True))
    if not any(ch.choices and ch.choices[0].delta.content for ch in chunks):
        raise RuntimeError("an empty stream")
    return time.perf_counter() - start


def measure(base_url: str, key: str, model: str, requests: int = 256, at_once: int = 64) -> Load:
    c = client(base_url, key)
    stream(c, model)  # connections and first-call costs out of the figure

    def one(_: int) -> float | None:
        try:
            return stream(c, model)
        except (openai.APIError, RuntimeError):
            return None

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        times = list(pool.map(one, range(requests)))
    wall = time.perf_counter() - start
    done = sorted(t * 1000 for t in times if t is not None)
    p99 = done[min(len(done) - 1, int(len(done) * 0.99))] if done else float("nan")
    return Load(requests, at_once, wall, statistics.median(done) if done else float("nan"), p99,
                requests - len(done))


class StreamLoop:
    """Streamed chat completions back to back on a few threads, while something changes (a route); each one's
    start, its time to the end of the stream, and its error if any. A `with` block runs it."""

    def __init__(self, c: openai.OpenAI, model: str, threads: int = 4):
        self.c, self.model, self.results = c, model, []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(threads)]

    def loop(self) -> None:
        while not self.stop.is_set():
            start, error = time.monotonic(), None
            try:
                stream(self.c, self.model)
            except (openai.APIError, RuntimeError) as e:
                error = f"{type(e).__name__}: {e}"
            self.results.append((start, time.monotonic() - start, error))

    def __enter__(self) -> "StreamLoop":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(1)  # requests that start after the change, too
        self.stop.set()
        for t in self.threads:
            t.join(60)

    @property
    def failed(self) -> list[str]:
        return [e for _, _, e in self.results if e]

    @property
    def longest_ms(self) -> float:
        return max(s for _, s, _ in self.results) * 1000
