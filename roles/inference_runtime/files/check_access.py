#!/usr/bin/env python3
"""Refuse, on the controller before anything is installed, a node that the runtime itself would
refuse to start: predictions on a non-loopback host with no API token and no
allow_unauthenticated. The rule is the runtime's own (torchfleet_compat.runtime_settings.access),
the sentence the project's one (torchfleet_compat.problems.sentence). Without this check the role
would write the configuration, start a service that exits at once and wait out every readiness
retry.

usage: check_access.py COMPAT_PATH VARS_JSON

COMPAT_PATH is the compat wheel or source directory being deployed; VARS_JSON holds the role's
inference_runtime_host, inference_runtime_allow_unauthenticated, inference_runtime_config (whose
keys win, as in templates/runtime.yml.j2) and token_given (the role writes a token file).
Prints nothing when the settings are allowed, else one sentence naming the variables.
"""

import json
import sys

CONFIG = "inference_runtime_config"


def main(argv):
    sys.path.insert(0, argv[1])
    from torchfleet_compat.problems import sentence
    from torchfleet_compat.runtime_settings import FIELDS, access, parse_value

    given = json.loads(argv[2])
    config = given[CONFIG] or {}
    parsed, names = {}, {}
    for key in ("host", "allow_unauthenticated"):
        # inference_runtime_config's keys override the role's own variables (runtime.yml.j2)
        names[key] = f"{CONFIG}.{key}" if key in config else f"inference_runtime_{key}"
        raw = config[key] if key in config else given[f"inference_runtime_{key}"]
        try:
            parsed[key] = parse_value(key, raw)
        except ValueError as exc:
            print(
                f"inference_runtime: {sentence(names[key], raw, FIELDS[key].allowed, why=str(exc))}"
            )
            return 0
    tokens = bool(given["token_given"] or config.get("api_token") or config.get("api_token_file"))
    if access(parsed["host"], tokens, bool(parsed["allow_unauthenticated"])) is not None:
        return 0
    allowed = (
        "a loopback host (127.0.0.1, ::1, localhost); or a token: "
        "inference_runtime_api_token_command or inference_runtime_api_token (or api_token / "
        f"api_token_file in {CONFIG}); or {names['allow_unauthenticated']}: true to serve "
        "predictions to the network without a token on purpose"
    )
    why = "predictions on a non-loopback address with no API token"
    print(f"inference_runtime: {sentence(names['host'], parsed['host'], allowed, why=why)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
