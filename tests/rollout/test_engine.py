"""The rollout loop against a recorded fleet and scripted windows (no sleeping, no network):
which nodes switch when, the weights at every step, the verdicts and the record it leaves.
tests/rollout/test_local_rollout.py runs the same engine on real runtimes behind HAProxy."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest

from infra.rollout.engine import EQUAL_WEIGHT, Options, Rollout, RolloutError
from infra.rollout.policy import Figures, GuardSettings
from infra.rollout.ref import ModelRef, RefError, Store
from infra.rollout.signals import SignalError
from infra.rollout.state import RolloutState


class FakeFleet:
    def __init__(self, folder: Path, n: int = 3) -> None:
        self.files = {f"node-{i}": folder / f"node-{i}.pt" for i in range(n)}
        for f in self.files.values():
            f.write_bytes(b"stable")
        self.events: list[tuple[str, object]] = []
        self.weights = {name: EQUAL_WEIGHT for name in self.files}
        self.fail_switch = False

    def nodes(self) -> list[str]:
        return list(self.files)

    def version_of(self, data: bytes) -> str:
        return "v1" if data == b"stable" else "v2"

    def serving(self, node: str) -> tuple[Path, str]:
        return self.files[node], self.version_of(self.files[node].read_bytes())

    def switch(self, node: str, model: Path) -> str:
        if self.fail_switch and model.read_bytes() != b"stable":
            raise RuntimeError("reload answered 422: not a TorchScript archive")
        self.files[node].write_bytes(model.read_bytes())
        self.events.append(("switch", (node, self.serving(node)[1])))
        return self.serving(node)[1]

    def set_weights(self, weights: dict[str, int]) -> None:
        self.weights.update(weights)
        self.events.append(("weights", dict(self.weights)))

    def set_shadow(self, node: str, model: Path | None) -> str | None:
        self.events.append(("shadow", (node, model is not None)))
        return None if model is None else "v2"


class Windows:
    """Each window's figures, scripted: `cand` (requests, errors, p99) per window."""

    def __init__(self, cand: list[tuple[float, float, float]]) -> None:
        self.cand = list(cand)
        self.opened = 0

    def begin(self) -> None:
        self.opened += 1

    def end(self) -> dict[str, Figures]:
        req, err, p99 = self.cand.pop(0) if self.cand else (100, 0, 0.05)
        return {"v1": Figures("v1", 500, 0, 0.05), "v2": Figures("v2", req, err, p99)}


@pytest.fixture
def setup(tmp_path):
    fleet = FakeFleet(tmp_path)
    cand = tmp_path / "cand.pt"
    cand.write_bytes(b"candidate")
    ref = ModelRef(str(cand), hashlib.sha256(b"candidate").hexdigest())
    state = RolloutState(tmp_path / "state" / "rollout.json")
    lines: list[str] = []
    clock = [0.0]

    def make(windows: Windows, **opts) -> Rollout:
        def sleep(s: float) -> None:
            clock[0] += s

        return Rollout(
            fleet,
            state,
            Store(tmp_path / "store"),
            windows,
            Options(bake_s=10, window_s=5, guards=GuardSettings(), **opts),
            say=lines.append,
            clock=lambda: clock[0],
            sleep=sleep,
        )

    return fleet, ref, state, lines, make


def test_a_good_candidate_is_promoted_through_every_step(setup):
    fleet, ref, state, lines, make = setup
    assert make(Windows([]), strategy="linear").start(ref) == "promoted"
    switched = [e[1] for e in fleet.events if e[0] == "switch"]
    # 25 % -> 1 node, 50 % -> 2 (round(1.5)), 75 % -> 2, 100 % -> 3; never back
    assert switched == [("node-0", "v2"), ("node-1", "v2"), ("node-2", "v2")]
    doc = state.read()
    assert doc["status"] == "promoted"
    assert (doc["stable"]["version"], doc["previous"]["version"]) == ("v2", "v1")
    assert [e["decision"] for e in doc["timeline"]][-1] == "promoted"
    assert sum(1 for e in doc["timeline"] if e["decision"] == "ok") == 8  # 2 windows x 4 steps
    assert fleet.weights == {n: EQUAL_WEIGHT for n in fleet.files}
    assert any("step 1/4: 25 % of requests" in line for line in lines)


def test_a_switch_happens_out_of_the_rotation(setup):
    fleet, ref, _, _, make = setup
    make(Windows([]), strategy="canary").start(ref)
    first = fleet.events.index(("switch", ("node-0", "v2")))
    assert fleet.events[first - 1] == ("weights", {"node-0": 0, "node-1": 90, "node-2": 90})
    # the canary step: about 10 % to node-0
    assert fleet.events[first + 1] == ("weights", {"node-0": 20, "node-1": 90, "node-2": 90})


def test_a_candidate_answering_5xx_is_rolled_back_by_the_error_guard(setup):
    fleet, ref, state, lines, make = setup
    assert make(Windows([(100, 30, 0.05)])).start(ref) == "rolled_back"
    rollback = next(line for line in lines if line.startswith("ROLLBACK"))
    assert "guard error_ratio: candidate error ratio 30.00 % > stable 0.00 % + 0.10 %" in rollback
    # out of rotation before it reloads the stable model, then back in
    i = fleet.events.index(("switch", ("node-0", "v1")))
    assert fleet.events[i - 1] == ("weights", {"node-0": 0, "node-1": 100, "node-2": 100})
    assert all(fleet.serving(n)[1] == "v1" for n in fleet.files)
    doc = state.read()
    assert doc["status"] == "rolled_back" and doc["stable"]["version"] == "v1"
    assert doc["timeline"][-1]["guard"] == "error_ratio"


def test_a_slow_candidate_is_rolled_back_by_the_p99_guard(setup):
    fleet, ref, state, lines, make = setup
    assert make(Windows([(100, 0, 0.05), (100, 0, 0.3)])).start(ref) == "rolled_back"
    assert state.read()["timeline"][-1]["guard"] == "p99"
    assert "candidate p99 300.0 ms > 1.2 x stable 50.0 ms" in "\n".join(lines)


def test_too_little_traffic_rolls_back_after_three_bakes(setup):
    fleet, ref, state, _, make = setup
    windows = Windows([(3, 0, 0.05)] * 10)
    assert make(windows).start(ref) == "rolled_back"
    assert state.read()["timeline"][-1]["guard"] == "min_requests"
    assert windows.opened == 6  # 3 x 10 s of 5 s windows


def test_a_digest_mismatch_moves_nothing(setup):
    fleet, ref, state, _, make = setup
    with pytest.raises(RefError, match="nothing was changed"):
        make(Windows([])).start(ModelRef(ref.location, "f" * 64))
    assert fleet.events == [] and state.read()["status"] == "idle"


def test_a_candidate_that_does_not_load_leaves_the_stable_serving(setup):
    fleet, ref, state, lines, make = setup
    fleet.fail_switch = True
    assert make(Windows([])).start(ref) == "rolled_back"
    assert state.read()["timeline"][-1]["guard"] == "load"
    assert fleet.weights == {n: EQUAL_WEIGHT for n in fleet.files}


def test_figures_that_cannot_be_read_roll_back_after_three_windows_in_a_row(setup):
    fleet, ref, state, lines, make = setup

    class Blind(Windows):
        """The source fails in the 2nd window, recovers, then fails from the 4th on."""

        def end(self) -> dict[str, Figures]:
            if self.opened == 2 or self.opened >= 4:
                raise SignalError(
                    f"Prometheus at http://mon:9090: timed out (window {self.opened})"
                )
            return super().end()

    # linear: 4 steps of 2 windows; a step whose bake had an ok window ends at its deadline
    assert make(Blind([]), strategy="linear").start(ref) == "rolled_back"
    timeline = [e for e in state.read()["timeline"] if "step" in e]
    assert [(e["decision"], e["guard"]) for e in timeline] == [
        ("ok", ""),
        ("wait", "signals"),  # one blind window judges nothing
        ("ok", ""),  # and a readable one resets the count
        ("wait", "signals"),
        ("wait", "signals"),
        ("rollback", "signals"),
        ("rolled_back", "signals"),  # the rollback's own entry, once every node is back
    ]
    rollback = next(line for line in lines if line.startswith("ROLLBACK"))
    assert "3 windows in a row without figures; the last: Prometheus at http://mon:9090" in rollback
    assert all(fleet.serving(n)[1] == "v1" for n in fleet.files)


def test_abort_and_pause_are_read_between_windows(setup):
    fleet, ref, state, lines, make = setup

    class Controlled(Windows):
        def end(self) -> dict[str, Figures]:
            if self.opened == 1:
                state.update(lambda d: d.update(control="pause"))
            if self.opened == 2:  # a paused rollout opens no window until resumed
                raise AssertionError("judged while paused")
            return super().end()

    w = Controlled([])
    r = make(w)
    original_sleep = r.sleep
    naps = [0]

    def sleep(s: float) -> None:
        original_sleep(s)
        if state.read()["status"] == "paused":
            naps[0] += 1
            if naps[0] == 3:
                state.update(lambda d: d.update(control="abort"))

    r.sleep = sleep
    assert r.start(ref) == "aborted"
    assert any(line.startswith("paused") for line in lines)
    assert state.read()["status"] == "aborted"
    assert all(fleet.serving(n)[1] == "v1" for n in fleet.files)


def test_an_ab_split_holds_until_aborted(setup):
    fleet, ref, state, lines, make = setup

    class Held(Windows):
        def end(self) -> dict[str, Figures]:
            if self.opened == 40:  # long past any bake: still held, then the operator ends it
                assert state.read()["status"] == "running"
                state.update(lambda d: d.update(control="abort"))
            return super().end()

    w = Held([])
    r = make(w, strategy="ab", steps="10")
    r.options.bake_s = math.inf  # what the command sets for --strategy ab
    assert r.start(ref) == "aborted"
    assert w.opened == 40
    held = [e[1] for e in fleet.events if e[0] == "weights"]
    assert held.count({"node-0": 20, "node-1": 90, "node-2": 90}) == 1  # set once, kept
    assert sum(1 for e in state.read()["timeline"] if e["decision"] == "ok") == 40
    assert all(fleet.serving(n)[1] == "v1" for n in fleet.files)  # abort: back to stable


def test_an_ab_split_is_rolled_back_by_a_guard(setup):
    fleet, ref, state, lines, make = setup
    r = make(Windows([(100, 0, 0.05)] * 5 + [(100, 30, 0.05)]), strategy="ab", steps="10")
    r.options.bake_s = math.inf
    assert r.start(ref) == "rolled_back"
    last = state.read()["timeline"][-1]
    assert (last["guard"], last["decision"]) == ("error_ratio", "rolled_back")
    assert sum(1 for e in state.read()["timeline"] if e["decision"] == "ok") == 5


def test_rollback_after_a_promotion_returns_to_the_previous_version(setup):
    fleet, ref, state, lines, make = setup
    make(Windows([]), strategy="all-at-once").start(ref)
    assert all(fleet.serving(n)[1] == "v2" for n in fleet.files)
    assert make(Windows([])).revert() == "rolled_back"
    assert all(fleet.serving(n)[1] == "v1" for n in fleet.files)
    doc = state.read()
    assert doc["stable"]["version"] == "v1" and doc["previous"] is None


@pytest.mark.parametrize(
    ("agreement", "result", "windows"), [(1.0, "agrees", 2), (0.4, "differs", 1)]
)
def test_a_shadow_test_judges_agreement_and_always_removes_the_shadow(
    setup, agreement, result, windows
):
    fleet, ref, state, lines, make = setup
    seen = [0]

    def counts() -> dict[str, tuple[float, float]]:
        seen[0] += 1
        n = 100.0 * (seen[0] - 1)  # 100 instances compared per window
        return {"v2": (n, n * agreement)}

    assert make(Windows([])).shadow(ref, counts) == result
    assert seen[0] == windows + 1
    shadows = [e[1] for e in fleet.events if e[0] == "shadow"]
    assert shadows == [(n, True) for n in fleet.files] + [(n, False) for n in fleet.files]
    assert not any(e[0] in ("switch", "weights") for e in fleet.events)  # traffic untouched
    doc = state.read()
    assert doc["shadow"]["result"] == result
    assert doc["shadow"]["argmax_agreement"] == agreement
    if result == "differs":
        assert "guard shadow_agreement: argmax agreement 40.00 % < 99.00 %" in lines[-1]


def test_ctrl_c_rolls_back_and_a_dead_engines_rollout_must_be_aborted_first(setup):
    fleet, ref, state, lines, make = setup

    class Interrupted(Windows):
        def end(self) -> dict[str, Figures]:
            raise KeyboardInterrupt

    assert make(Interrupted([])).start(ref) == "aborted"
    assert all(fleet.serving(n)[1] == "v1" for n in fleet.files)
    # an engine that died mid-rollout (kill -9) left a candidate node: no new rollout over it
    fleet.switch("node-0", Path(ref.location))
    state.update(lambda d: d.update(status="running", pid=2**22 + 12345))
    with pytest.raises(RolloutError, match="its engine is gone.*`rollout abort`"):
        make(Windows([])).start(ref)
    assert make(Windows([])).revert() == "rolled_back"  # what `rollout abort` does then
    assert all(fleet.serving(n)[1] == "v1" for n in fleet.files)


def test_a_rollback_from_100_percent_keeps_a_node_in_rotation_throughout(setup):
    fleet, ref, state, lines, make = setup
    assert make(Windows([(100, 0, 0.3)]), strategy="all-at-once").start(ref) == "rolled_back"
    first = next(i for i, e in enumerate(fleet.events) if e == ("switch", ("node-0", "v1")))
    after = [e[1] for e in fleet.events[first - 1 :] if e[0] == "weights"]
    assert after and all(any(w > 0 for w in ws.values()) for ws in after)
    assert all(fleet.serving(n)[1] == "v1" for n in fleet.files)


def test_the_candidate_must_be_another_version(setup, tmp_path):
    fleet, ref, state, lines, make = setup
    same = tmp_path / "same.pt"
    same.write_bytes(b"stable")
    with pytest.raises(RolloutError, match="is the stable version v1 already"):
        make(Windows([])).start(ModelRef(str(same), hashlib.sha256(b"stable").hexdigest()))
    fleet.version_of = lambda data: "v1"  # another file that calls itself v1 too
    assert make(Windows([])).start(ref) == "rolled_back"
    assert state.read()["timeline"][-1]["guard"] == "version"
    assert fleet.weights == {n: EQUAL_WEIGHT for n in fleet.files}


def test_the_command_gives_an_ab_split_no_end():
    import argparse

    from infra.rollout.command import _options

    args = argparse.Namespace(guard=[], strategy="ab", steps="10", bake="5m", window="30s")
    options = _options(args)
    assert (options.strategy, options.bake_s, options.window_s) == ("ab", math.inf, 30.0)
    assert _options(argparse.Namespace(**{**vars(args), "strategy": "canary"})).bake_s == 300


def test_nodes_serving_different_versions_are_refused_before_anything_moves(setup, tmp_path):
    fleet, ref, state, lines, make = setup
    fleet.files["node-2"].write_bytes(b"something else")
    with pytest.raises(RolloutError, match="node-0 v1, node-1 v1, node-2 v2"):
        make(Windows([])).start(ref)
    assert fleet.events == [] and state.read()["stable"] is None
