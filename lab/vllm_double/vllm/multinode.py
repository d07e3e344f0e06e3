"""vLLM's multiprocessing executor across nodes: `--distributed-executor-backend mp --nnodes N --node-rank k
--master-addr A --master-port P`, one `vllm serve` a node, ranks above 0 `--headless`.

What the double does, in vLLM's order (torch.distributed's rendezvous, then the weights, then the API):
  * Node rank 0 hosts the rendezvous store on the master port of every address (torch's TCPStore server binds
    the wildcard address); a taken port fails as torch's does.
  * Every rank, rank 0 included, opens its own listener on VLLM_HOST_IP (the port NCCL's and gloo's bootstrap
    and vLLM's message queue take; here one random port), so an address that is not the node's fails at once.
  * Every rank connects to A:P, retrying until a bound, then fails as torch's client does, naming (A, P).
  * Rank 0 waits (bounded) for all N ranks, checks that they agree on TP, PP and nnodes, and sends every rank
    the roster; each rank then connects once to every other rank's listener (gloo's full mesh).
  * Each rank reads its share of the shards (every nnodes-th, from its own rank), and tells rank 0; rank 0
    serves the API only once every rank has loaded.
  * While serving, rank 0 exits 1 when a rank's connection drops (a rank died), and every rank exits 1 when
    rank 0's does. A SIGTERM'd rank above 0 exits 0 (and so takes rank 0 down, as in vLLM).

The store speaks newline-delimited JSON over TCP: it is the double's, not torch's wire format.
"""

import errno
import json
import os
import signal
import socket
import threading
import time

from vllm.loader import load_shards
from vllm.logger import init_logger

logger = init_logger(__name__)

CONNECT_RETRY_S = 0.5
MESH_TIMEOUT_S = 10
LIVENESS_INTERVAL_S = 1


class DistNetworkError(RuntimeError):
    """torch.distributed.DistNetworkError: the rendezvous store cannot be reached or served."""


def _send(sock: socket.socket, message: dict) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


def _lines(sock: socket.socket):
    """The messages arriving on `sock`, one JSON object a line; ends when the peer closes."""
    buffer = b""
    while True:
        try:
            data = sock.recv(65536)
        except OSError:
            return
        if not data:
            return
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield json.loads(line)


def host_ip(master_addr: str) -> str:
    """vLLM's get_ip(): VLLM_HOST_IP if set, else the address this node would use to reach the master."""
    if os.environ.get("VLLM_HOST_IP"):
        return os.environ["VLLM_HOST_IP"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((master_addr, 80))  # no packet is sent: only the route is looked up
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


class _Store:
    """Rank 0's rendezvous store: collects the ranks, checks they agree, then watches them."""

    def __init__(self, port: int, nnodes: int):
        self.nnodes = nnodes
        self.lock = threading.Condition()
        self.hellos = {}  # node rank -> its hello
        self.conns = {}  # node rank -> socket
        self.loaded = {}  # node rank -> bytes read, or an error message
        self.serving = False
        self.closing = False
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.server.bind(("0.0.0.0", port))
        except OSError as err:
            code = errno.errorcode.get(err.errno, str(err.errno))
            raise DistNetworkError(
                "The server socket has failed to listen on any local network address. port: "
                f"{port}, useIpv6: false, code: -{err.errno}, name: {code}, message: {err.strerror}") from None
        self.server.listen(64)
        threading.Thread(target=self._accept, name="rendezvous-store", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        rank = None
        for message in _lines(conn):
            with self.lock:
                if "hello" in message:
                    rank = message["hello"]["node_rank"]
                    self.hellos[rank] = message["hello"]
                    self.conns[rank] = conn
                elif "loaded" in message or "failed" in message:
                    self.loaded[rank] = message.get("loaded", message.get("failed"))
                self.lock.notify_all()
        with self.lock:
            if rank is not None and not self.closing:
                self.conns.pop(rank, None)
                if self.serving:
                    hello = self.hellos[rank]
                    logger.error("Node rank %d (%s) of the engine died: its connection to the master closed. "
                                 "The engine cannot serve without it. Exiting.", rank, hello["host_ip"])
                    os._exit(1)
                self.loaded.setdefault(rank, "its connection to the master closed before it loaded")
            self.lock.notify_all()

    def gather(self, timeout_s: float, addr: str, port: int) -> list:
        """Every rank's hello, in rank order, once all N have come; the same error for every rank otherwise."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while len(self.hellos) < self.nnodes and time.monotonic() < deadline:
                self.lock.wait(max(0.0, deadline - time.monotonic()))
            joined = sorted(self.hellos)
        if len(joined) < self.nnodes:
            missing = [r for r in range(self.nnodes) if r not in joined]
            raise DistNetworkError(
                f"Timed out after {timeout_s:g} seconds waiting for {self.nnodes} node ranks at {addr}:{port}: "
                f"joined node ranks {joined}, missing {missing}. Check that every node reaches {addr}:{port}.")
        hellos = [self.hellos[r] for r in joined]
        problem = _disagreement(hellos, self.nnodes)
        roster = {"error": problem} if problem else {"roster": hellos}
        for rank in joined:
            try:
                _send(self.conns[rank], roster)
            except (KeyError, OSError):
                pass
        if problem:
            raise RuntimeError(problem)
        return hellos

    def wait_loaded(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while len(self.loaded) < self.nnodes and time.monotonic() < deadline:
                self.lock.wait(max(0.0, deadline - time.monotonic()))
            loaded = dict(self.loaded)
            failed = {r: v for r, v in loaded.items() if isinstance(v, str)}
            if not failed and len(loaded) == self.nnodes:
                self.serving = True
                return
        if failed:
            rank, reason = sorted(failed.items())[0]
            raise RuntimeError(f"Node rank {rank} ({self.hellos[rank]['host_ip']}) failed to load the "
                               f"checkpoint: {reason}")
        waiting = [r for r in range(self.nnodes) if r not in loaded]
        raise RuntimeError(f"Node ranks {waiting} did not finish loading the checkpoint within {timeout_s:g} "
                           "seconds.")

    def close(self) -> None:
        with self.lock:
            self.closing = True
            conns = list(self.conns.values())
        for conn in conns:
            try:
                _send(conn, {"bye": True})
            except OSError:
                pass
        self.server.close()


def _disagreement(hellos: list, nnodes: int):
    keys = ("tensor_parallel_size", "pipeline_parallel_size", "nnodes")
    shapes = {tuple(h[k] for k in keys) for h in hellos}
    if len(shapes) > 1:
        each = "; ".join(f"node rank {h['node_rank']} ({h['host_ip']}) has " +
                         ", ".join(f"{k}={h[k]}" for k in keys) for h in hellos)
        return f"The node ranks disagree on the parallel configuration: {each}."
    ips = [h["host_ip"] for h in hellos]
    if len(set(ips)) != len(ips):
        return (f"Every node should have a unique IP address, got {ips} for node ranks "
                f"{[h['node_rank'] for h in hellos]}. If you set `VLLM_HOST_IP`, make sure it is unique for each "
                "node.")
    return None


class MultiNode:
    """One node's rank of an mp engine across `nnodes` nodes; rank 0 also hosts the store."""

    def __init__(self, args, rendezvous_timeout_s: float):
        self.tp, self.pp = args.tensor_parallel_size, args.pipeline_parallel_size
        self.nnodes, self.rank = args.nnodes, args.node_rank
        self.addr, self.port = args.master_addr, args.master_port
        self.timeout_s = rendezvous_timeout_s
        self.world_size = self.tp * self.pp
        self.store = None
        self.conn = None
        self.roster = []
        self.listener = None

    def start(self) -> None:
        """Listener, store (rank 0), rendezvous, the full mesh."""
        self.ip = host_ip(self.addr)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.listener.bind((self.ip, 0))
        except OSError as err:
            raise RuntimeError(f"VLLM_HOST_IP {self.ip} is not an address of this node: cannot bind {self.ip} "
                               f"({err.strerror}). Set VLLM_HOST_IP to this node's own address on the network "
                               "the nodes share.") from None
        self.listener.listen(64)
        threading.Thread(target=self._accept_mesh, name="mesh", daemon=True).start()
        if self.rank == 0:
            self.store = _Store(self.port, self.nnodes)
        logger.info("Node rank %d of %d: connecting to the master at %s:%d (this node: %s)", self.rank,
                    self.nnodes, self.addr, self.port, self.ip)
        self.conn = self._connect()
        _send(self.conn, {"hello": {"node_rank": self.rank, "nnodes": self.nnodes, "host_ip": self.ip,
                                    "mesh_port": self.listener.getsockname()[1],
                                    "tensor_parallel_size": self.tp, "pipeline_parallel_size": self.pp}})
        self.messages = _lines(self.conn)
        if self.store:
            self.store.gather(self.timeout_s, self.addr, self.port)
        reply = self._next(self.timeout_s + 5)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        self.roster = reply["roster"]
        self._mesh()
        local = self.world_size // self.nnodes
        for local_rank in range(local):
            rank = self.rank * local + local_rank
            logger.info("rank %d in world size %d is assigned as DP rank 0, PP rank %d, TP rank %d", rank,
                        self.world_size, rank // self.tp, rank % self.tp)

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self.timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                return socket.create_connection((self.addr, self.port),
                                                timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            except OSError as err:
                last = err
                time.sleep(CONNECT_RETRY_S)
        raise DistNetworkError(
            f"The client socket has timed out after {int(self.timeout_s * 1000)}ms while trying to connect to "
            f"({self.addr}, {self.port}). (last error: {last.strerror if last else 'none'})")

    def _next(self, timeout_s: float) -> dict:
        self.conn.settimeout(timeout_s)
        try:
            message = next(self.messages, None)
        except socket.timeout:
            message = None
        self.conn.settimeout(None)
        if message is None:
            raise DistNetworkError(f"The master at {self.addr}:{self.port} closed the connection.")
        return message

    def _accept_mesh(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            conn.close()

    def _mesh(self) -> None:
        """gloo's connectFullMesh: this rank reaches every other rank at its advertised address."""
        for peer in self.roster:
            if peer["node_rank"] == self.rank:
                continue
            try:
                socket.create_connection((peer["host_ip"], peer["mesh_port"]), timeout=MESH_TIMEOUT_S).close()
            except OSError as err:
                raise RuntimeError(f"Gloo connectFullMesh failed: node rank {self.rank} cannot connect to node "
                                   f"rank {peer['node_rank']} at {peer['host_ip']}:{peer['mesh_port']} "
                                   f"({err.strerror or err})") from None

    def load(self, shards: list, delay_s: float, timeout_s: float, load_format: str = "auto") -> int:
        """This rank's share of the shards; rank 0 returns once every rank has loaded."""
        mine = shards[self.rank::self.nnodes]
        try:
            total = load_shards(mine, delay_s, load_format) if mine else 0
        except Exception as err:
            _send(self.conn, {"failed": f"{type(err).__name__}: {err}"})
            raise
        _send(self.conn, {"loaded": total})
        if self.store:
            self.store.wait_loaded(timeout_s)
        return total

    def watch_master(self) -> None:
        """Ranks above 0: block until rank 0 ends the engine (exit 0) or dies (exit 1); SIGTERM exits 0."""
        def stop(signum, _frame):
            logger.info("Node rank %d: received signal %d, shutting down.", self.rank, signum)
            os._exit(0)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        logger.info("Node rank %d is loaded and serves no API (headless); waiting on the master.", self.rank)
        for message in self.messages:
            if message.get("bye"):
                logger.info("The master ended the engine; exiting.")
                os._exit(0)
        logger.error("Lost the master (node rank 0 at %s:%d): its connection closed. Exiting.", self.addr,
                     self.port)
        os._exit(1)

    def shutdown(self) -> None:
        if self.store:
            self.store.close()
