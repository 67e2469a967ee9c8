"""The one verdict rule of every study that compares trained arms, declared before any result.

A study may say "reproduced" or "not reproduced" only when
  (a) each arm has at least MIN_SEEDS seeds,
  (b) each arm is measurably past chance on the held-out split: its mean beyond the chance level (chance accuracy,
      a unigram model's perplexity) by more than MARGIN × its seed standard deviation, and
  (c) the gap between the two means is larger than MARGIN × their pooled standard deviation
      √(((n₁ − 1)s₁² + (n₂ − 1)s₂²) / (n₁ + n₂ − 2)), which is √((s₁² + s₂²) / 2) for arms of as many seeds;
then the direction of the gap decides: the paper's claimed order → "reproduced", the opposite → "not reproduced".
Otherwise the verdict is "not measurable at this budget", with the reason. Standard deviations are the sample
ones (n − 1) over seeds.

Where the claim itself predicts that an arm stays at chance (gMLP on a task that needs alignment, which its fixed
spatial weights cannot do), (b) is asked of a control instead: an arm that must learn the task at this budget
(`studies.amlp_alignment`: the Transformer must learn to copy), so "at chance" means the arm cannot, not that the
budget was too small. Such an arm is given an infinite chance level, and the study says which and why.

Controls come first. Where a comparison means something only if the models learned the task at all, each such
model's held-out accuracy must be measurably above the majority class (`learned`, a `decide_threshold` against it);
other controls are thresholds too (a language model's perplexity under half the unigram's, attention away from
uniform). Any control that does not hold makes the verdict "not measurable", naming it (`failed_controls`), and
the comparison is not read as a verdict. A failed "learned the task" control's budget comes from the models' last
training losses against the entropy of the training labels, the loss of a model that learned only the class
frequencies (`chance_loss_budget`): at chance, no number of steps follows.

A claim about a level ("the score exceeds 0.5") is `decide_threshold`: (a), (b), and the mean beyond the threshold by
more than MARGIN × the seed standard deviation; the side decides.

A claim that a measured quantity lies in a range ("the fitted slope is +1 ± 0.15") is `decide_within`: (a), and the
mean inside the range by more than MARGIN × the seed standard deviation at both ends → reproduced; outside it by as
much at either end → not reproduced; otherwise not measurable. A quantity measured at initialisation has no chance
level, so (b) does not apply. A quantity without noise (a parameter count) is `decide_exact`: no seeds, the side of
the bound decides.

Where a study records its quantity along training (a learning curve), a "not measurable" part also says the budget
that would settle it (`budget_from_curve`): the last recorded interval's change per doubling of the steps, carried
forward (a learning curve's tail is roughly linear in log steps; its pace falls as it goes, so the figure is the
earliest the budget could suffice) until the mean reaches what the rule asks of it at the present seed spread — or
that the curve has slowed or turned away, so that more steps of the same setting will not settle it, or that no
mean could satisfy the rule at the present seed spread.

A claim about spread ("less variance between runs") is a claim about two variances, which a gap in means cannot
test: `decide_spread` needs (a), (b) and the two-sided F-test of the variances over seeds at SPREAD_LEVEL: a ratio
beyond its critical value decides the direction, anything nearer 1 is "not measurable at this budget". A claim
made of several parts (`combine`) is reproduced when every part is, not reproduced when any part is not, and
otherwise not measurable.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

from lra_flax.compare import mean_std
from studies.common import NOT_MEASURABLE

REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"
MIN_SEEDS = 3
MARGIN = 2.0
SPREAD_LEVEL = 0.05


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
    if (unjudged := _too_few_seeds(claimed, other) or _at_chance(claimed, other, sign=sign, margin=margin)) is not None:
        return unjudged
    m1, m2 = mean_std(claimed.values)[0], mean_std(other.values)[0]
    gap, pooled = sign * (m1 - m2), pooled_std(claimed, other)
    means = f"means {m1:.4g} ({claimed.name}) and {m2:.4g} ({other.name})"
    what = f"gap {m1 - m2:+.4g} between {means}, pooled std {pooled:.3g}"
    if abs(gap) <= margin * pooled:
        return Verdict(NOT_MEASURABLE, f"{what}: not larger than {margin:g} × the pooled std")
    return Verdict(REPRODUCED if gap > 0 else NOT_REPRODUCED, what)


def decide_threshold(arm: Arm, threshold: float, *, higher_is_better: bool, margin: float = MARGIN) -> Verdict:
    """The verdict on the claim "`arm` is beyond `threshold`" (above it if `higher_is_better`; module docstring)."""
    sign = 1.0 if higher_is_better else -1.0
    if (unjudged := _too_few_seeds(arm) or _at_chance(arm, sign=sign, margin=margin)) is not None:
        return unjudged
    mean, std = mean_std(arm.values)
    gap = sign * (mean - threshold)
    what = f"{arm.name}: mean {mean:.4g} against the threshold {threshold:.4g}, seed std {std:.3g}"
    if abs(gap) <= margin * std:
        return Verdict(NOT_MEASURABLE, f"{what}: not beyond it by more than {margin:g} × the std")
    return Verdict(REPRODUCED if gap > 0 else NOT_REPRODUCED, what)


def decide_within(arm: Arm, low: float, high: float, *, margin: float = MARGIN) -> Verdict:
    """The verdict on the claim "`arm`'s value lies in [low, high]" (module docstring): its seeds are measurements
    (draws of random inputs), not trainings, so chance plays no part."""
    if (unjudged := _too_few_seeds(arm)) is not None:
        return unjudged
    mean, std = mean_std(arm.values)
    inside = min(mean - low, high - mean)  # > 0 inside the range, < 0 outside it
    what = f"{arm.name}: mean {mean:.4g} against [{low:.4g}, {high:.4g}], seed std {std:.3g}"
    if abs(inside) <= margin * std:
        return Verdict(NOT_MEASURABLE, f"{what}: not {'inside' if inside > 0 else 'outside'} by more than "
                                       f"{margin:g} × the std")  # fmt: skip
    return Verdict(REPRODUCED if inside > 0 else NOT_REPRODUCED, what)


def decide_exact(name: str, value: float, bound: float, *, claimed_below: bool) -> Verdict:
    """The verdict on the claim "`value` is below `bound`" (above it unless `claimed_below`) for a quantity without
    noise (a parameter count): the side decides; on the bound itself the claim of "below"/"above" fails."""
    what = f"{name}: {value:.4g} against {bound:.4g}"
    holds = value < bound if claimed_below else value > bound
    return Verdict(REPRODUCED if holds else NOT_REPRODUCED, what)


MAX_DOUBLINGS = 4  # a trend read off one interval says little beyond 16× the steps it was read at


def budget_from_curve(
    steps: Sequence[int],
    curve: Sequence[float],
    needed: float,
    *,
    higher_is_better: bool,
    best: float | None = None,
    unit: str = "steps",
) -> str:
    """The budget, in training steps, at which `curve` (the mean over seeds of the quantity a part of a verdict reads,
    recorded at `steps`) reaches `needed` (what the rule asks of that mean at the present seed spread), carrying the
    last interval's change per doubling of steps forward (module docstring). `best`: the best value the quantity can
    take (a score's 1), beyond which no budget reaches. `unit`: what `steps` count where the budget is not training
    steps (FAVOR+'s random features). A sentence for the verdict's reason."""
    if len(steps) < 2 or len(steps) != len(curve):
        raise ValueError(f"a learning curve needs ≥ 2 points, one per step: {len(steps)} steps, {len(curve)} values")
    if steps[0] <= 0 or not all(a < b for a, b in itertools.pairwise(steps)):
        raise ValueError(f"a learning curve's steps must be positive and increasing, got {list(steps)}")
    sign = 1.0 if higher_is_better else -1.0
    if best is not None and sign * (needed - best) > 0:
        # The rule's spread is the seeds' standard deviation, not its error: more seeds do not shrink it.
        return (f"at this seed spread the rule needs a mean of {needed:.4g}, beyond the best possible {best:.4g}: "
                "no budget settles it unless the seeds come closer together (a steadier setting, or more steps if "
                "they bring the laggards along)")  # fmt: skip
    last, before = steps[-1], steps[-2]
    short = sign * (needed - curve[-1])  # how far the mean still has to go, in the better direction
    if short <= 0:
        return f"the curve already reaches {needed:.4g} at {unit} {last:,}"
    per_doubling = sign * (curve[-1] - curve[-2]) / math.log2(last / before)
    pace = f"{sign * per_doubling:+.3g} per doubling of the {unit} over {unit} {before:,}–{last:,}"
    where = f"{curve[-1]:.4g} against the {needed:.4g} needed"
    if per_doubling <= 0:
        return f"the curve moves away from what the rule needs ({pace}, {where}): more {unit} will not settle it"
    doublings = short / per_doubling
    if doublings > MAX_DOUBLINGS:
        return (f"the curve has slowed ({pace}, {where}: not within {2**MAX_DOUBLINGS}× the {unit} at that pace): "
                f"more {unit} of this setting will not settle it")  # fmt: skip
    return (f"at the curve's last pace ({pace}) it reaches the {needed:.4g} needed at ~{last * 2**doublings:,.0f} "
            f"{unit} ({2**doublings:.1f}× these) at the earliest (a learning curve's pace falls as it goes), if the "
            "seed spread stays as it is")  # fmt: skip


def gap_budget(
    claimed: Arm, other: Arm, steps: Sequence[int], claimed_curve: Sequence[float], other_curve: Sequence[float],
    *, higher_is_better: bool,
) -> str | None:  # fmt: skip
    """The budget of a `decide` part whose gap is within the seed spread (`budget_from_curve` on the gap between the
    arms' mean curves, against MARGIN × their pooled std now); None where the gap is not what stands in the way (too
    few seeds, an arm at chance). The curves' last points are the arms' means."""
    sign = 1.0 if higher_is_better else -1.0
    if _too_few_seeds(claimed, other) or _at_chance(claimed, other, sign=sign, margin=MARGIN):
        return None
    gap = [sign * (c - o) for c, o in zip(claimed_curve, other_curve, strict=True)]
    return budget_from_curve(steps, gap, MARGIN * pooled_std(claimed, other), higher_is_better=True)


MAX_SEEDS = 1000  # a spread claim that needs more seeds than this is not one a study can settle


def seeds_for_spread(claimed: Arm, other: Arm, *, higher_is_better: bool, level: float = SPREAD_LEVEL) -> str | None:
    """The budget of a `decide_spread` part left not measurable: the seeds per arm at which the F-test's critical
    value falls below the variance ratio observed now (if the ratio stayed as it is) — more seeds, unlike more steps,
    are what an F-test needs; None where the spread is not what stands in the way (too few seeds, an arm at
    chance)."""
    sign = 1.0 if higher_is_better else -1.0
    if _too_few_seeds(claimed, other) or _at_chance(claimed, other, sign=sign, margin=MARGIN):
        return None
    from scipy import stats  # here, not at the top: scipy.stats takes ~0.9 s to import, and few verdicts need it

    (_, s1), (_, s2) = mean_std(claimed.values), mean_std(other.values)
    if s1 == 0 or s2 == 0:
        return "an arm does not vary at all"
    ratio = max(s1, s2) ** 2 / min(s1, s2) ** 2
    for n in range(max(len(claimed.values), len(other.values)) + 1, MAX_SEEDS + 1):
        if float(stats.f.ppf(1 - level / 2, n - 1, n - 1)) < ratio:
            return f"at the variance ratio seen now ({ratio:.3g}) the F-test decides with {n} seeds per arm"
    return f"the variance ratio seen now ({ratio:.3g}) would need over {MAX_SEEDS} seeds per arm: no budget settles it"


def with_budget(part: Verdict, budget: str | None) -> Verdict:
    """`part` with the budget that would settle it after its reason; unchanged where there is none to say."""
    return part if budget is None else Verdict(part.verdict, f"{part.reason}; budget: {budget}")


def _too_few_seeds(*arms: Arm) -> Verdict | None:
    """(a): "not measurable" when an arm has fewer than MIN_SEEDS seeds, else None."""
    for arm in arms:
        if len(arm.values) < MIN_SEEDS:
            return Verdict(NOT_MEASURABLE, f"{arm.name} has {len(arm.values)} seed(s); the rule needs {MIN_SEEDS}")
    return None


def _at_chance(*arms: Arm, sign: float, margin: float) -> Verdict | None:
    """(b): "not measurable" when an arm's mean is not beyond its chance level (on the side `sign` says is better)
    by more than `margin` × its seed std, else None."""
    for arm in arms:
        mean, std = mean_std(arm.values)
        if not sign * (mean - arm.chance) > margin * std:
            return Verdict(
                NOT_MEASURABLE,
                f"{arm.name} is not measurably past chance: mean {mean:.4g} vs chance {arm.chance:.4g}, "
                f"seed std {std:.3g}",
            )
    return None


def pooled_std(a: Arm, b: Arm) -> float:
    """The pooled sample standard deviation of two arms' seeds (each arm's variance weighted by n − 1)."""
    (_, s1), (_, s2) = mean_std(a.values), mean_std(b.values)
    n1, n2 = len(a.values), len(b.values)
    return math.sqrt(((n1 - 1) * s1**2 + (n2 - 1) * s2**2) / (n1 + n2 - 2))


def decide_spread(
    claimed: Arm, other: Arm, *, higher_is_better: bool, level: float = SPREAD_LEVEL, margin: float = MARGIN
) -> Verdict:
    """The verdict on the claim "`claimed` varies less between seeds than `other`" (module docstring); the arms'
    metric is better higher or lower as `higher_is_better` says, which decides the side of chance each must be on."""
    from scipy import stats  # as in `seeds_for_spread`

    sign = 1.0 if higher_is_better else -1.0
    if (unjudged := _too_few_seeds(claimed, other) or _at_chance(claimed, other, sign=sign, margin=margin)) is not None:
        return unjudged
    (_, s1), (_, s2) = mean_std(claimed.values), mean_std(other.values)
    n1, n2 = len(claimed.values), len(other.values)
    what = f"seed std {s1:.3g} ({claimed.name}) and {s2:.3g} ({other.name})"
    if s1 == s2:
        return Verdict(NOT_MEASURABLE, f"{what}: equal")
    if s1 == 0 or s2 == 0:
        return Verdict(REPRODUCED if s1 < s2 else NOT_REPRODUCED, f"{what}: one arm does not vary at all")
    # Two-sided: the larger variance over the smaller against F's upper level/2 quantile, its own degrees first.
    if s1 < s2:
        ratio, critical = (s2 / s1) ** 2, float(stats.f.ppf(1 - level / 2, n2 - 1, n1 - 1))
    else:
        ratio, critical = (s1 / s2) ** 2, float(stats.f.ppf(1 - level / 2, n1 - 1, n2 - 1))
    what = f"{what}, variance ratio {ratio:.3g} (F critical value {critical:.3g} at {level:g}, two-sided)"
    if ratio <= critical:
        return Verdict(NOT_MEASURABLE, f"{what}: not beyond it")
    return Verdict(REPRODUCED if s1 < s2 else NOT_REPRODUCED, what)


def mean_pm_std(values, digits: int, scale: float = 1.0, *, signed: bool = False) -> str:
    """ "mean ± std" of `values` over seeds (`mean_std`), each times `scale`, to `digits` decimals (a table cell);
    `signed`: the mean with its sign, + too (a slope beside a predicted +1)."""
    mean, std = mean_std(values)
    return f"{scale * mean:{'+' if signed else ''}.{digits}f} ± {scale * std:.{digits}f}"


def learned(
    name: str, accuracies, majority: float, *, last_losses: Sequence[float] | None = None,
    label_entropy: float | None = None,
) -> Verdict:  # fmt: skip
    """A control: "`name` learned the task", its held-out accuracy per seed past the majority class (chance). Where it
    fails and the models' last logged training losses and the training labels' entropy are given, it carries the
    budget they call for (`chance_loss_budget`)."""
    part = decide_threshold(Arm(f"{name} test accuracy", tuple(map(float, accuracies)), majority), majority,
                            higher_is_better=True)  # fmt: skip
    if part.verdict == REPRODUCED or last_losses is None or label_entropy is None:
        return part
    return with_budget(part, chance_loss_budget(last_losses, label_entropy))


# A classifier's last logged training loss this far under the entropy of its training labels (the loss of a model
# that learned only how often each class occurs) has left chance: the logged losses of a model at chance swing by
# ~0.1 from batch to batch.
LEFT_CHANCE_LOSS = 0.15


def chance_loss_budget(losses: Sequence[float], label_entropy: float) -> str:
    """The budget of a failed "learned the task" control of a classifier, from its models' last logged training losses
    against `label_entropy` (the entropy of the training labels, in nats): nothing follows from curves still at
    chance; models that have all left it say that longer training is what is missing."""
    lo, hi, line = min(losses), max(losses), label_entropy - LEFT_CHANCE_LOSS
    against = f"the training labels' entropy {label_entropy:.2f} (a model that learned only the class frequencies)"
    if lo > line:
        return (
            f"the models' last logged training losses are {lo:.2f}–{hi:.2f} against {against}: all still at chance, "
            "so their curves give no number of steps — a setting in which the models learn the task comes first"
        )
    if hi > line:
        return (
            f"the models' last logged training losses are {lo:.2f}–{hi:.2f} against {against}: some have left chance "
            f"(below {line:.2f}), others not, so their curves give no number of steps — a steadier setting comes first"
        )
    return (
        f"the models' last logged training losses are {lo:.2f}–{hi:.2f}, every one below {against} by more than "
        f"{LEFT_CHANCE_LOSS:g}: they are learning, and longer training is what is missing"
    )


def failed_controls(controls: dict[str, Verdict]) -> Verdict | None:
    """ "Not measurable", naming every control that does not hold (each must be reproduced before the claim's
    comparison is read), else None."""
    failed = [f"{name}: {v.reason}" for name, v in controls.items() if v.verdict != REPRODUCED]
    return Verdict(NOT_MEASURABLE, "a control failed: " + "; ".join(failed)) if failed else None


def combine(parts: dict[str, Verdict]) -> Verdict:
    """A claim made of parts: reproduced when every part is, not reproduced when any is not, else not measurable."""
    kinds = {v.verdict for v in parts.values()}
    reason = "; ".join(f"{name}: {v.verdict} ({v.reason})" for name, v in parts.items())
    if kinds == {REPRODUCED}:
        return Verdict(REPRODUCED, reason)
    return Verdict(NOT_REPRODUCED if NOT_REPRODUCED in kinds else NOT_MEASURABLE, reason)


def judged(result: dict, measured: tuple[str, ...], parts: dict[str, Verdict], verdict: Verdict) -> dict:
    """A study's result.json: the `measured` fields of `result` (what an earlier judgement derived is dropped), each
    part's verdict with its reason, and the verdict."""
    return {
        **{k: v for k, v in result.items() if k in measured},
        "parts": {name: dataclasses.asdict(v) for name, v in parts.items()},
        "verdict": verdict.verdict,
    }
