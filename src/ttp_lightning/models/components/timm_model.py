"""Any timm architecture by name (`model=timm model.name=resnet18`), with pretrained weights from a local file
(`model.pretrained_file=PATH`, through timm's own pretrained-weights mechanism, which drops a classifier head
of another class count and adapts the stem to the channel count) or from the hub (`model.pretrained=true`,
needs network access). The ViT configs build through the same function.

A weights file is read by timm with safetensors or `torch.load(weights_only=True)`; timm's custom loaders
(numpy archives) are switched off, so a pretrained file never runs code.
"""

from pathlib import Path

from torch import nn

from ttp_lightning.core.errors import TTPUserError

PRETRAINED_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")


def _known(name: str) -> None:
    import timm

    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('_')[0]}*")[:8]
        raise TTPUserError(f"model.name={name!r} is not a timm architecture"
                           + (f"; similar: {', '.join(close)}" if close else "; see timm.list_models()"))


def _pretrained_overlay(pretrained_file: str) -> dict:
    path = Path(pretrained_file).expanduser()
    if not path.is_file():
        raise TTPUserError(f"model.pretrained_file={str(path)!r} does not exist or is not a file")
    if path.suffix not in PRETRAINED_SUFFIXES:
        raise TTPUserError(f"model.pretrained_file={str(path)!r} is not allowed; choose a "
                           f"{', '.join(PRETRAINED_SUFFIXES)} file (a state_dict)")
    return {"file": str(path), "custom_load": False, "hf_hub_id": None, "url": None}


def timm_model(in_channels: int, image_size: int, num_classes: int, name: str = "resnet18", pretrained: bool = False,
               pretrained_file: str | None = None, **kwargs) -> nn.Module:
    """timm.create_model(name) for this data set's channels and classes; `img_size` is passed to the
    architectures that take it (vision transformers), so small images give a sensible token count."""
    import timm

    _known(name)
    options = dict(kwargs)
    if pretrained_file:
        options["pretrained_cfg_overlay"] = _pretrained_overlay(pretrained_file)
    if "vit" in name or "deit" in name:
        options.setdefault("img_size", image_size)
    try:
        return timm.create_model(name, pretrained=bool(pretrained or pretrained_file), num_classes=num_classes,
                                 in_chans=in_channels, **options)
    except TTPUserError:
        raise
    except Exception as exc:  # noqa: BLE001 -- a file for another architecture, an unreachable hub, bad kwargs
        where = f"model.pretrained_file={pretrained_file!r}" if pretrained_file else f"model.name={name!r}"
        raise TTPUserError(f"{where} cannot build timm model {name!r} ({type(exc).__name__}: "
                           f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})") from None
