"""A step's image embeddings: which rows go where, and each image encoded once.

The model here is a stand-in whose "encoder" tags each row with its image and index,
so the test sees which rows land where; the real encoder is tested against
transformers in tests/engine/test_vision_exactness.py.
"""

from __future__ import annotations

import torch
from hetero_infer.engine.params.image_input import ImageInput
from hetero_infer.engine.worker import image_embeddings
from hetero_infer.engine.worker.image_embeddings import ImageEmbeddings, place_images


class TaggingModel:
    """encode_images: one row per tile, the tile's value as it is (the images below
    tag each of their tiles: 10 x the image's tag + the row's index); counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def encode_images(self, pixel_values: list[torch.Tensor]) -> torch.Tensor:
        self.calls += 1
        return torch.cat(pixel_values)


def image(tag: int, positions: tuple[int, ...]) -> ImageInput:
    tiles = torch.tensor([[10.0 * tag + i] for i in range(len(positions))])
    return ImageInput(tag, tiles, positions)


def test_a_chunk_takes_the_rows_of_its_positions() -> None:
    img = image(5, (5, 6, 8, 9))  # a token between its placeholders (a row marker)
    (placement,) = place_images((img,), start=6, end=9, first_row=3)
    assert placement.image_rows.tolist() == [1, 2]  # positions 6 and 8
    assert placement.step_rows.tolist() == [3, 5]
    assert place_images((img,), start=0, end=5, first_row=0) == []


def test_each_image_is_encoded_once_and_its_rows_land_in_place() -> None:
    model = TaggingModel()
    embeddings = ImageEmbeddings(model, torch.device("cpu"))
    a, b = image(1, (0, 1, 2)), image(2, (3, 4))
    rows, values = embeddings(
        place_images((a, b), start=1, end=4, first_row=10)  # a's last two, b's first
    )
    assert model.calls == 1  # both images in one call
    assert rows.tolist() == [10, 11, 12]
    assert values.flatten().tolist() == [11.0, 12.0, 20.0]
    rows, values = embeddings(place_images((b,), start=4, end=5, first_row=0))
    assert model.calls == 1 and values.flatten().tolist() == [21.0]


def test_the_least_recently_used_images_leave_first(monkeypatch) -> None:
    model = TaggingModel()
    embeddings = ImageEmbeddings(model, torch.device("cpu"))
    row_bytes = 4  # one fp32 value a row
    monkeypatch.setattr(image_embeddings, "ENCODER_CACHE_BYTES", 5 * row_bytes)
    a, b, c = (image(tag, (0, 1)) for tag in (1, 2, 3))
    for img in (a, b, a, c):  # a used again after b: b is the oldest when c comes
        embeddings(place_images((img,), 0, 2, 0))
    assert list(embeddings.cache) == [1, 3] and model.calls == 3
    assert embeddings.cached_bytes == 4 * row_bytes
