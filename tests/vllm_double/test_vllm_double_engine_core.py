"""The double's engine core, a process of its own as vLLM's: stopped (a wedge), completions hang while /health
answers; killed, the API server exits 1. Real signals to real processes."""

import os
import signal
import subprocess
import time

from vllm_double_support import Double, http, write_model


def engine_core_pid(double: Double) -> int:
    out = subprocess.run(["pgrep", "-P", str(double.proc.pid), "-f", "VLLM::EngineCore"], capture_output=True,
                         text=True).stdout.split()
    assert len(out) == 1, out
    return int(out[0])


def serve(tmp_path) -> Double:
    model = write_model(tmp_path / "lab-tiny")
    double = Double([str(model), "--served-model-name", "lab-tiny"], tmp_path / "double.log")
    double.wait_ready(timeout=60)
    return double


def test_a_stopped_engine_core_hangs_completions_while_health_answers(tmp_path):
    double = serve(tmp_path)
    try:
        body = {"model": "lab-tiny", "prompt": "ping", "max_tokens": 2}
        assert http(double.url + "/v1/completions", "POST", body)[0] == 200
        core = engine_core_pid(double)
        os.kill(core, signal.SIGSTOP)
        assert http(double.url + "/health")[0] == 200
        started = time.monotonic()
        try:
            http(double.url + "/v1/completions", "POST", body, timeout=2)
            raise AssertionError("a completion came back from a stopped engine core")
        except TimeoutError:
            assert time.monotonic() - started >= 2
        os.kill(core, signal.SIGCONT)
    finally:
        assert double.stop() == 0


def test_a_wedged_engine_core_with_a_request_in_flight_still_stops_cleanly(tmp_path):
    """SIGTERM kills the stopped core under a waiting request: that is shutdown, not an engine death (exit 0)."""
    double = serve(tmp_path)
    try:
        os.kill(engine_core_pid(double), signal.SIGSTOP)
        try:
            http(double.url + "/v1/completions", "POST", {"model": "lab-tiny", "prompt": "ping"}, timeout=1)
            raise AssertionError("a completion came back from a stopped engine core")
        except TimeoutError:
            pass
    finally:
        assert double.stop() == 0
    assert "died unexpectedly" not in double.log() and "encountered an issue" not in double.log()


def test_a_dead_engine_core_ends_the_api_server(tmp_path):
    double = serve(tmp_path)
    try:
        os.kill(engine_core_pid(double), signal.SIGKILL)
        assert double.wait_exit(timeout=20) == 1
        assert "died unexpectedly" in double.log()
    finally:
        double.stop()
