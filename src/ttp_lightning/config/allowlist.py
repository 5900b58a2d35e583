"""How this package reads a file from outside (a release's config.json, a certificate, an audit record): strict
JSON, every value checked against a typed allowlist of fields, and the data set and model it names rebuilt from
this package's own registered configs (conf/), never from the file.

Nothing in such a file is ever instantiated, imported or unpickled: it may only name a registered data set and a
registered model, plus typed scalar settings from a fixed list. Any other key (e.g. `_target_`), a wrong type, a
string that is not a plain name or a file name with a path in it is a `FormatError` (verify: one `error:` line,
exit 2). Non-finite numbers pass the allowlist and fail verify's checks instead (they are a false statement, not
an unreadable one). The formats themselves: release/format.py (config.json), certified/certificate/format.py (the
certificate and the audit record).
"""

import json
import math
import re
from collections.abc import Callable

from ttp_lightning.config.build import (
    Node,
    Part,
    registered_file,
    to_plain,
)
from ttp_lightning.config.choices import CONF_DIR
from ttp_lightning.config.naming import registered_models
from ttp_lightning.config.schema import DataSchema, plain
from ttp_lightning.core.errors import TTPUserError

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}\.safetensors$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class FormatError(TTPUserError):
    """A file from outside (config.json, a certificate, an audit record) that is not in the allowed shape
    (unusable or hostile input)."""


Check = Callable[[object, str], object]


def strict_json(text: str):
    """JSON as a checker must read it: a key twice in one object is refused (FormatError), since readers disagree
    on which of the two counts (Python's json takes the last, others the first) and so would a second checker."""
    def pairs(items):
        seen = {}
        for key, value in items:
            if key in seen:
                raise FormatError(f"the key {key!r} appears twice in one object; a claim is stated once")
            seen[key] = value
        return seen

    return json.loads(text, object_pairs_hook=pairs)


def _fail(key: str, value, allowed: str):
    shown = repr(value)
    raise FormatError(f"{key}={shown[:80]}{'...' if len(shown) > 80 else ''} is not allowed; {allowed}")


def integer(value, key):
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(key, value, "expected an integer")
    return value


def number(value, key):
    """Any float or int (NaN and infinities pass here; verify's checks reject them)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(key, value, "expected a number")
    return float(value)


def finite(value, key):
    if not math.isfinite(number(value, key)):
        _fail(key, value, "expected a finite number")
    return value


def fraction(value, key):
    if not 0.0 <= number(finite(value, key), key) <= 1.0:
        _fail(key, value, "expected a number in [0, 1]")
    return value


def count(value, key):
    if integer(value, key) < 0:
        _fail(key, value, "expected an integer >= 0")
    return value


def boolean(value, key):
    if not isinstance(value, bool):
        _fail(key, value, "expected true or false")
    return value


def name(value, key):
    if not isinstance(value, str) or not _NAME.match(value):
        _fail(key, value, "expected a plain name (letters, digits, _ . -)")
    return value


def hex64(value, key):
    if not isinstance(value, str) or not _HEX64.match(value):
        _fail(key, value, "expected 64 lowercase hex digits")
    return value


def weights_file(value, key):
    if not isinstance(value, str) or not _FILE.match(value):
        _fail(key, value, "expected a file name ending in .safetensors, without a folder")
    return value


def one_of(*choices) -> Check:
    def check(value, key):
        if value not in choices or isinstance(value, bool):
            _fail(key, value, f"choose one of: {', '.join(map(str, choices))}")
        return value
    return check


def optional(inner: Check) -> Check:
    return lambda value, key: None if value is None else inner(value, key)


def list_of(inner: Check, max_items: int = 100_000) -> Check:
    def check(value, key):
        if not isinstance(value, list) or len(value) > max_items:
            _fail(key, value, f"expected a list of at most {max_items} items")
        return [inner(item, f"{key}[{i}]") for i, item in enumerate(value)]
    return check


def record(fields: dict[str, Check]) -> Check:
    """A dict with exactly these keys, each checked."""
    def check(value, key):
        if not isinstance(value, dict):
            _fail(key, value, "expected an object")
        unknown = sorted(set(value) - set(fields))
        if unknown:
            _fail(f"{key}.{unknown[0]}" if key else unknown[0], value[unknown[0]],
                  f"this key is not part of the format (allowed: {', '.join(sorted(fields))})")
        missing = sorted(set(fields) - set(value))
        if missing:
            raise FormatError(f"{key + '.' if key else ''}{missing[0]} is missing")
        return {k: fields[k](v, f"{key}.{k}" if key else k) for k, v in value.items()}
    return check


def metric_value(value, key):
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return name(value, key)


def metrics_map(value, key):
    if not isinstance(value, dict) or len(value) > 200:
        _fail(key, value, "expected an object of at most 200 metrics")
    return {name(k, f"{key} key"): metric_value(v, f"{key}.{k}") for k, v in value.items()}


# ----------------------------------------------------------------------------------- data and model
def registered(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


DATA_FIELDS: dict[str, Check] = {
    "split": one_of("official", "paper"), "train_fraction": fraction, "split_seed": integer,
    "batch_size": count, "forget_batch_size": count, "eval_batch_size": count,
    "augment": one_of("none", "crop_flip"), "normalize": boolean,
    "max_train_size": optional(count), "max_test_size": optional(count), "seed": integer,
    "forget": record({"size": optional(count), "seed": integer, "source": one_of("train", "test", "mixed"),
                      "test_fraction": fraction, "requests": optional(list_of(count, 10_000)),
                      "from_file": boolean}),
}
# Never taken from a certificate (DATA_FIELDS names what is): where the data lives and whether to download it
# are the verifier's choices (command line), an index file is a path on the provider's machine, `_target_`
# and `loader` are code (the loader comes from this package's registered conf/data/<name>.yaml).


def _model_field(default) -> Check | None:
    """The check for one model setting, from the type of its default in the registered config."""
    if isinstance(default, bool):
        return boolean
    if isinstance(default, int):
        return count
    if isinstance(default, float):
        return finite
    if isinstance(default, str):
        return name
    if isinstance(default, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in default):
        return list_of(count, 64)
    return None


MODEL_EXCLUDED = ("_target_", "pretrained", "pretrained_file", "checkpoint", "checkpoint_test_acc")  # no downloads, no user files


def _registered_config(group: str, choice: str) -> Node:
    if choice not in registered(group):
        raise FormatError(f"{group}.name={choice!r} is not a registered {group}; choose one of: "
                          f"{', '.join(registered(group))}")
    return registered_file(group, choice)


# A model setting called `name` (model=timm's architecture) is stored as `model_name`: a spec's `name` is the
# registered config's.
SPEC_KEYS = {"name": "model_name"}
CONFIG_KEYS = {spec: key for key, spec in SPEC_KEYS.items()}


def model_fields(choice: str) -> dict[str, Check]:
    """The spec's keys (SPEC_KEYS renamed) with their checks."""
    base = _registered_config("model", choice)
    fields = {}
    for key, default in to_plain(base).items():
        check = None if key in MODEL_EXCLUDED else _model_field(default)
        if check is not None:
            fields[SPEC_KEYS.get(key, key)] = check
    return fields


def model_settings(spec: dict) -> dict:
    """A checked spec's settings under the model config's own keys (without the registered name)."""
    return {CONFIG_KEYS.get(key, key): value for key, value in spec.items() if key != "name"}


def check_data_spec(spec, key: str = "data") -> dict:
    if not isinstance(spec, dict):
        _fail(key, spec, "expected an object")
    choice = name(spec.get("name"), f"{key}.name")
    _registered_config("data", choice)
    return {"name": choice, **record(DATA_FIELDS)({k: v for k, v in spec.items() if k != "name"}, key)}


def check_model_spec(spec, key: str = "model") -> dict:
    if not isinstance(spec, dict):
        _fail(key, spec, "expected an object")
    choice = name(spec.get("name"), f"{key}.name")
    fields = model_fields(choice)
    return {"name": choice, **record(fields)({k: v for k, v in spec.items() if k != "name"}, key)}


def data_spec(data: DataSchema) -> dict:
    """The certificate's description of the data: the registered name and the allowed settings."""
    container = plain(data)
    forget = container["forget"]
    requests = forget.get("requests")
    from_file = forget.get("indices_file") is not None or any(isinstance(r, str) for r in requests or [])
    spec = {"name": container["name"],
            **{k: container[k] for k in DATA_FIELDS if k != "forget"},
            "forget": {"size": forget["size"], "seed": forget["seed"], "source": forget["source"],
                       "test_fraction": forget["test_fraction"],
                       "requests": None if from_file or requests is None else list(requests),
                       "from_file": from_file}}
    return check_data_spec(spec)


def model_spec(model: Part | Node) -> dict:
    """The registered model config with this target and keys, and the values of its allowed settings."""
    container = plain(model)
    for choice, base in registered_models():
        if base.get("_target_") == container.get("_target_") and set(base) == set(container):
            fields = model_fields(choice)
            return check_model_spec({"name": choice, **{k: container[CONFIG_KEYS.get(k, k)] for k in fields}})
    raise TTPUserError(f"model {container.get('_target_')} matches no registered model config; a certified "
                       f"release needs one of: {', '.join(registered('model'))}")


