"""Waits for the gateway to route: the router serving the config just written (its liveness answer names the
config's digest), then a one-token completion through it for every model it lists. Runs on the router's node
(`python3 - ARGS`, this file on stdin after a line that sets KEY, the gateway's key: it is never an argument).
Prints what each model last answered while it waits, and on failure.
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

REPORT_EVERY_S = 10


def call(url, key=None, body=None, timeout=5):
    """(HTTP status, body text); status 0 when nothing answered."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, str(e)


def brief(status, text):
    try:
        text = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    return f"{status or 'no answer'}: {' '.join(str(text).split())[:300]}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--container", required=True)  # the router's, for the hint on failure
    parser.add_argument("--config", required=True)  # the digest its liveness answer names once it serves the config
    parser.add_argument("--timeout", type=int, required=True)
    a = parser.parse_args()
    base, key = f"http://127.0.0.1:{a.port}", KEY  # type: ignore[name-defined] # noqa: F821 (the line before this file sets it)
    start = time.monotonic()
    deadline, last_report = start + a.timeout, start
    listed, pending, last = False, [], {}
    while time.monotonic() < deadline:
        if not listed:
            status, text = call(f"{base}/health/liveliness")
            serving = status == 200 and json.loads(text).get("config") == a.config
            if serving:
                status, text = call(f"{base}/v1/models", key)
            else:
                last["/v1/models"] = f"its liveness answers {brief(status, text)}; waiting for config {a.config}"
            if serving and status == 200:
                models = sorted(m["id"] for m in json.loads(text)["data"])
                listed, pending = True, list(models)
                print(f"gateway: the router serves config {a.config} after {time.monotonic() - start:.0f} s, routing "
                      f"{', '.join(models) or 'no model'}", flush=True)
            elif serving:
                last["/v1/models"] = brief(status, text)
        for model in list(pending):
            status, text = call(f"{base}/v1/chat/completions", key, timeout=60, body={
                "model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]})
            if status == 200:
                pending.remove(model)
                print(f"gateway: {model} answers through it ({time.monotonic() - start:.0f} s)", flush=True)
            else:
                last[model] = brief(status, text)
        if listed and not pending:
            print(f"gateway: every route answers ({time.monotonic() - start:.0f} s)")
            return 0
        if time.monotonic() - last_report >= REPORT_EVERY_S:
            last_report = time.monotonic()
            waiting = ", ".join(pending) if pending else "the router"
            print(f"gateway: waiting for {waiting} ({last_report - start:.0f}/{a.timeout} s)", flush=True)
        time.sleep(0.25)
    print(f"gateway: not ready after {a.timeout} s; what last answered:", file=sys.stderr)
    for what in pending if listed else ["/v1/models"]:
        print(f"  {what}: {last.get(what, 'not asked')}", file=sys.stderr)
    print(f"the router's log: docker logs {a.container}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
