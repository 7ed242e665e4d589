"""`python -m orchestrator data cifar10|synthetic --dest DIR`: put a dataset where the job reads it.

Both write `DIR/cifar-10-batches-py/` (data_batch_1..5, test_batch, batches.meta), the
layout of the official CIFAR-10 python archive, which train/train.py reads with
`--data-dir DIR`. Point DIR at the shared storage (default job path:
/mnt/cluster/data/cifar10). Nothing is left behind when a step fails: files are
built in a hidden temporary directory next to the target and renamed into place.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import random
import shutil
import struct
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from operator import getitem
from pathlib import Path

from ..errors import ClusterError

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
SUBDIR = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
REQUIRED = (*TRAIN_FILES, TEST_FILE, META_FILE)
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck")
IMAGE_BYTES = 3 * 32 * 32


class DataError(ClusterError):
    """A dataset could not be fetched, verified or written."""


# --- the CIFAR python-batch format, written without numpy ------------------------------
#
# The official batches were pickled by Python 2 with numpy: a dict of byte-string keys
# whose b'data' is an ndarray (rebuilt through numpy.core.multiarray._reconstruct plus
# a BUILD with the raw bytes). The emitter below writes the same opcodes, so
# pickle.load(f, encoding='bytes') with numpy, torchvision's reader and
# train/data.py all read the result.

class _PickleWriter:
    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")  # PROTO 2

    def int_(self, v: int) -> None:
        if 0 <= v < 256:
            self.out += b"K" + bytes([v])
        elif 0 <= v < 65536:
            self.out += b"M" + struct.pack("<H", v)
        else:
            self.out += b"J" + struct.pack("<i", v)

    def str_(self, v: bytes) -> None:  # a Python 2 str
        if len(v) < 256:
            self.out += b"U" + bytes([len(v)]) + v
        else:
            self.out += b"T" + struct.pack("<I", len(v)) + v

    def uint8_array(self, rows: int, cols: int, raw: bytes) -> None:
        o = self.out
        o += b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n"
        self.int_(0)
        o += b"\x85"                                  # TUPLE1: shape (0,)
        self.str_(b"b")
        o += b"\x87R("                                # TUPLE3, REDUCE, MARK (state)
        self.int_(1)
        self.int_(rows)
        self.int_(cols)
        o += b"\x86"                                  # TUPLE2: shape
        o += b"cnumpy\ndtype\n"
        self.str_(b"u1")
        self.int_(0)
        self.int_(1)
        o += b"\x87R("                                # dtype('u1', 0, 1), its state:
        self.int_(3)
        self.str_(b"|")
        o += b"NNN" + b"J" + struct.pack("<i", -1) + b"J" + struct.pack("<i", -1)
        self.int_(0)
        o += b"tb"                                    # TUPLE, BUILD (dtype)
        o += b"\x89"                                  # NEWFALSE: not Fortran order
        self.str_(raw)
        o += b"tb"                                    # TUPLE, BUILD (array)

    def list_(self, items: list[int] | list[bytes]) -> None:
        self.out += b"]("
        for item in items:
            self.int_(item) if isinstance(item, int) else self.str_(item)
        self.out += b"e"

    def dict_start(self) -> None:
        self.out += b"}("

    def dict_end(self) -> bytes:
        self.out += b"u."
        return bytes(self.out)


def encode_batch(label: str, images: bytes, labels: list[int], filenames: list[str]) -> bytes:
    """A data_batch/test_batch file: images are N x 3072 bytes, channel-major per image."""
    if len(images) != len(labels) * IMAGE_BYTES or len(filenames) != len(labels):
        raise ValueError("images, labels and filenames disagree in length")
    w = _PickleWriter()
    w.dict_start()
    w.str_(b"batch_label")
    w.str_(label.encode())
    w.str_(b"labels")
    w.list_(labels)
    w.str_(b"data")
    w.uint8_array(len(labels), IMAGE_BYTES, images)
    w.str_(b"filenames")
    w.list_([f.encode() for f in filenames])
    return w.dict_end()


def encode_meta(label_names: list[str], per_batch: int) -> bytes:
    w = _PickleWriter()
    w.dict_start()
    w.str_(b"num_cases_per_batch")
    w.int_(per_batch)
    w.str_(b"label_names")
    w.list_([n.encode() for n in label_names])
    w.str_(b"num_vis")
    w.int_(IMAGE_BYTES)
    return w.dict_end()


# --- synthetic, learnable data -----------------------------------------------------------

@dataclass(frozen=True)
class SyntheticSpec:
    train_per_class: int = 100
    test_per_class: int = 20
    classes: int = 10
    noise: int = 64   # +- this much uniform noise on each pixel value
    seed: int = 0

    def check(self) -> None:
        if not 2 <= self.classes <= 100:
            raise DataError(f"--classes {self.classes}: use 2 to 100 classes")
        if self.train_per_class < 1 or self.test_per_class < 1:
            raise DataError("--train-per-class and --test-per-class must be >= 1")
        if not 0 <= self.noise <= 127:
            raise DataError(f"--noise {self.noise}: use 0 to 127")


def _noise_tables(noise: int) -> list[bytes]:
    """table[v][n]: pixel value v plus noise byte n mapped to [-noise, +noise], clipped."""
    span = 2 * noise
    return [bytes(min(255, max(0, v - noise + (n * span + 127) // 255)) for n in range(256))
            for v in range(256)]


def _class_template(rng: random.Random) -> list[int]:
    """A 4 x 4 grid of random colours per class, each cell 8 x 8 pixels, channel-major."""
    cells = [[rng.randrange(40, 216) for _ in range(16)] for _ in range(3)]
    return [cells[c][(y // 8) * 4 + x // 8] for c in range(3) for y in range(32) for x in range(32)]


def synthetic_batches(spec: SyntheticSpec) -> dict[str, bytes]:
    """File name -> content of a small dataset whose classes a CNN learns in a few epochs."""
    spec.check()
    rng = random.Random(spec.seed)
    tables = _noise_tables(spec.noise)
    templates = [[tables[v] for v in _class_template(rng)] for _ in range(spec.classes)]

    def split(per_class: int) -> tuple[list[int], list[bytes]]:
        labels = [c for c in range(spec.classes) for _ in range(per_class)]
        rng.shuffle(labels)
        return labels, [bytes(map(getitem, templates[c], rng.randbytes(IMAGE_BYTES)))
                        for c in labels]

    names = [CIFAR10_CLASSES[i] if spec.classes == 10 else f"class{i}"
             for i in range(spec.classes)]
    files: dict[str, bytes] = {}
    labels, images = split(spec.train_per_class)
    n = len(labels)
    bounds = [n * i // len(TRAIN_FILES) for i in range(len(TRAIN_FILES) + 1)]
    for i, name in enumerate(TRAIN_FILES):
        lo, hi = bounds[i], bounds[i + 1]
        files[name] = encode_batch(f"training batch {i + 1} of 5", b"".join(images[lo:hi]),
                                   labels[lo:hi], [f"synthetic_{j}.png" for j in range(lo, hi)])
    labels, images = split(spec.test_per_class)
    files[TEST_FILE] = encode_batch("testing batch 1 of 1", b"".join(images), labels,
                                    [f"synthetic_test_{j}.png" for j in range(len(labels))])
    files[META_FILE] = encode_meta(names, bounds[1] - bounds[0])
    return files


# --- placing a dataset -------------------------------------------------------------------

def is_complete(dest: Path) -> bool:
    return all((dest / SUBDIR / n).is_file() for n in REQUIRED)


class _Staging:
    """A hidden work directory next to the target; removed (with any directories this
    command created) unless `commit` moved the result into place."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.created: list[Path] = []
        p = dest
        while not p.exists():
            self.created.append(p)
            p = p.parent
        try:
            dest.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DataError(f"cannot create {dest}: {exc.strerror}; choose a --dest "
                            "you can write to") from exc
        self.work = dest / f".staging-{os.getpid()}"
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir()
        self.done = False

    def commit(self, built: Path, force: bool) -> Path:
        target = self.dest / SUBDIR
        if target.exists():
            if not force:
                raise DataError(f"{target} exists but is incomplete; remove it or pass --force")
            shutil.rmtree(target)
        os.replace(built, target)
        self.done = True
        return target

    def __enter__(self) -> _Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        if not self.done:
            for p in self.created:  # innermost first
                try:
                    p.rmdir()
                except OSError:
                    break


def md5_of(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_url(url: str) -> None:
    """DataError unless URL is an http(s) or ftp address with a host."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https", "ftp") or not parts.netloc:
        raise DataError(f"--url {url!r} is not a download address: give it with its scheme "
                        f"and host, e.g. https://{url.split('://')[-1].lstrip('/')} (or pass "
                        "the archive with --archive FILE)")


def download(url: str, to: Path, log=print, timeout: float = 60.0) -> None:
    check_url(url)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(to, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0)
            done, next_report = 0, 0.0
            while chunk := resp.read(1 << 20):
                out.write(chunk)
                done += len(chunk)
                if total and done / total >= next_report:
                    log(f"  {done / 1e6:.0f} / {total / 1e6:.0f} MB")
                    next_report += 0.25
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DataError(f"download of {url} failed ({reason}). Without internet access, "
                        "fetch the archive elsewhere and pass it with --archive FILE") from exc
    except http.client.HTTPException as exc:  # the server there does not speak HTTP
        said = f": {exc.args[0]!r}" if exc.args and exc.args[0] else ""
        raise DataError(f"download of {url} failed: what answers there is not an HTTP server "
                        f"({type(exc).__name__}{said}); check the host and port of --url") from exc


def unpack(archive: Path, into: Path) -> Path:
    """Extract the archive's cifar-10-batches-py/ into `into`; refuses anything else."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            stray = [m.name for m in members
                     if not (m.name == SUBDIR or m.name.startswith(SUBDIR + "/"))]
            if stray:
                raise DataError(f"{archive} holds files outside {SUBDIR}/ (e.g. {stray[0]}); "
                                "it is not the CIFAR-10 python archive")
            tar.extractall(into, members=members, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise DataError(f"{archive} cannot be unpacked ({exc}); download it again") from exc
    built = into / SUBDIR
    missing = [n for n in REQUIRED if not (built / n).is_file()]
    if missing:
        raise DataError(f"{archive} lacks {', '.join(missing)}; it is not the CIFAR-10 "
                        "python archive")
    return built


def fetch_cifar10(dest: Path, archive: Path | None = None, url: str = CIFAR10_URL,
                  md5: str = CIFAR10_MD5, force: bool = False, log=print) -> Path:
    """Download (or take `archive`), verify its MD5, unpack into DEST/cifar-10-batches-py."""
    dest = Path(dest)
    if archive is not None and not Path(archive).is_file():
        raise DataError(f"--archive {archive}: no such file")
    if archive is None:
        check_url(url)
    if is_complete(dest) and not force:
        log(f"{dest / SUBDIR} is already complete; nothing to do (--force replaces it)")
        return dest / SUBDIR
    if (dest / SUBDIR).exists() and not force:
        raise DataError(f"{dest / SUBDIR} exists but is incomplete; remove it or pass --force")
    with _Staging(dest) as stage:
        source = str(archive)
        if archive is None:
            archive, source = stage.work / "cifar-10-python.tar.gz", url
            log(f"downloading {url}")
            download(url, archive, log=log)
        actual = md5_of(Path(archive))
        if actual != md5.lower():
            raise DataError(f"checksum mismatch for {source}: md5 {actual}, expected {md5}. "
                            "The file is damaged or not the CIFAR-10 python archive; fetch "
                            "it again (or pass --md5 with the digest a trusted mirror "
                            "publishes)")
        log(f"md5 {actual} ok; unpacking")
        built = unpack(Path(archive), stage.work / "unpacked")
        target = stage.commit(built, force=force)
    log(f"CIFAR-10 is in {target}; train with --data-dir {dest}")
    return target


def write_synthetic(dest: Path, spec: SyntheticSpec, force: bool = False, log=print) -> Path:
    spec.check()
    dest = Path(dest)
    if (dest / SUBDIR).exists() and not force:
        raise DataError(f"{dest / SUBDIR} already exists; pass --force to replace it")
    with _Staging(dest) as stage:
        built = stage.work / SUBDIR
        built.mkdir()
        for name, content in synthetic_batches(spec).items():
            (built / name).write_bytes(content)
        target = stage.commit(built, force=force)
    log(f"synthetic dataset ({spec.classes} classes, {spec.train_per_class} train and "
        f"{spec.test_per_class} test images per class) in {target}; "
        f"train with --data-dir {dest}")
    return target


# --- command line ------------------------------------------------------------------------


