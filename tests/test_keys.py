"""Issue 59: A(D)'s cache key and the method's checkpoint key cover every setting that reaches a fit. They hashed only
accelerator, devices, num_nodes, strategy and precision of `trainer`: after a kill, a rerun with
+trainer.gradient_clip_val=0.01 resumed the unclipped checkpoint, and a warm cache served an A(D) trained without
clipping. The keys are derived from the typed settings now; each setting either changes them or is named, with a
reason, as taking no part in any result."""

import copy
import inspect
from dataclasses import fields, is_dataclass, replace
from enum import Enum
from types import SimpleNamespace

import lightning as L
import pytest
from omegaconf import open_dict

from ttp_lightning.config.build import Part
from ttp_lightning.config.schema import plain
from ttp_lightning.data.datamodule import build_datamodule
from ttp_lightning.fit.pretraining import NOT_IN_PRETRAINING, cache_key
from ttp_lightning.fit.training import NOT_IN_RESULTS, TRAINER_NOT_IN_RESULTS, FitSettings, RunContext
from ttp_lightning.run.pipeline import method_key
from ttp_lightning.run.validation import build_method, validate_config

METHODS = ["pareto", "pareto_robust", "certified_exact", "certified_lissa", "certified_online", "retrain",
           "synthetic", "labeldp", "gaussian_uniform"]


@pytest.fixture(scope="module")
def base(request):
    from hydra import compose, initialize_config_dir

    from conftest import CONF_DIR, TINY
    from ttp_lightning.config.choices import normalize_overrides

    def settings_for(*overrides):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="main", overrides=normalize_overrides([*TINY, *overrides]),
                          return_hydra_config=True)
        with open_dict(cfg):
            del cfg["hydra"]
        return validate_config(cfg)

    settings = settings_for()
    return SimpleNamespace(settings_for=settings_for, settings=settings, datamodule=build_datamodule(settings.data))


def _changed(value):
    """A different value of the same kind (a leaf of a plain settings tree, or a schema's field)."""
    if isinstance(value, Enum):
        return next(member for member in type(value) if member != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "_changed"
    if isinstance(value, list):
        return [*value, value[-1] if value else 1]
    return 1 if value is None else "changed"


def _leaves(tree, path=()):
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            yield from _leaves(value, (*path, key))
    else:
        yield path


def _with(tree, path, value):
    if not path:
        return value
    return {**tree, path[0]: _with(tree[path[0]], path[1:], value)}


def _keys(base, fit_settings: FitSettings, method) -> tuple[str, str]:
    ctx = RunContext(fit_settings=fit_settings)
    return cache_key(ctx, base.datamodule), method_key(ctx, method, base.datamodule)


def test_every_lightning_trainer_argument_changes_both_keys_or_is_named(base):
    """Every argument of Lightning's Trainer (what trainer.* and +trainer.KEY= may set)."""
    fit_settings, method = FitSettings.of(base.settings), build_method(base.settings)
    before = _keys(base, fit_settings, method)
    arguments = set(inspect.signature(L.Trainer.__init__).parameters) - {"self"}
    assert "gradient_clip_val" in arguments and set(TRAINER_NOT_IN_RESULTS) <= arguments
    for name in sorted(arguments):
        current = fit_settings.trainer.get(name)
        trainer = Part({**fit_settings.trainer.values, name: _changed(current)})
        after = _keys(base, replace(fit_settings, trainer=trainer), method)
        if name in TRAINER_NOT_IN_RESULTS:
            assert after == before and TRAINER_NOT_IN_RESULTS[name], name
        else:
            assert after[0] != before[0] and after[1] != before[1], name


def _edited(section, name: str, value):
    """A copy of a schema object with one field set (bypassing its range checks: a key must change for any value)."""
    edited = copy.copy(section)
    object.__setattr__(edited, name, value)
    return edited


def _fit_variants(fit_settings: FitSettings):
    """(label, field, changed FitSettings): one per field, and one per field of its typed sections."""
    for item in fields(FitSettings):
        value = getattr(fit_settings, item.name)
        if item.name in ("trainer", "model"):
            yield item.name, item.name, replace(fit_settings, **{item.name: Part({**value.values, "changed": 1})})
        elif item.name == "callbacks":
            mine = {**(value or {}), "mine": Part({"_target_": "x.Y"})}
            yield item.name, item.name, replace(fit_settings, callbacks=mine)
        elif is_dataclass(value):
            for inner in fields(value):
                current = getattr(value, inner.name)
                if is_dataclass(current):  # pretrain.certified: off by default, so its switch (the rest: below)
                    current = _edited(current, "gamma", 3.0)
                    yield f"{item.name}.{inner.name}", item.name, \
                        replace(fit_settings, **{item.name: _edited(value, inner.name, current)})
                    continue
                changed = _edited(value, inner.name, _changed(current))
                yield f"{item.name}.{inner.name}", item.name, replace(fit_settings, **{item.name: changed})
        else:
            yield item.name, item.name, replace(fit_settings, **{item.name: _changed(value)})


def test_every_fit_setting_changes_the_keys_of_the_fits_it_reaches_or_is_named(base):
    """Every field of FitSettings and of its typed sections (pretrain, performance)."""
    fit_settings, method = FitSettings.of(base.settings), build_method(base.settings)
    before = _keys(base, fit_settings, method)
    tried = 0
    for label, name, changed in _fit_variants(fit_settings):
        tried += 1
        pretrain_key, method_key_ = _keys(base, changed, method)
        if name in NOT_IN_RESULTS:
            assert (pretrain_key, method_key_) == before and NOT_IN_RESULTS[name], label
            continue
        assert method_key_ != before[1], label  # every other fit setting reaches the method's fits
        assert (pretrain_key == before[0]) == (name in NOT_IN_PRETRAINING), label
    assert tried >= 20, tried


def test_certified_pretraining_settings_key_a_certified_a_d_and_leave_every_plain_key_as_it_was(base):
    """pretrain.certified: with gamma > 0 every one of its settings changes A(D)'s key; with gamma 0 (plain ERM,
    the default) none does, so every A(D) cached before certified pretraining existed is still found."""
    fit_settings, method = FitSettings.of(base.settings), build_method(base.settings)
    pretrain = fit_settings.pretrain

    def key_with(**certified):
        edited = pretrain.certified
        for name, value in certified.items():
            edited = _edited(edited, name, value)
        return _keys(base, replace(fit_settings, pretrain=_edited(pretrain, "certified", edited)), method)[0]

    plain = _keys(base, fit_settings, method)[0]
    on = key_with(gamma=3.0)
    assert on != plain
    for inner in fields(pretrain.certified):
        if inner.name == "gamma":
            continue
        value = _changed(getattr(pretrain.certified, inner.name))
        assert key_with(**{inner.name: value}) == plain, inner.name
        assert key_with(gamma=3.0, **{inner.name: value}) != on, inner.name


def test_a_moved_callback_class_keeps_the_keys_written_before_the_move(base):
    """Issue 60 moved ConstrainedBestModel into alg1/: the keys hash it by its old name, so a cache or a checkpoint
    written before the move is found; the old name itself keys the same; any other class changes both keys."""
    from ttp_lightning.fit.training import KEYED_AS

    fit_settings, method = FitSettings.of(base.settings), build_method(base.settings)
    (moved, old), = KEYED_AS.items()
    assert fit_settings.callbacks["best_model"].get("_target_") == moved  # conf/callbacks/default.yaml: the new home
    assert fit_settings.identity()["callbacks"]["best_model"]["_target_"] == old

    def with_target(target):
        best = Part({**fit_settings.callbacks["best_model"].values, "_target_": target})
        callbacks = {**fit_settings.callbacks, "best_model": best}
        return _keys(base, replace(fit_settings, callbacks=callbacks), method)

    assert with_target(old) == _keys(base, fit_settings, method)
    other = with_target("ttp_lightning.fit.callbacks.EpochHistory")
    assert other[0] != _keys(base, fit_settings, method)[0] and other[1] != _keys(base, fit_settings, method)[1]


@pytest.mark.parametrize("name", METHODS)
def test_every_setting_of_each_methods_schema_changes_its_checkpoint_key(base, name):
    certified = ["model=logreg", "pretrain.norm_bound=10"] if name.startswith("certified") else []
    certified += ["data.forget.requests=[8,12]"] if name == "certified_online" else []
    settings = base.settings_for(f"method={name}", *certified)
    method = build_method(settings)
    fit_settings = FitSettings.of(settings)
    values = {key: value for key, value in plain(method.settings).items() if key != "_target_"}
    before = _keys(base, fit_settings, SimpleNamespace(settings=values))[1]
    paths = list(_leaves(values))
    assert len(paths) >= 5, paths
    for path in paths:
        current = values
        for key in path:
            current = current[key]
        edited = _with(values, path, _changed(current))
        assert _keys(base, fit_settings, SimpleNamespace(settings=edited))[1] != before, (name, path)


def test_a_clipped_rerun_does_not_reuse_an_unclipped_cache(run_main, caplog):
    """The issue's case end to end: the clipped run's A(D) is trained, not read from the unclipped run's cache."""
    import logging

    caplog.set_level(logging.INFO)

    def from_cache(*overrides) -> bool:
        caplog.clear()
        code, _, err, _ = run_main("attacks.enabled=false", *overrides)
        assert code in (0, 4), err
        return "pretraining A(D): from the cache" in caplog.text

    assert not from_cache()
    assert from_cache()  # the same settings: the cache serves it
    assert not from_cache("+trainer.gradient_clip_val=0.01")
    assert not from_cache("+trainer.accumulate_grad_batches=2")
    assert from_cache("trainer.enable_progress_bar=true", "trainer.log_every_n_steps=7")  # named: no part in it
