"""The one verdict rule of every study, declared before any result.

Every comparison is a test at level ALPHA with a smallest effect that matters, declared per claim by the study:
  (a) each arm has at least MIN_SEEDS seeds (standard deviations are the sample ones, n − 1);
  (b) two arms' means are compared by Welch's t-test (unequal variances), a level by a one-sample t-test, a spread
      between runs by the two-sided F-test of the seed variances;
  (c) "reproduced": the test rejects at ALPHA in the claimed direction and the gap is at least the smallest effect;
  (d) "not reproduced": the test rejects in the opposite direction by at least the smallest effect, or (between
      two arms) the two one-sided tests (TOST) put the gap within ± the smallest effect — and, for a trained
      quantity, only where that already held over the last two doublings of training (`history`: the gap at a
      quarter and half of the steps had the same sign, or was within ± the smallest effect);
      (c) and (d) need the paper's metric, or a proxy the study's README argues tracks it (`proxy` names a metric
      that is neither);
  (e) otherwise "not measurable at this budget", with the reason and, where a curve gives one, the budget.
A study's parts are one family: Holm's step-down correction over their p-values (`holm`) before (c) and (d) stand.
A claim over several settings (`combine`) is "partly reproduced" where some settings reproduce it and not all,
naming them.

Controls come first and are not part of the family. A trained classifier "learned" the task only when its held-out
accuracy beats the majority class by LEARNED_MARGIN (one-sample t-test) and its most frequent prediction is under
COLLAPSED_SHARE of its outputs; a failed control makes the claim "not measurable", naming it (`failed_controls`),
with the budget its last training losses call for (`chance_loss_budget`). Only trained classifiers have this chance
gate; estimators (FAVOR+'s error) and language models (their own plateau control) do not. Where the paper's claim is
about trained-out models, `converged` asks that the curve moved less than CONVERGED_CHANGE over its last doubling.

A quantity without noise (a parameter count) is `decide_exact`: the side of the bound decides. A claim that a
quantity lies in a range is `decide_within`: both one-sided tests inside → reproduced; either outside (Bonferroni
over the two ends) → not reproduced.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Sequence

from lra_flax.compare import mean_std
from studies.common import NOT_MEASURABLE

REPRODUCED, NOT_REPRODUCED, PARTLY = "reproduced", "not reproduced", "partly reproduced"
ALPHA = 0.05
MIN_SEEDS = 3
LEARNED_MARGIN = 0.02  # accuracy a trained classifier must beat the majority class by
COLLAPSED_SHARE = 0.9  # a classifier whose most frequent prediction is this share of its outputs has collapsed


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of a comparison: its measured value per seed."""

    name: str
    values: tuple[float, ...]

    def __post_init__(self):
        if not all(math.isfinite(v) for v in self.values):
            raise ValueError(f"arm {self.name!r}: every seed's value must be finite, got {list(self.values)}")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A verdict with its reason; `p`: the p-value it rests on (Holm's correction reads it); `control`: a control,
    outside the family and the claim."""

    verdict: str
    reason: str
    p: float | None = None
    control: bool = False


def _stats():
    from scipy import stats  # here, not at the top: scipy.stats takes ~0.9 s to import

    return stats


def _t_tail(t: float, df: float) -> float:
    """P(T ≥ t) for Student's t with `df` degrees of freedom (a zero standard error: a step at 0)."""
    if math.isinf(t) or math.isnan(df):
        return 0.0 if t > 0 else 1.0
    return float(_stats().t.sf(t, df))


def _tested(gap: float, se: float, df: float, smallest_effect: float) -> tuple[float, float, float]:
    """(t, two-sided p of gap ≠ 0, TOST p of |gap| < smallest_effect) for a gap with standard error `se`."""
    if se == 0:
        t = math.copysign(math.inf, gap) if gap else 0.0
        return t, (0.0 if gap else 1.0), (0.0 if abs(gap) < smallest_effect else 1.0)
    t = gap / se
    p_equal = max(_t_tail((gap + smallest_effect) / se, df), _t_tail((smallest_effect - gap) / se, df))
    return t, min(1.0, 2 * _t_tail(abs(t), df)), p_equal


def _judge(
    what: str, gap: float, t: float, p: float, p_equal: float | None, smallest_effect: float, *,
    history: Sequence[float] | None, trained: bool, proxy: str | None, alpha: float,
) -> Verdict:  # fmt: skip
    """(c)–(e) of the module docstring for a sign-adjusted `gap` (> 0: the claimed direction) and its test; `history`
    holds the sign-adjusted gap at earlier points of training."""
    effect = f"; smallest effect that matters {smallest_effect:.3g}" if smallest_effect else ""
    what = f"{what} (|t| {abs(t):.2f}, p {p:.2g}{effect})"
    if p < alpha and gap >= smallest_effect:
        if proxy is not None:
            reason = f"{what}: the claimed order; but {proxy}: a verdict needs the paper's metric"
            return Verdict(NOT_MEASURABLE, reason, p)
        return Verdict(REPRODUCED, what, p)
    if p < alpha and gap <= -smallest_effect:
        held = None if history is None else all(h < 0 for h in history)
        return _not_reproduced(f"{what}: the opposite order", p, held, trained=trained, proxy=proxy)
    if p_equal is not None and p_equal < alpha:
        held = None if history is None else all(abs(h) < smallest_effect for h in history)
        return _not_reproduced(f"{what}: within ± the smallest effect (TOST p {p_equal:.2g})", p_equal, held,
                               trained=trained, proxy=proxy)  # fmt: skip
    if p < alpha:
        return Verdict(NOT_MEASURABLE, f"{what}: a real gap smaller than the smallest effect that matters", p)
    return Verdict(NOT_MEASURABLE, f"{what}: not significant at α {alpha:g}", p)


def _not_reproduced(what: str, p: float, held: bool | None, *, trained: bool, proxy: str | None) -> Verdict:
    """(d)'s conditions on a "not reproduced": the paper's metric, and a gap that held as training went on."""
    if proxy is not None:
        return Verdict(NOT_MEASURABLE, f'{what}; but {proxy}: "not reproduced" needs the paper\'s metric', p)
    if trained and held is None:
        return Verdict(NOT_MEASURABLE, f"{what}; the gap was not recorded at a quarter and half of the training, so "
                                       "whether it held as the models converged is not known", p)  # fmt: skip
    if trained and not held:
        return Verdict(NOT_MEASURABLE, f"{what}; but not at a quarter and half of the training: it has not settled", p)
    return Verdict(NOT_REPRODUCED, what, p)


def decide(
    claimed: Arm, other: Arm, *, higher_is_better: bool, smallest_effect: float, history: Sequence[float] | None = None,
    trained: bool = True, proxy: str | None = None, alpha: float = ALPHA,
) -> Verdict:  # fmt: skip
    """The verdict on the claim "`claimed` does better than `other`" by Welch's t-test (module docstring). `history`:
    claimed − other's mean at a quarter and half of the training; `trained`: the arms are trained quantities;
    `proxy`: why the metric is not the paper's."""
    if (unjudged := _too_few_seeds(claimed, other)) is not None:
        return unjudged
    sign = 1.0 if higher_is_better else -1.0
    (m1, s1), (m2, s2) = mean_std(claimed.values), mean_std(other.values)
    se, df = _welch(s1, len(claimed.values), s2, len(other.values))
    gap = sign * (m1 - m2)
    t, p, p_equal = _tested(gap, se, df, smallest_effect)
    what = f"gap {m1 - m2:+.4g} between means {m1:.4g} ({claimed.name}) and {m2:.4g} ({other.name}), Welch's"
    signed = None if history is None else [sign * h for h in history]
    return _judge(what, gap, t, p, p_equal, smallest_effect, history=signed, trained=trained, proxy=proxy, alpha=alpha)


def _welch(s1: float, n1: int, s2: float, n2: int) -> tuple[float, float]:
    """The standard error of a gap between two means of seed spreads s1, s2 over n1, n2 seeds, and its
    Welch–Satterthwaite degrees of freedom (NaN when neither arm varies)."""
    v1, v2 = s1**2 / n1, s2**2 / n2
    df = (v1 + v2) ** 2 / (v1**2 / (n1 - 1) + v2**2 / (n2 - 1)) if v1 + v2 else math.nan
    return math.sqrt(v1 + v2), df


def decide_threshold(
    arm: Arm, threshold: float, *, higher_is_better: bool, smallest_effect: float = 0.0,
    history: Sequence[float] | None = None, trained: bool = True, proxy: str | None = None, alpha: float = ALPHA,
) -> Verdict:  # fmt: skip
    """The verdict on the claim "`arm` is beyond `threshold`" (above it if `higher_is_better`) by a one-sample t-test;
    `history`: the arm's mean at a quarter and half of the training."""
    if (unjudged := _too_few_seeds(arm)) is not None:
        return unjudged
    sign = 1.0 if higher_is_better else -1.0
    mean, std = mean_std(arm.values)
    gap = sign * (mean - threshold)
    t, p, _ = _tested(gap, std / math.sqrt(len(arm.values)), len(arm.values) - 1, smallest_effect)
    what = f"{arm.name}: mean {mean:.4g} against the threshold {threshold:.4g}, seed std {std:.3g}"
    signed = None if history is None else [sign * (h - threshold) for h in history]
    return _judge(what, gap, t, p, None, smallest_effect, history=signed, trained=trained, proxy=proxy, alpha=alpha)


def decide_within(arm: Arm, low: float, high: float, *, alpha: float = ALPHA) -> Verdict:
    """The verdict on the claim "`arm`'s value lies in [low, high]" (module docstring): its seeds are measurements
    (draws of random inputs), not trainings."""
    if low > high:
        raise ValueError(f"decide_within: the range [{low}, {high}] is empty")
    if (unjudged := _too_few_seeds(arm)) is not None:
        return unjudged
    mean, std = mean_std(arm.values)
    se, df = std / math.sqrt(len(arm.values)), len(arm.values) - 1
    z = (lambda x: math.copysign(math.inf, x) if x else 0.0) if se == 0 else (lambda x: x / se)
    p_inside = max(_t_tail(z(mean - low), df), _t_tail(z(high - mean), df))
    p_outside = min(1.0, 2 * min(_t_tail(z(low - mean), df), _t_tail(z(mean - high), df)))
    what = f"{arm.name}: mean {mean:.4g} against [{low:.4g}, {high:.4g}], seed std {std:.3g}"
    if p_inside < alpha:
        return Verdict(REPRODUCED, f"{what} (inside, p {p_inside:.2g})", p_inside)
    if p_outside < alpha:
        return Verdict(NOT_REPRODUCED, f"{what} (outside, p {p_outside:.2g})", p_outside)
    return Verdict(NOT_MEASURABLE, f"{what}: neither inside nor outside at α {alpha:g} (p {p_inside:.2g} inside, "
                                   f"{p_outside:.2g} outside)", min(p_inside, p_outside))  # fmt: skip


def decide_exact(name: str, value: float, bound: float, *, claimed_below: bool) -> Verdict:
    """The verdict on the claim "`value` is below `bound`" (above it unless `claimed_below`) for a quantity without
    noise (a parameter count): the side decides; on the bound itself the claim of "below"/"above" fails."""
    what = f"{name}: {value:.4g} against {bound:.4g}"
    holds = value < bound if claimed_below else value > bound
    return Verdict(REPRODUCED if holds else NOT_REPRODUCED, what)


def decide_spread(
    claimed: Arm, other: Arm, *, history: Sequence[float] | None = None, trained: bool = True,
    alpha: float = ALPHA,
) -> Verdict:  # fmt: skip
    """The verdict on the claim "`claimed` varies less between seeds than `other`" by the two-sided F-test of the
    seed variances; `history`: claimed − other's seed standard deviation at a quarter and half of the training."""
    if (unjudged := _too_few_seeds(claimed, other)) is not None:
        return unjudged
    (_, s1), (_, s2) = mean_std(claimed.values), mean_std(other.values)
    n1, n2 = len(claimed.values), len(other.values)
    what = f"seed std {s1:.3g} ({claimed.name}) and {s2:.3g} ({other.name})"
    if s1 == s2:
        return Verdict(NOT_MEASURABLE, f"{what}: equal", 1.0)
    if s1 == 0 or s2 == 0:
        p = 0.0
    else:
        f = _stats().f
        ratio = s1**2 / s2**2
        p = min(1.0, 2 * min(float(f.cdf(ratio, n1 - 1, n2 - 1)), float(f.sf(ratio, n1 - 1, n2 - 1))))
        what = f"{what}, variance ratio {ratio:.3g} (F-test, two-sided p {p:.2g})"
    if p >= alpha:
        return Verdict(NOT_MEASURABLE, f"{what}: not significant at α {alpha:g}", p)
    if s1 < s2:
        return Verdict(REPRODUCED, what, p)
    held = None if history is None else all(h > 0 for h in history)
    return _not_reproduced(f"{what}: the opposite order", p, held, trained=trained, proxy=None)


def earlier_gaps(
    claimed: Sequence[Sequence[tuple[int, float]]], other: Sequence[Sequence[tuple[int, float]]]
) -> list[float]:
    """The `history` of a comparison: claimed − other's mean over seeds at a quarter and half of the training, from
    each seed's logged curve of (step, value) pairs."""
    last = max(run[-1][0] for run in (*claimed, *other))
    return [c - o for c, o in zip(history_means(claimed, last), history_means(other, last), strict=True)]


def history_means(runs: Sequence[Sequence[tuple[int, float]]], last: float | None = None) -> list[float]:
    """The `history` of a level: the mean over seeds at a quarter and half of `last` (default: the runs' last step)."""
    last = max(run[-1][0] for run in runs) if last is None else last
    return [mean_at(runs, last * f) for f in (0.25, 0.5)]


def mean_at(runs: Sequence[Sequence[tuple[int, float]]], step: float) -> float:
    """The mean over seeds of each curve's value at its logged step nearest `step`."""
    return statistics.fmean(min(run, key=lambda logged: abs(logged[0] - step))[1] for run in runs)


CONVERGED_CHANGE = 0.05  # a curve that moved less than this (relative) over its last doubling of steps has settled


def converged(
    name: str, runs: Sequence[Sequence[tuple[int, float]]], *, tolerance: float = CONVERGED_CHANGE
) -> Verdict:
    """A control for claims about trained-out models (the paper's): the seeds' mean curve (of (step, value) pairs)
    moved by less than `tolerance` of its last value over the last doubling of steps."""
    last = max(run[-1][0] for run in runs)
    at_half, at_end = mean_at(runs, last / 2), mean_at(runs, last)
    change = abs(at_end - at_half) / abs(at_end)
    what = f"{name}: {at_half:.4g} at step ~{last // 2:,}, {at_end:.4g} at {last:,} ({100 * change:.1f}% change)"
    if change < tolerance:
        return Verdict(REPRODUCED, what, control=True)
    return Verdict(NOT_MEASURABLE, f"{what}: still moving by {100 * tolerance:g}% or more, not trained out",
                   control=True)  # fmt: skip


def holm(parts: dict[str, Verdict], alpha: float = ALPHA) -> dict[str, Verdict]:
    """`parts` after Holm's step-down correction over the p-values of the family (every part with one, controls
    aside): a decided part whose adjusted p is not below `alpha` becomes "not measurable"."""
    family = sorted((v.p, name) for name, v in parts.items() if v.p is not None and not v.control)
    adjusted, running = {}, 0.0
    for i, (p, name) in enumerate(family):
        running = max(running, min(1.0, (len(family) - i) * p))
        adjusted[name] = running
    out = {}
    for name, v in parts.items():
        if name in adjusted and v.verdict in (REPRODUCED, NOT_REPRODUCED) and adjusted[name] >= alpha:
            v = Verdict(NOT_MEASURABLE, f"{v.reason}; p {v.p:.2g} is {adjusted[name]:.2g} after Holm's correction "
                                        f"over {len(family)} tests: not below α {alpha:g}", v.p)  # fmt: skip
        out[name] = v
    return out


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
        return (f"at this seed spread and count the rule needs a mean of {needed:.4g}, beyond the best possible "
                f"{best:.4g}: no number of steps settles it — more seeds (the test's standard error falls as "
                "1/√seeds) or a steadier setting")  # fmt: skip
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
    *, higher_is_better: bool, smallest_effect: float, alpha: float = ALPHA,
) -> str | None:  # fmt: skip
    """The budget of a `decide` part left not measurable (`budget_from_curve` on the gap between the arms' mean
    curves, against the gap Welch's test would need at the present seed spread, or the smallest effect where that
    is more); None with too few seeds. The curves' last points are the arms' means."""
    if _too_few_seeds(claimed, other):
        return None
    sign = 1.0 if higher_is_better else -1.0
    gap = [sign * (c - o) for c, o in zip(claimed_curve, other_curve, strict=True)]
    needed = needed_gap(claimed, other, smallest_effect=smallest_effect, alpha=alpha)
    return budget_from_curve(steps, gap, needed, higher_is_better=True)


def needed_gap(claimed: Arm, other: Arm, *, smallest_effect: float, alpha: float = ALPHA) -> float:
    """The gap `decide` would need at the arms' present seed spread: the smallest effect, or what Welch's test needs
    where that is more (its critical value at n₁ + n₂ − 2 degrees of freedom, the most Welch's can have: a lower
    bound of the need)."""
    (_, s1), (_, s2) = mean_std(claimed.values), mean_std(other.values)
    se, _ = _welch(s1, len(claimed.values), s2, len(other.values))
    df = len(claimed.values) + len(other.values) - 2
    return max(smallest_effect, float(_stats().t.ppf(1 - alpha / 2, df)) * se)


def needed_mean(arm: Arm, threshold: float, *, higher_is_better: bool, alpha: float = ALPHA) -> float:
    """The mean `decide_threshold` would need at the arm's present seed spread to call it beyond `threshold`."""
    sign = 1.0 if higher_is_better else -1.0
    _, std = mean_std(arm.values)
    n = len(arm.values)
    return threshold + sign * float(_stats().t.ppf(1 - alpha / 2, n - 1)) * std / math.sqrt(n)


def seeds_for_gap(claimed: Arm, other: Arm, *, smallest_effect: float, alpha: float = ALPHA) -> str | None:
    """The budget of a `decide` part without a curve to read: the seeds per arm at which Welch's test would find the
    gap seen now (if the means and spreads stayed as they are); None with too few seeds."""
    if _too_few_seeds(claimed, other):
        return None
    (m1, s1), (m2, s2) = mean_std(claimed.values), mean_std(other.values)
    gap = abs(m1 - m2)
    if gap < smallest_effect:
        return (f"the gap seen now ({gap:.3g}) is below the smallest effect that matters: more seeds would test it "
                "as no effect (the two one-sided tests), not as the claimed gap")  # fmt: skip
    for n in range(max(len(claimed.values), len(other.values)) + 1, MAX_SEEDS + 1):
        se, df = _welch(s1, n, s2, n)
        if float(_stats().t.ppf(1 - alpha / 2, df if se else 2 * n - 2)) * se < gap:
            return f"at the gap and spread seen now, Welch's test decides with ~{n} seeds per arm"
    return f"the gap seen now ({gap:.3g}) would need over {MAX_SEEDS} seeds per arm: no budget settles it"


MAX_SEEDS = 1000  # a spread claim that needs more seeds than this is not one a study can settle


def seeds_for_spread(claimed: Arm, other: Arm, *, alpha: float = ALPHA) -> str | None:
    """The budget of a `decide_spread` part left not measurable: the seeds per arm at which the F-test's critical
    value falls below the variance ratio observed now (if the ratio stayed as it is) — more seeds, unlike more steps,
    are what an F-test needs; None with too few seeds."""
    if _too_few_seeds(claimed, other):
        return None
    (_, s1), (_, s2) = mean_std(claimed.values), mean_std(other.values)
    if s1 == 0 or s2 == 0:
        return "an arm does not vary at all"
    ratio, f = max(s1, s2) ** 2 / min(s1, s2) ** 2, _stats().f
    for n in range(max(len(claimed.values), len(other.values)) + 1, MAX_SEEDS + 1):
        if float(f.ppf(1 - alpha / 2, n - 1, n - 1)) < ratio:
            return f"at the variance ratio seen now ({ratio:.3g}) the F-test decides with {n} seeds per arm"
    return f"the variance ratio seen now ({ratio:.3g}) would need over {MAX_SEEDS} seeds per arm: no budget settles it"


def with_budget(part: Verdict, budget: str | None) -> Verdict:
    """`part` with the budget that would settle it after its reason; unchanged where there is none to say."""
    return part if budget is None else dataclasses.replace(part, reason=f"{part.reason}; budget: {budget}")


def _too_few_seeds(*arms: Arm) -> Verdict | None:
    """(a): "not measurable" when an arm has fewer than MIN_SEEDS seeds, else None."""
    for arm in arms:
        if len(arm.values) < MIN_SEEDS:
            return Verdict(NOT_MEASURABLE, f"{arm.name} has {len(arm.values)} seed(s); the rule needs {MIN_SEEDS}")
    return None


def mean_pm_std(values, digits: int, scale: float = 1.0, *, signed: bool = False) -> str:
    """ "mean ± std" of `values` over seeds (`mean_std`), each times `scale`, to `digits` decimals (a table cell);
    `signed`: the mean with its sign, + too (a slope beside a predicted +1)."""
    mean, std = mean_std(values)
    return f"{scale * mean:{'+' if signed else ''}.{digits}f} ± {scale * std:.{digits}f}"


def learned(
    name: str, accuracies, majority: float, top_shares: Sequence[float] | None, *,
    last_losses: Sequence[float] | None = None, label_entropy: float | None = None,
) -> Verdict:  # fmt: skip
    """A control: "`name` learned the task" — its held-out accuracy per seed beats the majority class by
    LEARNED_MARGIN (a one-sample t-test) and no seed's most frequent prediction (`top_shares`, its share of the
    outputs) reaches COLLAPSED_SHARE. Where it fails and the models' last logged training losses and the training
    labels' entropy are given, it carries the budget they call for (`chance_loss_budget`)."""
    arm = Arm(f"{name} test accuracy", tuple(map(float, accuracies)))
    part = decide_threshold(arm, majority + LEARNED_MARGIN, higher_is_better=True, trained=False)
    part = Verdict(part.verdict, f"{part.reason} (the majority class {majority:.4g} + {LEARNED_MARGIN:g})")
    if part.verdict == REPRODUCED:
        if top_shares is None:
            part = Verdict(NOT_MEASURABLE, f"{part.reason}; the share of its most frequent prediction was not "
                                           "recorded, so a collapsed classifier cannot be told apart")  # fmt: skip
        elif (top := max(top_shares)) >= COLLAPSED_SHARE:
            collapsed = f"{100 * top:.0f}% of its outputs (≥ {100 * COLLAPSED_SHARE:.0f}%)"
            part = Verdict(NOT_MEASURABLE, f"{part.reason}; but it collapsed: a seed's most frequent prediction is "
                                           f"{collapsed}")  # fmt: skip
    if part.verdict != REPRODUCED and last_losses is not None and label_entropy is not None:
        part = with_budget(part, chance_loss_budget(last_losses, label_entropy))
    return control(part)


def control(part: Verdict) -> Verdict:
    """`part` as a control: outside the family Holm's correction counts and outside the claim `combine` judges."""
    return dataclasses.replace(part, control=True)


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
    """The claim's verdict from its parts after Holm's correction, controls aside: reproduced when every part is;
    "partly reproduced" when some are and not all, naming which; not reproduced when none is and some part is not;
    else not measurable."""
    claim = {name: v for name, v in holm(parts).items() if not v.control}
    kinds = {v.verdict for v in claim.values()}
    reason = "; ".join(f"{name}: {v.verdict} ({v.reason})" for name, v in claim.items())
    if kinds == {REPRODUCED}:
        return Verdict(REPRODUCED, reason)
    if REPRODUCED in kinds:
        which = ", ".join(name for name, v in claim.items() if v.verdict == REPRODUCED)
        return Verdict(PARTLY, f"reproduced for {which} only; {reason}")
    return Verdict(NOT_REPRODUCED if NOT_REPRODUCED in kinds else NOT_MEASURABLE, reason)


def judged(result: dict, measured: tuple[str, ...], parts: dict[str, Verdict], verdict: Verdict) -> dict:
    """A study's result.json: the `measured` fields of `result` (what an earlier judgement derived is dropped), each
    part's verdict with its reason after Holm's correction, and the verdict."""
    return {
        **{k: v for k, v in result.items() if k in measured},
        "parts": {name: dataclasses.asdict(v) for name, v in holm(parts).items()},
        "verdict": verdict.verdict,
    }


if __name__ == "__main__":  # a library: running it would do nothing, which must not pass for success
    raise SystemExit("studies.verdict is the studies' verdict rule, a library, not a command: run a study instead")
