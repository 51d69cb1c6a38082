"""A gate config (YAML, gates/gsm8k/run.py shows one), read and checked against its schema: any error is one
line that says where, what was wrong and what is accepted."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

from gates.gsm8k.dataset import LINES
from gates.gsm8k.prompts import RECIPES

_FRACTION = {"type": "number", "minimum": 0, "maximum": 1}
_POSITIVE = {"type": "number", "exclusiveMinimum": 0}

SERVER = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "command": {"type": "string", "minLength": 1},
        "url": {"type": "string", "pattern": "^https?://"},
        "env": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}},
        "port": {"type": "integer", "minimum": 1, "maximum": 65535},
        "health_path": {"type": "string", "pattern": "^/"},
        "startup_timeout_s": _POSITIVE,
        "health_timeout_s": _POSITIVE,
    },
    "oneOf": [{"required": ["command"]}, {"required": ["url"]}],
}
CLIENT = {  # gates.gsm8k.client.ClientConfig, less base_url and model (the gate sets them)
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "mode": {"enum": ["completions", "chat"]},
        "max_tokens": {"type": "integer", "minimum": 1},
        "stop": {"type": "array", "items": {"type": "string"}},
        "seed": {"type": "integer"},
        "concurrency": {"type": "integer", "minimum": 1},
        "timeout_s": _POSITIVE,
        "retries": {"type": "integer", "minimum": 0},
        "backoff_s": {"type": "number", "minimum": 0},
        "backoff_max_s": {"type": "number", "minimum": 0},
        "progress": {"type": "boolean"},
    },
}
GATE = {  # gates.gsm8k.gate.GateRule
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "accuracy_threshold": {"anyOf": [_FRACTION, {"type": "null"}]},
        "tolerance": _FRACTION,
        "max_drop": _FRACTION,
        "alpha": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "max_invalid_rate": {"anyOf": [_FRACTION, {"type": "null"}]},
    },
}
SCHEMA = {  # gates.gsm8k.run.GateConfig
    "type": "object",
    "additionalProperties": False,
    "required": ["model", "recipe", "baseline", "candidate"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "recipe": {"enum": sorted(RECIPES)},
        "num_questions": {"type": "integer", "minimum": 1, "maximum": LINES["test"]},
        "num_shots": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
        "data": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "client": CLIENT,
        "gate": GATE,
        "baseline": SERVER,
        "candidate": SERVER,
    },
}


class ConfigError(ValueError):
    """The config file is missing, not YAML, or not a gate config; the message is one line."""


def _describe(error, path) -> str:
    where = "/".join(map(str, error.absolute_path)) or "top level"
    if error.validator == "oneOf":
        return f"{path}: {where}: give exactly one of command (a server the gate starts) or url (one already running)"
    accepted = ""
    if error.validator == "required":
        accepted = f"; required: {', '.join(error.schema['required'])}"
    elif error.validator == "additionalProperties":
        accepted = f"; accepted: {', '.join(error.schema['properties'])}"
    return f"{path}: {where}: {error.message}{accepted}"


EXAMPLE = "configs/gsm8k/qwen3-30b-a3b-vllm-megamoe.yaml"


def read(path) -> dict:
    """The config at ``path`` as a dict that matches SCHEMA, or a ConfigError."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(
            f"cannot read the config {path} ({err.strerror}); give a YAML file such as {EXAMPLE}"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not text (not UTF-8); give a YAML file such as {EXAMPLE}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path} is not valid YAML{at}: {getattr(err, 'problem', None) or err}") from None
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(SCHEMA).iter_errors(raw))
    if error is not None:
        raise ConfigError(_describe(error, path))
    return raw
