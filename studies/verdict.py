"""The one verdict rule of every study that compares trained arms, declared before any result.

A study may say "reproduced" or "not reproduced" only when
  (a) each arm has at least MIN_SEEDS seeds,
  (b) each arm is measurably past chance on the held-out split: its mean beyond the chance level (chance accuracy,
      a unigram model's perplexity) by more than MARGIN × its seed standard deviation, and
  (c) the gap between the two means is larger than MARGIN × their pooled standard deviation √((s₁² + s₂²) / 2);
then the direction of the gap decides: the paper's claimed order → "reproduced", the opposite → "not reproduced".
Otherwise the verdict is "not measurable at this budget", with the reason. Standard deviations are the sample
ones (n − 1) over seeds.
"""

from __future__ import annotations

import dataclasses
import math

from lra_flax.compare import mean_std
from studies.common import NOT_MEASURABLE

REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"
MIN_SEEDS = 3
MARGIN = 2.0


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of a comparison: its held-out metric per seed and the metric of a model that learned nothing."""

    name: str
    values: tuple[float, ...]
    chance: float

    def __post_init__(self):
        if not all(math.isfinite(v) for v in self.values):
            raise ValueError(f"arm {self.name!r}: every seed's value must be finite, got {list(self.values)}")


@dataclasses.dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str


def decide(claimed: Arm, other: Arm, *, higher_is_better: bool, margin: float = MARGIN) -> Verdict:
    """The verdict on the claim "`claimed` does better than `other`" (module docstring for the rule)."""
    sign = 1.0 if higher_is_better else -1.0
    for arm in (claimed, other):
        if len(arm.values) < MIN_SEEDS:
            return Verdict(NOT_MEASURABLE, f"{arm.name} has {len(arm.values)} seed(s); the rule needs {MIN_SEEDS}")
        mean, std = mean_std(arm.values)
        beyond = sign * (mean - arm.chance)
        if not beyond > margin * std:
            return Verdict(
                NOT_MEASURABLE,
                f"{arm.name} is not measurably past chance: mean {mean:.4g} vs chance {arm.chance:.4g}, "
                f"seed std {std:.3g}",
            )
    (m1, s1), (m2, s2) = mean_std(claimed.values), mean_std(other.values)
    gap, pooled = sign * (m1 - m2), math.sqrt((s1**2 + s2**2) / 2)
    means = f"means {m1:.4g} ({claimed.name}) and {m2:.4g} ({other.name})"
    what = f"gap {m1 - m2:+.4g} between {means}, pooled std {pooled:.3g}"
    if abs(gap) <= margin * pooled:
        return Verdict(NOT_MEASURABLE, f"{what}: not larger than {margin:g} × the pooled std")
    return Verdict(REPRODUCED if gap > 0 else NOT_REPRODUCED, what)
