"""Shapes: 32x32 colour images of ten drawn shapes on cluttered backgrounds, with a ResNet-9.

Shaped like GPU image training (CIFAR-10 with the DAWNBench/airbench ResNet-9) but offline: the
images are drawn with Pillow (shape_drawing.py), deterministically, and kept PNG-encoded; each
training sample is decoded, randomly cropped and flipped in `__getitem__`, so the loader costs
real CPU time (with data_on_device, each batch at once on the device: _device_train). Drawn once per
process, cached on disk (`AUTOTUNE_CACHE`, else `$XDG_CACHE_HOME/autotune` or
`~/.cache/autotune`); a cache file that cannot be read is drawn again.

Drawing the full size (60,000 images) takes 25 s on one core and 14 s on two, in blocks on every
core. The cache file (180 MB) holds the PNGs and the validation images decoded: building the task
from it takes 0.1 s, against 0.9-1.3 s when each process decoded them. Measured on 2 CPU cores: a
training `__getitem__` costs about 120 us (decoding most of it), a validation one about 8 us. A
ResNet-9 step trains ~80 samples/s at width 64 there, and ~1,700 at the small task's width 8.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

from autotune.train.measure import cpu_count
from autotune.train.tasks import Task
from autotune.train.tasks.resnet9 import ResNet9
from autotune.train.tasks.shape_drawing import CLASSES, SIDE, draw_image

VERSION = 2  # of the drawing; in the cache file's name, so a change never reads stale images
# images a process draws at a time: each block has its own generator, so any core count draws the
# same
BLOCK = 1000
PAD = 4  # random crops of 32x32 from the image reflect-padded by 4, as CIFAR training does
TRAIN_SIZE, VAL_SIZE = 50_000, 10_000  # CIFAR-10's sizes: epochs of seconds on one GPU
SMALL_TRAIN_SIZE, SMALL_VAL_SIZE = 3_000, 1_000  # trains in seconds on 2 CPU cores, for tests
SMALL_TARGET = 0.5  # accuracy small() reaches in ~5 epochs with the baseline's batch of 32 and SGD
SMALL_WIDTH = 8  # 1/64 of the full model's compute: ~1,000 samples/s on 2 CPU cores
SEED = 0  # the data is part of the task, not of a trial: fixed


@dataclasses.dataclass(frozen=True)
class Encoded:
    """PNG files in one byte array: cheap to fork into loader workers, where a list of 50,000
    bytes objects would be copied page by page as their reference counts change."""

    data: np.ndarray  # uint8: every image's PNG bytes, one after another
    offsets: np.ndarray  # int64: image i is data[offsets[i]:offsets[i + 1]]
    labels: np.ndarray  # int64 class indices

    def image(self, index: int) -> np.ndarray:
        """Image `index`, decoded to HWC uint8."""
        png = io.BytesIO(self.data[self.offsets[index] : self.offsets[index + 1]])
        with Image.open(png) as image:
            return np.asarray(image.convert("RGB"))


def _generate(n: int, seed: int) -> tuple[Encoded, np.ndarray]:
    """`n` images, the classes balanced and shuffled, and their per-channel pixel sums and sums of
    squares (for the normalisation constants). Drawn in blocks, each from its own generator, on
    every core: the same images whatever the number of cores."""
    labels = np.random.default_rng(seed).permutation(np.arange(n) % len(CLASSES))
    blocks = [(seed, start, labels[start : start + BLOCK]) for start in range(0, n, BLOCK)]
    # the cores this process may use, not all the machine has
    processes = min(len(blocks), cpu_count())
    if processes > 1:
        with concurrent.futures.ProcessPoolExecutor(processes) as pool:
            drawn = list(pool.map(_draw_block, blocks))
    else:
        drawn = [_draw_block(block) for block in blocks]
    sizes = np.concatenate([block_sizes for _, block_sizes, _ in drawn])
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    moments = np.sum([block_moments for _, _, block_moments in drawn], axis=0)
    return Encoded(
        np.concatenate([data for data, _, _ in drawn]), offsets, labels.astype(np.int64)
    ), moments


def _draw_block(block: tuple[int, int, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One block's images as PNG bytes end to end, each image's size, and their pixel moments."""
    seed, start, labels = block
    rng = np.random.default_rng([seed, start])
    blobs, moments = [], np.zeros((2, 3))
    for label in labels:
        pixels = draw_image(rng, int(label))
        flat = pixels.reshape(-1, 3).astype(np.float64)
        moments += (flat.sum(0), (flat**2).sum(0))
        # PNG, not JPEG: lossless, so the pixels are the ones drawn, and faster to decode (~40 us
        # against ~80). The noise keeps it at ~2.3 KB an image (raw: 3 KB; JPEG at quality 90:
        # ~1.1).
        buffer = io.BytesIO()
        # higher levels: slower, no smaller
        Image.fromarray(pixels).save(buffer, "PNG", compress_level=1)
        blobs.append(np.frombuffer(buffer.getvalue(), np.uint8))
    return np.concatenate(blobs), np.array([len(b) for b in blobs], np.int64), moments


def cache_dir() -> Path:
    """Where drawn data is kept for other processes and later runs."""
    if os.environ.get("AUTOTUNE_CACHE"):
        return Path(os.environ["AUTOTUNE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autotune"


def _read(path: Path, sizes: dict[str, int]) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None for a file that is missing, unreadable or not what was written.
    An .npz is a zip that checks each array's CRC: a damaged file fails here, not mid-trial."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
        for split, n in sizes.items():
            data, offsets, labels = (arrays[f"{split}_{k}"] for k in ("data", "offsets", "labels"))
            if (
                len(labels) != n
                or len(offsets) != n + 1
                or offsets[-1] != len(data)
                or np.any(np.diff(offsets) <= 0)
            ):
                return None
        pixels = arrays.get("val_pixels")
        if pixels is not None and pixels.shape != (sizes["val"], SIDE, SIDE, 3):
            return None
        return arrays if arrays["mean"].shape == arrays["std"].shape == (3,) else None
    except Exception:  # missing, unreadable, truncated, garbage: each means "draw it again"
        return None


def _write(path: Path, save: Callable[[Any], None]) -> None:
    """`save(file)` atomically: a concurrent reader sees the whole file or none. A folder that
    cannot be written only means no cache."""
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            dir=path.parent, prefix=path.name, suffix=".tmp", delete=False
        ) as file:
            temporary = Path(file.name)
            save(file)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            temporary.unlink(missing_ok=True)


def _arrays(n_train: int, n_val: int, seed: int) -> dict[str, np.ndarray]:
    """From the disk cache, or drawn (the training split seeded `seed`, validation `seed + 1`) and
    cached."""
    path = cache_dir() / f"shapes-v{VERSION}-{n_train}-{n_val}-seed{seed}.npz"
    arrays = _read(path, {"train": n_train, "val": n_val})
    if arrays is None:
        (train, (sums, squares)), (val, _) = _generate(n_train, seed), _generate(n_val, seed + 1)
        mean = sums / (n_train * SIDE * SIDE)
        arrays = {
            "mean": mean,
            "std": np.sqrt(squares / (n_train * SIDE * SIDE) - mean**2),
            **{
                f"{split}_{k}": v
                for split, data in (("train", train), ("val", val))
                for k, v in vars(data).items()
            },
        }
    if "val_pixels" not in arrays:  # drawn now, or cached before the file kept them
        # Validation has no augmentation: decoded once and kept decoded in the cache, where every
        # process that builds the task (each trial's child among them) spent ~1 s decoding it.
        val = Encoded(*(arrays[f"val_{k}"] for k in ("data", "offsets", "labels")))
        arrays["val_pixels"] = np.stack([val.image(i) for i in range(n_val)])
        # uncompressed: PNG bytes do not compress further
        _write(path, lambda file: np.savez(file, **arrays))
    return arrays


# The row (or column) indices into an image of each crop offset into its reflect-padded copy:
# a random crop is two `take`s, with no padded copy of each image made.
_REFLECTED = np.abs(np.arange(-PAD, SIDE + PAD))
WINDOWS = np.stack(
    [
        np.where(_REFLECTED > SIDE - 1, 2 * (SIDE - 1) - _REFLECTED, _REFLECTED)[o : o + SIDE]
        for o in range(2 * PAD + 1)
    ]
)


# The augmentations: a crop offset down, one across, and flipped or not; a keyed sample's is its
# key modulo their number, so the loader's workers and the device (_device_train) draw alike.
DRAWS = len(WINDOWS) ** 2 * 2


def _augmentation(draw: int | torch.Tensor) -> tuple[Any, Any, Any]:
    """A draw's (crop offset down, crop offset across, flip)."""
    across = len(WINDOWS) * 2  # // and %, not divmod: a draw may be a tensor of them
    return draw // across, draw % across // 2, draw % 2


class ShapesTrain(Dataset):
    """Decoded, randomly cropped and flipped per sample, drawn from the sample's key."""

    keyed = True  # the trial's loader gives (index, key)

    def __init__(self, images: Encoded, *, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.images, self.labels, self.mean, self.std = (
            images,
            torch.from_numpy(images.labels),
            mean,
            std,
        )

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, item: int | tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(item, tuple):
            index, draw = item[0], item[1] % DRAWS
        else:  # from another loader: torch's random numbers, as it seeds them per worker
            index, draw = item, int(torch.randint(0, DRAWS, ()))
        dy, dx, flip = _augmentation(draw)
        crop = (
            self.images.image(index)
            .take(WINDOWS[dy], axis=0)
            .take(WINDOWS[dx][::-1] if flip else WINDOWS[dx], axis=1)
        )
        return (
            torch.from_numpy(crop).permute(2, 0, 1).float() - self.mean
        ) / self.std, self.labels[index]


class ShapesVal(Dataset):
    """Decoded once (NCHW uint8): validation has no augmentation. Only normalised per sample."""

    def __init__(
        self, images: torch.Tensor, labels: torch.Tensor, *, mean: torch.Tensor, std: torch.Tensor
    ) -> None:
        self.images, self.labels, self.mean, self.std = images, labels, mean, std

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.images[index].float() - self.mean) / self.std, self.labels[index]


@functools.lru_cache(maxsize=4)
def datasets(n_train: int, n_val: int, seed: int = SEED) -> tuple[ShapesTrain, ShapesVal]:
    """Built once per process, as a study builds the task for every trial: they hold no state of a
    trial's."""
    a = _arrays(n_train, n_val, seed)
    val_images = torch.from_numpy(a["val_pixels"]).permute(0, 3, 1, 2).contiguous()
    # 0-255 levels
    norm = {k: torch.tensor(a[k], dtype=torch.float32).view(3, 1, 1) for k in ("mean", "std")}
    return (
        ShapesTrain(Encoded(a["train_data"], a["train_offsets"], a["train_labels"]), **norm),
        ShapesVal(val_images, torch.from_numpy(a["val_labels"]), **norm),
    )


@functools.lru_cache(maxsize=2)
def train_pixels(n_train: int, n_val: int, seed: int = SEED) -> np.ndarray:
    """The training images decoded (NHWC uint8), for the device's copy: decoded once and kept in
    a cache file beside the PNGs' (150 MB at the full size), mapped (copy on write), not read."""
    path = cache_dir() / f"shapes-v{VERSION}-{n_train}-{n_val}-seed{seed}-train-pixels.npy"
    with contextlib.suppress(Exception):  # missing, unreadable, truncated: decoded again
        pixels = np.load(path, mmap_mode="c", allow_pickle=False)
        if pixels.shape == (n_train, SIDE, SIDE, 3) and pixels.dtype == np.uint8:
            return pixels
    images = datasets(n_train, n_val, seed)[0].images
    pixels = np.stack([images.image(i) for i in range(n_train)])
    _write(path, lambda file: np.save(file, pixels))
    return pixels


def _device_train(n_train: int, n_val: int) -> Callable[[torch.device], Callable[..., Any]]:
    """Task.device_train: the decoded training images copied to the device, and each batch cropped
    and flipped there in one gather, each sample as ShapesTrain gives it for the same key."""
    train_pixels(n_train, n_val)  # decoded (the first time) as the task is built, off any clock

    def on(device: torch.device) -> Callable[..., Any]:
        train = datasets(n_train, n_val)[0]
        pixels = torch.from_numpy(train_pixels(n_train, n_val)).to(device)
        labels, windows = train.labels.to(device), torch.from_numpy(WINDOWS).to(device)
        mean, std = train.mean.to(device), train.std.to(device)

        def gather(indices: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            indices = indices.to(device, non_blocking=True)
            dy, dx, flip = _augmentation((keys % DRAWS).to(device, non_blocking=True))
            columns = torch.where(flip[:, None].bool(), windows[dx].flip(1), windows[dx])
            crops = pixels[indices[:, None, None], windows[dy][:, :, None], columns[:, None, :]]
            return ((crops.permute(0, 3, 1, 2).float() - mean) / std).contiguous(), labels[indices]

        return gather

    return on


def _task(n_train: int, n_val: int, model: Callable[..., nn.Module]) -> Task:
    train, val = datasets(n_train, n_val)
    return Task(model=model, train=train, val=val, device_train=_device_train(n_train, n_val))


def task() -> Task:
    """The full size, for GPUs."""
    return _task(TRAIN_SIZE, VAL_SIZE, ResNet9)


def small_model(width: int = SMALL_WIDTH) -> ResNet9:
    return ResNet9(width)


def small() -> Task:
    """The same task at a size that trains on 2 CPU cores in seconds."""
    return _task(SMALL_TRAIN_SIZE, SMALL_VAL_SIZE, small_model)
