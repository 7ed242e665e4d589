"""Benchmark: what authenticating the supervisors' beats costs (orchestrator/node/ring.py):
the HMAC-SHA256 a sender puts in front of a beat and the receiver checks, per datagram, in
microseconds, beside what a beat already cost (its JSON written and read). Beats as a run
of N nodes carries them at its end (every node's word in each: the largest they get).

    python bench/ring_mac.py [--sizes 3,16,64] [--number 20000] [--repeat 7]

Writes bench/results/ring_mac.json and prints a markdown table (the median of REPEAT
rounds of NUMBER datagrams each, the node package's own functions).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.node.ring import seal, unseal  # noqa: E402

RESULTS = REPO / "bench" / "results" / "ring_mac.json"


def beat(n: int) -> bytes:
    """A beat of a run of N nodes at its end: every node's word in it."""
    status = {f"node{i}": {"state": "ended", "reason": "peer-failed", "code": 143,
                           "why": "node3", "timed_out": False, "v": 3} for i in range(n)}
    return json.dumps({"r": "20261128-024200-abcdef", "n": "node0", "c": 1234, "q": 0.5,
                       "s": status, "l": {}}, separators=(",", ":")).encode()


def micro(stmt, number: int, repeat: int) -> float:
    """Median microseconds per call of STMT."""
    return statistics.median(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e6


def measure(n: int, number: int, repeat: int) -> dict:
    key, content = os.urandom(32), beat(n)
    datagram = seal(key, content)
    return {"nodes": n, "bytes": len(datagram),
            "seal_us": round(micro(lambda: seal(key, content), number, repeat), 2),
            "unseal_us": round(micro(lambda: unseal(key, datagram), number, repeat), 2),
            "json_dumps_us": round(micro(lambda: json.dumps(json.loads(content),
                                                            separators=(",", ":")),
                                         number, repeat), 2),
            "json_loads_us": round(micro(lambda: json.loads(content), number, repeat), 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="3,16,64")
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    rows = [measure(int(n), args.number, args.repeat) for n in args.sizes.split(",")]
    load = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "what": "HMAC-SHA256 of a beat: sealed by its sender, checked by its receiver, "
                "microseconds per datagram (median of rounds), beside the beat's JSON",
        "machine": f"{os.cpu_count()} cores (load average {load[0]:.1f} at the end); "
                   f"Python {sys.version.split()[0]}",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": rows}, indent=2) + "\n")
    print("| nodes | datagram bytes | seal, µs | check, µs | JSON out, µs | JSON in, µs |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['nodes']} | {r['bytes']} | {r['seal_us']} | {r['unseal_us']} | "
              f"{r['json_dumps_us']} | {r['json_loads_us']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
