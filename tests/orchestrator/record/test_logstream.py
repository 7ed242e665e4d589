"""`node/rank | line` prefixing of a node's byte stream."""

from orchestrator.node import doctor as doctor_job
from orchestrator.record.logstream import RECORD, LineSplitter, is_record, prefix_line


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


def test_a_worker_line_that_torchrun_cut_in_two_is_whole_again() -> None:
    """torchrun's tailer prints a half-written line with the rank's prefix and the rest
    with the prefix again (seen in CI: 'node2/rank2 | sum [rank2]:12 numpy')."""
    s = LineSplitter("node2")
    assert s.feed(b"[rank2]:sum [rank2]:12 numpy 2.4\n") == ["node2/rank2 | sum 12 numpy 2.4"]
    # two ranks of one node: rank 0's half line, then rank 1's whole one, then the rest
    assert s.feed(b"[rank0]:loss [rank1]:loss 0.7\n[rank0]:0.5\n") == \
        ["node2/rank1 | loss 0.7", "node2/rank0 | loss 0.5"]
    assert s.feed(b"[rank3]:half [rank4]:whole\n") == ["node2/rank4 | whole"]
    assert s.flush() == ["node2/rank3 | half "]
    assert s.flush() == []
