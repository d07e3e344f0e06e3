"""The keeper: one container a node for each stack, restarted by Docker (`unless-stopped`), that keeps the
deployment serving (docs/watchdog.md). Stdlib only; it drives its node's Docker Engine over the unix socket.

  python3 -c BOOT SOURCE CONFIG_JSON   the keeper (the container's command): SOURCE, copied to /keeper.py first
  python3 /keeper.py arm TOKEN TIMEOUT (docker exec, by the arm resource) watch the deployment TOKEN names;
                                       waits until the leader does
  python3 /keeper.py disarm TIMEOUT    stop watching; waits for a relaunch in progress to end or abort

The head's keeper leads: it probes the API with one real completion, watches the serve and every rank or Ray
container, and relaunches the whole group. The other nodes' keepers follow it over the fabric: they report their
containers and stop or start them as the leader's generation says. A generation's containers start only once
every container of the one before is stopped; a keeper never starts a container of an older generation.
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TICK_S = 1
STALE_S = 15  # a follower that has not reported for this long is taken as down
STOP_S = 120  # bound on a group's stop (a follower that does not confirm in time: its node is down)
CONTROL, STATE, LOG, GENERATION = "control.json", "state.json", "watchdog.log", "generation.json"


class Docker:
    """The few Engine API calls the keeper needs, over /var/run/docker.sock."""

    class _Conn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(self.timeout)
            self.sock.connect("/var/run/docker.sock")

    def call(self, method, path, body=None, timeout=60):
        conn = self._Conn("docker", timeout=timeout)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
        finally:
            conn.close()
        if r.status >= 400 and r.status != 304:
            raise RuntimeError(f"docker {method} {path}: {r.status} {data.decode(errors='replace').strip()}")
        return json.loads(data) if data and r.getheader("Content-Type", "").startswith("application/json") else data

    def inspect(self, name):
        try:
            return self.call("GET", f"/containers/{name}/json")
        except RuntimeError as e:
            if ": 404 " in str(e):
                return None
            raise

    def running(self, name):
        c = self.inspect(name)
        return bool(c and c["State"]["Running"])

    def stop(self, name):
        """Killed and confirmed stopped (no second process can start beside it)."""
        if self.running(name):
            try:
                self.call("POST", f"/containers/{name}/kill")
            except RuntimeError as e:
                if "is not running" not in str(e):
                    raise
        self.call("POST", f"/containers/{name}/wait?condition=not-running", timeout=STOP_S)

    def start(self, name):
        self.call("POST", f"/containers/{name}/start")

    def exec(self, name, argv, timeout=120):
        """(exit code, stdout) of argv run in the container."""
        made = self.call("POST", f"/containers/{name}/exec", {"Cmd": argv, "AttachStdout": True,
                                                               "AttachStderr": True})
        raw = self.call("POST", f"/exec/{made['Id']}/start", {"Detach": False, "Tty": False}, timeout=timeout)
        return self.call("GET", f"/exec/{made['Id']}/json")["ExitCode"], demux(raw, (1,)).decode(errors="replace")

    def logs(self, name):
        """The container's whole log, stdout and stderr as they came."""
        return demux(self.call("GET", f"/containers/{name}/logs?stdout=1&stderr=1"), (1, 2))


def demux(raw, streams):
    """Docker's multiplexed stream: a header of 8 bytes a frame (its stream, then its size)."""
    out, i = b"", 0
    while i + 8 <= len(raw):
        size = int.from_bytes(raw[i + 4:i + 8], "big")
        if raw[i] in streams:
            out += raw[i + 8:i + 8 + size]
        i += 8 + size
    return out


def now():
    return time.time()


def read_json(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def write_json(path, data):
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)


class Keeper:
    def __init__(self, cfg):
        self.cfg, self.docker = cfg, Docker()
        self.dir = cfg["stateDir"]
        self.guarded = not cfg.get("guard")
        self.whole = True  # the last relaunch's reach: every container, or (Ray, on an intact cluster) the serve

    def path(self, name):
        return os.path.join(self.dir, name)

    def log(self, line):
        print(line, flush=True)

    def guard(self):
        """The node's fabric guard, in the host's namespaces, before any of its containers starts: a reboot
        flushes it. Left alone when it is in place (re-applying rebuilds the chain: a moment without rules)."""
        if self.guarded:
            return True
        g = self.cfg["guard"]
        host = ["nsenter", "-t", "1", "-m", "--", "sh", "-c", g["script"], "fabric-guard"]
        listed = subprocess.run(host + ["list", g["chain"]], capture_output=True, text=True, timeout=60)
        if listed.returncode == 0 and g["chain"] in listed.stdout.split():
            self.guarded = True
            return True
        done = subprocess.run(host + ["apply", g["chain"], *g["args"]], capture_output=True, text=True, timeout=60)
        self.guarded = done.returncode == 0
        self.log(f"fabric guard {g['chain']}: " + ("applied" if self.guarded else f"failed: {done.stderr.strip()}"))
        return self.guarded


class Follower(Keeper):
    """A worker node's keeper: its containers follow the leader's generation."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.told = None  # the last answer it acted on: each report is sampled after acting on the one before

    def run(self):
        mine = read_json(self.path(GENERATION), {"gen": 0})
        while True:
            time.sleep(TICK_S)
            try:
                mine = self.tick(mine)
            except Exception as e:  # as the leader's
                self.log(f"keeper: {type(e).__name__}: {e}")

    def tick(self, mine):
        if not self.guard():
            return mine
        report = {"node": self.cfg["node"], "started": mine["gen"], "told": self.told,
                  "running": {c: self.docker.running(c) for c in self.cfg["containers"]}}
        try:
            req = urllib.request.Request(f"http://{self.cfg['leader']}/report", json.dumps(report).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                want = json.load(r)
        except (OSError, ValueError):
            return mine  # the leader is away (its node restarting): nothing changes here meanwhile
        if not want["armed"]:
            return mine
        if want["adopt"] and mine["gen"] < want["gen"]:
            mine = {"gen": want["gen"]}  # the containers `pulumi up` made are this generation
        elif not want["run"] or mine["gen"] < want["gen"]:
            for c in self.cfg["containers"]:
                self.docker.stop(c)
            if want["run"]:
                for c in self.cfg["containers"]:
                    self.docker.start(c)
                mine = {"gen": want["gen"]}
                self.log(f"generation {want['gen']}: started {', '.join(self.cfg['containers'])}")
        write_json(self.path(GENERATION), mine)
        self.told = {"gen": want["gen"], "run": want["run"]}
        return mine


class Leader(Keeper):
    """The head's keeper: probes, watches, relaunches, gives up; answers the followers."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.w = cfg["watchdog"]
        self.lock = threading.Lock()
        self.reports = {n: (now(), None) for n in cfg.get("followers", ())}  # node -> (time, report); None: none yet
        # Kept across the keeper's own restarts (a reboot): the generation, the arming, the restarts counted.
        self.state = {"gen": 0, "restarts": [], "armed": False, "run": True, **read_json(self.path(STATE), {}),
                      "adopt": False}
        self.failed = 0

    # ---- the followers' side ----
    def answer(self, report):
        with self.lock:
            self.reports[report["node"]] = (now(), report)
            return {k: self.state[k] for k in ("armed", "gen", "run", "adopt")}

    def serve_followers(self):
        leader = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                data = json.dumps(leader.answer(json.loads(body))).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer((self.cfg["bind"], self.cfg["port"]), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def save(self, **changes):
        with self.lock:
            self.state.update(changes)
            write_json(self.path(STATE), self.state)

    def journal(self, line):
        """One line a relaunch (or a give-up) in watchdog.log on the head, which outlives every container."""
        self.log(line)
        with open(self.path(LOG), "a") as f:
            f.write(time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + line + "\n")

    # ---- arming ----
    def control(self):
        """Applies control.json (written by arm and disarm); returns whether the keeper is armed."""
        c = read_json(self.path(CONTROL), {"armed": False, "token": None})
        if c["armed"] and (not self.state["armed"] or self.state.get("token") != c["token"]):
            # A new deployment: its containers, as `up` left them, are the next generation; nothing counted before.
            self.save(armed=True, token=c["token"], gen=self.state["gen"] + 1, run=True, adopt=True, restarts=[],
                      gave_up=None, phase="watching", armed_at=now())
            self.failed = 0
            self.log(f"armed for {c['token']} (generation {self.state['gen']})")
        elif not c["armed"] and self.state["armed"]:
            self.keep_log()  # `up` may replace the container next, and its log with it
            self.save(armed=False, phase="disarmed")
            self.log("disarmed")
        return self.state["armed"]

    def disarmed(self):
        return not read_json(self.path(CONTROL), {"armed": False})["armed"]

    # ---- what is watched ----
    def api_key(self):
        ex = self.cfg["executor"]
        if ex == "mp":
            c = self.docker.inspect(self.cfg["containers"][0]) or {"Config": {"Env": []}}
            env = dict(e.split("=", 1) for e in c["Config"]["Env"] or [])
            return env.get("VLLM_API_KEY")
        code, out = self.docker.exec(self.cfg["containers"][0], ["cat", self.cfg["ray"]["envFile"]])
        for line in out.splitlines() if code == 0 else []:
            if line.startswith("VLLM_API_KEY="):
                return line.split("=", 1)[1][1:-1].replace("'\\''", "'")
        return None

    def probe(self):
        """None when one real completion comes back in time, else why not."""
        api = self.cfg["api"]
        body = json.dumps({"model": api["model"], "prompt": "ping", "max_tokens": 2}).encode()
        key = self.api_key()
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        req = urllib.request.Request(f"http://{api['host']}:{api['port']}/v1/completions", body, headers)
        started = now()
        try:
            with urllib.request.urlopen(req, timeout=self.w["probeTimeout"]) as r:
                ok = bool(json.load(r).get("choices"))
            problem = None if ok else "the completion had no choices"
        except urllib.error.HTTPError as e:
            problem = f"the completion failed: HTTP {e.code}"
        except (OSError, ValueError) as e:
            problem = f"no completion within {self.w['probeTimeout']} s: {e}"
        self.save(lastProbe={"at": started, "seconds": round(now() - started, 3), "error": problem})
        return problem

    def dead(self):
        """What of the group is down: a container, a follower's report, the serve process; None if nothing."""
        for c in self.cfg["containers"]:
            if not self.docker.running(c):
                return f"{c} on {self.cfg['node']} is not running"
        with self.lock:
            reports = dict(self.reports)
        for node in self.cfg["followers"]:
            seen, report = reports[node]
            if now() - seen > STALE_S:
                return f"{node}'s keeper has not reported for {STALE_S} s"
            down = [c for c, up in report["running"].items() if not up] if report else []
            if down and report["started"] >= self.state["gen"]:
                return f"{', '.join(down)} on {node} is not running"
        if self.cfg["executor"] == "ray" and self.serve_ctl("alive")[0] != 0:
            return "vllm serve is not running in " + self.cfg["containers"][0]
        return None

    def containers_down(self):
        reason = self.dead()
        return bool(reason) and not reason.startswith("vllm serve")

    def serve_ctl(self, action, *more):
        r = self.cfg["ray"]
        return self.docker.exec(self.cfg["containers"][0],
                                ["sh", "-c", r["ctl"], "serve-ctl", action, r["pidFile"], r["envFile"], *more],
                                timeout=STOP_S)

    # ---- relaunching ----
    def stop_group(self):
        """Every process of the group stopped, the followers' confirmed; else why not (None: done)."""
        if self.cfg["executor"] == "ray" and self.docker.running(self.cfg["containers"][0]):
            code, out = self.serve_ctl("stop-keep")
            if code:
                return f"vllm serve did not stop: {out.strip()}"
        if not self.whole:
            return None  # Ray's serve alone: the cluster, and its generation, stay
        self.save(gen=self.state["gen"] + 1, run=False, adopt=False)
        for c in self.cfg["containers"]:
            self.docker.stop(c)
        deadline = now() + STOP_S
        while now() < deadline:
            with self.lock:
                reports = dict(self.reports)
            waiting = [n for n in self.cfg["followers"] if not self.stopped(reports[n][1])]
            if not waiting:
                return None
            self.save(phase=f"stopping: waiting for {', '.join(waiting)}")
            time.sleep(TICK_S)
        return f"{', '.join(waiting)} did not confirm its container stopped within {STOP_S} s"

    def stopped(self, report):
        """A follower's report confirms the stop only if it was sampled after the follower acted on it: one that
        arrives after the stop but was sampled before (its containers between two starts) would confirm a stop
        that the follower, still told to run, then undoes."""
        return report is not None and report["told"] == {"gen": self.state["gen"], "run": False} \
            and not any(report["running"].values())

    def keep_log(self):
        """mp: rank 0's log (the API server's) copied to serve.log on the volume, the one before to serve.log.1.
        With Ray the serve writes there itself."""
        if self.cfg["executor"] != "mp" or not self.docker.inspect(self.cfg["containers"][0]):
            return
        log = self.path("serve.log")
        if os.path.exists(log):
            os.replace(log, log + ".1")
        with open(log, "wb") as f:
            f.write(self.docker.logs(self.cfg["containers"][0]))

    def start_group(self):
        """The group started and answering a completion; else why not (None: serving)."""
        gen = self.state["gen"]
        self.keep_log()
        if self.whole:
            for c in self.cfg["containers"]:
                self.docker.start(c)
            self.save(run=True)  # the followers start theirs now
        if self.cfg["executor"] == "ray":
            if self.whole:
                # The head container was stopped, its serve with it: a pid in the old pid file may be another
                # process now, which `relaunch` would stop.
                self.docker.exec(self.cfg["containers"][0], ["rm", "-f", self.cfg["ray"]["pidFile"]])
                problem = self.wait(self.cluster_ready, "the Ray cluster")
                if problem:
                    return problem
            code, out = self.serve_ctl("relaunch", self.cfg["ray"]["argvFile"], self.cfg["ray"]["log"])
            if code:
                return f"the relaunch of vllm serve failed: {out.strip()}"
        self.log(f"generation {gen}: started")
        # A process of the group that dies while it loads ends the wait at once, with its reason.
        return self.wait(lambda: self.dead() or (self.all_started() and self.probe() is None),
                         "an answered completion")

    def all_started(self):
        with self.lock:
            reports = [report for _, report in self.reports.values()]
        return all(r and r["started"] >= self.state["gen"] and all(r["running"].values()) for r in reports)

    def cluster_ready(self):
        code, out = self.docker.exec(self.cfg["containers"][0], ["ray", "status"], timeout=60)
        return code == 0 and out.count("node_") >= len(self.cfg["followers"]) + 1

    def wait(self, ready, what):
        """None once `ready()` is True; its text if it returns one; else the reason of the timeout or abort."""
        deadline = now() + self.w["loadTimeout"]
        while now() < deadline:
            if self.disarmed():
                return "disarmed"
            found = ready()
            if found is True:
                return None
            if found:
                return found
            time.sleep(min(self.w["interval"], 5))
        return f"no {what} within {self.w['loadTimeout']} s"

    def relaunch(self, reason):
        recent = [r for r in self.state["restarts"] if now() - r["at"] < self.w["window"]]
        if len(recent) >= self.w["maxRestarts"]:
            # mp: every rank stopped; Ray: the serve (what reloads the weights), the Ray cluster left as it is.
            self.whole = self.cfg["executor"] == "mp"
            self.stop_group()
            self.save(gave_up=f"gave up after {len(recent)} restarts: {reason}", phase="gave up")
            self.journal(self.state["gave_up"])
            return
        pause = min(self.w["backoffInitial"] * 2 ** len(recent), self.w["backoffMax"])
        self.save(phase=f"relaunching in {pause} s: {reason}")
        deadline = now() + pause
        while now() < deadline:
            if self.disarmed():
                return
            time.sleep(TICK_S)
        # With Ray on an intact cluster, the serve alone; otherwise every container of the group.
        self.whole = self.cfg["executor"] == "mp" or self.containers_down()
        self.save(restarts=self.state["restarts"] + [{"at": now(), "reason": reason, "whole": self.whole}],
                  phase=f"relaunching: {reason}")
        reach = f"generation {self.state['gen'] + 1}, every container" if self.whole else "the serve"
        self.journal(f"relaunch {len(recent) + 1} of {self.w['maxRestarts']} ({reach}): {reason}")
        started = now()
        problem = self.stop_group() or self.start_group()
        self.failed = 0
        took = round(now() - started, 1)
        self.journal(f"generation {self.state['gen']}: " + (f"not serving after {took} s: {problem}" if problem
                                                              else f"serving again after {took} s"))
        self.save(phase=f"relaunch failed after {took} s: {problem}" if problem else "watching",
                  lastRelaunchSeconds=took)
        if problem and not self.disarmed():
            self.relaunch(problem)

    def run(self):
        while not self.guard():  # the guard before any port of this deployment opens, the leader's own included
            time.sleep(TICK_S)
        self.serve_followers()
        next_probe = 0.0
        while True:
            time.sleep(TICK_S)
            try:
                next_probe = self.tick(next_probe)
            except Exception as e:  # Docker's answer, a full disk: said, then tried again at the next tick
                self.log(f"keeper: {type(e).__name__}: {e}")

    def tick(self, next_probe):
        """One look at the group; returns when to probe next."""
        if not self.guard() or not self.control() or self.state.get("gave_up"):
            return next_probe
        reason = self.dead()
        if reason is None and now() >= next_probe:
            next_probe = now() + self.w["interval"]
            problem = self.probe()
            self.failed = self.failed + 1 if problem else 0
            if self.failed >= self.w["failures"]:
                reason = f"{self.failed} probes failed in a row, the last: {problem}"
        if reason:
            self.relaunch(reason)
            next_probe = now() + self.w["interval"]
        return next_probe


# The container's `python3 -c BOOT SOURCE CONFIG`: this file kept at /keeper.py for arm and disarm, then run.
BOOT = ("import sys; src = sys.argv[1]; open('/keeper.py', 'w').write(src); sys.argv = ['/keeper.py', *sys.argv[2:]]; "
        "exec(compile(src, '/keeper.py', 'exec'))")


def arm(state_dir, token, timeout):
    """Returns once the leader watches the deployment `token` names, so that `up` ends with the watchdog on."""
    write_json(os.path.join(state_dir, CONTROL), {"armed": True, "token": token})
    deadline = now() + timeout
    while not ((state := read_json(os.path.join(state_dir, STATE), {})).get("armed") and state.get("token") == token):
        if now() > deadline:
            sys.exit(f"the watchdog's leader did not arm within {timeout} s: see `docker logs` of its keeper")
        time.sleep(0.5)
    print(f"watchdog armed for {token}")


def disarm(state_dir, timeout):
    """Returns once the leader has seen the disarm: it then starts or stops nothing until armed again."""
    write_json(os.path.join(state_dir, CONTROL), {"armed": False, "token": None})
    deadline = now() + timeout
    while read_json(os.path.join(state_dir, STATE), {}).get("armed"):
        if now() > deadline:
            sys.exit(f"the watchdog's leader did not disarm within {timeout} s")
        time.sleep(0.5)
    print("watchdog disarmed")


def main(argv):
    if argv[0] in ("arm", "disarm"):
        state_dir = os.environ["SPARK_VLLM_STATE_DIR"]
        return (arm(state_dir, argv[1], float(argv[2])) if argv[0] == "arm"
                else disarm(state_dir, float(argv[1])))
    cfg = json.loads(argv[0])
    (Leader if cfg["role"] == "leader" else Follower)(cfg).run()


if __name__ == "__main__":
    main(sys.argv[1:])
