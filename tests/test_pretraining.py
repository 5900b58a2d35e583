"""The pretraining cache key changes with everything that determines A(D), and only with that."""

import hydra

from ttp_lightning.pretraining import cache_key
from ttp_lightning.training import RunContext


def key_for(compose_cfg, *overrides):
    cfg = compose_cfg(*overrides)
    datamodule = hydra.utils.instantiate(cfg.data)
    datamodule.setup()
    return cache_key(RunContext(cfg=cfg), datamodule)


def test_cache_key_tracks_what_determines_the_pretrained_model(compose_cfg):
    base = key_for(compose_cfg)
    assert key_for(compose_cfg, "method.theta=0.25", "method.epochs=3") == base  # method settings: same A(D)
    assert key_for(compose_cfg, "data.forget.seed=1", "data.forget.size=30") == base  # A(D) ignores D_f
    for override in ("data.normalize=false", "data.split_seed=1", "pretrain.lr=0.001", "seed=7",
                     "model.hidden_dim=32", "trainer=ddp_sim", "data.batch_size=64"):
        assert key_for(compose_cfg, override) != base, override
