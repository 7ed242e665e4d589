"""train/checkpoint.py: atomic writes survive SIGKILL at any moment; resume picks the newest.

The stress test forks a writer that saves checkpoints in a loop (each holding
8 MB so that a kill often lands inside a write) and SIGKILLs it at random
moments, many times. After every kill, every checkpoint under a final name must
load completely and the newest must be at least the last one the writer reported
as saved.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import time

import pytest
import torch

PAYLOAD_INTS = 1 << 20  # 8 MB of int64 per checkpoint


@pytest.fixture
def ckpt(train_modules):
    return train_modules("checkpoint")


def payload(epoch: int) -> dict:
    # Built without parallel kernels: safe in a forked child.
    w = torch.frombuffer(bytearray(struct.pack("<q", epoch) * PAYLOAD_INTS), dtype=torch.int64)
    return {"model": {"w": w}, "optimizer": {"state": {0: {"momentum": w[:16].clone()}},
                                             "param_groups": [{"lr": 0.1, "params": [0]}]},
            "history": [{"epoch": e, "train_loss": 1.0 / (e + 1)} for e in range(epoch)]}


def writer(ckpt, directory, start: int, report_fd: int) -> None:
    """Child process: resume after the newest checkpoint and save forever."""
    store = ckpt.CheckpointStore(directory, keep=2)
    store.remove_stale_temps()
    epoch = start
    while True:
        store.save(payload(epoch), ckpt.Position(epoch, 0))
        os.write(report_fd, struct.pack("<q", epoch))
        epoch += 1


def test_sigkill_during_saves_never_leaves_an_unloadable_newest_checkpoint(ckpt, tmp_path):
    rng = random.Random(1234)
    store = ckpt.CheckpointStore(tmp_path, keep=2)
    kills, kills_mid_write, last_reported = 40, 0, -1
    for _ in range(kills):
        found = store.latest()
        start = found[1]["epoch"] + 1 if found else 0
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            try:
                os.close(r)
                writer(ckpt, tmp_path, start, w)
            finally:
                os._exit(0)
        os.close(w)
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        reported = b""
        while chunk := os.read(r, 4096):
            reported += chunk
        os.close(r)
        if reported:
            last_reported = struct.unpack("<q", reported[-8:])[0]
        if any(p.name.startswith(".ckpt-") for p in tmp_path.iterdir()):
            kills_mid_write += 1

        finals = store.positions()
        assert len(finals) <= store.keep + 1  # a kill between rename and prune: one extra
        for pos, path in finals:  # every final name is a complete checkpoint
            state = ckpt.CheckpointStore.load(path)
            assert state["epoch"] == pos.epoch
            assert bool((state["model"]["w"] == pos.epoch).all())
        newest = store.latest()
        if last_reported >= 0:
            assert newest is not None and newest[1]["epoch"] >= last_reported, \
                "a save that returned was lost"
            epoch = newest[1]["epoch"]
            assert len(newest[1]["history"]) == epoch
            assert bool((newest[1]["optimizer"]["state"][0]["momentum"] == epoch).all())

    assert last_reported >= 5, "the writer hardly ever finished a save; test too short"
    # The point of the test: many kills must have hit a write in progress.
    assert kills_mid_write >= 5, f"only {kills_mid_write}/{kills} kills landed mid-write"
    store.remove_stale_temps()  # what the next writer does first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ckpt-")]


def test_newest_damaged_checkpoint_is_skipped_for_the_previous_one(ckpt, tmp_path):
    messages: list[str] = []
    store = ckpt.CheckpointStore(tmp_path, keep=3, log=messages.append)
    for e in range(3):
        store.save(payload(e), ckpt.Position(e, 0))
    newest = tmp_path / ckpt.Position(2, 0).filename()
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # e.g. lost blocks
    path, state = store.latest()
    assert path.name == ckpt.Position(1, 0).filename() and state["epoch"] == 1
    assert any("cannot be loaded" in m for m in messages)


def test_keeps_the_last_k_and_orders_mid_epoch_after_epoch_boundary(ckpt, tmp_path):
    store = ckpt.CheckpointStore(tmp_path, keep=2)
    for pos in (ckpt.Position(1, 0), ckpt.Position(2, 0), ckpt.Position(2, 7)):
        store.save({"model": {}}, pos)
    assert [p for p, _ in store.positions()] == [ckpt.Position(2, 0), ckpt.Position(2, 7)]
    assert store.latest()[1]["step"] == 7


def test_a_writer_killed_before_its_prune_leaves_one_extra_that_the_next_save_removes(
        ckpt, tmp_path, monkeypatch):
    """Killed between rename and prune, twice in a row: never more than keep + 1 files,
    even while the second save is being written (where the kill may land)."""
    store = ckpt.CheckpointStore(tmp_path, keep=2)
    for epoch in range(3):  # three final names: the first writer died before its prune
        torch.save({"format": ckpt.FORMAT, "epoch": epoch, "step": 0},
                   tmp_path / ckpt.Position(epoch, 0).filename())
    seen: list[int] = []
    real_replace = os.replace

    def replace(src, dst):
        real_replace(src, dst)
        seen.append(len(store.positions()))  # what a kill right here would leave

    monkeypatch.setattr(ckpt.os, "replace", replace)
    store.save({"model": {}}, ckpt.Position(3, 0))
    assert seen == [3]
    assert [p.epoch for p, _ in store.positions()] == [2, 3]


def test_loading_refuses_pickled_code(ckpt, tmp_path):
    """weights_only=True: a checkpoint that would run code on load is not loaded."""
    store = ckpt.CheckpointStore(tmp_path, keep=2)
    store.save({"model": {}}, ckpt.Position(1, 0))
    evil = tmp_path / ckpt.Position(2, 0).filename()
    torch.save({"format": ckpt.FORMAT, "epoch": 2, "step": 0, "x": os.system},
               evil)  # pickles a reference to os.system
    path, state = store.latest()
    assert path.name == ckpt.Position(1, 0).filename()
