"""The studies' verdict rule: its tests against scipy's, each verdict, and every reason a claim is not measurable."""

import math

import pytest
from scipy import stats

from studies.common import NOT_MEASURABLE
from studies.verdict import (
    NOT_REPRODUCED,
    PARTLY,
    REPRODUCED,
    Arm,
    Verdict,
    budget_from_curve,
    chance_loss_budget,
    combine,
    control,
    decide,
    decide_exact,
    decide_spread,
    decide_threshold,
    decide_within,
    failed_controls,
    gap_budget,
    holm,
    learned,
    mean_std,
    seeds_for_spread,
)


def _arm(name, *values):
    return Arm(name, tuple(values))


def _pooled_rule(a: Arm, b: Arm) -> bool:
    """The rule this one replaced: a gap beyond 2 × the pooled standard deviation (an effect size, not a test)."""
    (m1, s1), (m2, s2) = mean_std(a.values), mean_std(b.values)
    n1, n2 = len(a.values), len(b.values)
    return abs(m1 - m2) > 2 * math.sqrt(((n1 - 1) * s1**2 + (n2 - 1) * s2**2) / (n1 + n2 - 2))


def test_welch_s_test_agrees_with_scipy_s():
    a, b = _arm("a", 0.61, 0.64, 0.60, 0.66), _arm("b", 0.50, 0.58, 0.52)
    v = decide(a, b, higher_is_better=True, smallest_effect=0.0)
    assert v.p == pytest.approx(stats.ttest_ind(a.values, b.values, equal_var=False).pvalue, rel=1e-9)
    v = decide_threshold(a, 0.6, higher_is_better=True)
    assert v.p == pytest.approx(stats.ttest_1samp(a.values, 0.6).pvalue, rel=1e-9)


def test_where_welch_and_the_pooled_threshold_disagree_welch_decides():
    # Ten steady seeds against three noisy ones: the pooled std is the steady arm's, so the old rule saw a gap;
    # Welch's test weighs the noisy arm's own spread over its three seeds (≈ 2 degrees of freedom) and does not.
    steady = _arm("a", *(0.60 + 0.002 * i for i in range(10)))
    noisy = _arm("b", 0.45, 0.60, 0.49)
    assert _pooled_rule(steady, noisy)
    v = decide(steady, noisy, higher_is_better=True, smallest_effect=0.01)
    assert v.verdict == NOT_MEASURABLE and "not significant at α 0.05" in v.reason
    # The other way: five seeds an arm, d = 1.56 — below the old 2, yet Welch's t 2.47 (p 0.039) is significant.
    oglu = _arm("OGLU", 1.9602, 1.9656, 1.9491, 1.9705, 1.9304)
    linear = _arm("orth. linear", 1.9803, 1.9883, 1.9777, 1.9994, 1.9556)
    assert not _pooled_rule(oglu, linear)
    v = decide(oglu, linear, higher_is_better=False, smallest_effect=0.01)
    assert v.verdict == REPRODUCED and "|t| 2.47, p 0.039" in v.reason


def test_a_significant_gap_needs_the_smallest_effect_that_matters():
    a, b = _arm("a", 0.600, 0.601, 0.602), _arm("b", 0.590, 0.591, 0.592)  # gap 0.01, tiny spread
    assert decide(a, b, higher_is_better=True, smallest_effect=0.005).verdict == REPRODUCED
    v = decide(a, b, higher_is_better=True, smallest_effect=0.05, trained=False)  # surely within ±0.05: no effect
    assert v.verdict == NOT_REPRODUCED and "within ± the smallest effect (TOST" in v.reason
    v = decide(a, b, higher_is_better=True, smallest_effect=0.0105, trained=False)
    assert v.verdict == NOT_MEASURABLE and "a real gap smaller than the smallest effect" in v.reason


def test_a_gap_that_has_not_settled_is_not_a_not_reproduced():
    better, worse = _arm("relu", 0.50, 0.51, 0.52), _arm("softmax", 0.60, 0.62, 0.61)
    claim = dict(higher_is_better=True, smallest_effect=0.02)
    assert decide(better, worse, **claim, history=[-0.05, -0.08]).verdict == NOT_REPRODUCED
    v = decide(better, worse, **claim, history=[0.04, -0.02])  # the other order a quarter of the way in
    assert v.verdict == NOT_MEASURABLE and "it has not settled" in v.reason
    v = decide(better, worse, **claim)  # no history of a trained quantity
    assert v.verdict == NOT_MEASURABLE and "whether it held as the models converged is not known" in v.reason
    assert decide(better, worse, **claim, trained=False).verdict == NOT_REPRODUCED  # measured at initialisation
    v = decide(better, worse, **claim, history=[-0.05, -0.08], proxy="perplexity is not BLEU")
    assert v.verdict == NOT_MEASURABLE and "but perplexity is not BLEU" in v.reason
    v = decide(worse, better, **claim, proxy="perplexity is not BLEU")  # nor the claimed order on a proxy
    assert v.verdict == NOT_MEASURABLE and "the claimed order; but perplexity is not BLEU" in v.reason


def test_lower_is_better_reverses_the_direction():
    better, worse = _arm("split", 100.0, 101.0, 99.0), _arm("linear", 130.0, 131.0, 129.0)
    claim = dict(higher_is_better=False, smallest_effect=1.0)
    assert decide(better, worse, **claim, history=[-20.0, -25.0]).verdict == REPRODUCED  # claimed − other's means
    assert decide(worse, better, **claim, history=[20.0, 25.0]).verdict == NOT_REPRODUCED


def test_too_few_seeds_and_non_finite_seeds():
    assert (
        "a has 2 seed(s); the rule needs 3"
        in decide(_arm("a", 0.6, 0.7), _arm("b", 0.3, 0.3, 0.3), higher_is_better=True, smallest_effect=0.0).reason
    )
    with pytest.raises(ValueError, match="arm 'a': every seed's value must be finite"):
        Arm("a", (0.5, float("nan"), 0.4))


def test_holm_s_correction_over_a_study_s_parts():
    parts = {"x": Verdict(REPRODUCED, "x", 0.03), "y": Verdict(REPRODUCED, "y", 0.04)}
    corrected = holm(parts)  # 2 × 0.03 = 0.06: neither stands
    assert {v.verdict for v in corrected.values()} == {NOT_MEASURABLE}
    assert "p 0.03 is 0.06 after Holm's correction over 2 tests" in corrected["x"].reason
    corrected = holm({"x": Verdict(REPRODUCED, "x", 0.01), "y": Verdict(NOT_REPRODUCED, "y", 0.04)})
    assert [v.verdict for v in corrected.values()] == [REPRODUCED, NOT_REPRODUCED]  # 0.02, then max(0.02, 0.04)
    # A control is outside the family: it neither counts nor is corrected.
    assert holm({"x": Verdict(REPRODUCED, "x", 0.03), "c": control(Verdict(REPRODUCED, "c", 0.04))})["x"].p == 0.03
    assert combine(parts).verdict == NOT_MEASURABLE


def test_a_claim_over_several_settings_is_partly_reproduced_naming_which():
    yes, no, unsure = Verdict(REPRODUCED, "r"), Verdict(NOT_REPRODUCED, "n"), Verdict(NOT_MEASURABLE, "m")
    assert combine({"text": yes, "listops": yes}).verdict == REPRODUCED
    v = combine({"text": yes, "listops": no})
    assert v.verdict == PARTLY and v.reason.startswith("reproduced for text only; text: reproduced (r)")
    assert combine({"text": yes, "listops": unsure}).verdict == PARTLY
    assert combine({"text": unsure, "listops": no}).verdict == NOT_REPRODUCED
    assert combine({"text": unsure, "listops": unsure}).verdict == NOT_MEASURABLE
    assert combine({"a learned (control)": control(yes), "text": yes}).verdict == REPRODUCED  # controls aside


def test_a_collapsed_classifier_has_not_learned_the_task():
    accuracies, majority = (0.40, 0.41, 0.42), 0.2
    assert learned("a", accuracies, majority, [0.3, 0.25, 0.4]).verdict == REPRODUCED
    v = learned("a", accuracies, majority, [0.3, 0.93, 0.4])
    assert v.verdict == NOT_MEASURABLE and "collapsed: a seed's most frequent prediction is 93%" in v.reason
    v = learned("a", accuracies, majority, None)
    assert v.verdict == NOT_MEASURABLE and "most frequent prediction was not recorded" in v.reason
    # The margin: 0.21 beats the majority 0.2 but not by LEARNED_MARGIN.
    assert learned("b", (0.21, 0.21, 0.211), majority, [0.5] * 3).verdict != REPRODUCED
    assert learned("a", accuracies, majority, [0.3] * 3).control


def test_controls_must_all_hold_before_a_comparison_is_read():
    past, at_chance = learned("a", (0.40, 0.41, 0.42), 0.2, [0.3] * 3), learned("b", (0.19, 0.20, 0.21), 0.2, [0.3] * 3)
    assert failed_controls({"a learned": past}) is None
    unjudged = failed_controls({"a learned": past, "b learned": at_chance, "c": learned("c", (0.4, 0.4), 0.2, None)})
    assert unjudged.verdict == NOT_MEASURABLE and "b learned: b test accuracy: mean 0.2" in unjudged.reason
    assert "c: c test accuracy has 2 seed(s)" in unjudged.reason and "a learned" not in unjudged.reason


def test_a_spread_claim_is_decided_by_the_f_test_of_the_seed_variances():
    steady = _arm("oglu", 1.00, 1.02, 0.98, 1.01, 0.99)  # std 0.0158
    noisy = _arm("linear", 1.0, 1.2, 0.8, 1.1, 0.9)  # std 0.158: variance ratio 100
    v = decide_spread(steady, noisy)
    assert v.verdict == REPRODUCED and v.p == pytest.approx(2 * stats.f.cdf(0.01, 4, 4))
    assert decide_spread(noisy, steady, history=[0.1, 0.12]).verdict == NOT_REPRODUCED
    assert decide_spread(noisy, steady).verdict == NOT_MEASURABLE  # not reproduced, but not known to have settled
    v = decide_spread(_arm("a", 1.0, 1.1, 0.9), _arm("b", 1.0, 1.2, 0.8))  # ratio 4 with 3 seeds each
    assert v.verdict == NOT_MEASURABLE and "not significant" in v.reason
    # Two arms that do not vary at all: equal spreads (a float sum's rounding is not spread).
    v = decide_spread(_arm("a", 0.1, 0.1, 0.1), _arm("b", 0.7, 0.7, 0.7))
    assert v.verdict == NOT_MEASURABLE and "equal" in v.reason


def test_a_level_claim_is_a_one_sample_test_against_the_threshold():
    above = _arm("layer 0", 0.625, 0.75, 0.875)  # mean 0.75, std 0.125
    assert decide_threshold(above, 0.3, higher_is_better=True).verdict == REPRODUCED  # t 6.2 on 2 df: p 0.025
    assert decide_threshold(above, 0.45, higher_is_better=True).verdict == NOT_MEASURABLE  # t 4.2: p 0.053
    assert decide_threshold(above, 1.2, higher_is_better=True, trained=False).verdict == NOT_REPRODUCED
    assert decide_threshold(above, 1.2, higher_is_better=False, smallest_effect=0.1).verdict == REPRODUCED


def test_a_range_claim_needs_both_ends_tested():
    assert decide_within(_arm("slope", 0.98, 1.00, 1.02), 0.85, 1.15).verdict == REPRODUCED
    v = decide_within(_arm("slope", 1.38, 1.40, 1.42), 0.85, 1.15)
    assert v.verdict == NOT_REPRODUCED and "mean 1.4 against [0.85, 1.15]" in v.reason
    v = decide_within(_arm("slope", 1.10, 1.14, 1.18), 0.85, 1.15)  # inside by 0.01, std 0.04
    assert v.verdict == NOT_MEASURABLE and "neither inside nor outside" in v.reason
    assert decide_within(_arm("slope", 1.0, 1.0), 0.85, 1.15).verdict == NOT_MEASURABLE  # two seeds
    with pytest.raises(ValueError, match=r"the range \[1.15, 0.85\] is empty"):
        decide_within(_arm("slope", 1.0, 1.0, 1.0), 1.15, 0.85)


def test_an_exact_quantity_is_judged_by_its_side_of_the_bound():
    assert decide_exact("2×GLU", 0.04, 0.10, claimed_below=True).verdict == REPRODUCED
    assert decide_exact("2×GLU", 0.12, 0.10, claimed_below=True).verdict == NOT_REPRODUCED
    assert decide_exact("3×GLU", 0.12, 0.10, claimed_below=False).verdict == REPRODUCED
    assert decide_exact("3×GLU", 0.10, 0.10, claimed_below=False).verdict == NOT_REPRODUCED


def test_a_budget_is_read_from_the_learning_curve_s_last_pace_per_doubling():
    # +0.1 per doubling over 1,000–2,000 steps; 0.2 still to go: two more doublings, 8,000 steps.
    note = budget_from_curve([500, 1000, 2000], [0.1, 0.4, 0.5], 0.7, higher_is_better=True)
    assert "reaches the 0.7 needed at ~8,000 steps (4.0× these)" in note and "+0.1 per doubling" in note
    note = budget_from_curve([1000, 2000], [3.0, 2.9], 2.7, higher_is_better=False)
    assert "at ~8,000 steps" in note and "-0.1 per doubling" in note


def test_a_slow_or_receding_curve_says_more_steps_will_not_settle_it():
    note = budget_from_curve([1750, 2000], [0.50, 0.5005], 0.9, higher_is_better=True)
    assert "has slowed" in note and "not within 16× the steps" in note and "will not settle it" in note
    note = budget_from_curve([1000, 2000], [20.0, 22.0], 12.0, higher_is_better=False)  # a rising perplexity
    assert "moves away from what the rule needs (+2 per doubling" in note
    assert "already reaches" in budget_from_curve([1, 2], [0.5, 0.95], 0.9, higher_is_better=True)
    note = budget_from_curve([1, 2], [0.5, 0.6], 1.3, higher_is_better=True, best=1.0)
    assert "beyond the best possible 1: no number of steps settles it — more seeds" in note
    with pytest.raises(ValueError, match="a learning curve needs ≥ 2 points"):
        budget_from_curve([2000], [0.5], 0.9, higher_is_better=True)
    for steps in ([0, 250], [250, 250]):
        with pytest.raises(ValueError, match="positive and increasing"):
            budget_from_curve(steps, [0.1, 0.2], 0.9, higher_is_better=True)


def test_a_gap_within_the_spread_gets_the_budget_its_curve_calls_for():
    claimed, other = _arm("a", 0.60, 0.62, 0.64), _arm("b", 0.58, 0.60, 0.62)  # gap 0.02, se 0.0163
    # Welch's test needs at most t(0.975; 4) × se = 0.0453; the gap grew 0 → 0.02 over the last doubling.
    note = gap_budget(claimed, other, [2000, 4000], [0.50, 0.62], [0.50, 0.60], higher_is_better=True,
                      smallest_effect=0.01)  # fmt: skip
    assert "reaches the 0.04534 needed at ~9,626 steps" in note
    note = gap_budget(claimed, other, [2000, 4000], [0.50, 0.62], [0.50, 0.60], higher_is_better=True,
                      smallest_effect=0.08)  # fmt: skip
    assert "the 0.08 needed" in note  # the smallest effect, where it asks more
    assert gap_budget(_arm("a", 0.1, 0.11), other, [1, 2], [0, 0], [0, 0], higher_is_better=True,
                      smallest_effect=0.0) is None  # fmt: skip


def test_a_spread_part_gets_the_seeds_its_f_test_would_need():
    # Variance ratio 4: F's two-sided 5% critical value falls below 4 at 11 seeds a side (4.03 at 10, 3.72 at 11).
    steady, noisy = _arm("a", 1.0, 1.1, 1.2), _arm("b", 1.0, 1.2, 1.4)
    assert "the F-test decides with 11 seeds per arm" in seeds_for_spread(steady, noisy)
    note = seeds_for_spread(steady, _arm("b", 1.0, 1.101, 1.202))
    assert "would need over 1000 seeds per arm: no budget settles it" in note
    assert seeds_for_spread(_arm("a", 1.0, 1.1), noisy) is None


def test_a_budget_can_count_something_else_than_steps():
    note = budget_from_curve([256, 1024], [1.77, 1.24], 0.9, higher_is_better=False, unit="random features")
    assert "per doubling of the random features over random features 256–1,024" in note and "random features (" in note


def test_a_failed_learned_control_s_budget_reads_the_last_losses_against_the_label_entropy():
    # Entropy 2.25: chance is anything above 2.10 (the logged losses swing ~0.1 at chance).
    assert "all still at chance" in chance_loss_budget([2.2, 2.24, 2.3], 2.25)
    assert "some have left chance (below 2.10), others not" in chance_loss_budget([1.8, 2.2, 2.3], 2.25)
    learning = chance_loss_budget([1.7, 1.9, 2.05], 2.25)
    assert "every one below the training labels' entropy 2.25" in learning and "longer training" in learning
    v = learned("a", (0.19, 0.2, 0.21), 0.2, [0.3] * 3, last_losses=[2.2, 2.24, 2.3], label_entropy=2.25)
    assert "budget: the models' last logged training losses are 2.20–2.30" in v.reason
