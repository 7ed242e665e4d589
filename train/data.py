"""CIFAR-10 in its python-batch format, read without numpy and without running pickled code.

The batches (data_batch_1..5, test_batch, batches.meta in `cifar-10-batches-py/`) are
pickled dicts whose b'data' is a numpy uint8 array N x 3072 (1024 red, 1024 green,
1024 blue values per image, rows of 32) and whose b'labels' is a list of ints. A
restricted unpickler rebuilds the arrays from their raw bytes: only the few numpy
names an array pickle uses are accepted, so a tampered file cannot run code and
numpy need not be installed on the nodes.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
SUBDIR = "cifar-10-batches-py"
# Per-channel mean and std of the CIFAR-10 training set, on the 0..1 scale.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)

FETCH_HINT = ("Fetch it onto the shared storage with `python -m orchestrator data cifar10 "
              "--dest {dir}` (add --archive FILE on an air-gapped cluster), or write a small "
              "test set with `python -m orchestrator data synthetic --dest {dir}`; or point "
              "--data-dir at an existing copy.")


class DataMissingError(Exception):
    """The dataset is not where the job looks for it."""


class DataFormatError(Exception):
    """A file is there but is not a CIFAR python batch."""


# --- restricted unpickling of numpy arrays -------------------------------------------

_TORCH_DTYPES = {"u1": torch.uint8, "i1": torch.int8, "i2": torch.int16,
                 "i4": torch.int32, "i8": torch.int64, "f4": torch.float32,
                 "f8": torch.float64}


class _DType:
    """Stands in for numpy.dtype while unpickling: remembers the type code."""

    def __init__(self, code: Any, align: Any = False, copy: Any = True) -> None:
        self.code = code.decode() if isinstance(code, bytes) else str(code)
        self.byteorder = "|"

    def __setstate__(self, state: tuple) -> None:
        order = state[1]
        self.byteorder = order.decode() if isinstance(order, bytes) else str(order)

    def torch_dtype(self) -> torch.dtype:
        code = self.code.lstrip("<>|=")
        if self.byteorder == ">" or self.code.startswith(">"):
            raise DataFormatError("big-endian arrays are not supported")
        if code not in _TORCH_DTYPES:
            raise DataFormatError(f"unsupported array type {self.code!r}")
        return _TORCH_DTYPES[code]


class _Array:
    """Stands in for numpy.ndarray while unpickling; `.tensor()` gives the torch tensor."""

    def __init__(self) -> None:
        self.shape: tuple[int, ...] = (0,)
        self.dtype: _DType | None = None
        self.fortran = False
        self.raw: bytes = b""

    def __setstate__(self, state: tuple) -> None:
        if len(state) == 5:
            _version, shape, dtype, fortran, raw = state
        else:
            shape, dtype, fortran, raw = state
        self.shape, self.dtype, self.fortran = tuple(shape), dtype, bool(fortran)
        self.raw = raw.encode("latin1") if isinstance(raw, str) else bytes(raw)

    def tensor(self) -> torch.Tensor:
        if not isinstance(self.dtype, _DType):
            raise DataFormatError("array without a dtype")
        dtype = self.dtype.torch_dtype()
        flat = torch.frombuffer(bytearray(self.raw), dtype=dtype)
        if self.fortran:
            return flat.reshape(tuple(reversed(self.shape))).permute(
                *reversed(range(len(self.shape)))).contiguous()
        return flat.reshape(self.shape)


def _reconstruct(cls: Any, shape: Any, typecode: Any) -> _Array:
    return _Array()


def _frombuffer(buf: Any, dtype: _DType, shape: tuple, order: Any) -> _Array:
    arr = _Array()
    arr.__setstate__((1, shape, dtype, order == "F", bytes(buf)))
    return arr


def _codecs_encode(text: str, encoding: str = "utf-8") -> bytes:
    """How protocol-2 pickles made by Python 3 spell bytes; only text codecs allowed."""
    if encoding.lower().replace("-", "") not in ("latin1", "utf8", "ascii"):
        raise DataFormatError(f"refusing codec {encoding!r} in a data file")
    return text.encode(encoding)


_ALLOWED = {
    ("_codecs", "encode"): _codecs_encode,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("numpy", "ndarray"): _Array,
    ("numpy", "dtype"): _DType,
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise DataFormatError(f"refusing to load {module}.{name} from a data file "
                                  "(only numpy arrays, lists, numbers and strings "
                                  "are allowed)") from None


def load_batch(path: Path) -> dict[bytes, Any]:
    """Unpickle one CIFAR batch file; keys come back as bytes, as with encoding='bytes'."""
    try:
        with open(path, "rb") as f:
            obj = _Unpickler(io.BufferedReader(f), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise DataFormatError(f"{path} is not a readable CIFAR python batch: {exc}") from exc
    if not isinstance(obj, dict):
        raise DataFormatError(f"{path}: expected a pickled dict, found {type(obj).__name__}")
    return {(k.encode() if isinstance(k, str) else k): v for k, v in obj.items()}


def _as_tensor(value: Any, what: str, path: Path) -> torch.Tensor:
    if isinstance(value, _Array):
        return value.tensor()
    if isinstance(value, (list, tuple)):
        return torch.tensor(value)
    if isinstance(value, (bytes, bytearray)):
        return torch.frombuffer(bytearray(value), dtype=torch.uint8)
    raise DataFormatError(f"{path}: {what} has unexpected type {type(value).__name__}")


def read_images_labels(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 N x 3 x 32 x 32, int64 N) from one batch file."""
    d = load_batch(path)
    if b"data" not in d or (b"labels" not in d and b"fine_labels" not in d):
        raise DataFormatError(f"{path}: missing b'data' or b'labels'")
    x = _as_tensor(d[b"data"], "b'data'", path)
    y = _as_tensor(d.get(b"labels", d.get(b"fine_labels")), "b'labels'", path).to(torch.int64)
    if x.dtype != torch.uint8 or x.numel() % 3072 != 0:
        raise DataFormatError(f"{path}: b'data' must be uint8 N x 3072, got "
                              f"{x.dtype} with {x.numel()} values")
    x = x.reshape(-1, 3, 32, 32)
    if x.shape[0] != y.shape[0]:
        raise DataFormatError(f"{path}: {x.shape[0]} images but {y.shape[0]} labels")
    return x, y


# --- the dataset ----------------------------------------------------------------------

@dataclass
class Cifar:
    train_x: torch.Tensor  # uint8 N x 3 x 32 x 32
    train_y: torch.Tensor  # int64 N
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: list[str]
    root: Path


def find_root(data_dir: Path) -> Path:
    """The directory holding the batch files: DATA_DIR/cifar-10-batches-py or DATA_DIR itself.

    Raises DataMissingError naming the data command when the files are not there.
    """
    data_dir = Path(data_dir)
    needed = (*TRAIN_FILES, TEST_FILE)
    for candidate in (data_dir / SUBDIR, data_dir):
        if all((candidate / n).is_file() for n in needed):
            return candidate
    probe = data_dir / SUBDIR if (data_dir / SUBDIR).is_dir() else data_dir
    if not probe.is_dir():
        problem = f"the dataset directory {data_dir} does not exist"
    else:
        missing = [n for n in needed if not (probe / n).is_file()]
        problem = f"CIFAR-10 batch files missing in {probe}: {', '.join(missing)}"
    raise DataMissingError(f"{problem}. " + FETCH_HINT.format(dir=data_dir))


def load_cifar(data_dir: Path) -> Cifar:
    root = find_root(data_dir)
    xs, ys = zip(*(read_images_labels(root / n) for n in TRAIN_FILES), strict=True)
    test_x, test_y = read_images_labels(root / TEST_FILE)
    classes = [str(i) for i in range(int(max(int(torch.cat(ys).max()), int(test_y.max()))) + 1)]
    if (root / META_FILE).is_file():
        names = load_batch(root / META_FILE).get(b"label_names")
        if isinstance(names, list) and len(names) >= len(classes):
            classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    return Cifar(torch.cat(xs), torch.cat(ys), test_x, test_y, classes, root)


# --- batches on the device -------------------------------------------------------------

def normalize(x_uint8: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 N x 3 x 32 x 32 (CPU) -> normalized float32 on `device`."""
    x = x_uint8.to(device, non_blocking=True).float().div_(255.0)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    return (x - mean) / std


def augment(x: torch.Tensor, gen: torch.Generator, pad: int = 4) -> torch.Tensor:
    """Random crop after zero padding by `pad`, and random horizontal flip, per image.

    The random numbers come from `gen` (a CPU generator) so runs are reproducible
    and resumable regardless of device.
    """
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    oy = torch.randint(0, 2 * pad + 1, (n,), generator=gen).to(x.device)
    ox = torch.randint(0, 2 * pad + 1, (n,), generator=gen).to(x.device)
    flip = (torch.rand(n, generator=gen) < 0.5).to(x.device)
    rows = oy[:, None] + torch.arange(h, device=x.device)[None, :]  # n x h
    cols = ox[:, None] + torch.arange(w, device=x.device)[None, :]  # n x w
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    batch = torch.arange(n, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # n h w c
    return out.permute(0, 3, 1, 2).contiguous()


def batches(indices: list[int], batch_size: int) -> Iterator[torch.Tensor]:
    """Consecutive index batches (the last one may be short)."""
    idx = torch.tensor(indices, dtype=torch.int64)
    for start in range(0, len(idx), batch_size):
        yield idx[start:start + batch_size]


def eval_shard(n: int, rank: int, world_size: int) -> list[int]:
    """A disjoint, exhaustive shard of range(n): no padding, so summed counts are exact."""
    return list(range(rank, n, world_size))
