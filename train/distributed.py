"""Process-group setup from torchrun's environment, and the few collectives the job uses.

torchrun exports RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. Without them (plain `python train.py`) the job runs as one process
and no process group is created.
"""

from __future__ import annotations

import datetime
import io
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None  # None: single process, no process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"error: environment variable {name}={raw!r} is not an integer; "
                         "start the job with torchrun or unset it") from None


def pick_backend(requested: str, cuda: bool) -> str:
    """NCCL when this process drives a GPU, gloo otherwise; an explicit choice wins."""
    if requested != "auto":
        return requested
    return "nccl" if cuda else "gloo"


def setup(requested_backend: str = "auto", device: str = "auto",
          timeout_s: float = 600.0) -> DistEnv:
    """Read torchrun's environment, choose and set the device, then init the group.

    The CUDA device is set *before* init_process_group so that NCCL binds each
    rank to its own GPU instead of all ranks piling onto GPU 0.
    """
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ

    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda:
        if not torch.cuda.is_available():
            raise SystemExit("error: --device cuda was requested but no GPU is visible; "
                             "use --device cpu or check CUDA_VISIBLE_DEVICES")
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise SystemExit(f"error: LOCAL_RANK {local_rank} but only {count} GPU(s) are "
                             "visible; start torchrun with --nproc-per-node <= the GPU count")
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")

    if not launched:
        return DistEnv(rank=0, local_rank=0, world_size=1, device=dev, backend=None)

    backend = pick_backend(requested_backend, dev.type == "cuda")
    kwargs: dict[str, Any] = {"backend": backend,
                              "timeout": datetime.timedelta(seconds=timeout_s)}
    if backend == "nccl":
        kwargs["device_id"] = dev  # eager NCCL init on the right GPU
    store = _restart_store(rank, world_size, timeout_s)
    if store is not None:
        kwargs.update(store=store, rank=rank, world_size=world_size)
    dist.init_process_group(**kwargs)
    return DistEnv(rank=dist.get_rank(), local_rank=local_rank,
                   world_size=dist.get_world_size(), device=dev, backend=backend)


def _restart_store(rank: int, world_size: int, timeout_s: float):
    """Under torchrun, the agent's store with a namespace per rendezvous round.

    After torchrun restarted the workers (--max-restarts), a new rank was seen to
    read a dead rank's gloo address from the store and fail with "connection
    refused". Keys under a prefix that names the round cannot be stale. The round is
    counted in the store itself: every round starts each rank exactly once, so the
    count of starts of this rank number is the same on every node. (torchrun's
    TORCHELASTIC_RESTART_COUNT is not: it is per agent, and an agent that restarts
    because another node's worker died may count differently, which leaves the ranks
    waiting for each other in different namespaces.)
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], _env_int("MASTER_PORT", 29500),
                          world_size, is_master=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    round_ = store.add(f"clustertrain/starts/rank{rank}", 1)
    return dist.PrefixStore(f"clustertrain/round_{round_}", store)


def control_group(env: DistEnv):
    """A gloo group for small CPU-side messages (stop flags), so that checking them
    never forces a GPU sync. With gloo as the main backend the default group serves."""
    if not env.distributed:
        return None
    if env.backend == "gloo":
        return dist.group.WORLD
    return dist.new_group(backend="gloo")


def any_rank(flag: bool, env: DistEnv, group=None) -> bool:
    """True on every rank if `flag` is true on at least one rank."""
    if not env.distributed:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t.item())


def sum_across(values: list[float], env: DistEnv) -> list[float]:
    """Element-wise sum over ranks (float64, on the job's device)."""
    t = torch.tensor(values, dtype=torch.float64, device=env.device)
    if env.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


# Object collectives of torch.distributed need numpy, which the nodes may lack; these
# move small objects as uint8 tensors serialized with torch.save (and read back with
# weights_only=True, so only tensors and plain containers travel).

def _encode(obj: Any) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _decode(t: torch.Tensor, size: int) -> Any:
    return torch.load(io.BytesIO(bytes(t[:size].tolist())), weights_only=True)


def gather_to_main(obj: Any, env: DistEnv, group=None) -> list[Any] | None:
    """Every rank's `obj` as a list on rank 0 (None elsewhere). Collective; CPU group."""
    if not env.distributed:
        return [obj]
    mine = _encode(obj)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(env.world_size)]
    dist.all_gather(sizes, torch.tensor([mine.numel()], dtype=torch.int64), group=group)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:mine.numel()] = mine
    parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(env.world_size)]
    dist.all_gather(parts, padded, group=group)
    if not env.is_main:
        return None
    return [_decode(p, int(s.item())) for p, s in zip(parts, sizes, strict=True)]


def broadcast_from_main(obj: Any, env: DistEnv, group=None) -> Any:
    """Rank 0's `obj` on every rank. Collective; CPU group."""
    if not env.distributed:
        return obj
    data = _encode(obj) if env.is_main else None
    size = torch.tensor([data.numel() if data is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src=0, group=group)
    buf = data if data is not None else torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(buf, src=0, group=group)
    return _decode(buf, int(size.item()))


def barrier(env: DistEnv) -> None:
    """Wait for every rank (no-op in a single process)."""
    if env.distributed and dist.is_initialized():
        dist.barrier()


def teardown(env: DistEnv) -> None:
    if env.distributed and dist.is_initialized():
        dist.destroy_process_group()
