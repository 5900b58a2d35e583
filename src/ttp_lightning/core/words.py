"""The bound-based proof's words before issue 60, for reading the files written with them.

Until results.json `ttp_lightning.results/2` and config.json `ttp_lightning.release/3`, a CD proven by bounds within
a radius was "certified", the paper's word for the (epsilon, delta) certificate of Algs 2-4 too. The files now say
"proven" (proven CD, proven radius, `release_gate.require=[proven]`, `early_stopping.select=proven`); the names of
the certified learners and their certificates keep the paper's word. `upgraded` turns a document of the earlier
words into one of the new, so every reader reads one set of names; a document that states both an old and a new
name for one thing is refused (which of the two is meant is not for a reader to guess)."""

RESULTS_FORMAT = "ttp_lightning.results/2"  # results.json in these words; /1 (no format key) in the old ones
OLD_KEYS = {  # exact key -> key
    "certified": "proven",  # results.json's per-stage bound summaries, a per-image stage's CD, a gate kind's count
    "certified_radius": "proven_radius",
    "certified_bound": "proof_bound",
    "certified_note": "proof_note",
    "min_certified_radius": "min_proven_radius",
    "forget_certified_unproven": "forget_unproven",
    "val/forget_certified_unproven": "val/forget_unproven",
}
OLD_PREFIXES = {"forget_certified_": "forget_proven_", "val/forget_certified_": "val/forget_proven_"}
OLD_VALUES = {"require": {"certified": "proven"}, "select": {"certified": "proven"}}  # key -> {old value: new}


class BothWords(ValueError):
    """A document names one thing by its old and its new word."""


def new_key(key):
    """The key's name in the current words (itself when it was never renamed)."""
    if not isinstance(key, str):
        return key
    if key in OLD_KEYS:
        return OLD_KEYS[key]
    for old, new in OLD_PREFIXES.items():
        if key.startswith(old) and key not in OLD_KEYS:
            return new + key[len(old):]
    return key


def upgraded(document, where: str = ""):
    """`document` (JSON data) with every old key and value in the current words; BothWords names a key stated
    twice, once in each."""
    if isinstance(document, list):
        return [upgraded(item, where) for item in document]
    if not isinstance(document, dict):
        return document
    out = {}
    for key, value in document.items():
        name = new_key(key)
        if name in out or (name != key and name in document):
            raise BothWords(f"{where + '.' if where else ''}{name} is stated twice (as {key!r} and {name!r})")
        value = upgraded(value, f"{where}.{name}" if where else str(name))
        values = OLD_VALUES.get(name)
        if values is not None:
            value = [values.get(v, v) for v in value] if isinstance(value, list) else values.get(value, value)
        out[name] = value
    return out
