"""The release's card, README.md: a model hub's YAML metadata (licence, library, tags, data set, the Effect table's
after values as the hub's model-index results, and what the promise means), then what a release protects, how
well (the per-image numbers and the attacks), what it assumes and how to load it. The metadata restates the
Effect table's claims: verify robust compares the two (metadata_failures) and the table with what it recomputes."""

import re
from dataclasses import MISSING, fields
from types import SimpleNamespace

from ttp_lightning.assess.frontier import format_frontier
from ttp_lightning.assess.protection import bound_name, masking_note
from ttp_lightning.config.schema import AttacksSchema
from ttp_lightning.release.format import CARD, RELEASE_FORMAT, WEIGHTS

# ------------------------------------------------------------------------------------------- model card
ATTACKS_TEXT = ("An adversary who holds these weights perturbs a protected image to recover a confident "
                "prediction (the forget confidence distance it reaches; higher is worse). `proven` rows are "
                "upper bounds no perturbation within that radius can exceed; `relearn` rows finetune the weights "
                "on labelled images without the forget set (the test split, a sample of the retain data) for "
                "that many steps at several learning rates, and show the worst of them:")
FRONTIER_TEXT = ("What robust Alg 1 measured on its way to the promised radius: per radius it trained at, its "
                 "best epoch's accuracy cost on the images the retain rule reads and how many forget images were "
                 "exposed and proven at the promised radius; then these weights judged at each attack radius, and "
                 "the overrides that would release, each with the cost it was measured at (results.json "
                 "`frontier`).")
CERTIFICATE_TEXT = ("The certificate and the hashes of the released weights are in the run's release/ folder "
                    "(`python -m ttp_lightning.verify`).")
LIMITATIONS = (
    ("- Protection covers the listed forget images (matched by their pixels) and is measured on them; images "
     "that differ from them (other photos of the same person, crops, recompression) are not covered unless "
     "they were in the forget set."),
    ("- The attack table is empirical: stronger attacks than those run here may do better. The proven bound is "
     "a proof, but only for the L-inf ball of the stated radius around each forget image; beyond it nothing is "
     "proven."),
    ("- Open weights can be finetuned: the `relearn` rows show how far a short finetune on public images brings "
     "the forget images' predictions back; no change to the weights alone can rule that out."),
    "- Accuracy elsewhere was measured on the test set named above only.",
    "- The forget images themselves are not in this release; only their fingerprint is.",
    ("- What `verify robust` checks in this card: its title and the after column of the Effect table, against "
     "config.json and against what it recomputes from the weights and the images (each claim once). This prose, "
     "the before column and the attack table are not checked; `verify attack` re-attacks the images."),
)
LOAD_LINE = 'model = ttp_lightning.load_released("release")  # [N, C, H, W] pixels in [0, 1] -> logits'
PLAIN_LOADING = (f'or with safetensors alone: `load_file("release/{WEIGHTS}")` into the architecture (config.json '
                 "`architecture`), inputs normalised by config.json `input.mean` / `input.std`.")

def effect_rows(gamma: float, threshold: float, old_words: bool = False) -> dict:
    """The model card's Effect table: {key: (row label, how a stage's metrics give its cell)}, in order (verify
    robust reads the cells back from a card with the same labels; `old_words`: a card of a release before /3,
    whose labels said "certified" where they now say "proven")."""
    radius = f"{gamma:g}/255"
    rows = [("retain accuracy", "retain_acc", True), ("test accuracy", "test_acc", True),
            ("forget accuracy", "forget_acc", True),
            ("forget confidence distance (0 = uniform softmax)", "forget_conf_dist", False),
            ("forget confidence distance under attack", "forget_robust_conf_dist", False),
            ("test confidence distance", "test_conf_dist", False),
            ("worst forget image's confidence distance", "forget_worst_conf_dist", False),
            (f"worst forget image under attack ({radius})", "forget_robust_worst_conf_dist", False),
            (f"worst forget image, proven bound ({radius})", "forget_proven_worst_conf_dist", False),
            (f"smallest proven radius (1/255, CD <= {threshold:g})", "forget_proven_radius_min", None),
            (f"median proven radius (1/255, CD <= {threshold:g})", "forget_proven_radius_median", None)]
    counts = [(f"forget images with confidence distance > {threshold:g}", "forget_exposed", False),
              (f"forget images with confidence distance > {threshold:g} under attack ({radius})",
               "forget_robust_exposed", False),
              (f"forget images proven <= 0.05 within {radius}", "forget_proven_share_05", True),
              (f"forget images proven <= 0.1 within {radius}", "forget_proven_share_10", True)]
    word = (lambda label: label.replace("proven", "certified")) if old_words else (lambda label: label)
    table = {key: (word(label), lambda values, key=key, pct=pct: _metric(values, key, pct)) for label, key, pct in rows}
    table.update({key: (word(label), lambda values, key=key, pct=pct: _count(values, key, pct))
                  for label, key, pct in counts})
    return table


EFFECT_HEADING, EFFECT_HEADER = "## Effect", "| measure | before | after |"
DELIMITER_ROW = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)+\|?$")  # what makes the lines around it a table


def split_front_matter(card: str) -> tuple[str | None, str]:
    """(the YAML between a first line `---` and the next `---` line, or None; the card with those lines blanked,
    so its line numbers stay the file's)."""
    lines = card.splitlines()
    if not lines or lines[0].strip() != "---":
        return None, card
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        return None, card
    return "\n".join(lines[1:end]), "\n".join([""] * (end + 1) + lines[end + 1:])


def card_title(card: str) -> str:
    """The card's first line after its metadata (its `# ...` title)."""
    return next((line for line in split_front_matter(card)[1].splitlines() if line.strip()), "")


def card_cells(card: str, gamma: float, threshold: float, old_words: bool = False) -> tuple[dict[str, str], list[str]]:
    """({key: the "after" cell} of the Effect table, why the card cannot be read unambiguously). The card is read
    whole, its YAML metadata aside (metadata_failures reads that): its Effect table must hold this format's rows,
    each once and in order (a release/1 card may lack the radius rows), and nothing outside the table may look
    like one of its rows, or like any table (a second row for a claim, above or below the genuine one, is a claim
    that escapes comparison); HTML tables are refused."""
    rows = effect_rows(gamma, threshold, old_words)
    labels = {label: key for key, (label, _) in rows.items()}
    lines = split_front_matter(card)[1].splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == EFFECT_HEADING), None)
    if start is None:
        return {}, [f"{CARD} has no {EFFECT_HEADING!r} section"]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    cells, failures, fenced = {}, [], False
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if text.startswith("```"):
            fenced = not fenced
            continue
        if "<table" in text.lower() or "<td" in text.lower():
            failures.append(f"{CARD} line {number} holds an HTML table; a release card's claims are its Effect table")
            continue
        if fenced or "|" not in text:
            continue
        parts = [part.strip() for part in text.strip("|").split("|")]
        inside = start < number - 1 < end
        if inside and text in (EFFECT_HEADER, "|---|---|---|"):
            continue
        if not inside and not (text.startswith("|") or DELIMITER_ROW.match(text)):
            continue  # prose with a pipe in it (an experiment's name): no table without a delimiter row
        if not inside:
            failures.append(f"{CARD} line {number} is a table row outside the Effect table ({text[:60]!r}); a "
                            "claim there escapes comparison")
        elif parts[0] not in labels:
            failures.append(f"{CARD}'s Effect table has a row this format does not write: {parts[0][:60]!r}")
        elif labels[parts[0]] in cells:
            failures.append(f"{CARD} has two rows for {parts[0]!r}: a claim must be stated once")
        else:
            cells[labels[parts[0]]] = parts[-1] if len(parts) == 3 and text.startswith("|") and \
                text.endswith("|") else "?"
    order = [key for key in rows if key in cells]
    if list(cells) != order:
        failures.append(f"{CARD}'s Effect table rows are not in the order this format writes them")
    return cells, failures


def _metric(values: dict, key: str, percent: bool | None) -> str:
    """A cell: a percentage, a CD to 4 places, or (percent None) a radius as it is."""
    value = values.get(key)
    if not isinstance(value, (int, float)):
        return "-"
    if percent is None:
        return f"{value:g}"
    return f"{100 * value:.2f} %" if percent else f"{value:.4f}"


def _count(values: dict, key: str, percent: bool) -> str:
    value = values.get(key)
    if not isinstance(value, (int, float)):
        return "-"
    return f"{100 * value:.0f} %" if percent else f"{value:d}"


def number_of(cell: str) -> float | None:
    """The number an Effect table cell states ("96.10 %" -> 96.1, "0.0260" -> 0.026, "10.5" -> 10.5; "-" -> None)."""
    try:
        return float(cell.removesuffix(" %"))
    except ValueError:
        return None


def front_matter(results: dict, settings, cells: dict[str, tuple[str, str]]) -> str:
    """The hub's YAML metadata (huggingface_hub.ModelCardData): licence (`license`), library, tags, data set, the
    Effect table's after values (`cells`: {key: (label, cell)}) as model-index results, and `ttp_lightning`: the
    format, whether it is protected, the promise and what a proven radius means."""
    from huggingface_hub import EvalResult, ModelCardData

    gate, data_name = results["release_gate"], str(settings.data.name)
    protected = bool(gate["passed"])
    evals = [EvalResult(task_type="image-classification", dataset_type=data_name, dataset_name=data_name,
                        metric_type=key, metric_name=label, metric_value=number_of(cell))
             for key, (label, cell) in cells.items() if number_of(cell) is not None]
    metadata = ModelCardData(
        license=str(settings.license), library_name="pytorch", pipeline_tag="image-classification",
        datasets=[data_name], model_name=results["experiment"], eval_results=evals or None,
        tags=["ttp_lightning", "test-time-privacy", "image-classification",
              "protected" if protected else "not-protected", results["method"]],
        ttp_lightning={"format": RELEASE_FORMAT, "protected": protected, "gamma": gate["gamma"],
                       "conf_dist_at_most": gate["conf_dist_at_most"], "require": list(gate["require"]),
                       "radius": (f"the largest L-inf radius, in 1/255, within which a bound proves a forget "
                                  f"image's confidence distance <= {gate['conf_dist_at_most']:g}"),
                       "check": "python -m ttp_lightning.verify robust RELEASE FORGET_IMAGES"})
    return f"---\n{metadata.to_yaml()}\n---\n"


def metadata_failures(card: str, cells: dict[str, str], rows: dict, protected: bool) -> list[str]:
    """Where a card's YAML metadata says something its Effect table (`cells`, read by card_cells; `rows`:
    effect_rows) or config.json (`protected`) does not: a metric whose value differs from its row's cell, a
    metric no row states, a protected flag or tag that contradicts config.json, metadata the hub's reader cannot
    parse (with its errors ignored, a model-index missing a field is dropped whole: its numbers would show on a
    hub page and be compared with nothing). The YAML is read as data (huggingface_hub's safe loader); a card
    without metadata has nothing to compare (release/1-3)."""
    from huggingface_hub import ModelCard

    yaml_text, _ = split_front_matter(card)
    if yaml_text is None:
        return []
    try:
        data = ModelCard(card, ignore_metadata_errors=False).data
    except Exception as exc:  # noqa: BLE001 -- any unreadable metadata is a failure, never a pass
        return [f"{CARD}'s metadata cannot be read ({type(exc).__name__})"]
    failures = []
    for result in data.eval_results or []:
        key = getattr(result, "metric_type", None)
        if key not in rows:
            failures.append(f"{CARD}'s metadata states {key!r}, which its Effect table has no row for")
            continue
        stated, cell = getattr(result, "metric_value", None), number_of(cells.get(key, "-"))
        if not isinstance(stated, (int, float)) or isinstance(stated, bool) or cell is None or float(stated) != cell:
            failures.append(f"{CARD}'s metadata says {stated!r} for {rows[key][0]!r}; its Effect table says "
                            f"{cells.get(key, 'nothing')!r}")
    ours = data.to_dict().get("ttp_lightning") or {}
    tags = data.tags or []
    if ours.get("protected") is not protected or ("protected" in tags) != protected or \
            ("not-protected" in tags) == protected:
        failures.append(f"{CARD}'s metadata (ttp_lightning.protected, tags) contradicts config.json's \"protected\": "
                        f"{str(protected).lower()}")
    return failures


def starting_point(settings) -> str:
    """What the card says the release started from: the provider's checkpoint, or A(D) pretrained here (by
    certified pretraining, which is not the paper's ERM A(D), where `pretrain.certified` was on)."""
    if settings.model.get("checkpoint"):
        return "the provider's checkpoint (model.checkpoint)"
    certified = settings.pretrain.certified
    if certified.enabled:
        return (f"a model pretrained by ttp_lightning for an interval bound at {certified.gamma:g}/255 (certified "
                "pretraining, IBP with Shi et al. 2021's recipe; not the paper's ERM A(D))")
    return "a model pretrained by ttp_lightning"


def model_card(results: dict, method_label: str, attack_table: str | None, certificate_line: str | None,
               settings) -> str:
    """README.md: the hub's metadata (front_matter), then whether the release gate passed, what was done and
    why, the settings (the run's typed `settings`, config.schema.MainSchema), the measured effect (per image
    too) and the limitations."""
    data, metrics, gate = results["data"], results["metrics"], results["release_gate"]
    method, typed = results["method"], settings
    before, after = metrics.get("pretrain_original", metrics["pretrain"]), metrics[method]
    theta = method_theta(results, settings.method)
    gamma = f"{gate['gamma']:g}/255"
    rows = effect_rows(gate["gamma"], gate["conf_dist_at_most"])
    table = "\n".join(f"| {label} | {cell(before)} | {cell(after)} |" for label, cell in rows.values())
    start = starting_point(settings)
    what = (f"This model was rewritten with ttp_lightning ({method_label}) so that it is maximally uncertain (a "
            f"uniform softmax) on a protected forget set of {data['forget_size']} images while keeping its "
            f"accuracy elsewhere (test-time privacy). It starts from {start}. ")
    what += ("Every forget image passed the release gate (" + _gate_rule(gate) + "): anyone who runs it on a "
             "protected image gets no confident prediction for it." + _unrequired_sentence(gate, data["forget_size"])
             + _radius_sentence(after, gate) if gate["passed"] else
             "It did NOT pass the release gate (" + _gate_rule(gate) + "): do not publish it as protected.")
    settings = [
        f"- method: {method} ({method_label})" + (f", theta = {theta}{_theta_source(settings.method)}" if theta is not None else ""),
        (f"- data: {settings.data.name}; training set {data['train_size']} images, test set "
         f"{data['test_size']} images"),
        (f"- forget set: {data['forget_size']} images ({data.get('forget_from_test', 0)} from outside the "
         f"training data); SHA-256 fingerprint `{data['forget_fingerprint']}`"),
        judge_line(settings.attacks, gate["gamma"]),
        *_accuracy_line(after),
    ]
    title = f"# Model card: {results['experiment']} ({method_label})" + ("" if gate["passed"] else ": NOT PROTECTED")
    lines = [title, "", *_refusal(gate, results.get("frontier"))]
    lines += ["## What was done and why", "", what,
              "", "## Settings", "", *settings, "", "## Effect", "", "| measure | before | after |", "|---|---|---|",
              table, "", PER_IMAGE_TEXT.format(gamma=gamma, bound=bound_phrase(results)), ""]
    if attack_table:
        lines += ["## Attacks on the forget set", "", ATTACKS_TEXT, "", "```", attack_table, "```", ""]
    if certificate_line:
        lines += ["## Certificate", "", certificate_line, "", CERTIFICATE_TEXT, ""]
    masking = masking_note((results.get("attack_checks") or {}).get(method), data["forget_size"])
    lines += ["## Limitations", "", *LIMITATIONS, *([f"- The attacked CDs: {masking}."] if masking else []), "",
              "## Loading", "", "```python", "import ttp_lightning", "",
              LOAD_LINE, "```", "", PLAIN_LOADING, ""]
    return front_matter(results, typed, {key: (label, cell(after)) for key, (label, cell) in rows.items()}) \
        + "\n".join(lines)


def _refusal(gate: dict, frontier: dict | None) -> list[str]:
    """A refused release's sections: why, and (robust Alg 1) what the promise would cost."""
    if gate["passed"]:
        return []
    lines = ["## Not protected", "", *[f"- {reason}" for reason in gate["reasons"]], "",
             (f"{len(gate['failing_images'])} forget image(s) failed; the run's results.json lists them "
              "(`release_gate.failing_images`, `forget_per_image`)." if gate["failing_images"] else
              "Every forget image met the per-image bound; the reasons above concern how the model was "
              "obtained, so it is not released as protected either."), ""]
    if frontier is not None:
        lines += ["## What the promise would cost", "", FRONTIER_TEXT, "", "```", format_frontier(frontier), "```",
                  ""]
    return lines


def judge_line(attacks, gamma: float) -> str:
    """The attacks that measured the attacked CD (and the gate, where it requires it), with every way they are
    weaker than the default judge (conf/attacks/adaptive.yaml) named: a weakened judge is a weaker claim."""
    if attacks is None or not attacks.enabled:
        return "- attacks: off (no attacked CD was measured; nothing here is claimed under attack)"
    default = SimpleNamespace(**{item.name: item.default if item.default is not MISSING else item.default_factory()
                                 for item in fields(AttacksSchema)})  # the schema's defaults, unvalidated
    suite = [name for name, part in attacks.suite.items() if part is not None]
    objectives, betas = [str(o) for o in attacks.objectives], list(attacks.surrogate_betas)
    weaker = [f"{key} {getattr(attacks, key)} (default {getattr(default, key)})" for key in ("apgd_steps", "restarts")
              if getattr(attacks, key) < getattr(default, key)]
    weaker += [f"objectives without {', '.join(missing)}" for missing in
               [[str(o) for o in default.objectives if str(o) not in objectives]] if missing]
    weaker += [f"surrogate_betas without {missing}" for missing in
               [[b for b in default.surrogate_betas if b not in betas]] if missing]
    weaker += [] if "apgd" in suite else ["no APGD in the suite"]
    line = (f"- attacks measuring the attacked CD within {gamma:g}/255: {', '.join(suite)} (APGD {attacks.apgd_steps} "
            f"steps x {attacks.restarts} restarts; objectives {', '.join(objectives)}; ReLU surrogates "
            f"{', '.join('exact' if b is None else f'{b:g}' for b in betas)})")
    return line + (f"; WEAKER than the default judge: {'; '.join(weaker)}" if weaker else "")


def _accuracy_line(after: dict) -> list[str]:
    """Where Alg 1's retain rule read the accuracy it spends, beside the test accuracy (nothing without a slice)."""
    if "retain_holdout_acc" not in after:
        return []
    test = f", {after['test_acc']:.2%} on the test split" if "test_acc" in after else " (no test split)"
    where = {"val": "validation images of the provider's own (val/), which neither the model nor finetuning "
                    "trained on",
             "withheld": "training images withheld from D, which neither the model nor finetuning trained on"
             }.get(after.get("retain_holdout_source"), "held-out retain images it never trained on")
    lines = [(f"- accuracy: {after['retain_fit_acc']:.2%} on the retain images finetuning trained on, "
              f"{after['retain_holdout_acc']:.2%} on the {after['retain_holdout_size']} {where} "
              f"(what the retain rule read){test}")]
    confirmed = after.get("retain_confirmed")
    if confirmed:
        against = "A(D)'s accuracy on them" if confirmed["paired"] else "A(D)'s on the test split"
        lines.append(f"- accuracy cost, confirmed: {100 * confirmed['cost']:.2f} points ({confirmed['kept_acc']:.2%} "
                     f"against {against}, {confirmed['start_acc']:.2%}) on {confirmed['images']} more such images "
                     f"that no rule chose the kept epoch by; at most {100 * confirmed['cost_upper']:.2f} points at "
                     f"{confirmed['confidence']:.0%} confidence (a one-sided exact bound)")
    selected = after.get("retain_selected")
    if selected:
        lines.append(f"- accuracy cost, not confirmed: {100 * selected['cost']:.2f} points on the "
                     f"{selected['images']} held-out images the retain rule read (too few to split off images no "
                     f"rule reads); at most {100 * selected['cost_upper']:.2f} points at "
                     f"{selected['confidence']:.0%} confidence over the {selected['compared']} epochs it could "
                     "compare (a one-sided exact bound, a union over the epochs)")
    return lines


def _unrequired_sentence(gate: dict, forget_size: int) -> str:
    """Passed at the images, not within the radius: say it where a publisher reads."""
    above = gate.get("unrequired_above") or {}
    if not above:
        return ""
    parts = " and ".join(f"{count} of {forget_size} images have {kind} confidence distance above "
                         f"{gate['conf_dist_at_most']:g}" for kind, count in above.items())
    return (f" It is NOT protected against an attacker who may change a protected image by up to "
            f"{gate['gamma']:g}/255 per pixel: {parts} within that radius (the gate did not require it; "
            f"`release_gate.require=[clean,{','.join(above)}]` would have refused this release).")


def _radius_sentence(after: dict, gate: dict) -> str:
    """What is proven within a radius, from the smallest proven radius (nothing when it is 0 or unknown)."""
    least = after.get("forget_proven_radius_min")
    if not least:
        return ""
    return (f" Provably, from these weights alone: no change of up to {least:g}/255 per pixel to any protected "
            f"image brings its confidence distance above {gate['conf_dist_at_most']:g} (the smallest proven "
            "radius below).")


def _gate_rule(gate: dict) -> str:
    return (f"every forget image's {' / '.join(gate['require'])} confidence distance at most "
            f"{gate['conf_dist_at_most']:g}" + (f", within {gate['gamma']:g}/255" if len(gate["require"]) > 1 else ""))


PER_IMAGE_TEXT = ("Per image: a release is judged by its worst protected image, not the mean. The proven bound is "
                  "an upper bound on the confidence distance anywhere within {gamma} (L-inf, pixels in [0, 1]) of "
                  "each forget image, computed from these weights alone ({bound}); an image's proven radius is the "
                  "largest L-inf radius at which "
                  "that bound is at most the gate's threshold. Anyone holding the weights and the images can "
                  "recompute both: `python -m ttp_lightning.verify robust RELEASE_DIR IMAGES_DIR`.")
BOUND_PHRASES = {"intervals": "interval bound propagation",
                 "CROWN-IBP": "linear bound propagation, CROWN with interval pre-activation bounds (CROWN-IBP), never "
                              "looser than interval bounds",
                 "CROWN": "linear bound propagation, CROWN, never looser than interval bounds",
                 "alpha-CROWN": "linear bound propagation, CROWN with optimised ReLU slopes (alpha-CROWN), never "
                                "looser than interval bounds"}


def bound_phrase(results: dict) -> str:
    """The bound that gave the released model's proven values, in words, and whether a rule chose it."""
    record = (results.get("proof_bound") or {}).get(results.get("method")) or {}
    name = bound_name(record)
    if name is None:
        return "no bound supports this network's layers"
    rule = record.get("rule")
    return BOUND_PHRASES[name] + (f"; chosen by bounds.kind=auto as the bound that proved the most on "
                                  f"{rule['probe_images']} forget images within {rule['seconds_per_image_allowed']:g} "
                                  "s per image" if rule else "")


def _theta_source(method) -> str:
    return " (chosen by the theta rule: method.theta=auto)" if getattr(method, "theta", None) == "auto" else ""


def method_theta(results: dict, method):
    """The theta the method used: the one its rule chose (`method.theta=auto`), else its typed settings' (`method`;
    None for a method without one)."""
    return results["metrics"][results["method"]].get("theta", getattr(method, "theta", None))
