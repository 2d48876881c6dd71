"""The figures of a window as a stub source gives them (engine.Source): a fixed number of
requests per version, the candidate with `cand_errors` 5xx among its 100, both at 50 ms p99."""

from __future__ import annotations

from infra.rollout.policy import Figures


class FixedWindows:
    def __init__(self, stable: str, candidate: str, cand_errors: int = 0) -> None:
        self.stable, self.candidate, self.cand_errors = stable, candidate, cand_errors

    def begin(self) -> None:
        pass

    def end(self) -> dict[str, Figures]:
        return {
            self.stable: Figures(self.stable, 900, 0, 0.05),
            self.candidate: Figures(self.candidate, 100, self.cand_errors, 0.05),
        }
