"""Data sets, train/test splits and forget/retain selection."""

from ttp_lightning.data.datamodule import TTPDataModule, build_datamodule
from ttp_lightning.data.sources import DATA_SOURCES
from ttp_lightning.dataset_info import DatasetInfo

__all__ = ["DATA_SOURCES", "DatasetInfo", "TTPDataModule", "build_datamodule"]
