"""The shapes task: drawn offline and deterministically, stored encoded, decoded and augmented per
sample, cached on disk for other processes, and learnable by its ResNet-9."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from autotune.search.space import DEFAULT_BASELINE, complete
from autotune.train.config import Limits, TrialConfig
from autotune.train.loader import make_loader
from autotune.train.tasks import BUILT_IN, Task, load_task, shapes
from autotune.train.trial import run

N_TRAIN, N_VAL = 200, 100  # enough for every class many times over, drawn in a fraction of a second
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh cache folder and a fresh per-process cache: no test reads the user's cache or another
    test's."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("AUTOTUNE_CACHE", str(folder))
    shapes.datasets.cache_clear()
    yield folder
    shapes.datasets.cache_clear()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Task:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUTOTUNE_CACHE", str(tmp_path_factory.mktemp("cache")))
        return load_task("autotune.train.tasks.shapes:small")


def drawn(seed: int = 0) -> list[np.ndarray]:
    """Everything the data is made of: the PNG bytes, offsets, labels, decoded validation images."""
    train, val = shapes.datasets(N_TRAIN, N_VAL, seed)
    return [
        train.images.data,
        train.images.offsets,
        train.images.labels,
        val.images.numpy(),
        val.labels.numpy(),
    ]


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def config(**overrides: object) -> TrialConfig:
    return TrialConfig.from_mapping(complete({**DEFAULT_BASELINE, **overrides}))


def test_the_same_call_draws_byte_identical_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = drawn()
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "elsewhere"))  # drawn again, not read back
    shapes.datasets.cache_clear()
    assert same(first, drawn())
    assert not same(first, drawn(seed=1))


def test_the_images_are_the_same_whatever_the_number_of_cores_drawing_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn = {}
    for cores in (1, 3):  # 2,500 images: three blocks, drawn here, then by three processes
        monkeypatch.setattr(shapes, "cpu_count", lambda cores=cores: cores)
        drawn[cores] = shapes._generate(2500, 0)
    (serial, serial_moments), (parallel, parallel_moments) = drawn[1], drawn[3]
    for field in ("data", "offsets", "labels"):
        assert np.array_equal(getattr(serial, field), getattr(parallel, field)), field
    assert np.array_equal(serial_moments, parallel_moments)
    assert len(serial.labels) == 2500 and serial.offsets[-1] == len(serial.data)


def test_images_are_stored_as_png_and_every_class_is_in_both_splits_in_equal_numbers() -> None:
    train, val = shapes.datasets(N_TRAIN, N_VAL)
    data, offsets = train.images.data, train.images.offsets
    assert len(offsets) == N_TRAIN + 1 and all(
        data[a : a + 8].tobytes() == PNG_SIGNATURE for a in offsets[:-1]
    )
    assert train.images.image(0).shape == (32, 32, 3) and val.images.shape == (N_VAL, 3, 32, 32)
    for labels, n in ((train.labels, N_TRAIN), (val.labels, N_VAL)):
        assert torch.bincount(labels, minlength=10).tolist() == [n // 10] * 10
    assert len(shapes.CLASSES) == 10 and train.labels[:10].tolist() != list(range(10))  # shuffled


def test_a_training_sample_is_a_normalised_reflect_padded_crop_maybe_flipped() -> None:
    train, _ = shapes.datasets(N_TRAIN, N_VAL)
    image, label = train[3]
    assert image.dtype == torch.float32 and image.shape == (3, 32, 32) and label.dtype == torch.long
    padded = np.pad(train.images.image(3), ((4, 4), (4, 4), (0, 0)), mode="reflect")
    crops = {
        (dy, dx, flip): padded[dy : dy + 32, dx : dx + 32][:, :: (-1 if flip else 1)]
        for dy in range(9)
        for dx in range(9)
        for flip in (0, 1)
    }
    seen = set()
    for _ in range(100):
        pixels = (train[3][0] * train.std + train.mean).round().byte().permute(1, 2, 0).numpy()
        seen |= {key for key, crop in crops.items() if np.array_equal(crop, pixels)}
    assert {flip for _, _, flip in seen} == {0, 1} and len({(dy, dx) for dy, dx, _ in seen}) > 20
    samples = torch.stack([train[i][0] for i in range(N_TRAIN)])
    assert (
        samples.mean(dim=(0, 2, 3)).abs().max() < 0.2
        and (samples.std(dim=(0, 2, 3)) - 1).abs().max() < 0.2
    )


def test_training_reads_differ_unless_seeded_and_validation_reads_repeat() -> None:
    train, val = shapes.datasets(N_TRAIN, N_VAL)
    assert not torch.equal(train[0][0], train[0][0])
    torch.manual_seed(7)
    first = train[0][0]
    torch.manual_seed(7)
    assert torch.equal(first, train[0][0])
    image, label = val[0]
    assert (
        image.dtype == torch.float32
        and image.shape == (3, 32, 32)
        and torch.equal(image, val[0][0])
    )
    assert label.dtype == torch.long


def test_the_disk_cache_is_written_once_and_read_by_a_later_build(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = drawn()
    # no temporary left
    assert [p.name for p in cache.iterdir()] == [
        f"shapes-v{shapes.VERSION}-{N_TRAIN}-{N_VAL}-seed0.npz"
    ]

    def no_drawing(*args: object) -> None:
        raise AssertionError("drew the images again instead of reading the cache")

    monkeypatch.setattr(shapes, "_generate", no_drawing)
    shapes.datasets.cache_clear()
    assert same(first, drawn())


def test_the_cache_keeps_the_validation_images_decoded_and_a_file_without_them_gains_them(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = drawn()
    (path,) = cache.iterdir()
    with np.load(path) as npz:
        assert npz["val_pixels"].shape == (N_VAL, shapes.SIDE, shapes.SIDE, 3)
        older = {k: npz[k] for k in npz.files if k != "val_pixels"}
    np.savez(path, **older)  # as the cache was written before it kept them
    monkeypatch.setattr(shapes, "_generate", lambda *args: pytest.fail("drew the images again"))
    shapes.datasets.cache_clear()
    assert same(first, drawn())  # decoded from the PNGs, the same pixels

    decoded = []
    monkeypatch.setattr(shapes.Encoded, "image", lambda self, i: decoded.append(i))
    shapes.datasets.cache_clear()
    drawn()  # the file now holds them: no image is decoded to build the task
    assert decoded == []


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_damaged_cache_file_is_drawn_again(cache: Path, damage: str) -> None:
    first = drawn()
    (path,) = cache.iterdir()
    content = path.read_bytes()
    path.write_bytes(
        {
            "garbage": b"not a zip file" * 100,
            "truncated": content[: len(content) // 2],
            "empty": b"",
        }[damage]
    )
    shapes.datasets.cache_clear()
    assert same(first, drawn())
    # and written again, whole
    assert shapes._read(path, {"train": N_TRAIN, "val": N_VAL}) is not None


def test_a_cache_folder_that_cannot_be_made_only_means_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a file").write_text("")
    # a folder inside a file: never
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "a file" / "cache"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(shapes.datasets(N_TRAIN, N_VAL)[0]) == N_TRAIN


def test_resnet9_takes_channels_last_and_bf16_and_its_width_is_a_parameter(small: Task) -> None:
    torch.manual_seed(0)
    model, inputs = shapes.ResNet9(width=4).eval(), torch.randn(5, 3, 32, 32)
    expected = model(inputs)
    assert expected.shape == (5, 10)
    model = model.to(memory_format=torch.channels_last)
    torch.testing.assert_close(
        model(inputs.to(memory_format=torch.channels_last)), expected, rtol=1e-4, atol=1e-4
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(inputs).shape == (5, 10)
    assert small.unused(["width"]) == [] and small.model(width=4).head.in_features == 32


def test_shapes_is_a_built_in_task() -> None:
    module, _, name = BUILT_IN["shapes"].partition(":")
    assert getattr(importlib.import_module(module), name) is shapes.task


def test_the_small_task_trains_to_its_target(small: Task) -> None:
    """Within 8 epochs (it takes about 6); the seconds are left unbounded, for a busy machine
    trains it in minutes."""
    result = run(
        small,
        config(lr=0.05),
        limits=Limits(target=shapes.SMALL_TARGET, max_epochs=8, max_seconds=3600, eval_every=0.5),
        device=CPU,
        seed=0,
    )
    assert result.reached and result.curve[0][2] < shapes.SMALL_TARGET


def test_loader_workers_yield_the_same_batches_as_the_main_process(small: Task) -> None:
    """Each sample's crop and flip follow from the run's seed alone: not from which process
    prepares it, nor from what else drew random numbers (the training's own draws, with no
    workers)."""

    def first_batches(workers: int, seed: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
        batches = iter(
            make_loader(
                small.train, config(num_workers=workers, prefetch_factor=2), seed=seed, device=CPU
            )
        )
        # the workers shut down as the loader goes out of scope
        return [next(batches) for _ in range(3)]

    torch.manual_seed(0)
    in_workers, again = first_batches(2), first_batches(2)
    in_main = first_batches(0)
    torch.manual_seed(1)  # another global state: the main process's draws would follow it
    in_main_again = first_batches(0)
    for (x, y), (x_again, y_again), (x_main, y_main), (x_main_again, _) in zip(
        in_workers, again, in_main, in_main_again
    ):
        assert (
            x.shape == x_main.shape == (32, 3, 32, 32)
            and x.dtype == torch.float32
            and y.shape == (32,)
        )
        assert torch.equal(x, x_again) and torch.equal(y, y_again)
        # the same samples, the same augmentation
        assert torch.equal(y, y_main) and torch.equal(x, x_main)
        assert torch.equal(x_main, x_main_again)
    other_seed = first_batches(0, seed=4)
    assert not torch.equal(other_seed[0][0], in_main[0][0])


def test_the_shipped_gpu_study_loads_and_fits_a_cpu(small: Task) -> None:
    """studies/shapes.yaml is valid and its space prepares on this machine (the small task standing
    in for the full one): the knobs a CPU cannot run are fixed, with notices, and nothing else."""
    from autotune.search.space import Choices
    from autotune.spec.study_file import load
    from autotune.study import preparation

    spec = load(Path(__file__).resolve().parents[2] / "studies" / "shapes.yaml")
    assert spec.task == "shapes" and spec.target.metric == "accuracy" and spec.confirm.runs == 5
    assert spec.confirm.baseline == "until_resolved"  # its runs are the longest
    prepared = preparation.prepare(spec, task=small)
    assert prepared.space["batch_size"] == Choices((32, 64, 128, 256, 512))
    assert prepared.space["num_workers"] == Choices((0, 2, 4, 8))
    if not torch.cuda.is_available():
        for knob in ("compile", "cudnn_benchmark", "pin_memory"):
            assert prepared.space[knob] == Choices((False,))
        # a ResNet has 2-D convolutions
        assert prepared.space["channels_last"] == Choices((False, True))
