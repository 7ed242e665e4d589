"""The measurements of `doctor`, run by torchrun on every node like a job (copied there as
the run's script; the standard library and torch only).

    torchrun ... doctor_job.py --addresses A0,A1,... [--link-seconds 1] [--pings 50] ...

- links: every node's first rank serves a TCP socket on its cluster address; in rounds of
  disjoint pairs (so that each node is in one measurement at a time) the lower node of
  each pair sends for LINK_SECONDS, receives for as long, and times PINGS one-byte round
  trips. Throughput is counted by the side that receives, as the best of its LINK_WINDOW
  windows: what the link carries, not a moment in which the node's CPUs served another job
  (a link read slow cordons both its nodes for every user). A link below SLOW_RATIO x the
  others' median is measured once more, a pair at a time, and its better reading counts
  (LINK_ROUNDS): a link that is slow reads slow again.
- compute: every rank times matrix products (bf16 on a GPU, float32 on the CPU); while
  some rank reads below SLOW_RATIO x the others, every rank measures again and keeps its
  best (COMPUTE_ROUNDS readings at most).
- all_reduce: the whole world reduces a tensor of ALLREDUCE_MB; bus bandwidth as
  nccl-tests defines it (algbw x 2(n-1)/n).
- GPUs: each node's first rank reads nvidia-smi's health fields (parsed by the controller).

Rank 0 prints one line, RESULT_MARK followed by the results as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

# a record line (logstream.RECORD): in the run's log, not on the terminal
RESULT_MARK = "##clustertrain record doctor "
CHUNK = 1 << 20
# What doctor measures by default (DoctorRequest takes them from here).
LINK_SECONDS = 1.0       # per direction of each link
LINK_WINDOW = 0.2        # seconds: a link's rate is that of its best window this long
PINGS = 50               # round trips per link
COMPUTE_SECONDS = 1.0
# Below this fraction of the median of the others, a rate is slow (the controller names a
# node by it; here a rank that reads slow makes every rank measure its compute again).
SLOW_RATIO = 0.5
COMPUTE_ROUNDS = 3       # compute measurements at most, while some rank reads slow
LINK_ROUNDS = 2          # a link's measurements at most, while it reads slow: the best
                         # counts (on the sandbox, another test's load slowed one reading
                         # of a healthy link to half the others' and doctor named it)
ALLREDUCE_MB = 16.0
ALLREDUCE_ITERS = 5
CONNECT_TIMEOUT = 10.0   # seconds to open a link's connection
IO_TIMEOUT = 30.0        # seconds a link may stall beyond its measurement
# nvidia-smi's health fields, in this order (`--format=csv,noheader,nounits`). Drivers
# before 535 call the event reasons clocks_throttle_reasons.active.
GPU_FIELDS = ("index", "pci.bus_id", "name", "ecc.errors.uncorrected.volatile.total",
              "clocks_event_reasons.active", "clocks.sm", "clocks.max.sm",
              "pcie.link.width.current", "pcie.link.width.max", "temperature.gpu")
OLD_GPU_FIELDS = tuple(f.replace("clocks_event_reasons", "clocks_throttle_reasons")
                       for f in GPU_FIELDS)


def pair_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Every pair of N nodes once, in rounds of disjoint pairs (the circle method: N-1
    rounds for an even N, N for an odd one, where each round one node rests)."""
    players: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        pairs = [(players[i], players[m - 1 - i]) for i in range(m // 2)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs
                             if a is not None and b is not None))
        players = [players[0], players[-1], *players[1:-1]]
    return [r for r in rounds if r]


# --- the link server and client (plain sockets) -------------------------------------

def _recv_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        byte = conn.recv(1)
        if not byte:
            break
        data += byte
    return data.decode().strip()


def _receive_all(conn: socket.socket, window: float = LINK_WINDOW) -> tuple[int, float]:
    """Bytes received until the peer closes and the seconds they took, of the best WINDOW
    seconds among them (all of them when none was that long): the rate is bytes / seconds."""
    buf = bytearray(CHUNK)
    total, first, last = 0, 0.0, 0.0
    best: tuple[int, float] | None = None
    begun, got = 0.0, 0   # the window being counted
    while True:
        n = conn.recv_into(buf)
        if not n:
            return best or (total, max(last - first, 1e-9))
        now = time.perf_counter()
        if not total:
            first = begun = now   # the first chunk marks the start
        else:
            got += n
            if now - begun >= window:
                if best is None or got / (now - begun) > best[0] / best[1]:
                    best = (got, now - begun)
                begun, got = now, 0
        total, last = total + n, now


def _send_for(conn: socket.socket, seconds: float) -> None:
    payload = b"\0" * CHUNK
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        conn.sendall(payload)
    conn.shutdown(socket.SHUT_WR)


def _serve_one(conn: socket.socket) -> None:
    with conn:
        verb, _, arg = _recv_line(conn).partition(" ")
        if verb == "SEND":      # the peer sends: count, then answer what arrived
            total, seconds = _receive_all(conn)
            conn.sendall(f"{total} {seconds}\n".encode())
        elif verb == "RECV":    # the peer receives: send for ARG seconds
            _send_for(conn, float(arg))
        elif verb == "PING":    # echo ARG single bytes
            for _ in range(int(arg)):
                byte = conn.recv(1)
                if not byte:
                    break
                conn.sendall(byte)


def serve(address: str) -> tuple[socket.socket, int]:
    """Listen on ADDRESS (an ephemeral port) and answer every connection in a daemon
    thread; the socket (close it to stop) and its port."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind((address, 0))
    listener.listen(16)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener, listener.getsockname()[1]


def _connect(address: str, port: int, verb: str, seconds: float) -> socket.socket:
    conn = socket.create_connection((address, port), timeout=CONNECT_TIMEOUT)
    conn.settimeout(seconds + IO_TIMEOUT)   # a peer that stops answering ends the wait
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.sendall(f"{verb}\n".encode())
    return conn


def measure_link(address: str, port: int, seconds: float, pings: int) -> dict:
    """Both directions and the round trip to the server at ADDRESS:PORT: Gbit/s out (this
    node sends), Gbit/s in, and the median round trip of a byte in milliseconds; or, when
    the link cannot carry them (a blocked port, a peer gone), "error" with what failed."""
    step = "connecting"
    try:
        with _connect(address, port, "SEND", seconds) as conn:
            step = "sending"
            _send_for(conn, seconds)
            total, took = (float(x) for x in _recv_line(conn).split())
            out = total * 8 / took / 1e9
        step = "receiving"
        with _connect(address, port, f"RECV {seconds}", seconds) as conn:
            total, took = _receive_all(conn)
            back = total * 8 / took / 1e9
        step = "timing round trips"
        trips = []
        with _connect(address, port, f"PING {pings}", seconds) as conn:
            for _ in range(pings):
                start = time.perf_counter()
                conn.sendall(b"x")
                if not conn.recv(1):
                    break
                trips.append(time.perf_counter() - start)
    except (OSError, ValueError) as exc:   # ValueError: no byte count came back
        return {"error": f"{step} to {address}:{port}: {exc or type(exc).__name__}"}
    return {"out_gbit_s": out, "in_gbit_s": back,
            "rtt_ms": statistics.median(trips) * 1000 if trips else None}


# --- the measurements inside the job -----------------------------------------------

def gpu_health() -> str | None:
    """nvidia-smi's health fields as CSV, or None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    for fields in (GPU_FIELDS, OLD_GPU_FIELDS):
        done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}",
                               "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30, check=False)
        if done.returncode == 0:
            return done.stdout
    return f"error: {(done.stderr or done.stdout).strip()}"


def _sync(torch, device) -> None:  # noqa: ANN001 (torch module)
    """Wait for the GPU's queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(torch, device, seconds: float) -> float:  # noqa: ANN001 (torch module)
    """Matrix products for about SECONDS: GFLOP/s (bf16 on a GPU, float32 on the CPU with
    CPU_THREADS threads), of the best of COMPUTE_WINDOWS windows (best_rate)."""
    n, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (512, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    threads = torch.get_num_threads()
    if device.type != "cuda":   # one core per rank: see CPU_THREADS
        torch.set_num_threads(CPU_THREADS)
    try:
        torch.matmul(a, b)
        _sync(torch, device)
        per_second = best_rate(lambda: torch.matmul(a, b), seconds,
                               sync=lambda: _sync(torch, device))
    finally:
        torch.set_num_threads(threads)
    return 2 * n ** 3 * per_second / 1e9


# GFLOP/s is the best window's rate: a node whose compute is slow is slow in every window,
# while a moment of someone else's work on its cores (or, in the sandbox, three nodes
# sharing two cores) slows only some; the mean of the whole time named healthy nodes.
COMPUTE_WINDOWS = 5
# On the CPU each rank measures with one thread: with torch's default (a thread per core)
# the ranks of a node, or nodes sharing a machine's cores, fight over them and one reads a
# fifth of the others' GFLOP/s (seen on the sandbox: 3 nodes on 2 cores). One thread's rate
# still tells a slow node from the others, which is all doctor asks of it.
CPU_THREADS = 1
SYNC_EVERY = 10   # a GPU queues work ahead: the clock reads it once this many are done


def best_rate(step: Callable[[], object], seconds: float, windows: int = COMPUTE_WINDOWS,
              sync: Callable[[], object] = lambda: None) -> float:
    """STEPs per second in the best of WINDOWS windows of SECONDS / WINDOWS each (each
    window ends with SYNC, and at least one step is timed in it)."""
    best, window = 0.0, seconds / windows
    for _ in range(windows):
        count, start = 0, time.perf_counter()
        while count == 0 or time.perf_counter() - start < window:
            step()
            count += 1
            if count % SYNC_EVERY == 0:
                sync()
        sync()
        best = max(best, count / (time.perf_counter() - start))
    return best


def far_below(rates: list[float], ratio: float = SLOW_RATIO) -> list[int]:
    """The indices of RATES below RATIO x the median of the other rates."""
    return [i for i, x in enumerate(rates)
            if len(rates) > 1 and x < ratio * statistics.median(rates[:i] + rates[i + 1:])]


def keep_best(links: list[dict], reading: dict) -> None:
    """READING of a link direction into LINKS: the first, or a better one than it holds (a
    reading without an error over one with; a higher rate)."""
    for i, held in enumerate(links):
        if (held["src"], held["dst"]) == (reading["src"], reading["dst"]):
            if ("error" in held and "error" not in reading) or (
                    ("error" in reading) == ("error" in held)
                    and reading["gbit_s"] > held["gbit_s"]):
                links[i] = reading
            return
    links.append(reading)


def steady_rate(measure: Callable[[], float], gather: Callable[[float], list[float]],
                rounds: int = COMPUTE_ROUNDS,
                again: Callable[[list[int]], object] = lambda slow: None) -> float:
    """This rank's best of MEASURE's readings: while some rank's best (GATHER: every
    rank's, in rank order) is far below the others', every rank measures again (AGAIN
    is told which were slow), ROUNDS readings at most. Someone else's work on a node's
    cores for a few seconds (on the sandbox: the other tests' containers on the same two
    cores) slows one reading; a slow node reads slow every time and is named for it."""
    best = 0.0
    for n in range(1, rounds + 1):
        best = max(best, measure())
        slow = far_below(gather(best))
        if not slow or n == rounds:
            return best
        again(slow)
    return best


def allreduce(torch, dist, device, megabytes: float, iters: int) -> dict:  # noqa: ANN001
    """Time an all_reduce of MEGABYTES (float32) over the whole world."""
    world = dist.get_world_size()
    tensor = torch.ones(max(1, int(megabytes * 1e6 // 4)), device=device)
    size = tensor.numel() * 4
    for _ in range(2):
        dist.all_reduce(tensor)
    _sync(torch, device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    _sync(torch, device)
    took = (time.perf_counter() - start) / iters
    algbw = size / took / 1e9
    return {"bytes": size, "ranks": world, "iters": iters, "seconds": took,
            "algbw_gbyte_s": algbw, "busbw_gbyte_s": algbw * 2 * (world - 1) / world,
            "backend": str(dist.get_backend())}


def all_gather_json(torch, dist, obj, group) -> list:  # noqa: ANN001 (torch modules)
    """Every rank's OBJ (JSON), through CPU tensors on GROUP (torch's *_object collectives
    need numpy, which a node's environment need not have)."""
    data = torch.tensor(list(json.dumps(obj).encode()), dtype=torch.uint8)
    world = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([data.numel()], dtype=torch.int64), group=group)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:data.numel()] = data
    everyone = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(everyone, padded, group=group)
    return [json.loads(bytes(t[:int(n.item())].tolist()).decode())
            for t, n in zip(everyone, sizes, strict=True)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--addresses", required=True,
                   help="the nodes' cluster addresses, by node rank, comma-separated")
    p.add_argument("--link-seconds", type=float, default=LINK_SECONDS)
    p.add_argument("--pings", type=int, default=PINGS)
    p.add_argument("--compute-seconds", type=float, default=COMPUTE_SECONDS)
    p.add_argument("--allreduce-mb", type=float, default=ALLREDUCE_MB)
    p.add_argument("--allreduce-iters", type=int, default=ALLREDUCE_ITERS)
    return p.parse_args(argv)


def say(rank: int, text: str) -> None:
    if rank == 0:
        print(f"doctor: {text}", flush=True)


def measure_links(args: argparse.Namespace, torch, dist, control,  # noqa: ANN001
                  addresses: list[str], node: int, local: int) -> list[dict]:
    """Every link, in rounds of disjoint pairs (one server per node, on its first rank),
    then once more each link that read slow: the links this rank measured, each
    direction's best reading (the others' ranks return theirs)."""
    rank = dist.get_rank()
    server = port = None
    if local == 0:
        own = addresses[node]
        server, port = serve(own if ":" in own else socket.gethostbyname(own))
    ports = all_gather_json(torch, dist, [node, port], control)
    port_of = {n: p for n, p in ports if p is not None}
    links: list[dict] = []   # the links this rank measured: each direction's best reading

    def measure_pairs(rounds: list[list[tuple[int, int]]], what: str) -> None:
        for i, pairs in enumerate(rounds, 1):
            dist.barrier(group=control)
            say(rank, f"links: {what} {i}/{len(rounds)}: "
                + ", ".join(f"{a}-{b}" for a, b in pairs))
            for a, b in pairs:
                if local == 0 and node == a:
                    got = measure_link(addresses[b], port_of[b], args.link_seconds,
                                       args.pings)
                    for src, dst, key in ((a, b, "out_gbit_s"), (b, a, "in_gbit_s")):
                        keep_best(links, {"src": src, "dst": dst,
                                          "gbit_s": got.get(key, 0.0),
                                          "latency_ms": got.get("rtt_ms"),
                                          **({"error": got["error"]} if "error" in got
                                             else {})})

    measure_pairs(pair_rounds(len(addresses)), "round")
    for _ in range(LINK_ROUNDS - 1):   # a link that read slow: once more, a pair at a time
        every = [link for part in all_gather_json(torch, dist, links, control)
                 for link in part]
        again = sorted({(min(every[i]["src"], every[i]["dst"]),
                         max(every[i]["src"], every[i]["dst"]))
                        for i in far_below([link["gbit_s"] for link in every])})
        if not again:
            break
        measure_pairs([[pair] for pair in again], "read below "
                      f"{SLOW_RATIO:g} x the others, measuring again")
    dist.barrier(group=control)
    if server is not None:
        server.close()
    return links


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    addresses = args.addresses.split(",")
    node, local = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"])
    gpu = torch.cuda.is_available() and os.environ.get("CLUSTERTRAIN_BACKEND") == "nccl"
    device = torch.device("cuda", local) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo")
    rank = dist.get_rank()
    control = dist.new_group(backend="gloo") if gpu else None  # barriers, objects

    links = measure_links(args, torch, dist, control, addresses, node, local)

    say(rank, "compute: matrix products on every rank")

    def measure() -> float:
        dist.barrier(group=control)   # every rank measures at the same time
        return matmul_gflops(torch, device, args.compute_seconds)

    gflops = steady_rate(
        measure, lambda best: all_gather_json(torch, dist, best, control),
        again=lambda slow: say(rank, f"compute: rank(s) {', '.join(map(str, slow))} read "
                                     f"below {SLOW_RATIO:g} x the others: measuring again"))
    say(rank, f"all_reduce: {args.allreduce_mb:g} MB over {dist.get_world_size()} ranks")
    reduced = allreduce(torch, dist, device, args.allreduce_mb, args.allreduce_iters)

    mine = {"rank": rank, "node": node, "local_rank": local, "gflops": gflops,
            "device": str(torch.cuda.get_device_name(device)) if gpu else "cpu",
            "links": links, "gpus": gpu_health() if local == 0 else None}
    everyone = all_gather_json(torch, dist, mine, control)
    if rank == 0:
        result = {"nodes": len(addresses), "allreduce": reduced,
                  "ranks": [{k: v for k, v in r.items() if k not in ("links", "gpus")}
                            for r in everyone],
                  "links": [link for r in everyone for link in r["links"]],
                  "gpus": {str(r["node"]): r["gpus"] for r in everyone
                           if r["gpus"] is not None},
                  "link_seconds": args.link_seconds, "pings": args.pings}
        print(RESULT_MARK + json.dumps(result), flush=True)
    dist.barrier(group=control)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
