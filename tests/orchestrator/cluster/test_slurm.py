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
    assert "fair share" in slurm.reason_words("Priority")
    assert slurm.reason_words("SomethingNew") == "SomethingNew"
    assert slurm.gpus_of("gres:gpu:tesla:4") == 4
    assert slurm.gpus_of("N/A") == 0


def test_at_the_per_user_limit_the_line_says_what_the_user_holds_and_only_that() -> None:
    """Slurm says QOSMaxGRESPerUser both for a job that waits for the user's other jobs
    to end and for one that alone asks for more than the limit: the words say which, from
    what squeue shows the user holding; they never claim GPUs the user does not hold."""
    others = {"job": "21", "user": "alice", "name": "prep", "nodes": "node[0-1]",
              "gres": "gres:gpu:2", "time": "0:42", "count": "2"}
    alone = {"event": "pending", "job": "22", "user": "bob", "reason": "QOSMaxGRESPerUser",
             "position": 1, "holders": [others]}
    line = slurm.waiting_line(alone, 3.0)
    assert "already held" not in line and "alice" not in line, line
    assert line.endswith("more GPUs than one user may hold (the site's per-user limit): it "
                         "can never start; cancel it and ask for fewer"), line
    mine = {**others, "job": "20", "user": "bob", "name": "clustertrain-20261126-1",
            "nodes": "node2", "count": "1"}
    holding = {**alone, "holders": [others, mine]}
    line = slurm.waiting_line(holding, 3.0)
    assert ("over the site's per-user GPU limit with the 2 GPU(s) already held by you in "
            "running jobs; it starts when enough of them end; held by bob's run "
            "20261126-1 (job 20, node2, 2 GPUs per node, for 0:42)") in line, line
    assert "alice" not in line


def test_a_request_above_a_limit_is_named_with_what_to_ask_instead() -> None:
    event = {"event": "over-limit", "job": "", "nodes": 3, "gpus_per_node": 2,
             "limits": [{"limit": "gpus-per-user", "asked": 6, "most": 4,
                         "where": "QOS clustertrain-gpus",
                         "setting": "MaxTRESPerUser=gres/gpu=4"},
                        {"limit": "time", "asked": 172800, "most": 86400,
                         "where": "partition gpu", "setting": "MaxTime=1-00:00:00"}]}
    assert slurm.limit_words(event) == (
        "Slurm could never start this request, it would wait for ever: 6 GPUs (3 node(s) x "
        "2) is more than one user may hold at once: 4 (QOS clustertrain-gpus, "
        "MaxTRESPerUser=gres/gpu=4); ask for at most 4, e.g. --nodes 2 --gpus-per-node 2; "
        "a time limit of 2-00:00:00 is above the partition's: 1-00:00:00 (partition gpu, "
        "MaxTime=1-00:00:00); ask for --time 1-00:00:00 or less (or ask the cluster's "
        "admin to raise the limit). Nothing was queued")
    nodes = {**event, "nodes": 5, "gpus_per_node": 1, "limits": [
        {"limit": "nodes", "asked": 5, "most": 3, "where": "partition gpu",
         "setting": "TotalNodes=3"}]}
    assert "5 nodes is more than the partition has: 3 (partition gpu, TotalNodes=3); ask " \
        "for --nodes 3 or fewer" in slurm.limit_words(nodes)


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


def test_queue_words_the_per_user_limit_by_what_each_user_holds() -> None:
    jobs = slurm.parse_squeue(SQUEUE + "37|alice|big|PENDING|QOSMaxGRESPerUser|(null)|"
                              "gres:gpu:2|1|0:00|3000\n38|dave|huge|PENDING|"
                              "QOSMaxGRESPerUser|(null)|gres:gpu:2|3|0:00|3000\n")
    lines = {line.split()[0]: line for line in slurm.render_queue(jobs).splitlines()}
    assert lines["37"].endswith("over the site's per-user GPU limit with the 4 GPU(s) "
                                "already held by alice in running jobs; it starts when "
                                "enough of them end"), lines["37"]
    assert lines["38"].endswith("it can never start; cancel it and ask for fewer"), lines["38"]
