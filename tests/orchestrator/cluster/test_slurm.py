"""Slurm's words as a user reads them (orchestrator/cluster/slurm.py)."""

from __future__ import annotations

from orchestrator.cluster import slurm


def test_a_waiting_line_names_place_reason_and_who_holds_the_gpus() -> None:
    event = {"event": "pending", "job": "22", "reason": "Resources", "position": 1,
             "holders": [{"job": "21", "user": "alice", "name": "clustertrain-20261126-1",
                          "nodes": "node[0-1]", "gres": "gres:gpu:2", "time": "0:42"},
                         {"job": "9", "user": "carol", "name": "prep", "nodes": "node2",
                          "gres": "N/A", "time": "1:00:00"}]}
    line = slurm.waiting_line(event, 12.4)
    assert line == ("queued as Slurm job 22 for 12 s: #1 in the queue, waiting for GPUs to "
                    "free; held by alice's run 20261126-1 (job 21, node[0-1], 2 GPUs per "
                    "node, for 0:42); carol's job prep (job 9, node2, for 1:00:00)")


def test_reasons_in_words() -> None:
    assert "per-user limit" in slurm.reason_words("QOSMaxGRESPerUser")
    assert "fair share" in slurm.reason_words("Priority")
    assert slurm.reason_words("SomethingNew") == "SomethingNew"
    assert slurm.gpus_of("gres:gpu:tesla:4") == 4
    assert slurm.gpus_of("N/A") == 0


SQUEUE = """\
34|alice|clustertrain-20261126-0722-a1|RUNNING|None|node[0-1]|gres:gpu:2|2|0:04|3333
36|carol|prep|PENDING|Priority|(null)|gres:gpu:1|1|0:00|1200
35|bob|clustertrain-20261126-0723-b2|PENDING|Resources|(null)|gres:gpu:2|2|0:00|3333
"""


def test_queue_lists_running_jobs_then_waiting_ones_in_start_order() -> None:
    jobs = slurm.parse_squeue(SQUEUE)
    assert [(j["job"], j["run"], j["gpus"]) for j in jobs] == [
        ("34", "20261126-0722-a1", 4), ("36", None, 1), ("35", "20261126-0723-b2", 4)]
    lines = slurm.render_queue(jobs).splitlines()
    assert lines[0].split() == ["JOB", "USER", "WHAT", "STATE", "GPUS", "NODES", "FOR", "/",
                                "WHY"]
    assert lines[1].split()[:6] == ["34", "alice", "run", "20261126-0722-a1", "running", "4"]
    assert lines[2].split()[:6] == ["35", "bob", "run", "20261126-0723-b2", "waiting", "#1"]
    assert lines[2].endswith("waiting for GPUs to free")
    assert lines[3].split()[:4] == ["36", "carol", "prep", "waiting"]
    assert "fair share" in lines[3]
    assert slurm.render_queue([]) == "the queue is empty: every GPU is free"
