"""The rollout loop: verify, move traffic step by step, judge every window, promote or roll back.

Contract. `Rollout(fleet, state, store, source, options, say)`:
- `start(ref)`: the reference is checked (ref.Store.put: digest) before anything moves; the
  stable version is recorded first when the stack has none (the file node 0 serves, kept in the
  store; nodes serving different versions are refused, nothing moved). A source that says
  which latency buckets it reads p99s from (signals.py: `latency_bounds`) is read over one
  window before the first step (the window just past, where it has `recent`): the line says
  what the p99 guard can see at the stable's p99 (policy.p99_resolution), and a max_p99_ratio
  finer than that is refused, nothing moved. Then, per step of the
  strategy (policy.steps): the nodes the split needs switch to the candidate one at a time
  (weight 0, the fleet's zero-downtime reload, then the step's weights), and the step bakes
  for `bake_s`: windows of `window_s` are judged (policy.judge: candidate against stable over
  the same seconds; at 100 % against the last stable window). A window
  whose verdict is rollback rolls back at once: every candidate node leaves the rotation, then
  reloads the stable file, then gets its weight back (at 100 % one node at a time, so some node
  always serves); the line names the guard and the numbers.
  A step ends after its bake with at least one window judged ok; three bakes without one
  (too little traffic to judge) roll back too. A window whose figures disagree with the load
  balancer's own (signals.SignalMismatch: a node may be forging them) is neither judged nor
  counted: the rollout pauses itself (the split held until `rollout resume` or `abort`), so a
  forged figure neither rolls back nor promotes. After the last step the candidate is promoted:
  it becomes `stable`, the one before it `previous`.
- Controls between windows (state.control, from `rollout pause|resume|abort`): pause holds the
  current split and judges nothing until resume; abort rolls back.
- `shadow(ref)` (`--strategy shadow`): the candidate runs as every node's shadow (the runtime's
  shadow testing: no client ever sees its outputs) for `bake_s`; each window's argmax agreement
  (policy.judge_shadow) is logged; it ends at the first window below `min_shadow_agreement`
  ("differs") or after the bake ("agrees"), and the shadow is removed from every node either
  way. Traffic and the stable version never change. The result goes to the record's `shadow`.
- `revert()` (`rollout rollback`): every node back to `previous` after a promotion, or to
  `stable` when a candidate is still on some node, one node at a time.
One progress line per decision through `say`, with the numbers it used; the same entries go to
the state's timeline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from infra.rollout.errors import RolloutError as RolloutError  # the engine's own refusals
from infra.rollout.policy import (
    Figures,
    GuardSettings,
    Verdict,
    judge,
    judge_shadow,
    p99_resolution,
    split,
    steps,
)
from infra.rollout.ref import ModelRef, Store, sha256_of
from infra.rollout.signals import ShadowCounts, SignalError, SignalMismatch, Source
from infra.rollout.state import ACTIVE, RolloutState, engine_alive

EQUAL_WEIGHT = 100  # every node's weight outside a split
# Windows in a row whose figures could not be read before a rollout backs out (fails safe).
UNREADABLE_WINDOWS = 3


class Fleet(Protocol):
    def nodes(self) -> list[str]: ...

    def serving(self, node: str) -> tuple[Path, str]:
        """The file a node serves and its model_version."""
        ...

    def switch(self, node: str, model: Path) -> str:
        """Make `node` serve `model` (zero-downtime reload); its model_version."""
        ...

    def set_weights(self, weights: dict[str, int]) -> None: ...

    def set_shadow(self, node: str, model: Path | None) -> str | None:
        """Start (a file) or end (None) a shadow test on `node`; the candidate's version."""
        ...


@dataclass
class Options:
    strategy: str = "canary"
    steps: str | None = None
    bake_s: float = 300.0
    window_s: float = 30.0
    guards: GuardSettings = field(default_factory=GuardSettings)


def _set_candidate_version(doc: dict[str, Any], version: str) -> None:
    doc["candidate"]["version"] = version


def _append(doc: dict[str, Any], entry: dict[str, Any]) -> None:
    doc["timeline"].append(entry)


def _set_step(doc: dict[str, Any], step: int, share: float) -> None:
    doc.update(step=step, share=share)


class Rollout:
    def __init__(
        self,
        fleet: Fleet,
        state: RolloutState,
        store: Store,
        source: Source,
        options: Options,
        say: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.fleet, self.state, self.store, self.source = fleet, state, store, source
        self.options = options
        self.say, self.clock, self.sleep = say, clock, sleep
        self.started = clock()
        self._baseline: Figures | None = None  # the last stable window with requests
        self._unreadable_windows = 0  # windows in a row without figures

    # --- start -------------------------------------------------------------------------------

    def start(self, ref: ModelRef) -> str:
        """Run a rollout to its end; the final status (promoted, rolled_back)."""
        shares = steps(self.options.strategy, self.options.steps)
        kept = self.store.put(ref)  # the digest check: before anything moves
        doc = self.state.read()
        if doc["status"] in ACTIVE:
            how = (
                f"(pid {doc['pid']}): `rollout abort` or `rollout resume` it first"
                if engine_alive(doc)
                else "but its engine is gone, some nodes may serve the candidate: "
                "`rollout abort` rolls them back first"
            )
            raise RolloutError(
                f"a rollout of {doc['candidate']['version']} is {doc['status']} {how}"
            )
        stable = doc["stable"] or self._record_stable()
        if stable["sha256"] == ref.sha256:
            raise RolloutError(f"{ref} is the stable version {stable['version']} already")
        cand = {"sha256": ref.sha256, "file": str(kept), "version": None, "ref": str(ref)}
        self._resolution(stable["version"])

        def begin(d: dict[str, Any]) -> None:
            d.update(
                status="running",
                stable=stable,
                candidate=cand,
                strategy=self.options.strategy,
                steps=list(shares),
                step=0,
                share=0.0,
                guards=self.options.guards.as_dict(),
                control=None,
                pid=os.getpid(),
                timeline=[],
            )

        self.state.update(begin)
        self.say(
            f"rollout {ref} ({self.options.strategy}: steps {','.join(map(str, shares))} %, "
            f"bake {self.options.bake_s:g} s, windows of {self.options.window_s:g} s); "
            f"stable {stable['version']}"
        )
        return self._run(shares)

    def _resolution(self, stable_version: str) -> None:
        """Say what the p99 guard can see at the stable's p99 now; RolloutSettingsError (nothing
        moved) when max_p99_ratio is finer than the source's latency buckets resolve there."""
        bounds_of = getattr(self.source, "latency_bounds", None)
        if bounds_of is None:  # a source that does not say (scripted windows)
            return
        o = self.options
        recent = getattr(self.source, "recent", None)
        try:
            if recent is not None:
                figures = recent(o.window_s)
            else:
                self.source.begin()
                self.sleep(o.window_s)
                figures = self.source.end()
            bounds = bounds_of()
        except SignalError as exc:
            self.say(f"p99 guard: resolution unknown, no figures before the first step ({exc})")
            return
        if bounds is None:
            self.say(
                "p99 guard: the source's p99 is a percentile statistic, not read from buckets: "
                f"max_p99_ratio {o.guards.max_p99_ratio:g} is judged as set"
            )
            return
        stable = figures.get(stable_version)
        if stable is None or stable.p99_s is None or stable.requests < o.guards.min_requests:
            self.say(
                f"p99 guard: resolution unknown, fewer than {o.guards.min_requests} stable "
                f"requests in the {o.window_s:g} s before the first step"
            )
            return
        seen = p99_resolution(stable.p99_s, bounds, o.guards)
        self._baseline = stable
        self.say(f"p99 guard: {seen.text()} (max_p99_ratio {o.guards.max_p99_ratio:g})")

    def _record_stable(self) -> dict[str, Any]:
        """The version every node serves, recorded as the stable one (node 0's file kept). Nodes
        that disagree are refused: the guards compare the candidate with one stable version, and
        a rollback needs the one file to go back to."""
        nodes = self.fleet.nodes()
        serving = {node: self.fleet.serving(node) for node in nodes}
        versions = {node: v for node, (_, v) in serving.items()}
        if len(set(versions.values())) > 1:
            raise RolloutError(
                "the nodes serve different versions, so there is no one stable version to "
                "compare the candidate with or roll back to: "
                + ", ".join(f"{n} {v}" for n, v in versions.items())
                + ". Put every node on one model first (a version declared in the model's "
                "sidecar keeps nodes that build their own file alike)"
            )
        node = nodes[0]
        path, version = serving[node]
        sha = sha256_of(path)
        kept = self.store.put(ModelRef(str(path), sha))
        return {"sha256": sha, "file": str(kept), "version": version, "ref": f"{path}@sha256:{sha}"}

    # --- the steps -----------------------------------------------------------------------------

    def _run(self, shares: tuple[int, ...]) -> str:
        nodes = self.fleet.nodes()
        on_candidate: list[str] = []
        try:
            return self._steps(shares, nodes, on_candidate)
        except KeyboardInterrupt:  # Ctrl-C: leave every node on the stable version
            return self._rollback(nodes, on_candidate, 0, "abort", "interrupted (Ctrl-C)", {})

    def _steps(self, shares: tuple[int, ...], nodes: list[str], on_candidate: list[str]) -> str:
        doc = self.state.read()
        cand_file = Path(doc["candidate"]["file"])
        for i, share in enumerate(shares, 1):
            sp = split(share, len(nodes))
            for node in nodes[len(on_candidate) : sp.candidates]:
                weights = self._weights(nodes, on_candidate, sp.candidate_weight, sp.stable_weight)
                weights[node] = 0
                self.fleet.set_weights(weights)
                try:
                    version = self.fleet.switch(node, cand_file)
                except Exception as exc:  # the node keeps serving the stable model
                    # the rollback's first weights take the candidates out and this node back in
                    return self._rollback(
                        nodes,
                        on_candidate,
                        i,
                        "load",
                        f"{node} did not load the candidate: {exc}",
                        {},
                    )
                on_candidate.append(node)
                self.state.update(partial(_set_candidate_version, version=version))
                stable_version = self.state.read()["stable"]["version"]
                if version == stable_version:  # the guards could not tell the two apart
                    return self._rollback(
                        nodes,
                        on_candidate,
                        i,
                        "version",
                        f"the candidate reports the stable's model_version {version!r}: give "
                        "it its own version (the sidecar's 'version')",
                        {},
                    )
            self.fleet.set_weights(
                self._weights(nodes, on_candidate, sp.candidate_weight, sp.stable_weight)
            )
            self.state.update(partial(_set_step, step=i, share=sp.share))
            self.say(
                f"step {i}/{len(shares)}: {sp.share:g} % of requests to the candidate "
                f"({len(on_candidate)} of {len(nodes)} nodes, weights {sp.candidate_weight}/"
                f"{sp.stable_weight})"
            )
            verdict = self._bake(i, sp.share)
            if verdict.decision == "rollback":
                return self._rollback(
                    nodes, on_candidate, i, verdict.guard, verdict.reason, verdict.numbers
                )
        return self._promote(nodes)

    @staticmethod
    def _weights(nodes: list[str], on_cand: list[str], wc: int, ws: int) -> dict[str, int]:
        return {n: (wc if n in on_cand else ws) for n in nodes}

    def _bake(self, step: int, share: float) -> Verdict:
        o = self.options
        deadline = self.clock() + o.bake_s
        give_up = self.clock() + 3 * o.bake_s
        judged_ok = False
        while True:
            control = self._control()
            if control == "abort":
                return Verdict("rollback", "abort", "aborted by `torchfleet rollout abort`")
            if control == "pause":
                self.sleep(min(1.0, o.window_s))
                deadline += min(1.0, o.window_s)
                give_up += min(1.0, o.window_s)
                continue
            verdict = self._window(step, share)
            if verdict.decision == "rollback":
                return verdict
            if verdict.decision == "hold":  # a forged figure moves nothing: pause for a person
                self.state.update(lambda d: d.update(control="pause"))
                continue
            judged_ok = judged_ok or verdict.decision == "ok"
            now = self.clock()
            if now >= deadline and judged_ok:
                return verdict
            if now >= give_up:
                return Verdict(
                    "rollback",
                    "min_requests",
                    f"no window with {o.guards.min_requests} candidate requests in "
                    f"{3 * o.bake_s:g} s: too little traffic to judge",
                    verdict.numbers,
                )

    def _window(self, step: int, share: float) -> Verdict:
        doc = self.state.read()
        stable_v, cand_v = doc["stable"]["version"], doc["candidate"]["version"]
        try:
            self.source.begin()
        except SignalError as exc:
            self.sleep(self.options.window_s)  # a window's time passes either way
            return self._unreadable(step, share, exc)
        self.sleep(self.options.window_s)
        try:
            figures = self.source.end()
        except SignalMismatch as exc:
            verdict = Verdict("hold", "signals", f"the figures are not trusted: {exc}")
            self._record(step, share, verdict, "figures disagree with the load balancer's")
            return verdict
        except SignalError as exc:
            return self._unreadable(step, share, exc)
        self._unreadable_windows = 0
        stable = figures.get(stable_v)
        if stable is not None and stable.requests >= self.options.guards.min_requests:
            self._baseline = stable
        else:
            stable = self._baseline  # 100 %: the last stable window before it
        cand = figures.get(cand_v) or Figures(cand_v, 0, 0, None)
        verdict = judge(stable, cand, self.options.guards)
        self._log(step, share, verdict, stable, cand)
        return verdict

    def _unreadable(self, step: int, share: float, exc: SignalError) -> Verdict:
        """A window whose figures could not be read (a scrape, Prometheus or CloudWatch failed)
        judges nothing; UNREADABLE_WINDOWS of them in a row roll back: a rollout that cannot see
        the candidate does not keep sending it traffic."""
        self._unreadable_windows += 1
        n = self._unreadable_windows
        if n >= UNREADABLE_WINDOWS:
            verdict = Verdict(
                "rollback", "signals", f"{n} windows in a row without figures; the last: {exc}"
            )
        else:
            verdict = Verdict(
                "wait",
                "signals",
                f"no figures this window ({n} of {UNREADABLE_WINDOWS} before a rollback): {exc}",
            )
        self._record(step, share, verdict, "no figures")
        return verdict

    def _control(self) -> str | None:
        doc = self.state.read()
        control = doc.get("control")
        if control == "pause" and doc["status"] != "paused":
            self.state.update(lambda d: d.update(status="paused"))
            self.say("paused: the split is held, nothing is judged until `rollout resume`")
        elif control == "resume":
            self.state.update(lambda d: d.update(status="running", control=None))
            self.say("resumed")
            return None
        return control

    def _log(
        self, step: int, share: float, v: Verdict, stable: Figures | None, cand: Figures
    ) -> None:
        base = stable.text() if stable is not None else "stable: no window yet"
        self._record(step, share, v, f"{cand.text()} | {base}")

    def _record(self, step: int, share: float, v: Verdict, figures: str) -> None:
        """One window's line and timeline entry: what was seen, the decision and its numbers."""
        at = round(self.clock() - self.started, 1)
        self.say(
            f"  t+{at:g}s step {step} {share:g} %: {figures} -> {v.decision}"
            + (f" ({v.guard}: {v.reason})" if v.decision != "ok" else "")
        )
        entry = {
            "t": at,
            "step": step,
            "share": share,
            "decision": v.decision,
            "guard": v.guard,
            "reason": v.reason,
            "numbers": v.numbers,
        }
        self.state.update(lambda d: d["timeline"].append(entry))

    # --- ends ----------------------------------------------------------------------------------

    def _rollback(
        self,
        nodes: list[str],
        on_candidate: list[str],
        step: int,
        guard: str,
        reason: str,
        numbers: dict[str, Any],
    ) -> str:
        doc = self.state.read()
        stable_file = Path(doc["stable"]["file"])
        self.say(f"ROLLBACK at step {step}: guard {guard}: {reason}")
        if len(on_candidate) < len(nodes):
            # out of the rotation at once: from this moment no client reaches the candidate
            self.fleet.set_weights({n: (0 if n in on_candidate else EQUAL_WEIGHT) for n in nodes})
            for node in on_candidate:
                self.fleet.switch(node, stable_file)
        else:  # every node serves it (100 %): one at a time, or nobody would be in rotation
            for node in on_candidate:
                self.fleet.set_weights({n: (0 if n == node else EQUAL_WEIGHT) for n in nodes})
                self.fleet.switch(node, stable_file)
        self.fleet.set_weights({n: EQUAL_WEIGHT for n in nodes})
        at = round(self.clock() - self.started, 1)

        def done(d: dict[str, Any]) -> None:
            d["timeline"].append(
                {
                    "t": at,
                    "step": step,
                    "decision": "rolled_back",
                    "guard": guard,
                    "reason": reason,
                    "numbers": numbers,
                }
            )
            d.update(
                status="aborted" if guard == "abort" else "rolled_back",
                control=None,
                share=0.0,
                pid=None,
            )

        self.state.update(done)
        self.say(
            f"rolled back: {len(on_candidate)} node(s) serve {doc['stable']['version']} again "
            f"after {at:g} s"
        )
        return "aborted" if guard == "abort" else "rolled_back"

    def _promote(self, nodes: list[str]) -> str:
        self.fleet.set_weights({n: EQUAL_WEIGHT for n in nodes})
        at = round(self.clock() - self.started, 1)

        def promote(d: dict[str, Any]) -> None:
            d["timeline"].append({"t": at, "decision": "promoted"})
            d.update(
                previous=d["stable"],
                stable=d["candidate"],
                candidate=None,
                status="promoted",
                share=100.0,
                control=None,
                pid=None,
            )

        doc = self.state.update(promote)
        self.say(f"promoted: {doc['stable']['version']} serves 100 % after {at:g} s")
        return "promoted"

    def revert(self) -> str:
        """Every node back to the version before: `previous` after a promotion, else `stable`."""
        doc = self.state.read()
        if doc["status"] in ACTIVE and engine_alive(doc):
            raise RolloutError("a rollout is running: `rollout abort` it instead")
        target = doc["previous"] if doc["status"] == "promoted" else doc["stable"]
        if target is None:
            raise RolloutError("nothing to roll back to: no earlier version is recorded")
        nodes = self.fleet.nodes()
        for node in nodes:
            if self.fleet.serving(node)[1] == target["version"]:
                continue
            others = {n: (0 if n == node else EQUAL_WEIGHT) for n in nodes}
            self.fleet.set_weights(others)
            self.fleet.switch(node, Path(target["file"]))
        self.fleet.set_weights({n: EQUAL_WEIGHT for n in nodes})

        def reverted(d: dict[str, Any]) -> None:
            if d["status"] == "promoted":
                d.update(stable=d["previous"], previous=None)
            d.update(status="rolled_back", candidate=None, control=None, pid=None, share=0.0)

        self.state.update(reverted)
        self.say(f"rolled back: every node serves {target['version']}")
        return "rolled_back"

    # --- shadow ----------------------------------------------------------------------------------

    def shadow(self, ref: ModelRef, counts: ShadowCounts) -> str:
        """Run `ref` as every node's shadow; "agrees" or "differs" (see the module doc)."""
        kept = self.store.put(ref)
        nodes = self.fleet.nodes()
        version = ""
        try:
            for node in nodes:
                version = self.fleet.set_shadow(node, kept) or version
            self.say(
                f"shadow {ref}: {version} beside the serving model on {len(nodes)} node(s), "
                f"bake {self.options.bake_s:g} s, windows of {self.options.window_s:g} s"
            )
            verdict = self._shadow_windows(version, counts)
        finally:
            for node in nodes:
                self.fleet.set_shadow(node, None)
        result = "differs" if verdict.decision == "rollback" else "agrees"
        record = {"version": version, "sha256": ref.sha256, "result": result, **verdict.numbers}
        self.state.update(lambda d: d.update(shadow=record))
        self.say(
            f"shadow {version} {result}: "
            + (
                f"guard {verdict.guard}: {verdict.reason}"
                if result == "differs"
                else verdict.reason
            )
            + "; no client saw its outputs, the shadow is removed"
        )
        return result

    def _shadow_windows(self, version: str, counts: ShadowCounts) -> Verdict:
        deadline = self.clock() + self.options.bake_s
        before = counts().get(version, (0.0, 0.0))
        verdict = Verdict("wait", "min_requests", "nothing compared yet")
        while True:
            self.sleep(self.options.window_s)
            now = counts().get(version, (0.0, 0.0))
            compared, agreed = now[0] - before[0], now[1] - before[1]
            before = now
            v = judge_shadow(agreed / compared if compared else None, compared, self.options.guards)
            at = round(self.clock() - self.started, 1)
            self.say(
                f"  t+{at:g}s shadow {version}: {compared:.0f} instances compared, argmax "
                f"agreement {'-' if not compared else f'{agreed / compared * 100:.1f} %'} -> "
                + v.decision
            )
            entry = {"t": at, "shadow": version, "decision": v.decision, "guard": v.guard}
            self.state.update(partial(_append, entry={**entry, "numbers": v.numbers}))
            if v.decision != "wait":
                verdict = v
            if v.decision == "rollback" or self.clock() >= deadline:
                return verdict
