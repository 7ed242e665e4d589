"""`node/rank | line` prefixing of a node's byte stream."""

from orchestrator.node import doctor as doctor_job
from orchestrator.run.logstream import RECORD, LineSplitter, is_record, prefix_line


def test_prefix_worker_and_torchrun_lines() -> None:
    assert prefix_line("node1", "[rank3]:loss 0.5") == "node1/rank3 | loss 0.5"
    assert prefix_line("node0", "W1122 torch/distributed/run.py") == \
        "node0/torchrun | W1122 torch/distributed/run.py"
    assert prefix_line("n", "[rankX]:odd") == "n/torchrun | [rankX]:odd"


def test_splitter_joins_partial_chunks_and_utf8() -> None:
    s = LineSplitter("node0")
    assert s.feed(b"[rank0]:hel") == []
    assert s.feed(b"lo\n[rank1]:\xc3") == ["node0/rank0 | hello"]
    assert s.feed(b"\xa9t\xc3\xa9\r\n[rank1]:tail") == ["node0/rank1 | été"]
    assert s.flush() == ["node0/rank1 | tail"]
    assert s.flush() == []


def test_a_workers_record_line_is_told_from_other_lines() -> None:
    assert is_record("node0/rank0 | ##clustertrain record doctor {}")
    assert not is_record("node0/torchrun | ##clustertrain record doctor {}")
    assert not is_record("node0/rank0 | doctor: links: round 1/3")
    assert doctor_job.RESULT_MARK.startswith(RECORD)   # doctor's results are records
