"""Drawing one image of the shapes task (shapes.py): one of ten shapes at a random size, place,
angle and colour, among clutter, antialiased and noisy, as a 32x32 HWC uint8 array.

A change here changes the task's images: shapes.VERSION, in the cache file's name, goes up with it.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

SIDE = 32  # pixels, as CIFAR-10
SUPERSAMPLE = 4  # drawn at 128x128 and box-filtered down: antialiased edges, as a camera gives
NOISE = 8.0  # std of the Gaussian pixel noise, in 0-255 levels
# Smallest |luminance of the shape - luminance of the background|, in 0-255 levels (Rec. 601
# weights): any two colours, but the shape never fades into the background, even in grey.
MIN_CONTRAST = 80
# of the side: the smallest are 8 pixels across, hard to tell apart
MIN_RADIUS, MAX_RADIUS = 0.12, 0.4
LUMINANCE = np.array([0.299, 0.587, 0.114])


def _polygon(n: int, *, phase: float = 0.0) -> list[tuple[float, float]]:
    """A regular n-gon of radius 1 around the origin, a corner at the top unless turned by
    `phase`."""
    return [
        (math.sin(phase + 2 * math.pi * k / n), -math.cos(phase + 2 * math.pi * k / n))
        for k in range(n)
    ]


_ROUND = _polygon(48)
_ARM = 0.33  # half the width of a plus's arms
# (outline of radius about 1 around the origin, hollow). Every shape is mirror-symmetric, so a
# horizontal flip gives the same shape at another rotation: the augmentation keeps the class.
SHAPES: dict[str, tuple[list[tuple[float, float]], bool]] = {
    "circle": (_ROUND, False),
    "ring": (_ROUND, True),
    "square": (_polygon(4, phase=math.pi / 4), False),
    "frame": (_polygon(4, phase=math.pi / 4), True),
    "triangle": ([(1.2 * x, 1.2 * y + 0.25) for x, y in _polygon(3)], False),  # centred on its area
    "star": ([(r * x, r * y) for (x, y), r in zip(_polygon(10), [1.0, 0.45] * 5)], False),
    "plus": (
        [
            (a * x - b * y, b * x + a * y)
            for a, b in ((1, 0), (0, 1), (-1, 0), (0, -1))  # 4 turns of an arm
            for x, y in ((-_ARM, -1), (_ARM, -1), (_ARM, -_ARM))
        ],
        False,
    ),
    "pentagon": (_polygon(5), False),
    "hexagon": (_polygon(6), False),
    "ellipse": ([(x, 0.5 * y) for x, y in _ROUND], False),
}
CLASSES = tuple(SHAPES)


def _colour(rng: np.random.Generator) -> tuple[int, int, int]:
    return tuple(int(c) for c in rng.integers(0, 256, 3))


def draw_image(rng: np.random.Generator, label: int) -> np.ndarray:
    """One image, HWC uint8: clutter, the shape at a random size, place and angle, more clutter,
    noise."""
    big = SIDE * SUPERSAMPLE
    background = _colour(rng)
    colour = _colour(rng)
    while abs(LUMINANCE @ np.subtract(colour, background)) < MIN_CONTRAST:
        colour = _colour(rng)
    image = Image.new("RGB", (big, big), background)
    draw = ImageDraw.Draw(image)
    outline, hollow = SHAPES[CLASSES[label]]
    radius = rng.uniform(MIN_RADIUS, MAX_RADIUS) * big
    angle = rng.uniform(0, 2 * math.pi)
    cx, cy = rng.uniform(0.7 * radius, big - 0.7 * radius, 2)  # up to 30% of it may leave the frame
    cos, sin = math.cos(angle) * radius, math.sin(angle) * radius
    xy = [(cx + cos * x - sin * y, cy + sin * x + cos * y) for x, y in outline]
    # lines and dots; with more, the small task learns too slowly for tests
    clutter = int(rng.integers(1, 4))
    for i in range(clutter):
        if i == clutter // 2:  # half of the clutter behind the shape, half over it
            if hollow:
                draw.polygon(xy, outline=colour, width=max(SUPERSAMPLE, round(0.3 * radius)))
            else:
                draw.polygon(xy, fill=colour)
        if rng.random() < 0.5:
            draw.line(
                [tuple(p) for p in rng.uniform(0, big, (2, 2))],
                fill=_colour(rng),
                width=int(rng.integers(SUPERSAMPLE // 2, 2 * SUPERSAMPLE)),
            )
        else:
            x, y, r = *rng.uniform(0, big, 2), rng.uniform(0.5, 1.5) * SUPERSAMPLE
            draw.ellipse([x - r, y - r, x + r, y + r], fill=_colour(rng))
    small = np.asarray(image.resize((SIDE, SIDE), Image.Resampling.BOX), dtype=np.float32)
    return np.clip(small + rng.normal(0, NOISE, small.shape), 0, 255).round().astype(np.uint8)
