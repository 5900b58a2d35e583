"""Data sets, train/test splits and forget/retain selection."""

from ttp_lightning.core.dataset_info import DatasetInfo
from ttp_lightning.data.datamodule import TTPDataModule, build_datamodule
from ttp_lightning.data.sources import Source

__all__ = ["DatasetInfo", "Source", "TTPDataModule", "build_datamodule"]
