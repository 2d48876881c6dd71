"""Runtime configuration: one typed record, four sources, one precedence.

Precedence (highest first): command-line flags > environment `TORCHFLEET_<KEY>` > YAML file
(`--config`, else /etc/torchfleet/runtime.yml when it exists) > defaults. YAML keys are the long
flag names in snake_case. The keys, their types, defaults and allowed values are the settings
contract in torchfleet_compat.runtime_settings (infra and the inference_runtime role read it
too); this module reads the sources and parses every value with it, so bad values fail at start,
all of them in one ConfigError, each as torchfleet_compat.problems' sentence ("<source>: <key> =
<value> is invalid (<why>); allowed: <what>"), never deep inside a request.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from torchfleet_compat.problems import InvalidInput, Problems
from torchfleet_compat.runtime_settings import (
    ENV_PREFIX,
    FIELDS,
    UNAUTHENTICATED_ALLOWED,
    Config,
    access,
    defaults,
    parse_value,
)

__all__ = ["ENV_PREFIX", "FIELDS", "Config", "ConfigError", "access_of", "load_config"]

DEFAULT_CONFIG_FILE = "/etc/torchfleet/runtime.yml"


class ConfigError(InvalidInput):
    """Configuration values that are missing, unknown or out of range: every one, one line each."""


def _set(
    found: Problems,
    values: dict[str, Any],
    sources: dict[str, str],
    key: str,
    raw: Any,
    source: str,
) -> None:
    if key not in FIELDS:
        found.add(key, raw, "the keys " + ", ".join(sorted(FIELDS)), where=source)
        return
    try:
        value = parse_value(key, raw)
    except ValueError as exc:
        found.add(key, raw, FIELDS[key].allowed, where=source, why=str(exc))
        return
    values[key] = value
    sources[key] = source


def read_yaml(path: str) -> dict[str, Any]:
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML ({exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path}: expected a mapping of keys, got {type(data).__name__}"
        )
    return data


def load_config(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | None = None,
) -> tuple[Config, dict[str, str]]:
    """Merge defaults < YAML < env < flags; returns the config and where each set key came from.

    `flags` holds only the flags the user gave (None means "not given"). `config_file` None means
    the default file if it exists; an explicitly named file must exist.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    found = Problems()

    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path is None and Path(DEFAULT_CONFIG_FILE).is_file():
        path = DEFAULT_CONFIG_FILE
    if path is not None:
        for key, raw in read_yaml(path).items():
            _set(found, values, sources, str(key), raw, f"config file {path}")

    for key in FIELDS:
        raw = env.get(ENV_PREFIX + key.upper())
        if raw is not None:
            _set(found, values, sources, key, raw, f"env {ENV_PREFIX}{key.upper()}")

    for key, raw in (flags or {}).items():
        if raw is not None:
            _set(found, values, sources, key, raw, f"flag --{key.replace('_', '-')}")

    _check_combinations(values, sources, found)
    found.raise_if_any(ConfigError)
    return Config(**values), sources


def access_of(config: Config) -> str:
    """Who may call /v1/* under `config` (torchfleet_compat.runtime_settings.access), for the
    start-up log line, /v1/model and `diagnose`. A Config built in code skips load_config's
    refusal: then it says so plainly."""
    tokens = bool(config.api_token or config.api_token_file)
    stated = access(config.host, tokens, config.allow_unauthenticated)
    return stated or f"no token: anyone who reaches {config.host} (not checked at start)"


def _check_combinations(values: dict[str, Any], sources: dict[str, str], found: Problems) -> None:
    """Rules between keys, on the values that parsed (so one pass reports these too)."""
    model_format = values.get("model_format", defaults()["model_format"])
    factory = values.get("factory")
    if model_format == "eager" and not factory:
        found.add("factory", factory, "pkg.module:function, required when model_format is 'eager'")
    if factory and model_format not in ("auto", "eager"):
        found.add(
            "factory",
            factory,
            f"unset unless model_format is auto or eager (it is {model_format!r})",
            where=sources.get("factory", ""),
        )
    cert, key = values.get("tls_cert_file"), values.get("tls_key_file")
    if bool(cert) != bool(key):
        missing = "tls_key_file" if cert else "tls_cert_file"
        given = "tls_cert_file" if cert else "tls_key_file"
        found.add(missing, None, f"a PEM path, required when {given} is set (HTTPS needs both)")
    host = values.get("host", defaults()["host"])
    tokens = bool(values.get("api_token") or values.get("api_token_file"))
    if access(host, tokens, bool(values.get("allow_unauthenticated"))) is None:
        found.add(
            "host",
            host,
            UNAUTHENTICATED_ALLOWED,
            where=sources.get("host", ""),
            why="predictions on a non-loopback address with no API token",
        )
