"""The studies' verdict rule: each of the three verdicts, and every reason a comparison is not measurable."""

import math

import pytest

from studies.common import NOT_MEASURABLE
from studies.verdict import (
    NOT_REPRODUCED,
    REPRODUCED,
    Arm,
    Verdict,
    budget_from_curve,
    combine,
    decide,
    decide_exact,
    decide_spread,
    decide_threshold,
    decide_within,
    gap_budget,
    mean_std,
    pooled_std,
    seeds_for_spread,
)


def _arm(name, *values, chance=0.1):
    return Arm(name, tuple(values), chance)


def test_a_gap_in_the_claimed_direction_beyond_the_spread_is_reproduced():
    v = decide(_arm("relu", 0.60, 0.62, 0.61), _arm("softmax", 0.50, 0.51, 0.52), higher_is_better=True)
    assert v.verdict == REPRODUCED and "pooled std" in v.reason


def test_a_gap_the_other_way_beyond_the_spread_is_not_reproduced():
    v = decide(_arm("relu", 0.50, 0.51, 0.52), _arm("softmax", 0.60, 0.62, 0.61), higher_is_better=True)
    assert v.verdict == NOT_REPRODUCED


def test_lower_is_better_reverses_the_direction():
    perplexity = dict(chance=700.0)
    better = Arm("split", (100.0, 101.0, 99.0), **perplexity)
    worse = Arm("linear", (130.0, 131.0, 129.0), **perplexity)
    assert decide(better, worse, higher_is_better=False).verdict == REPRODUCED
    assert decide(worse, better, higher_is_better=False).verdict == NOT_REPRODUCED


@pytest.mark.parametrize(
    "claimed, other, why",
    [
        (_arm("a", 0.6, 0.7), _arm("b", 0.3, 0.3, 0.3), "a has 2 seed(s); the rule needs 3"),
        (_arm("a", 0.6, 0.6, 0.6), _arm("b", 0.11, 0.09, 0.10), "b is not measurably past chance"),
        (_arm("a", 0.6, 0.7, 0.5), _arm("b", 0.55, 0.65, 0.6), "not larger than 2 × the pooled std"),
    ],
)
def test_otherwise_not_measurable_with_the_reason(claimed, other, why):
    v = decide(claimed, other, higher_is_better=True)
    assert v.verdict == NOT_MEASURABLE and why in v.reason


def test_the_margin_is_a_rule_not_a_tuning_knob_in_the_studies():
    arms = _arm("a", 0.60, 0.62, 0.64), _arm("b", 0.56, 0.58, 0.60)  # gap 0.04, pooled std 0.02: 2× exactly
    assert decide(*arms, higher_is_better=True).verdict == NOT_MEASURABLE  # "larger than", strictly
    assert decide(*arms, higher_is_better=True, margin=1.5).verdict == REPRODUCED
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)


def test_a_non_finite_seed_is_refused_naming_the_arm():
    with pytest.raises(ValueError, match="arm 'a': every seed's value must be finite"):
        Arm("a", (0.5, float("nan"), 0.4), 0.1)


def test_a_spread_claim_is_decided_by_the_f_test_of_the_seed_variances():
    steady = _arm("oglu", 1.00, 1.02, 0.98, 1.01, 0.99)  # std 0.0158
    noisy = _arm("linear", 1.0, 1.2, 0.8, 1.1, 0.9)  # std 0.158: variance ratio 100 > F(0.975; 4, 4) = 9.60
    v = decide_spread(steady, noisy, higher_is_better=True)
    assert v.verdict == REPRODUCED and "F critical value 9.6" in v.reason
    assert decide_spread(noisy, steady, higher_is_better=True).verdict == NOT_REPRODUCED
    # Ratio 4 with 3 seeds each: F(0.975; 2, 2) = 39, far from decided.
    v = decide_spread(_arm("a", 1.0, 1.1, 0.9), _arm("b", 1.0, 1.2, 0.8), higher_is_better=True)
    assert v.verdict == NOT_MEASURABLE and "not beyond it" in v.reason
    assert "the rule needs 3" in decide_spread(_arm("a", 1.0, 1.1), noisy, higher_is_better=True).reason
    # (b) as for means: two losses at chance (ln 10) are not judged, however different their spreads; and a
    # claim whose other part is at chance is then not measurable, not "not reproduced".
    at_chance = Arm("oglu", (2.30, 2.31, 2.29, 2.36, 2.24), 2.302585)
    flat = Arm("orth. linear", (2.302, 2.3021, 2.3019, 2.302, 2.3021), 2.302585)
    v = decide_spread(at_chance, flat, higher_is_better=False)
    assert v.verdict == NOT_MEASURABLE and "not measurably past chance" in v.reason
    parts = {"faster": decide(at_chance, flat, higher_is_better=False), "steadier": v}
    assert combine(parts).verdict == NOT_MEASURABLE


def test_the_pooled_std_weights_each_arm_by_its_degrees_of_freedom():
    a = _arm("a", *[float(x) for x in range(10)])  # s² = 9.1667, 9 degrees of freedom
    b = _arm("b", 0.0, 1.0, 2.0)  # s² = 1, 2 degrees of freedom
    assert pooled_std(a, b) == pytest.approx(math.sqrt((9 * 9.1667 + 2 * 1.0) / 11), rel=1e-4)  # 2.87
    assert pooled_std(b, _arm("c", 5.0, 7.0, 9.0)) == pytest.approx(math.sqrt((1.0 + 4.0) / 2))  # equal n: the mean


def test_a_claim_of_several_parts_needs_every_part():
    yes, no, unsure = (Verdict(REPRODUCED, "r"), Verdict(NOT_REPRODUCED, "n"), Verdict(NOT_MEASURABLE, "m"))
    assert combine({"faster": yes, "steadier": yes}).verdict == REPRODUCED
    assert combine({"faster": yes, "steadier": unsure}).verdict == NOT_MEASURABLE
    assert combine({"faster": unsure, "steadier": no}).verdict == NOT_REPRODUCED
    assert combine({"faster": yes, "steadier": no}).reason == "faster: reproduced (r); steadier: not reproduced (n)"


def test_a_level_claim_needs_the_seeds_beyond_the_threshold_by_the_margin():
    above = _arm("layer 0", 0.625, 0.75, 0.875, chance=0.03)  # mean 0.75, std 0.125 (exact in binary)
    assert decide_threshold(above, 0.45, higher_is_better=True).verdict == REPRODUCED
    assert decide_threshold(above, 0.5, higher_is_better=True).verdict == NOT_MEASURABLE  # 2 std above, not more
    assert decide_threshold(above, 1.05, higher_is_better=True).verdict == NOT_REPRODUCED
    perplexity = _arm("model", 0.625, 0.75, 0.875, chance=2.0)  # lower is better: chance lies above
    assert decide_threshold(perplexity, 1.05, higher_is_better=False).verdict == REPRODUCED  # "below 1.05"
    noise = _arm("layer 1", 0.03, 0.031, 0.029, chance=0.03)
    assert "not measurably past chance" in decide_threshold(noise, 0.5, higher_is_better=True).reason
    assert "the rule needs 3" in decide_threshold(_arm("a", 0.7, 0.7), 0.5, higher_is_better=True).reason


def test_controls_must_all_hold_before_a_comparison_is_read():
    from studies.verdict import failed_controls, learned

    past, at_chance = learned("a", (0.40, 0.41, 0.42), 0.2), learned("b", (0.19, 0.20, 0.21), 0.2)
    assert past.verdict == REPRODUCED and at_chance.verdict == NOT_MEASURABLE
    assert failed_controls({"a learned": past}) is None
    unjudged = failed_controls({"a learned": past, "b learned": at_chance, "c": learned("c", (0.4, 0.4), 0.2)})
    assert unjudged.verdict == NOT_MEASURABLE
    assert "b learned: b test accuracy is not measurably past chance" in unjudged.reason
    assert "c: c test accuracy has 2 seed(s)" in unjudged.reason and "a learned" not in unjudged.reason


def test_a_range_claim_needs_the_mean_inside_or_outside_by_the_margin_at_the_nearer_end():
    inside = _arm("slope", 0.98, 1.00, 1.02)  # std 0.02: 0.15 from both ends of [0.85, 1.15]
    assert decide_within(inside, 0.85, 1.15).verdict == REPRODUCED
    outside = _arm("slope", 1.38, 1.40, 1.42)  # 0.25 beyond the upper end
    v = decide_within(outside, 0.85, 1.15)
    assert v.verdict == NOT_REPRODUCED and "mean 1.4 against [0.85, 1.15]" in v.reason
    near_edge = _arm("slope", 1.10, 1.14, 1.18)  # inside by 0.01, std 0.04
    v = decide_within(near_edge, 0.85, 1.15)
    assert v.verdict == NOT_MEASURABLE and "not inside by more than 2 × the std" in v.reason
    assert decide_within(_arm("slope", 1.0, 1.0), 0.85, 1.15).verdict == NOT_MEASURABLE  # two seeds


def test_an_exact_quantity_is_judged_by_its_side_of_the_bound():
    assert decide_exact("2×GLU", 0.04, 0.10, claimed_below=True).verdict == REPRODUCED
    assert decide_exact("2×GLU", 0.12, 0.10, claimed_below=True).verdict == NOT_REPRODUCED
    assert decide_exact("3×GLU", 0.12, 0.10, claimed_below=False).verdict == REPRODUCED
    assert decide_exact("3×GLU", 0.10, 0.10, claimed_below=False).verdict == NOT_REPRODUCED


def test_a_budget_is_read_from_the_learning_curve_s_last_pace_per_doubling():
    # +0.1 per doubling over 1,000–2,000 steps; 0.2 still to go: two more doublings, 8,000 steps.
    note = budget_from_curve([500, 1000, 2000], [0.1, 0.4, 0.5], 0.7, higher_is_better=True)
    assert "reaches the 0.7 needed at ~8,000 steps (4.0× these)" in note and "+0.1 per doubling" in note
    # Lower is better (a loss): the same arithmetic mirrored.
    note = budget_from_curve([1000, 2000], [3.0, 2.9], 2.7, higher_is_better=False)
    assert "at ~8,000 steps" in note and "-0.1 per doubling" in note


def test_a_slow_or_receding_curve_says_more_steps_will_not_settle_it():
    note = budget_from_curve([1750, 2000], [0.50, 0.5005], 0.9, higher_is_better=True)
    assert "has slowed" in note and "not within 16× the steps" in note and "will not settle it" in note
    note = budget_from_curve([1000, 2000], [20.0, 22.0], 12.0, higher_is_better=False)  # a rising perplexity
    assert "moves away from what the rule needs (+2 per doubling" in note
    assert "already reaches" in budget_from_curve([1, 2], [0.5, 0.95], 0.9, higher_is_better=True)
    note = budget_from_curve([1, 2], [0.5, 0.6], 1.3, higher_is_better=True, best=1.0)
    assert "beyond the best possible 1: no budget settles it unless the seeds come closer together" in note
    with pytest.raises(ValueError, match="a learning curve needs ≥ 2 points"):
        budget_from_curve([2000], [0.5], 0.9, higher_is_better=True)
    for steps in ([0, 250], [250, 250]):
        with pytest.raises(ValueError, match="positive and increasing"):
            budget_from_curve(steps, [0.1, 0.2], 0.9, higher_is_better=True)


def test_a_gap_within_the_spread_gets_the_budget_its_curve_calls_for_unless_an_arm_is_at_chance():
    claimed, other = _arm("a", 0.60, 0.62, 0.64), _arm("b", 0.58, 0.60, 0.62)  # gap 0.02, pooled std 0.02
    # The gap grew from 0 to 0.02 over the last doubling; the rule needs 0.04: one more doubling, 8,000 steps.
    note = gap_budget(claimed, other, [2000, 4000], [0.50, 0.62], [0.50, 0.60], higher_is_better=True)
    assert "reaches the 0.04 needed at ~8,000 steps" in note
    at_chance = _arm("a", 0.10, 0.11, 0.12)
    assert gap_budget(at_chance, other, [2000, 4000], [0.1, 0.11], [0.5, 0.6], higher_is_better=True) is None


def test_a_spread_part_gets_the_seeds_its_f_test_would_need():
    # Variance ratio 4: F's two-sided 5% critical value falls below 4 at 11 seeds a side (4.03 at 10, 3.72 at 11).
    steady, noisy = _arm("a", 1.0, 1.1, 1.2), _arm("b", 1.0, 1.2, 1.4)
    assert "the F-test decides with 11 seeds per arm" in seeds_for_spread(steady, noisy, higher_is_better=True)
    alike = _arm("b", 1.0, 1.101, 1.202)
    note = seeds_for_spread(steady, alike, higher_is_better=True)
    assert "would need over 1000 seeds per arm: no budget settles it" in note
    # Where the spread is not what stands in the way, it says nothing: two seeds, or an arm at chance.
    assert seeds_for_spread(_arm("a", 1.0, 1.1), noisy, higher_is_better=True) is None
    assert seeds_for_spread(_arm("a", 0.1, 0.11, 0.12), noisy, higher_is_better=True) is None


def test_a_budget_can_count_something_else_than_steps():
    note = budget_from_curve([256, 1024], [1.77, 1.24], 0.9, higher_is_better=False, unit="random features")
    assert "per doubling of the random features over random features 256–1,024" in note and "random features (" in note


def test_a_failed_learned_control_s_budget_reads_the_last_losses_against_the_label_entropy():
    from studies.verdict import chance_loss_budget

    # Entropy 2.25: chance is anything above 2.10 (the logged losses swing ~0.1 at chance).
    assert "all still at chance" in chance_loss_budget([2.2, 2.24, 2.3], 2.25)
    assert "some have left chance (below 2.10), others not" in chance_loss_budget([1.8, 2.2, 2.3], 2.25)
    learning = chance_loss_budget([1.7, 1.9, 2.05], 2.25)
    assert "every one below the training labels' entropy 2.25" in learning and "longer training" in learning
