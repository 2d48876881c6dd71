"""Configuration precedence and errors, the CLI, the demo model, and eager factory loading."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import rt_models
import torch
from torchfleet_runtime import cli, demo
from torchfleet_runtime.config import FIELDS, ConfigError, load_config
from torchfleet_runtime.model import ModelError, load

# A hang (a batch that never closes, a drain that never ends) fails fast instead of at 10 min.
pytestmark = pytest.mark.timeout(120)

CLI = str(Path(sys.executable).with_name("torchfleet-runtime"))


def test_flags_beat_env_beat_file_beat_defaults(tmp_path):
    f = tmp_path / "runtime.yml"
    f.write_text("port: 9000\nmax_delay_ms: 7\nprecision: bf16\nmodel: /m/file.pt\n")
    env = {"TORCHFLEET_PORT": "9100", "TORCHFLEET_MAX_DELAY_MS": "3.5", "TORCHFLEET_UNRELATED": "x"}
    cfg, sources = load_config({"port": "9200", "host": None}, env=env, config_file=str(f))
    assert cfg.port == 9200 and sources["port"] == "flag --port"
    assert cfg.max_delay_ms == 3.5 and sources["max_delay_ms"] == "env TORCHFLEET_MAX_DELAY_MS"
    assert cfg.precision == "bf16" and sources["precision"] == f"config file {f}"
    assert cfg.model == "/m/file.pt"
    assert cfg.host == "127.0.0.1" and "host" not in sources  # default
    assert cfg.max_batch_size is None  # auto


def test_env_can_name_the_config_file(tmp_path):
    f = tmp_path / "other.yml"
    f.write_text("max_batch_size: 16\ninput_shape: [3, 8, 8]\n")
    cfg, _ = load_config({}, env={"TORCHFLEET_CONFIG": str(f)})
    assert cfg.max_batch_size == 16 and cfg.input_shape == (3, 8, 8)


@pytest.mark.parametrize(
    "yaml_text, env, needles",
    [
        (
            "modle: x.pt\n",
            {},
            ["config file", "modle = 'x.pt' is invalid; allowed: the keys ", "model,"],
        ),
        ("precision: fp8\n", {}, ["precision = 'fp8' is invalid", "one of fp32, fp16, bf16"]),
        (
            "",
            {"TORCHFLEET_PORT": "http"},
            ["env TORCHFLEET_PORT: port = 'http' is invalid (expected an integer)", "1-65535"],
        ),
        ("warmup_iterations: 1\n", {}, ["warmup_iterations = 1 is invalid", "integer >= 3"]),
        ("memory_fraction: 1.5\n", {}, ["memory_fraction = 1.5 is invalid", "(0, 1]"]),
        ("device: gpu\n", {}, ["device = 'gpu' is invalid", "cuda:N"]),
        ("- just\n- a list\n", {}, ["expected a mapping"]),
        (
            "model_format: eager\n",
            {},
            ["factory = None is invalid", "required when model_format is 'eager'"],
        ),
    ],
)
def test_config_errors_name_the_key_value_and_what_is_allowed(tmp_path, yaml_text, env, needles):
    f = tmp_path / "runtime.yml"
    f.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_config({}, env=env, config_file=str(f))
    for needle in needles:
        assert needle in str(info.value)


def test_one_pass_reports_every_bad_value_of_every_source(tmp_path):
    f = tmp_path / "runtime.yml"
    f.write_text("precision: fp8\nmodle: x.pt\nmodel_format: onnx\n")
    env = {"TORCHFLEET_PORT": "http", "TORCHFLEET_MAX_QUEUE": "5"}
    flags = {"max_delay_ms": "-1", "factory": "pkg.mod:fn"}
    with pytest.raises(ConfigError) as info:
        load_config(flags, env=env, config_file=str(f))
    assert info.value.problems == [
        f"config file {f}: precision = 'fp8' is invalid; allowed: one of fp32, fp16, bf16",
        f"config file {f}: modle = 'x.pt' is invalid; allowed: the keys "
        + ", ".join(sorted(FIELDS)),
        "env TORCHFLEET_PORT: port = 'http' is invalid (expected an integer); "
        "allowed: an integer 1-65535",
        "flag --max-delay-ms: max_delay_ms = '-1' is invalid; allowed: a number >= 0",
        "flag --factory: factory = 'pkg.mod:fn' is invalid; allowed: unset unless model_format "
        "is auto or eager (it is 'onnx')",
    ]
    assert str(info.value) == "\n".join(info.value.problems)


def test_checks_against_the_machine_say_the_same_sentence(tmp_path):
    from torchfleet_runtime.model import resolve_device

    if torch.cuda.is_available():
        pytest.skip("cuda is a valid device on this machine")
    with pytest.raises(ConfigError) as info:
        resolve_device("cuda")
    assert str(info.value) == (
        "device = 'cuda' is invalid (CUDA is not available); allowed: auto, cpu"
    )
    proc = subprocess.run(
        [CLI, "serve", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},  # no TORCHFLEET_* settings
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "model = None is invalid; allowed: a path to the model file (--model PATH)" in (
        proc.stderr
    )


def test_a_named_config_file_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config({}, env={}, config_file=str(tmp_path / "nope.yml"))


def _serve(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CLI, "serve", *argv], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin"}
    )


def test_serve_reports_config_errors_with_exit_2():
    proc = _serve("--model", "m.pt", "--max-queue", "zero")
    assert proc.returncode == 2
    assert (
        "flag --max-queue: max_queue = 'zero' is invalid (expected an integer); "
        "allowed: an integer >= 1"
    ) in proc.stderr


def test_a_network_address_without_a_token_is_refused_naming_the_keys(tmp_path):
    """The image's case: host 0.0.0.0 and no token. The sentence names the key, the value and
    every way out (a loopback host, a token key, allow_unauthenticated)."""
    with pytest.raises(ConfigError) as err:
        load_config({}, env={"TORCHFLEET_HOST": "0.0.0.0"}, config_file=None)
    text = str(err.value)
    assert text.startswith("env TORCHFLEET_HOST: host = '0.0.0.0' is invalid"), text
    assert "predictions on a non-loopback address with no API token" in text
    for key in ("127.0.0.1", "api_token / api_token_file", "allow_unauthenticated: true"):
        assert key in text, key

    tokens = tmp_path / "tokens"
    tokens.write_text("a-token-of-sixteen-chars\n")
    for env in (
        {"TORCHFLEET_HOST": "0.0.0.0", "TORCHFLEET_API_TOKEN": "a-token-of-sixteen-chars"},
        {"TORCHFLEET_HOST": "10.0.1.5", "TORCHFLEET_API_TOKEN_FILE": str(tokens)},
        {"TORCHFLEET_HOST": "::", "TORCHFLEET_ALLOW_UNAUTHENTICATED": "true"},  # said so
        {"TORCHFLEET_HOST": "::1"},  # loopback: only this machine
        {"TORCHFLEET_HOST": "localhost"},
        {},  # the default host, 127.0.0.1
    ):
        load_config({}, env=env, config_file=None)


def test_serve_refuses_an_open_network_endpoint_before_loading_anything():
    proc = _serve("--model", "/nonexistent/m.pt", "--host", "0.0.0.0")
    assert proc.returncode == 2
    assert "flag --host: host = '0.0.0.0' is invalid (predictions on a non-loopback" in (
        proc.stderr
    )


def test_demo_model_is_deterministic_and_serves_its_own_answers(
    tmp_path, start_runtime, client_for
):
    proc = subprocess.run(
        [CLI, "demo-model", str(tmp_path / "a")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    demo.write_demo_model(tmp_path / "b")
    meta = json.loads((tmp_path / "a" / "model.json").read_text())
    assert meta["input_shape"] == [3, 64, 64] and meta["dtype"] == "float32" and meta["name"]
    assert 1_000_000 < meta["parameters"] < 1_500_000
    a = torch.jit.load(str(tmp_path / "a" / "model.pt"))
    b = torch.jit.load(str(tmp_path / "b" / "model.pt"))
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = a(x)
        assert torch.equal(want, b(x))  # same seed, same weights
    # metadata comes from the sidecar next to the model: no --input-shape here
    rt = start_runtime(model=str(tmp_path / "a" / "model.pt"), input_shape=None, max_batch_size=2)
    status, _, doc = client_for(rt).predict(x.tolist())
    assert status == 200 and rt.runtime.loaded.format == "torchscript"
    assert torch.allclose(torch.tensor(doc["outputs"]), want, atol=1e-4)


def test_eager_factory_with_a_state_dict(tmp_path):
    weights = tmp_path / "w.pt"
    trained = rt_models.tiny()
    with torch.no_grad():
        trained.fc.bias.fill_(42.0)  # differs from the factory's own init: must come from the file
    torch.save({"state_dict": trained.state_dict()}, weights)
    from torchfleet_runtime.config import Config

    loaded = load(Config(model=str(weights), factory="rt_models:tiny", input_shape=(4,)))
    out = loaded.predictor(torch.zeros(1, 4))
    assert loaded.format == "eager" and torch.allclose(out, torch.full((1, 3), 42.0))
    with pytest.raises(ModelError, match="has no attribute 'nope'"):
        load(Config(model=str(weights), factory="rt_models:nope", input_shape=(4,)))
    with pytest.raises(ModelError, match="does not fit 'torchfleet_runtime.demo:build_demo_model'"):
        load(
            Config(
                model=str(weights),
                factory="torchfleet_runtime.demo:build_demo_model",
                input_shape=(4,),
            )
        )


def test_precision_that_the_device_cannot_run_is_a_config_error():
    from torchfleet_runtime.config import Config

    if torch.cuda.is_available():
        pytest.skip("fp16 is valid on this machine")
    with pytest.raises(
        ConfigError,
        match=r"^precision = 'fp16' is invalid \(fp16 needs a CUDA device\); allowed: fp32, bf16$",
    ):
        load(Config(model="x.pt", precision="fp16", input_shape=(4,)), module=rt_models.tiny())


@pytest.mark.parametrize("form", ["eager", "torchscript"])
def test_bf16_on_cpu_runs_under_autocast(form, tmp_path, start_runtime, client_for):
    if form == "eager":
        rt = start_runtime(rt_models.tiny(), precision="bf16", max_batch_size=2)
    else:  # torch 1.12's JIT autocast pass fails here unless compat turns it off
        torch.jit.script(rt_models.tiny()).save(str(tmp_path / "tiny.pt"))
        rt = start_runtime(model=str(tmp_path / "tiny.pt"), precision="bf16", max_batch_size=2)
    status, _, doc = client_for(rt).predict([1.0, 2.0, 3.0, 4.0])
    assert status == 200
    want = rt_models.expected(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))[0]
    assert torch.allclose(torch.tensor(doc["outputs"]), want, rtol=0.05, atol=0.05)


def test_plugins_get_their_own_parser(monkeypatch):
    seen = {}

    class Plugin:
        @staticmethod
        def configure_parser(p: argparse.ArgumentParser) -> None:
            p.add_argument("--json", action="store_true")

        @staticmethod
        def run(args: argparse.Namespace) -> int:
            seen["json"] = args.json
            return 3

    monkeypatch.setitem(sys.modules, "fake_check_plugin", Plugin)
    monkeypatch.setitem(cli.PLUGINS, "check", ("fake_check_plugin", "x"))
    assert cli.main(["check", "--json"]) == 3 and seen == {"json": True}


class Stringly(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> str:  # type: ignore[override]
        return "not a tensor"


def test_a_model_whose_answer_cannot_be_encoded_fails_start_up_not_the_first_client(start_runtime):
    with pytest.raises(ModelError, match="returned str; expected a tensor"):
        start_runtime(Stringly(), max_batch_size=1)
