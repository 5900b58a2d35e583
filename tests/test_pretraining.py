"""The pretraining cache key changes with everything that determines A(D), and only with that."""

from ttp_lightning.data import build_datamodule
from ttp_lightning.fit.pretraining import cache_key
from ttp_lightning.fit.training import RunContext
from ttp_lightning.run.validation import validate_config


def key_for(compose_cfg, *overrides):
    settings = validate_config(compose_cfg(*overrides))
    return cache_key(RunContext.of(settings), build_datamodule(settings.data))


def test_cache_key_tracks_what_determines_the_pretrained_model(compose_cfg):
    base = key_for(compose_cfg)
    assert key_for(compose_cfg, "method.theta=0.25", "method.epochs=3") == base  # method settings: same A(D)
    assert key_for(compose_cfg, "data.forget.seed=1", "data.forget.size=30") == base  # A(D) ignores D_f
    for override in ("data.normalize=false", "data.split_seed=1", "pretrain.lr=0.001", "seed=7",
                     "model.hidden_dim=32", "trainer=ddp_sim", "data.batch_size=64"):
        assert key_for(compose_cfg, override) != base, override
    import torch

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)  # another float summation order: another A(D)
        assert key_for(compose_cfg) != base
    finally:
        torch.set_num_threads(threads)


def _cache_ctx(tmp_path, **trainer):
    from omegaconf import OmegaConf

    from ttp_lightning.config.schema import PretrainSchema
    from ttp_lightning.fit.training import FitSettings, RunContext

    return RunContext(FitSettings(trainer=OmegaConf.create({"devices": 1, "strategy": "auto", **trainer}),
                                  pretrain=PretrainSchema(use_cache=True), cache_dir=str(tmp_path)))


def _counting_fit(net, calls, seconds=0.0):
    import time

    import torch

    def fit():
        calls.append(1)
        time.sleep(seconds)
        with torch.no_grad():
            for param in net.parameters():
                param.fill_(0.5)
        return 1.25

    return fit


def test_cache_entry_is_safetensors_with_a_checksum_and_a_corrupt_one_is_rebuilt(tmp_path, caplog):
    from torch import nn

    from ttp_lightning.fit.pretraining import _cached_fit

    ctx, calls = _cache_ctx(tmp_path), []
    net = nn.Linear(3, 2)
    first = _cached_fit(ctx, net, "k", lambda: True, _counting_fit(net, calls))
    assert first["cached"] is False and first["cache_file"].endswith("k.safetensors") and calls == [1]
    again = nn.Linear(3, 2)
    second = _cached_fit(ctx, again, "k", lambda: True, _counting_fit(again, calls))
    assert second == {"wall_s": 1.25, "cached": True, "cache_file": first["cache_file"]} and calls == [1]
    assert (again.weight == 0.5).all()
    entry = tmp_path / "pretrain" / "k.safetensors"
    for corrupt in (lambda: entry.write_bytes(entry.read_bytes()[:40]),            # truncated
                    lambda: entry.write_bytes(entry.read_bytes()[:-4] + b"\0\0\0\0")):  # same size, altered
        corrupt()
        caplog.clear()
        third = nn.Linear(3, 2)
        result = _cached_fit(ctx, third, "k", lambda: True, _counting_fit(third, calls))
        assert result["cached"] is False and (third.weight == 0.5).all()
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and str(entry) in warnings[0] and "carries no valid proof" in warnings[0] \
            and "computing it again" in warnings[0]
    assert len(calls) == 3 and _cached_fit(ctx, nn.Linear(3, 2), "k", lambda: True, lambda: 0.0)["cached"]


def _race(cache_dir: str, out: str) -> None:
    from pathlib import Path

    from torch import nn

    from ttp_lightning.fit.pretraining import _cached_fit

    calls = []
    net = nn.Linear(3, 2)
    result = _cached_fit(_cache_ctx(Path(cache_dir)), net, "shared", lambda: True, _counting_fit(net, calls, 2.0))
    Path(out).write_text(f"{len(calls)} {result['cached']}")


def test_two_jobs_on_an_empty_cache_train_once_and_the_second_reuses(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    jobs = [context.Process(target=_race, args=(str(tmp_path / "cache"), str(tmp_path / f"job{i}"))) for i in (0, 1)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(120)
    outcomes = sorted((tmp_path / f"job{i}").read_text() for i in (0, 1))
    assert outcomes == ["0 True", "1 False"]  # one trained, the other waited and loaded
