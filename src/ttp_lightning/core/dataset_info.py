"""What a model needs to know about its data set (shape, classes, normalisation): shared by data/ and models/
so that neither imports the other for it."""

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a data set: shape, classes and normalisation statistics."""

    num_classes: int
    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    has_official_split: bool = True
    class_names: tuple[str, ...] = ()  # empty: the class indices 0..K-1 are the names

    def names(self) -> tuple[str, ...]:
        return self.class_names or tuple(str(i) for i in range(self.num_classes))
