"""One LightningDataModule for every registered data set: split, forget/retain selection, loaders."""

import logging
from collections.abc import Mapping
from dataclasses import fields, replace

import lightning as L
import torch
from lightning.pytorch.utilities.combined_loader import CombinedLoader

from ttp_lightning.config.build import build_class, instantiate
from ttp_lightning.config.schema import DataSchema, ForgetSchema, as_schema
from ttp_lightning.core.batching import ImageBatchDataset, batch_loader
from ttp_lightning.core.dataset_info import DatasetInfo
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.data.forget import fingerprint, select_forget, select_forget_requests, set_digest
from ttp_lightning.data.images import (
    NEAR_COPY,
    match_images,
    nearest_image,
    read_forget_images,
)
from ttp_lightning.data.sources import Source

log = logging.getLogger(__name__)


class TTPDataModule(L.LightningDataModule):
    """Training set D (= retain D_r + forget D_f) and test set, held in memory as uint8 tensors.

    With `forget.source=test` (or `mixed`) forget instances are drawn from the test set, leave it and are
    appended to the training set: part `pretrain` is D before them (what A(D) trains on), part `train` is D
    with them (what the released model has seen), and the test set is the rest.

    `split="official"` keeps the data set's own train/test partition; `split="paper"` pools all images
    and draws `train_fraction` of them for training (the paper's 70/30), by `split_seed`.
    `train_dataloader()` serves D for pretraining; `pareto_dataloader()` serves retain + forget pairs.
    Evaluation views never augment. `normalize=False` makes the model's input normalisation the identity
    (the authors' code feeds raw [0, 1] pixels on the MNIST family).
    """

    def __init__(self, name: str, loader: Source | None = None, root: str = "data", download: bool = False,
                 split: str = "official",
                 train_fraction: float = 0.7, split_seed: int = 0, forget: ForgetSchema | dict | None = None,
                 batch_size: int = 128, forget_batch_size: int = 10, eval_batch_size: int = 1024,
                 augment: str = "none", normalize: bool = True, max_train_size: int | None = None, max_test_size: int | None = None,
                 num_workers: int = 0, seed: int = 0, mean: list | None = None, std: list | None = None):
        super().__init__()
        if loader is None:
            raise TTPUserError(f"data set {name!r} names no loader; its conf/data/{name}.yaml needs `loader: "
                               "{_target_: <module>.<Source subclass>, ...}` (docs/extending.md)")
        if not isinstance(loader, Source):
            raise TTPUserError(f"data.loader of data set {name!r} is a {type(loader).__name__}, not a "
                               "ttp_lightning.data.sources.Source")
        self.name, self.loader, self.root, self.download = name, loader, root, download
        self.split, self.train_fraction, self.split_seed = split, train_fraction, split_seed
        # the one forget schema: the run's checked object, or a mapping checked here
        self.forget_cfg = forget if isinstance(forget, ForgetSchema) else as_schema(ForgetSchema, forget, "data.forget")
        self.batch_size, self.forget_batch_size, self.eval_batch_size = batch_size, forget_batch_size, eval_batch_size
        self.augment, self.normalize, self.num_workers, self.seed = augment, normalize, num_workers, seed
        self.max_train_size, self.max_test_size = max_train_size, max_test_size
        self.mean, self.std = mean, std  # the model's own input statistics (e.g. ImageNet's), when given
        self.forget_images: list[dict] = []  # data.forget.images: per image, its hash and where it is in D
        self.forget_test_indices: list[int] = []  # forget.source=test|mixed: the test-set indices taken
        self.info: DatasetInfo | None = None
        self._nearest_test: torch.Tensor | None = None
        self._train_files: tuple[str, ...] = ()  # each training image's file under data.root (image folders)

    # ----------------------------------------------------------------- set-up
    def setup(self, stage: str | None = None) -> None:
        if self.info is not None:
            return
        info, arrays = self.loader.load(self.name, self.root, self.download)
        prep = self.loader.preprocess(info)
        if self.split == "official" and not info.has_official_split:
            raise TTPUserError(f"data set {self.name!r} has no official test split; use data.split=paper")
        train_x, train_y, test_x, test_y = self._split(arrays)
        if self.max_train_size:
            train_x, train_y = train_x[: self.max_train_size], train_y[: self.max_train_size]
            self._train_files = self._train_files[: self.max_train_size]
        if self.max_test_size:
            test_x, test_y = test_x[: self.max_test_size], test_y[: self.max_test_size]
        self.pretrain_size = len(train_y)
        if self.forget_cfg.requests is not None:
            if self.forget_cfg.source != "train":
                raise TTPUserError(f"data.forget.requests needs data.forget.source=train, not "
                                   f"{self.forget_cfg.source!r}")
            self.forget_requests = select_forget_requests(len(train_y), list(self.forget_cfg.requests),
                                                          self.forget_cfg.seed)
            self.forget_indices = torch.cat(self.forget_requests).sort().values
        else:
            if self.forget_cfg.images:
                inside, (outside_x, outside_y), in_test = self._forget_images(prep, info, train_x, train_y, test_x)
            else:
                inside, in_test = self._select_forget(len(train_y), len(test_y))
                outside_x, outside_y = test_x[in_test], test_y[in_test]
            if len(outside_y):
                train_x, train_y = torch.cat([train_x, outside_x]), torch.cat([train_y, outside_y])
            if len(in_test):  # forget instances from the test set leave it
                stays = torch.ones(len(test_y), dtype=torch.bool)
                stays[in_test] = False
                test_x, test_y = test_x[stays], test_y[stays]
            self.forget_test_indices = [] if self.forget_cfg.images else sorted(int(i) for i in in_test)
            appended = torch.arange(self.pretrain_size, self.pretrain_size + len(outside_y))
            self.forget_indices = torch.cat([inside, appended])
            self.forget_requests = [self.forget_indices]
        self.train_images, self.train_labels = train_x, train_y
        self.test_images, self.test_labels = test_x, test_y
        self.val_images, self.val_labels = (train_x[:0], train_y[:0]) if arrays.val_labels is None else \
            (arrays.val_images, arrays.val_labels)
        self.withheld = torch.empty(0, dtype=torch.long)  # training indices taken out of D (withhold)
        keep = torch.ones(len(train_y), dtype=torch.bool)
        keep[self.forget_indices] = False
        self.retain_indices = keep.nonzero().flatten()
        self.info = self._normalised(info)

    def _normalised(self, info: DatasetInfo) -> DatasetInfo:
        """The statistics inputs are normalised with: none (data.normalize=false), the given data.mean /
        data.std, or the data's own."""
        if not self.normalize:
            return replace(info, mean=(0.0,) * info.channels, std=(1.0,) * info.channels)
        if self.mean is not None or self.std is not None:
            return replace(info, mean=self._statistic("mean", self.mean, info.mean, info.channels),
                           std=self._statistic("std", self.std, info.std, info.channels))
        return info

    @staticmethod
    def _statistic(key: str, given, default: tuple, channels: int) -> tuple:
        """data.mean / data.std: one value per channel (a checkpoint trained on other statistics, e.g.
        ImageNet's), or the data's own when not given."""
        if given is None:
            return default
        values = tuple(float(v) for v in given)
        if len(values) != channels:
            raise TTPUserError(f"data.{key}={list(values)} has {len(values)} values; the data has {channels} "
                               f"channel{'s' if channels > 1 else ''}, so give {channels}")
        if key == "std" and min(values) <= 0:
            raise TTPUserError(f"data.std={list(values)} is not allowed; every value must be > 0")
        return values

    def _forget_images(self, prep, info, train_x, train_y, test_x):
        """data.forget.images: the images that are in the training set (matched by their pixels, every copy)
        are D_f there; the others join D as outside instances (absorbed like forget.source=test), and any
        test image with the same pixels leaves the test set. Returns (training indices, (outside images,
        labels), test indices)."""
        cfg = self.forget_cfg
        if cfg.requests is not None or cfg.indices_file or cfg.source != "train":
            raise TTPUserError("data.forget.images replaces data.forget.indices_file, requests and source; "
                               "leave those unset (source=train)")
        found = read_forget_images(cfg.images, prep, info.names())
        in_train, in_test = match_images(found.hashes, train_x), match_images(found.hashes, test_x)
        inside, outside, records = [], [], []
        for i, digest in enumerate(found.hashes):
            wrong = [j for j in in_train[digest] if int(train_y[j]) != int(found.labels[i])]
            if wrong:
                raise TTPUserError(f"forget image {found.files[i]!r} is {self.training_image(wrong[0])}, labelled "
                                   f"{info.names()[int(train_y[wrong[0]])]!r} there, not "
                                   f"{info.names()[int(found.labels[i])]!r}")
            near = {} if in_train[digest] else self._near_copy(found, i, train_x, train_y, info)
            if near:
                in_train[digest] = [near["near_copy_of"]]
            inside += in_train[digest]
            if not in_train[digest]:
                outside.append(i)
            records.append({"sha256": digest, "training_indices": in_train[digest],
                            "outside": not in_train[digest], "test_copies": len(in_test[digest]), **near,
                            **({"decoded": list(found.notes[i])} if found.notes[i] else {})})
        self.forget_images = records
        test_hits = sorted({j for digest in found.hashes for j in in_test[digest]})
        rows = torch.as_tensor(outside, dtype=torch.long)
        return (torch.as_tensor(sorted(set(inside)), dtype=torch.long), (found.images[rows], found.labels[rows]),
                torch.as_tensor(test_hits, dtype=torch.long))

    def _near_copy(self, found, i: int, train_x, train_y, info) -> dict:
        """data.forget.near_copies for a forget image that is no training image bit for bit but is within
        NEAR_COPY of one (a lossy re-encoding, e.g. a JPEG): refuse (one line naming both and the two ways on),
        match (protect that training image; recorded as near_copy_of) or outside (a new image)."""
        policy = self.forget_cfg.near_copies
        nearest = None if policy == "outside" else nearest_image(found.images[i], train_x)
        if nearest is None or nearest[1] > NEAR_COPY:
            return {}
        index, distance = nearest
        training = self.training_image(index)
        what = (f"forget image {found.files[i]!r} is no training image bit for bit, but {training} differs from "
                f"it by {distance:.2f}/255 per pixel on average (a near copy: under {NEAR_COPY:g}/255)")
        if policy == "refuse":
            raise TTPUserError(f"{what}: a re-encoded copy (JPEG is lossy)? Set data.forget.near_copies=match to "
                               f"protect that training image with it, or near_copies=outside to treat it as a new "
                               "image (or send the original file)")
        if int(train_y[index]) != int(found.labels[i]):
            raise TTPUserError(f"{what}, labelled {info.names()[int(train_y[index])]!r} there, not "
                               f"{info.names()[int(found.labels[i])]!r}")
        log.warning("%s; protecting that training image (data.forget.near_copies=match)", what)
        return {"near_copy_of": index, "near_copy_mean_abs": round(distance, 4)}

    def _select_forget(self, num_train: int, num_test: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices into the training set, indices into the test set) of D_f, as `forget.source` says."""
        cfg, none = self.forget_cfg, torch.empty(0, dtype=torch.long)
        if cfg.source == "train":
            return select_forget(num_train, cfg.size, cfg.seed, cfg.indices_file), none
        if num_test == 0:
            raise TTPUserError(f"data.forget.source={cfg.source} needs a test set; this one is empty")
        if cfg.source == "test":
            return none, select_forget(num_test, cfg.size, cfg.seed, cfg.indices_file, pool="test set")
        if cfg.indices_file:
            raise TTPUserError("data.forget.indices_file is not allowed with data.forget.source=mixed; "
                               "use source=train or source=test")
        if not 0.0 <= cfg.test_fraction <= 1.0:
            raise TTPUserError(f"data.forget.test_fraction={cfg.test_fraction} is not allowed; "
                               "choose a value in [0, 1]")
        if cfg.size is None or int(cfg.size) < 1:
            raise TTPUserError(f"data.forget.size={cfg.size} is not allowed; choose a positive integer")
        outside = round(int(cfg.size) * cfg.test_fraction)
        inside = int(cfg.size) - outside
        return (select_forget(num_train, inside, cfg.seed, None) if inside else none,
                select_forget(num_test, outside, cfg.seed, None, pool="test set") if outside else none)

    @property
    def outside_forget_count(self) -> int:
        """How many forget instances came from outside the training data (appended after part `pretrain`)."""
        return len(self.train_labels) - self.pretrain_size

    def _split(self, arrays):
        """(train images, labels, test images, labels) of the chosen split; each training image's file, where
        the data set has files, goes to `_train_files`."""
        if self.split == "official":
            self._train_files = arrays.train_files
            return arrays.train_images, arrays.train_labels, arrays.test_images, arrays.test_labels
        images = torch.cat([arrays.train_images, arrays.test_images])
        labels = torch.cat([arrays.train_labels, arrays.test_labels])
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.split_seed))
        cut = round(self.train_fraction * len(labels))
        files = arrays.train_files + arrays.test_files
        self._train_files = tuple(files[i] for i in order[:cut].tolist()) if len(files) == len(labels) else ()
        return images[order[:cut]], labels[order[:cut]], images[order[cut:]], labels[order[cut:]]

    def training_image(self, index: int) -> str:
        """How a message names training image `index`: its file under data.root where it has one."""
        if index < len(self._train_files):
            return f"training image {self._train_files[index]!r} (index {index})"
        return f"training image {index}"

    # -------------------------------------------------------------- identity
    def data_fingerprint(self) -> str:
        """Hash of part `pretrain`'s images and labels, part of the pretraining cache key. The forget
        selection is not in it: A(D) trains on all of D whatever D_f is, so forget-set sweeps pretrain once;
        images withheld from D (withhold) are: A(D) did not train on them."""
        index = self._index("pretrain")
        return fingerprint(self.train_images[index], self.train_labels[index])

    def withhold(self, fraction: float) -> None:
        """Take a seeded `fraction` of the retain set (retain_split's holdout) out of D altogether: no part
        trains on it (pretrain, train, retain and the relearning floor leave it out) and it becomes part `val`,
        images A(D) never saw, as an image folder's val/ is. Alg 1's rules that spend accuracy then read it where
        neither A(D) nor finetuning trained (Pareto.hold_out). Only where there are no validation images yet."""
        if len(self.val_labels):
            raise TTPUserError(f"data set {self.name!r} already has {len(self.val_labels)} validation images; "
                               "nothing more is withheld from it")
        _, held = self.retain_split(fraction)
        self.withheld = held
        self.val_images, self.val_labels = self.train_images[held], self.train_labels[held]
        self.retain_indices = self.retain_indices[~torch.isin(self.retain_indices, held)]

    @property
    def val_source(self) -> str:
        """Where part `val` comes from: folder (an image folder's val/), withheld (withhold) or none."""
        if len(self.withheld):
            return "withheld"
        return "folder" if len(self.val_labels) else "none"

    def _index(self, part: str):
        """The training-set indices of part pretrain (D before outside forget instances) or train (D with them),
        less any withheld images; a slice where nothing is withheld."""
        whole = slice(0, self.pretrain_size) if part == "pretrain" else slice(None)
        if not len(self.withheld):
            return whole
        indices = torch.arange(len(self.train_labels))[whole]
        return indices[~torch.isin(indices, self.withheld)]

    def forget_record(self) -> dict:
        """Which instances D_f holds, for results.json: indices into the training set D (as loaded and split,
        before any outside instance joins it), the test-set indices of instances taken from the test set,
        and for forget images their pixels' SHA-256 (`forget_images`)."""
        inside = [int(i) for i in self.forget_indices if int(i) < self.pretrain_size]
        record = {"forget_indices": inside, "forget_test_indices": list(self.forget_test_indices)}
        if self.forget_images:
            record["forget_images"] = self.forget_images
        return record

    def forget_ids(self) -> list[str]:
        """A name for each forget instance, in the forget set's order: `train:<index>` for a training image,
        `test:<index>` for one taken from the test set, and for data.forget.images the image's pixel hash
        (`image:<first 16 hex digits>`, followed by its training index when it is in the training set)."""
        by_index = {i: record["sha256"] for record in self.forget_images for i in record["training_indices"]}
        outside_hashes = iter([record["sha256"] for record in self.forget_images if record["outside"]])
        test_indices = iter(self.forget_test_indices)
        ids = []
        for index in (int(i) for i in self.forget_indices):
            if index < self.pretrain_size:
                ids.append(f"image:{by_index[index][:16]} (train:{index})" if index in by_index else f"train:{index}")
            elif self.forget_images:
                ids.append(f"image:{next(outside_hashes)[:16]}")
            else:
                ids.append(f"test:{next(test_indices)}")
        return ids

    def forget_set_digest(self) -> str:
        """SHA-256 of the sorted, distinct SHA-256s of the forget images' pixels (forget.set_digest): names the
        forget SET whatever its order or labels, so whoever holds exactly these images can recognise it, while one
        image alone cannot be tested against it."""
        return set_digest(fingerprint(image) for image in self.train_images[self.forget_indices])

    def forget_fingerprint(self) -> str:
        return fingerprint(self.train_images[self.forget_indices], self.train_labels[self.forget_indices])

    # -------------------------------------------------------------- datasets
    def nearest_test_indices(self, chunk_size: int = 256) -> torch.Tensor:
        """For each forget instance, the test instance nearest in l2 pixel distance (computed once)."""
        if self._nearest_test is None:
            test = self.test_images.flatten(1).float()
            nearest = [torch.cdist(self.train_images[chunk].flatten(1).float(), test).argmin(dim=1)
                       for chunk in self.forget_indices.split(chunk_size)]
            self._nearest_test = torch.cat(nearest)
        return self._nearest_test

    def dataset(self, part: str, augment: bool = False) -> ImageBatchDataset:
        """`part` is one of pretrain (D before outside forget instances), train (D with them), retain,
        forget, test, forget_nn (each forget instance's nearest test instance, the paper's check that
        protection does not spill onto similar images), val (the user's own validation images, an image
        folder's val/, or the images withheld from D: never trained on, in either split; empty where there are
        none)."""
        if part == "test":
            images, labels = self.test_images, self.test_labels
        elif part == "val":
            images, labels = self.val_images, self.val_labels
        elif part == "forget_nn":
            index = self.nearest_test_indices()
            images, labels = self.test_images[index], self.test_labels[index]
        else:
            index = {"pretrain": self._index("pretrain"), "train": self._index("train"),
                     "retain": self.retain_indices, "forget": self.forget_indices}[part]
            return self.subset(index, augment)
        return ImageBatchDataset(images, labels, self.augment if augment else "none", seed=self.seed)

    def retain_split(self, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(fit, holdout): indices into the training set splitting the retain set, `fraction` of it (rounded, at
        least one image when the fraction is positive) held out, drawn by a generator seeded from data.seed
        alone, so every run and every DDP rank on the same data holds out the same images. Robust Alg 1
        finetunes on `fit` and measures its retain rule on `holdout`, which finetuning never sees."""
        count = 0 if fraction <= 0 else max(1, round(fraction * len(self.retain_indices)))
        if count >= len(self.retain_indices):
            raise TTPUserError(f"method.early_stopping.retain_holdout={fraction:g} holds out all "
                               f"{len(self.retain_indices)} retain images; choose a smaller fraction")
        order = torch.randperm(len(self.retain_indices), generator=torch.Generator().manual_seed(self.seed))
        shuffled = self.retain_indices[order]
        return shuffled[count:].sort().values, shuffled[:count].sort().values

    def subset(self, indices: torch.Tensor, augment: bool = False) -> ImageBatchDataset:
        """The training images at `indices` (indices or a boolean mask; e.g. a part of retain_split)."""
        return ImageBatchDataset(self.train_images[indices], self.train_labels[indices],
                                 self.augment if augment else "none", seed=self.seed)

    def request_parts(self, count: int) -> tuple[ImageBatchDataset, ImageBatchDataset]:
        """(retain, forget) after the first `count` forget requests: D_f the union of those requests,
        D_r the rest of the training set (Alg 4's D_{f_k} and D_{r_k})."""
        forgotten = torch.zeros(len(self.train_labels), dtype=torch.bool)
        for indices in self.forget_requests[:count]:
            forgotten[indices] = True
        outside = torch.zeros_like(forgotten)
        outside[self.withheld] = True
        return self.subset(~forgotten & ~outside), self.subset(forgotten)

    def eval_loader(self, part: str | ImageBatchDataset, sharded: bool = True) -> torch.utils.data.DataLoader:
        """Unaugmented, unshuffled batches of a part (or of a dataset); `sharded=False` gives every rank the
        whole part."""
        dataset = self.dataset(part) if isinstance(part, str) else part
        return batch_loader(dataset, self.eval_batch_size, training=False, sharded=sharded,
                            num_workers=self.num_workers)

    def eval_parts(self) -> list[str]:
        return ["retain", "test", "forget", "forget_nn"] if len(self.test_labels) else ["retain", "forget"]

    # --------------------------------------------------------------- loaders
    def train_dataloader(self):
        return self.training_loader("train")

    def training_loader(self, part: str, batch_size: int | None = None, drop_last: bool = False,
                        sharded: bool = True):
        return self.loader_for(self.dataset(part, augment=True), batch_size, drop_last, sharded)

    def loader_for(self, dataset: ImageBatchDataset, batch_size: int | None = None, drop_last: bool = False,
                   sharded: bool = True):
        """Shuffled training batches of any dataset (e.g. a baseline's own training set); under DDP each rank
        gets its own shard, or with `sharded=False` the whole dataset."""
        return batch_loader(dataset, batch_size or self.batch_size, shuffle=True, drop_last=drop_last,
                            seed=self.seed, num_workers=self.num_workers, sharded=sharded)

    def float_dataset(self, images: torch.Tensor, labels: torch.Tensor) -> ImageBatchDataset:
        """A training view of float images in [0, 1] with the data set's augmentation."""
        return ImageBatchDataset(images, labels, self.augment, seed=self.seed)

    def val_dataloader(self):
        return [self.eval_loader(part) for part in self.eval_parts()]

    def pareto_dataloader(self, retain: ImageBatchDataset | None = None,
                          forget: ImageBatchDataset | None = None) -> CombinedLoader:
        """Minibatch Alg 1: retain batches of `batch_size`, each paired with a forget batch of
        `forget_batch_size` cycled alongside (constant size, so every step gives the forget set one weight).
        The forget set is never sharded: under DDP every rank cycles through every forget image (a forget set
        smaller than the ranks times the forget batch would otherwise leave some ranks no full batch, and Alg 1
        would take no step). `retain`: the retain images to train on (an augmented view; default the whole
        retain set); `forget`: the forget images' augmented view (default with their labels)."""
        retain_loader = self.training_loader("retain", drop_last=False) if retain is None else \
            self.loader_for(retain, drop_last=False)
        loaders = {"retain": retain_loader,
                   "forget": self.loader_for(self.dataset("forget", augment=True) if forget is None else forget,
                                             self.forget_batch_size, drop_last=True, sharded=False)}
        return CombinedLoader(loaders, mode="max_size_cycle")


# what the loader reads (conf/data/imagefolder.yaml passes data.image_size, channels and decoded_cache to its
# loader), not the data module
LOADER_SETTINGS = ("_target_", "loader", "image_size", "channels", "decoded_cache")


def build_datamodule(data: DataSchema | Mapping) -> TTPDataModule:
    """The data module `data` describes (its loader built by Hydra from the loader's `_target_`), set up. `data`
    is the run's checked DataSchema; a config that did not come through it (a results.json's, a certificate's
    rebuilt one) is checked by the schema first, so bad data options end in the usual one line."""
    if not isinstance(data, DataSchema):
        data = as_schema(DataSchema, data, "data")
    values = {item.name: getattr(data, item.name) for item in fields(DataSchema) if item.name not in LOADER_SETTINGS}
    loader = instantiate(data.loader) if data.loader is not None else None
    datamodule = build_class(data._target_, "data", TTPDataModule, loader=loader, **values)
    datamodule.setup()
    return datamodule
