"""`python -m orchestrator data ...`: synthetic dataset, archive unpacking, checksum, download.

No internet: the download path is exercised against an HTTP server on loopback
serving a locally built archive in the official layout.
"""

from __future__ import annotations

import hashlib
import http.server
import importlib.util
import io
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.errors import ClusterError
from orchestrator.provision import data

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def loader():
    """The training job's own reader (train/data.py), loaded from its file."""
    spec = importlib.util.spec_from_file_location("clustertrain_job_data",
                                                  REPO / "train" / "data.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


SMALL = data.SyntheticSpec(train_per_class=6, test_per_class=3, classes=10, seed=7)


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[Path, str]:
    """A .tar.gz with cifar-10-batches-py/ like the official one, and its MD5."""
    tmp = tmp_path_factory.mktemp("archive")
    src = data.write_synthetic(tmp / "src", SMALL, log=lambda *_: None)
    path = tmp / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(src, arcname=data.SUBDIR)
    return path, hashlib.md5(path.read_bytes()).hexdigest()


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.rglob("*")) if parent.exists() else []


def test_synthetic_dataset_is_read_by_the_training_job(tmp_path, loader):
    data.write_synthetic(tmp_path, SMALL, log=lambda *_: None)
    assert sorted(p.name for p in (tmp_path / data.SUBDIR).iterdir()) == sorted(data.REQUIRED)
    c = loader.load_cifar(tmp_path)
    assert tuple(c.train_x.shape) == (60, 3, 32, 32) and tuple(c.test_x.shape) == (30, 3, 32, 32)
    assert c.train_y.bincount().tolist() == [6] * 10 and c.test_y.bincount().tolist() == [3] * 10
    assert c.classes[:2] == ["airplane", "automobile"]
    # Same class, same pattern: the class mean images differ far more between classes
    # than the noise inside one class would explain, which is what makes it learnable.
    means = [c.train_x[c.train_y == k].float().mean(0) for k in range(10)]
    between = min((means[a] - means[b]).abs().mean() for a in range(10) for b in range(a))
    within = (c.train_x[c.train_y == 0].float() - means[0]).abs().mean()
    assert between > 0.5 * within


def test_synthetic_is_deterministic_per_seed():
    a = data.synthetic_batches(SMALL)
    assert a == data.synthetic_batches(SMALL)
    other = data.synthetic_batches(data.SyntheticSpec(6, 3, 10, seed=8))
    assert a["data_batch_1"] != other["data_batch_1"]


def test_archive_is_verified_and_unpacked(tmp_path, archive, loader):
    path, md5 = archive
    dest = tmp_path / "data" / "cifar10"
    target = data.fetch_cifar10(dest, archive=path, md5=md5, log=lambda *_: None)
    assert target == dest / data.SUBDIR and data.is_complete(dest)
    assert [p.name for p in dest.iterdir()] == [data.SUBDIR]  # no staging left behind
    assert len(loader.load_cifar(dest).train_y) == 60
    # A second run sees a complete copy and does nothing.
    msgs: list[str] = []
    data.fetch_cifar10(dest, archive=path, md5=md5, log=msgs.append)
    assert "already complete" in msgs[0]


def test_wrong_checksum_fails_and_leaves_nothing(tmp_path, archive):
    path, _md5 = archive
    dest = tmp_path / "new" / "cifar10"
    with pytest.raises(data.DataError, match="checksum mismatch") as exc:
        data.fetch_cifar10(dest, archive=path, log=lambda *_: None)  # official MD5
    assert data.CIFAR10_MD5 in str(exc.value)
    assert not (tmp_path / "new").exists(), "directories created for the dataset must go too"


def test_archive_with_paths_outside_the_dataset_is_refused(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    md5 = hashlib.md5(bad.read_bytes()).hexdigest()
    dest = tmp_path / "dest"
    with pytest.raises(data.DataError, match="outside cifar-10-batches-py"):
        data.fetch_cifar10(dest, archive=bad, md5=md5, log=lambda *_: None)
    assert not (tmp_path / "escape.txt").exists() and not dest.exists()


@pytest.fixture
def http_server(archive):
    """Serves the archive on 127.0.0.1 only."""
    path, _ = archive
    content = path.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path != "/cifar-10-python.tar.gz":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_download_is_verified_and_unpacked(tmp_path, archive, http_server):
    _, md5 = archive
    dest = tmp_path / "dl"
    data.fetch_cifar10(dest, url=f"{http_server}/cifar-10-python.tar.gz", md5=md5,
                       log=lambda *_: None)
    assert data.is_complete(dest) and [p.name for p in dest.iterdir()] == [data.SUBDIR]


def test_download_with_wrong_checksum_leaves_nothing(tmp_path, http_server):
    dest = tmp_path / "dl"
    with pytest.raises(data.DataError, match="checksum mismatch"):
        data.fetch_cifar10(dest, url=f"{http_server}/cifar-10-python.tar.gz",
                           log=lambda *_: None)
    assert leftovers(tmp_path) == []


def test_unreachable_source_suggests_archive(tmp_path, http_server):
    with pytest.raises(data.DataError, match="--archive FILE"):
        data.fetch_cifar10(tmp_path / "dl", url=f"{http_server}/missing.tar.gz",
                           log=lambda *_: None)
    assert leftovers(tmp_path) == []


def test_cli(tmp_path, capsys):
    assert main(["data", "synthetic", "--dest", str(tmp_path / "s"),
                 "--train-per-class", "2", "--test-per-class", "1"]) == 0
    assert data.is_complete(tmp_path / "s")
    assert main(["data", "synthetic", "--dest", str(tmp_path / "s")]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["data", "cifar10", "--dest", str(tmp_path / "c"),
                 "--archive", str(tmp_path / "nope.tar.gz")]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and not (tmp_path / "c").exists()
    assert main(["data", "cifar10", "--dest", str(tmp_path / "c"), "--md5", "xyz"]) == 2
    assert "32 hex digits" in capsys.readouterr().err
    assert issubclass(data.DataError, ClusterError)
