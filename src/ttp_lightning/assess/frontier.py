"""The price of a refused robust release (issue 61): what robust Alg 1 measured on its way, so that a refusal
says what the promise would cost instead of only that it was not met.

Two views, both from numbers the run measured (none is estimated):

  trained  one row per training radius the fit trained at (the radius rule moves it): of the epochs there, the
           one with the fewest forget images exposed at the promised radius under early stopping's attack, then
           the fewest the interval bound left unproven, then the least accuracy lost on the images the retain rule
           reads (the held-out slice where there is one, else the retain images trained on);
  judged   the weights the run kept, at each radius of attacks.gammas: images exposed under the attack suite
           (the judge), images proven by the bound, and whether the release gate passes there (the gate's own
           judge() recomputes it from the per-image values at that radius).

And at most two overrides that would release, each with its measured cost: a smaller promised radius
(`attacks.robust_gamma`: the very weights kept, so its cost is their test-accuracy drop, exact) and a larger
accuracy budget (`method.early_stopping.retain_acc_drop_at_most`: an epoch at the promised radius that left no
image exposed but cost more than the budget; measured on the retain rule's images at that epoch, and a rerun
trains under the new budget, so its epochs differ). Where neither is measured, the frontier says why.

No torch here: pure functions of the run's records, tested on their own.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ttp_lightning.assess.confirmation import CONFIDENCE
from ttp_lightning.core.console import WIDTH, table, wrapped

BUDGET_STEP = 0.005  # a suggested budget is the measured cost rounded up to half a point


@dataclass(frozen=True)
class TrainedRadius:
    """One training radius of the fit and its best epoch (see the module docstring)."""

    train_gamma: float = field(metadata={"doc": "the training radius, in 1/255"})
    epochs: int = field(metadata={"doc": "how many epochs trained at it"})
    epoch: int = field(metadata={"doc": "its best epoch"})
    retain_cost: float = field(metadata={"doc": "accuracy points that epoch lost on the images the retain rule "
                                                "reads"})
    exposed: int | None = field(metadata={"doc": "forget images above the threshold at the promised radius under "
                                                 "early stopping's attack (null: not measured)"})
    proven: int | None = field(metadata={"doc": "forget images the interval bound proves at or below the threshold "
                                                "at the promised radius (null: the bound term off)"})
    ramp_from: float | None = field(default=None, metadata={
        "doc": "for the epochs of a held radius's ramp (alg1 Rounds), the smallest radius among them; train_gamma "
               "is then the largest (null: one radius of the radius rule)"})
    confirmed_cost: float | None = field(default=None, metadata={
        "doc": "accuracy points that epoch lost on the confirmation images, which no rule reads "
               "(assess/confirmation.py; null: none)"})

    @property
    def cost(self) -> float:
        """The cost a budget must cover: the larger of the rule's reading and the confirmed one."""
        return max(self.retain_cost, self.confirmed_cost) if self.confirmed_cost is not None else self.retain_cost

    def to_json(self) -> dict:
        return {"train_gamma": self.train_gamma, "epochs": self.epochs, "epoch": self.epoch,
                "retain_cost": self.retain_cost, "confirmed_cost": self.confirmed_cost, "exposed": self.exposed,
                "proven": self.proven, "ramp_from": self.ramp_from}


@dataclass(frozen=True)
class JudgedRadius:
    """The kept weights judged at one radius of attacks.gammas."""

    gamma: float = field(metadata={"doc": "the radius, in 1/255"})
    exposed: int | None = field(metadata={"doc": "forget images above the threshold under the attack suite"})
    proven: int | None = field(metadata={"doc": "forget images the bound proves at or below the threshold"})
    passes: bool = field(metadata={"doc": "whether the release gate passes these weights promised at this radius"})
    by: str = field(default="attack", metadata={"doc": "attack: a radius of attacks.gammas, attacked there; bound: "
                                                      "the least proven radius of every image, where no attack can "
                                                      "exceed the threshold"})

    def to_json(self) -> dict:
        return {"gamma": self.gamma, "exposed": self.exposed, "proven": self.proven, "passes": self.passes,
                "by": self.by}


@dataclass(frozen=True)
class Override:
    """A command-line override that would release, and what it was measured to cost."""

    override: str = field(metadata={"doc": "the override, as typed on the command line"})
    cost: float = field(metadata={"doc": "accuracy points lost"})
    measured: str = field(metadata={"doc": "where the cost was measured"})

    def to_json(self) -> dict:
        return {"override": self.override, "cost": self.cost, "measured": self.measured}


@dataclass(frozen=True)
class Frontier:
    """results.json `frontier` (a refused robust release): the promise, the budget, both views and the
    overrides; built once, by frontier()."""

    gamma: float = field(metadata={"doc": "the promised radius (attacks.robust_gamma), in 1/255"})
    budget: float | None = field(metadata={"doc": "the accuracy the protection may cost "
                                                  "(early_stopping.retain_acc_drop_at_most, a fraction)"})
    reads: str = field(metadata={"doc": "the images the retain rule and the costs read"})
    forget_size: int = field(metadata={"doc": "how many forget images"})
    kept: dict = field(metadata={"doc": "the kept epoch: epoch, train_gamma, retain_cost, test_cost, proven radius "
                                        "min / median"})
    trained: tuple[TrainedRadius, ...] = field(metadata={"doc": "per training radius, its best epoch"})
    judged: tuple[JudgedRadius, ...] = field(metadata={"doc": "the kept weights at each attack radius"})
    overrides: tuple[Override, ...] = field(metadata={"doc": "what would release, with its measured cost"})
    unmeasured: tuple[str, ...] = field(metadata={"doc": "why an override is not offered"})

    def to_json(self) -> dict:
        return {"gamma": self.gamma, "budget": self.budget, "reads": self.reads, "forget_size": self.forget_size,
                "kept": dict(self.kept), "trained": [row.to_json() for row in self.trained],
                "judged": [row.to_json() for row in self.judged],
                "overrides": [row.to_json() for row in self.overrides], "unmeasured": list(self.unmeasured)}


def points(value: float) -> float:
    """A fraction of accuracy as points, rounded for reading (NaN stays NaN)."""
    return round(100.0 * value, 2)


def _count(value) -> int | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


CONFIRMED = "retain_confirm_acc"  # a history row's accuracy on the confirmation images (alg1/method.CONFIRM_PART)
RUNG_FRACTIONS = (1.0, 0.5, 0.25, 0.125, 0.0)  # the radius rule's rungs (alg1/schema.RADIUS_RUNGS; a test ties them)


def _group(radius: float, target: float | None, gamma: float) -> float | str:
    """A radius of the radius rule is its own row; the epochs of a held radius's ramp are one row below the
    promised radius and one at or above it."""
    if target is None or any(abs(radius - target * fraction) < 1e-6 for fraction in RUNG_FRACTIONS):
        return radius
    return "ramp at or above" if radius >= gamma - 1e-9 else "ramp below"


def trained_radii(history: list[dict], reads: str, start_acc: float, forget_size: int, target: float | None = None,
                  gamma: float = math.inf, confirm_start: float | None = None) -> tuple[TrainedRadius, ...]:
    """Per training radius in `history` (the fit's epoch rows), its best epoch; largest radius first. `reads`:
    the row key of the accuracy the retain rule reads; `start_acc`: the accuracy it is relative to; `target`: the
    full training radius (the rule's rungs are fractions of it; other radii are a ramp's, grouped around the
    promised radius `gamma`); `confirm_start`: A(D)'s accuracy the confirmation images' cost is relative to (None:
    no confirmation images). The best epoch is chosen as the rule chooses, never by the confirmation images."""
    groups: dict[float | str, list[dict]] = {}
    for row in history:
        if "train_gamma" in row and reads in row:
            groups.setdefault(_group(round(float(row["train_gamma"]), 4), target, gamma), []).append(row)
    out = []
    for rows in groups.values():
        radii = [round(float(row["train_gamma"]), 4) for row in rows]
        best = min(rows, key=lambda row: _order(row, start_acc, reads))
        unproven = _count(best.get("forget_unproven"))
        confirmed = None if confirm_start is None or CONFIRMED not in best else points(confirm_start - best[CONFIRMED])
        out.append(TrainedRadius(max(radii), len(rows), int(best["epoch"]), points(start_acc - best[reads]),
                                 _count(best.get("forget_robust_exposed")),
                                 None if unproven is None else forget_size - unproven,
                                 min(radii) if len(set(radii)) > 1 else None, confirmed))
    return tuple(sorted(out, key=lambda row: (row.train_gamma, row.ramp_from is None), reverse=True))


def _order(row: dict, start_acc: float, reads: str) -> tuple[float, float, float]:
    """Fewest exposed, then fewest unproven, then least cost; NaN and unmeasured last."""
    def key(value) -> float:
        return math.inf if value is None or math.isnan(float(value)) else float(value)
    return key(row.get("forget_robust_exposed")), key(row.get("forget_unproven")), key(start_acc - row[reads])


def budget_override(trained: tuple[TrainedRadius, ...], gamma: float, budget: float | None, bound_on: bool,
                    forget_size: int) -> tuple[Override | None, str | None]:
    """The larger budget that the fit measured would release: the cheapest best epoch trained at the promised
    radius or above with no image exposed (and, with the bound term on, every image proven), or trained below it
    with every image proven (a proof holds whatever radius trained: the gate's radius_fallback), when it cost more
    than the budget. (override, None) or (None, why not)."""
    at_radius = [row for row in trained if row.train_gamma >= gamma - 1e-9 or _proven_clear(row, forget_size)]
    if not at_radius:
        return None, (f"no epoch trained at {gamma:g}/255 or above (the radius rule kept below it), and none below "
                      "it with every image proven there")
    clear = [row for row in at_radius if row.exposed == 0 and (not bound_on or row.proven == forget_size)]
    if not clear:
        fewest = min(at_radius, key=lambda row: math.inf if row.exposed is None else row.exposed)
        return None, (f"no epoch at {gamma:g}/255 or above left every image unexposed (fewest: {fewest.exposed} at "
                      f"epoch {fewest.epoch}, trained at {fewest.train_gamma:g}/255): no budget was measured to "
                      f"release")
    cheapest = min(clear, key=lambda row: row.retain_cost)  # as the rule reads (the confirmation chooses nothing)
    if budget is not None and cheapest.cost <= 100.0 * budget + 1e-9:
        return None, (f"epoch {cheapest.epoch} was within the budget and cleared early stopping's attack; the "
                      "gate's judge refused the epoch kept, so a larger budget is not what is missing")
    proof = f", all {forget_size} interval-proven there" if cheapest.proven == forget_size else ""
    suggested = math.ceil(cheapest.cost / 100.0 / BUDGET_STEP - 1e-9) * BUDGET_STEP
    where = "on the retain rule's images" if cheapest.confirmed_cost is None else \
        (f"{cheapest.retain_cost:g} pt on the retain rule's images, {cheapest.confirmed_cost:g} pt confirmed on "
         "images no rule reads")
    return Override(f"method.early_stopping.retain_acc_drop_at_most={suggested:.3g}", cheapest.cost,
                    f"epoch {cheapest.epoch} of this run (trained at {cheapest.train_gamma:g}/255): 0 exposed at "
                    f"{gamma:g}/255 under early stopping's attack{proof}; {where}; a rerun's radius rule follows the "
                    "new budget too"), None


def _proven_clear(row: TrainedRadius, forget_size: int) -> bool:
    """Every forget image proven at the promised radius and none exposed there (unmeasured is neither)."""
    return row.proven == forget_size and row.exposed == 0


def judged_radii(gammas: list[float], exposed: Callable[[float], int | None], proven: Callable[[float], int | None],
                 passes: Callable[[float], bool]) -> tuple[JudgedRadius, ...]:
    """The kept weights at each radius of `gammas` (ascending)."""
    return tuple(JudgedRadius(g, exposed(g), proven(g), passes(g)) for g in sorted(gammas))


def radius_override(judged: tuple[JudgedRadius, ...], gamma: float, test_cost: float | None
                    ) -> tuple[Override | None, str | None]:
    """The largest radius below the promised one at which the gate passes the kept weights: one of
    attacks.gammas, or every image's least proven radius (the override then adds it to attacks.gammas)."""
    below = [row for row in judged if row.gamma < gamma and row.passes]
    if not below:
        clear = [row for row in judged if row.gamma < gamma]
        why = " (for a reason that is no image's, such as the retain rule: no smaller radius changes it)" \
            if clear and all(row.exposed == 0 for row in clear) else ""
        return None, f"the gate refuses the kept weights at every radius below {gamma:g}/255 it judged them at{why}"
    best = max(below, key=lambda row: row.gamma)
    cost = math.nan if test_cost is None else test_cost
    radii = sorted({row.gamma for row in judged if row.by == "attack"} | {best.gamma})
    override = f"attacks.robust_gamma={best.gamma:g}"
    if best.by == "bound":
        override = f"attacks.gammas=[{','.join(f'{g:g}' for g in radii)}] {override}"
    why = ("every image proven there, so no attack can exceed the threshold" if best.by == "bound" else
           "the same fit, judged at the smaller radius")
    return Override(override, cost, f"these very weights ({why}): their test-accuracy drop"), None


READS = {"retain_holdout_acc": "the held-out retain slice", "retain_acc": "the retain images trained on"}


def is_robust_fit(reported: dict) -> bool:
    """Whether the method's record is robust Alg 1's with what a frontier reads (its radius, its retain rule)."""
    return all(key in reported for key in ("train_gamma_target", "retain_rule_reads", "retain_rule_start_acc"))


def frontier(history: list[dict], reported: dict, gamma: float, judged: tuple[JudgedRadius, ...],
             test_cost: float | None, radius: dict, forget_size: int) -> Frontier:
    """The price of a refused robust release from the fit's `history`, the method's `reported` record (its kept
    epoch, radius, retain rule and budget), the kept weights `judged` at each radius, their `test_cost` (points)
    and proven `radius` summary (forget_proven_radius_min / _median)."""
    reads, start = str(reported["retain_rule_reads"]), float(reported["retain_rule_start_acc"])
    budget = reported.get("retain_acc_drop_at_most")
    target = reported.get("train_gamma_target")
    confirmed = reported.get("retain_confirmed") or {}
    confirm_start = float(confirmed["start_acc"]) if confirmed else None
    trained = trained_radii(history, reads, start, forget_size, None if target is None else float(target), gamma,
                            confirm_start)
    bound_on = float(reported.get("interval_weight") or 0.0) > 0
    offers = [budget_override(trained, gamma, budget, bound_on, forget_size),
              radius_override(judged, gamma, test_cost)]
    epoch = int(reported.get("best_epoch") or 0)
    row = history[epoch - 1] if 0 < epoch <= len(history) else {}
    kept = {"epoch": epoch, "train_gamma": reported.get("train_gamma_kept"),
            "retain_cost": points(start - row[reads]) if reads in row else None,
            "confirmed_cost": points(float(confirmed["cost"])) if confirmed else None,
            "confirmed_cost_upper": points(float(confirmed["cost_upper"])) if confirmed else None,
            "confirm_images": confirmed.get("images"), "test_cost": test_cost,
            "proven_radius_min": radius.get("forget_proven_radius_min"),
            "proven_radius_median": radius.get("forget_proven_radius_median")}
    where = {"val": "the validation images (val/)", "withheld": "the images withheld from D"}.get(
        reported.get("retain_holdout_source"), READS.get(reads, reads))
    return Frontier(gamma, budget, where, forget_size, kept, trained, judged,
                    tuple(offer for offer, _ in offers if offer is not None),
                    tuple(why for _, why in offers if why is not None))


def _radius_cell(row: dict) -> str:
    ramp = row.get("ramp_from")
    return f"{row['train_gamma']:g}/255" if ramp is None else f"ramp {ramp:g}-{row['train_gamma']:g}/255"


def _cell(value, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:g}{suffix}"


def format_frontier(record: dict) -> str:
    """The console's account of a refusal's price (results.json `frontier`), every line within 100 columns."""
    gamma, size = f"{record['gamma']:g}/255", record["forget_size"]
    budget = "none" if record["budget"] is None else \
        f"{100 * record['budget']:g} point{'' if 100 * record['budget'] == 1 else 's'}"
    lines = [f"the price of {gamma} (budget {budget} of accuracy on {record['reads']}):"]
    confirmed = any(row.get("confirmed_cost") is not None for row in record["trained"])
    rows = [["trained at", "epochs", "best epoch", "cost: rule / confirmed" if confirmed else "accuracy cost",
             f"exposed at {gamma}", f"interval-proven at {gamma}"]]
    rows += [[_radius_cell(row), str(row["epochs"]), str(row["epoch"]), _cost_cell(row),
              f"{_cell(row['exposed'])} of {size}",
              f"{_cell(row['proven'])} of {size}" if row["proven"] is not None else "-"] for row in record["trained"]]
    lines += _indented(rows)
    kept = record["kept"]
    confirmation = "" if kept.get("confirmed_cost") is None else \
        (f", confirmed {_cell(kept['confirmed_cost'], ' pt')} on {kept['confirm_images']} other images (at most "
         f"{_cell(kept['confirmed_cost_upper'], ' pt')} at {CONFIDENCE:.0%})")
    lines.append(_wrapped(f"kept epoch {kept['epoch']} (trained at {_cell(kept['train_gamma'], '/255')}): accuracy cost "
                 f"{_cell(kept['retain_cost'], ' pt')} as the rule read it{confirmation}, test cost "
                 f"{_cell(kept['test_cost'], ' pt')}, proven radius min / median {_cell(kept['proven_radius_min'])} / "
                 f"{_cell(kept['proven_radius_median'])}"))
    rows = [["judged at", "exposed", "proven", "gate"]]
    rows += [[f"{row['gamma']:g}/255" + (" (bound)" if row.get("by") == "bound" else ""),
              f"{_cell(row['exposed'])} of {size}",
              f"{_cell(row['proven'])} of {size}" if row["proven"] is not None else "-",
              "passes" if row["passes"] else "refuses"] for row in record["judged"]]
    lines += _indented(rows)
    for offer in record["overrides"]:
        lines.append(_wrapped(f"would release: {offer['override']} (cost {_cell(offer['cost'], ' pt')}: "
                              f"{offer['measured']})"))
    lines += [_wrapped(f"not offered: {why}") for why in record["unmeasured"]]
    return "\n".join(lines)


def _cost_cell(row: dict) -> str:
    """A row's cost as the rule read it, and where confirmed, on the confirmation images."""
    if row.get("confirmed_cost") is None:
        return _cell(row["retain_cost"], " pt")
    return f"{_cell(row['retain_cost'])} / {_cell(row['confirmed_cost'], ' pt')}"


def _wrapped(text: str) -> str:
    return wrapped(text, WIDTH, indent="    ")


def _indented(rows: list[list[str]]) -> list[str]:
    return ["  " + line for line in table(rows, WIDTH - 2).splitlines()]
