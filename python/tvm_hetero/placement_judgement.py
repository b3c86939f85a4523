"""One way to judge a placement: work moves off the simpler placement only where that is faster,
by figures in one unit (seconds) that say where they come from.

Both automatic placements ask :func:`judge`:

- the CPU clusters' (:mod:`tvm_hetero.compiler.autoplace`): a split over devices against the best
  single device, first as predicted from measured kernels and blocks (*modeled*), then as built and
  run (*measured*, :mod:`tvm_hetero.build_driver`);
- an offload device's (:mod:`tvm_hetero.ep_offload.auto_placement`): each group on the device (its
  vendor's graph, *measured on a device* or *modeled* from its cycle count) against the host
  computing the same ops (*measured*).

Rule: the candidate (the split, the offload) is kept only if its cost is below the baseline's (the
single device, the host) by more than ``min_gain`` of the baseline, ``candidate < (1 - min_gain) *
baseline``; a tie goes to the baseline, because moving work is never free (a hand-off, a copy, a
call the figures do not charge). Guarantee: a kept candidate is, by its figures, faster than the
baseline by more than ``min_gain`` (``min_gain`` in [0, 1)).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

#: Timed on this machine (the fastest or median of several runs).
MEASURED = "measured"
#: Timed on the real device and kept in its cost table (an emulator's wall time never is).
MEASURED_ON_A_DEVICE = "measured on a device"
#: Predicted: from measured parts (kernels, blocks, copies), or from a vendor's cycle count.
MODELED = "modeled"
#: Every label a cost may carry.
SOURCES = (MEASURED, MEASURED_ON_A_DEVICE, MODELED)


@dataclass(frozen=True)
class Cost:
    """Seconds of one call (a group, an inference) and where the figure comes from."""

    seconds: float
    #: One of :data:`SOURCES`.
    source: str
    #: What the figure is made from, for the report (e.g. ``"2.1 M cycles x 0.5 us (table)"``).
    detail: str = ""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"a placement cost labelled {self.source!r}: expected one of {', '.join(SOURCES)}")
        if not (isinstance(self.seconds, (int, float)) and math.isfinite(self.seconds) and self.seconds >= 0):
            raise ValueError(f"a placement cost of {self.seconds!r} seconds ({self.source}): expected a finite "
                             "number of seconds, at least 0")

    def text(self) -> str:
        """``1.234 ms (modeled: 2.1 M cycles x 0.5 us)``."""
        return f"{self.seconds * 1e3:.3f} ms ({self.source}{': ' + self.detail if self.detail else ''})"


@dataclass(frozen=True)
class Verdict:
    """The judgement of a candidate against its baseline, and why."""

    candidate_name: str
    candidate: Cost
    baseline_name: str
    baseline: Cost
    min_gain: float
    #: The candidate is kept (else the baseline is).
    kept: bool

    def explain(self) -> str:
        """One line: both figures, their labels, and which is kept."""
        margin = f" by more than {self.min_gain:.0%}" if self.min_gain else ""
        if self.kept:
            why = f"{self.candidate_name} faster{margin}: {self.candidate_name} kept"
        else:
            why = f"{self.candidate_name} not faster{margin}: {self.baseline_name} kept"
        return (f"{self.candidate_name} {self.candidate.text()} against {self.baseline_name} "
                f"{self.baseline.text()}: {why}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict) -> Verdict:
        return cls(doc["candidate_name"], Cost(**doc["candidate"]), doc["baseline_name"], Cost(**doc["baseline"]),
                   doc["min_gain"], doc["kept"])


def judge(candidate: Cost, baseline: Cost, *, min_gain: float = 0.0, candidate_name: str = "the candidate",
          baseline_name: str = "the baseline") -> Verdict:
    """Keep ``candidate`` only where ``candidate.seconds < (1 - min_gain) * baseline.seconds`` (see
    the module docstring); the names are the two placements' as the report writes them."""
    if not 0.0 <= min_gain < 1.0:
        raise ValueError(f"min_gain {min_gain!r}: expected a fraction in [0, 1)")
    kept = candidate.seconds < (1.0 - min_gain) * baseline.seconds
    return Verdict(candidate_name, candidate, baseline_name, baseline, min_gain, kept)
