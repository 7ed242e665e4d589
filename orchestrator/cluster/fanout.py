"""One way to do something on every node at once: `each()` runs a function per node in
threads and returns a result per node, value or exception (fabric's GroupResult as a
model). A failure on one node never hides the others' results."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

MAX_PARALLEL = 32  # SSH sessions started at once (a bastion's MaxStartups is 10:30:100)

T = TypeVar("T")
X = TypeVar("X")


@dataclass(frozen=True)
class NodeResult(Generic[T]):
    node: str
    value: T | None = None
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class GroupResult(dict[str, NodeResult[T]]):
    """{node: NodeResult}, in the order the nodes were given."""

    @property
    def failed(self) -> dict[str, Exception]:
        return {n: r.error for n, r in self.items() if r.error is not None}

    def values_or_raise(self) -> dict[str, T]:
        """Every node's value; the first node's exception (in the nodes' order) if any
        node failed."""
        for r in self.values():
            if r.error is not None:
                raise r.error
        return {n: r.value for n, r in self.items()}  # type: ignore[misc]


def each(items: Iterable[X], fn: Callable[[X], T], name: Callable[[X], str],
         limit: int = MAX_PARALLEL) -> GroupResult[T]:
    """FN(item) for every item at once (LIMIT at a time), keyed by NAME(item)."""
    items = list(items)

    def one(item: X) -> NodeResult[T]:
        try:
            return NodeResult(name(item), fn(item))
        except Exception as exc:  # noqa: BLE001 - kept as this node's result
            return NodeResult(name(item), error=exc)

    results: GroupResult[T] = GroupResult()
    if not items:
        return results
    with ThreadPoolExecutor(max_workers=min(len(items), limit)) as pool:
        for r in pool.map(one, items):
            results[r.node] = r
    return results
