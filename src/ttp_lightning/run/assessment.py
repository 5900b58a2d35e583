"""Assessing a run's models on the forget set, on rank 0: the attack suite, the relearning attack and its
floor, every forget image one by one (clean, attacked and proven CD, proven radius) and the release gate.
It takes the models, the data and the settings and returns its part of the run's record, built once
(`Assessment`); the pipeline only orchestrates."""

import logging
import math
from dataclasses import dataclass, field

from ttp_lightning.assess.frontier import Frontier, JudgedRadius, frontier, is_robust_fit, judged_radii
from ttp_lightning.assess.protection import (
    GateSettings,
    GateVerdict,
    clean_conf_dist,
    judge,
    per_image_rows,
    proven_bounds,
    stage_summary,
)
from ttp_lightning.attacks import WORST, evaluate_attacks
from ttp_lightning.attacks.relearn import relearn_each, retain_subset
from ttp_lightning.config.schema import AttacksSchema, BoundsSchema
from ttp_lightning.core.console import Paced
from ttp_lightning.core.inference import eval_device, predictions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attacked:
    """The attack suite's and the relearning attack's part: per stage, the scores, the sanity checks, each forget
    image's CD at its most confident attacked point at each radius (robust_gamma's is the one judged), and the
    worst relearning case."""
    scores: dict
    checks: dict
    robust_conf_dist: dict  # stage -> the worst attack's mean forget CD at robust_gamma
    worst_by_gamma: dict  # stage -> {gamma: each image's CD at its most confident attacked point there}
    relearn: dict | None = None
    relearn_runs: dict | None = None
    relearn_floor: dict | None = None


@dataclass(frozen=True)
class PerImage:
    """Every forget image by id and stage (clean, attacked, proven CD, proven radius), the proven
    bound at every attack radius, which bound gave it, and each stage's per-image summary."""
    rows: list[dict]
    proven: dict
    proof_bound: dict
    summaries: dict  # stage -> stage_summary
    note: str | None  # why no proven bound could be computed (None when it was)
    proven_by_gamma: dict = field(default_factory=dict)  # stage -> {gamma: each image's proven CD} (None: no bound)


@dataclass(frozen=True)
class Assessment:
    attacked: Attacked | None  # None when attacks.enabled is false
    per_image: PerImage
    release_gate: GateVerdict
    frontier: Frontier | None = None  # a refused robust release: its price (assess/frontier.py)

    def stage_metrics(self, stage: str) -> dict:
        """What the assessment adds to a stage's metrics, in results.json's order (nothing to a stage it did not
        assess: A(D) before it absorbed outside forget instances)."""
        if stage not in self.per_image.summaries:
            return {}
        robust = {} if self.attacked is None else {"forget_robust_conf_dist": self.attacked.robust_conf_dist[stage]}
        return {**robust, **self.per_image.summaries[stage]}

    def to_json(self) -> dict:
        """results.json's keys of the assessment, in their order."""
        attacked = {}
        if self.attacked is not None:
            attacked = {"attacks": self.attacked.scores, "attack_checks": self.attacked.checks}
            if self.attacked.relearn is not None:
                attacked |= {"relearn": self.attacked.relearn, "relearn_runs": self.attacked.relearn_runs}
            if self.attacked.relearn_floor is not None:
                attacked["relearn_floor"] = self.attacked.relearn_floor
        note = {"proof_note": self.per_image.note} if self.per_image.note else {}
        frontier = {} if self.frontier is None else {"frontier": self.frontier.to_json()}
        return {**attacked, "proven": self.per_image.proven, "proof_bound": self.per_image.proof_bound,
                **note, "forget_per_image": self.per_image.rows, "release_gate": self.release_gate.to_json(),
                **frontier}


def assess(models: dict, method: str, reference: float, reported: dict, datamodule, attacks: AttacksSchema,
           suite: dict, sources: dict, floor: tuple | None, bounds: BoundsSchema, gate: GateSettings,
           history: list | None = None, test_cost: float | None = None) -> Assessment:
    """The whole assessment of `models` ({stage: network}, the method's `method`). Attackers must restore A(D)'s
    forget CD (`reference`); the gate reads what the method `reported` about how it got its model. A refused
    robust Alg 1 release gets its price (`frontier`) from the fit's `history` and its `test_cost` (points)."""
    attacked = None
    if attacks.enabled:
        log.info("attacking the forget set: %s at gamma %s/255", ", ".join(suite),
                 ", ".join(f"{float(g):g}" for g in attacks.gammas))
        attacked = attack_models(models, reference, datamodule, attacks, suite, sources, floor)
    per_image = account_per_image(models, datamodule, attacks, attacked, gate.conf_dist_at_most, bounds)
    gamma = float(attacks.robust_gamma)
    verdict = judge(per_image.rows, method, reported, gate, gamma, per_image.note)
    price = None
    if not verdict.passed and attacked is not None and history and is_robust_fit(reported):
        price = frontier(history, reported, gamma, judged_at_each_radius(per_image, attacked, method, reported, gate,
                                                                          attacks), test_cost,
                         per_image.summaries[method], len(per_image.rows))
    return Assessment(attacked, per_image, verdict, price)


def judged_at_each_radius(per_image: PerImage, attacked: Attacked, stage: str, reported: dict, gate: GateSettings,
                          attacks: AttacksSchema) -> tuple[JudgedRadius, ...]:
    """`stage`'s weights at each radius of attacks.gammas: exposed under the attack suite, proven, and the
    gate's own verdict were the release promised there (judge() on each image's CDs at that radius)."""
    threshold = gate.conf_dist_at_most
    worst, proven = attacked.worst_by_gamma[stage], per_image.proven_by_gamma.get(stage)

    def at(g: float) -> list[dict]:
        key = f"{g:g}"
        return [{**row, stage: {**row[stage], "attacked": worst[key][i],
                                "proven": None if proven is None else proven[key][i]}}
                for i, row in enumerate(per_image.rows)]

    def above(values) -> int:
        return sum(not value <= threshold for value in values)  # NaN counts as above

    judged = judged_radii(
        [float(g) for g in attacks.gammas], lambda g: above(worst[f"{g:g}"]),
        lambda g: None if proven is None else len(proven[f"{g:g}"]) - above(proven[f"{g:g}"]),
        lambda g: judge(at(g), stage, reported, gate, g, per_image.note).passed)
    least = per_image.summaries[stage].get("forget_proven_radius_min")
    if not least or math.isnan(least) or least >= max(float(g) for g in attacks.gammas) \
            or any(row.gamma == least for row in judged):  # none, or nothing the attack grid does not judge
        return judged
    # every image proven within `least`: no attack there exceeds the threshold, which the proven CD stands for
    bound = [{**row, stage: {**row[stage], "attacked": threshold, "proven": threshold}} for row in per_image.rows]
    passes = judge(bound, stage, reported, gate, float(least), per_image.note).passed
    return tuple(sorted([*judged, JudgedRadius(float(least), 0, len(bound), passes, "bound")],
                        key=lambda row: row.gamma))


def attack_models(models: dict, reference: float, datamodule, cfg: AttacksSchema, suite: dict, sources: dict,
                  floor: tuple | None) -> Attacked:
    """The attack evaluation of each stage's model on the forget set. Attackers aim for the pretrained model's
    predictions and must restore its forget CD (`reference`)."""
    forget = datamodule.dataset("forget")
    targets = predictions(models["pretrain"], forget)
    scores, checks, robust, by_gamma = {}, {}, {}, {}
    gamma = f"{float(cfg.robust_gamma):g}"  # validated: one of the gammas
    for stage, net in models.items():
        with Paced(f"attack table ({stage})", "attack runs") as paced:
            evaluation = evaluate_attacks(net, forget, cfg, suite, targets=targets, reference_conf_dist=reference,
                                          progress=paced.step)
        scores[stage], checks[stage] = evaluation["scores"], evaluation["checks"]
        robust[stage] = evaluation["scores"][WORST][gamma]["forget_conf_dist"]
        by_gamma[stage] = evaluation["worst_per_image"]
    if not sources:
        return Attacked(scores, checks, robust, by_gamma)
    settings = cfg.relearn
    log.info("relearning attack: Adam at lr %s on %s, forget set measured after %s steps; the worst case is "
             "reported", ", ".join(f"{lr:g}" for lr in settings.lrs), " and ".join(sources),
             ", ".join(map(str, settings.steps)))
    nets = dict(models) if floor is None else {**models, FLOOR: floor[0]}
    with Paced("relearning attack", "steps") as paced:
        results = relearn(nets, sources, forget, cfg, paced)
    worst = {stage: results[stage][0] for stage in models}
    runs = {stage: results[stage][1] for stage in models}
    floor_record = None if floor is None else {"worst": results[FLOOR][0], "retrain_wall_s": floor[1]["wall_s"],
                                               "retrain_cached": floor[1]["cached"]}
    return Attacked(scores, checks, robust, by_gamma, worst, runs, floor_record)


FLOOR = " the floor, A(D_r)"  # not a stage name (stage names are identifiers)


def relearn(nets: dict, sources: dict, forget, cfg: AttacksSchema, paced: Paced | None = None) -> dict:
    """attacks.relearn on each of `nets` from `sources` (relearn_sources), trained together: {name: (worst
    case, every run)}, relearn_each's; `paced` says how far it is at least once a minute."""
    settings = cfg.relearn
    return relearn_each(nets, sources, forget, list(settings.steps), [float(lr) for lr in settings.lrs],
                        int(settings.batch_size), int(cfg.seed), eval_device(),
                        progress=None if paced is None else paced.step)


def run_relearn_sources(cfg: AttacksSchema, datamodule) -> dict:
    """The run's relearning sources (relearn_sources), none when the attacks or the relearning attack are off."""
    return relearn_sources(datamodule, cfg.relearn, int(cfg.seed)) if cfg.enabled and cfg.relearn.enabled else {}


def relearn_sources(datamodule, relearn, seed: int) -> dict:
    """The relearning attacker's labelled images by name (attacks.relearn.data): the test split (when the data
    set has one), a `retain_size` subset of the retain data; built once per run and shared by every model."""
    sources = {}
    for name in relearn.data:
        if name == "test" and len(datamodule.test_labels):
            sources["test"] = datamodule.dataset("test")
        elif name == "retain":
            sources[f"retain {relearn.retain_size or 'all'}"] = retain_subset(datamodule.dataset("retain"),
                                                                             relearn.retain_size, seed)
    return sources


def account_per_image(models: dict, datamodule, attacks: AttacksSchema, attacked: Attacked | None,
                      threshold: float, bounds: BoundsSchema) -> PerImage:
    """Every forget image, one by one: clean, attacked and proven CD and the proven radius per image and
    stage, the proven bound at every attack radius and which bound gave them, each stage's summary."""
    forget_images, _ = datamodule.dataset("forget").everything()
    gamma = float(attacks.robust_gamma)
    gammas = sorted({float(g) for g in attacks.gammas} | {gamma})
    device = eval_device()
    # bounds.kind=auto chooses on the method's stage; A(D), the same architecture, is bounded the same way (a
    # reference row: its own trials took a minute on an MNIST ResNet8 to prove nothing)
    method = next((stage for stage in reversed(models) if stage != "pretrain"), None)
    found = {}
    for stage in sorted(models, key=lambda name: name != method):  # the method's stage first
        with Paced(f"bounding the forget images ({stage})", "bounds"):  # a line a minute, however long
            found[stage] = proven_bounds(models[stage], forget_images, gammas, device, bounds, threshold,
                                         same_as=None if stage == method else found.get(method))
    columns, proven_by_stage, bound_by_stage, summaries, lists = {}, {}, {}, {}, {}
    for stage, net in models.items():
        proven = found[stage]
        lists[stage] = proven.by_gamma
        columns[stage] = {"clean": clean_conf_dist(net, forget_images, device).tolist(),
                          "attacked": None if attacked is None else attacked.worst_by_gamma[stage][f"{gamma:g}"],
                          "proven": None if proven.by_gamma is None else proven.by_gamma[f"{gamma:g}"],
                          "proven_radius": proven.radius}
        if proven.by_gamma is not None:
            proven_by_stage[stage] = {g: stage_summary({"proven": values}, threshold)
                                         for g, values in proven.by_gamma.items()}
        bound_by_stage[stage] = {"bound": proven.bound, "intermediate": proven.intermediate,
                                 "slope_steps": proven.slope_steps, "note": proven.note, "seconds": proven.seconds,
                                 "rule": proven.rule}
        if proven.same_as_rule:
            bound_by_stage[stage]["same_as"] = method  # the method stage's choice, not a rule of its own
        summaries[stage] = stage_summary(columns[stage], threshold)
    shown = found[method if method is not None else next(iter(models))]  # the note is the method stage's
    note = None if shown.by_gamma is not None else shown.note
    return PerImage(per_image_rows(datamodule.forget_ids(), columns), proven_by_stage, bound_by_stage, summaries,
                    note, lists)
