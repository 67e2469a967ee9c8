"""BERT masking: rates, the 80/10/10 split, specials never chosen, whole words, determinism."""

import numpy as np
import pytest

from mlm_flax.masking import MaskingSpec, mask_tokens

SPECIALS = (0, 1, 2, 3, 4, 5, 6)  # pad unk bos eos [MASK] [CLS] [SEP]
MASK, CLS, SEP, VOCAB = 4, 5, 6, 300


def _sequences(n, length=128, seed=0):
    rng = np.random.default_rng(seed)
    seqs = rng.integers(7, VOCAB, (n, length)).astype(np.int32)
    seqs[:, 0] = CLS
    for s in seqs:
        s[rng.integers(1, length, 3)] = SEP  # document ends inside the sequence
        s[length - rng.integers(0, 40) :] = 0  # padding tail of varying length
    return seqs


def _spec(**kw):
    return MaskingSpec(mask_id=MASK, vocab_size=VOCAB, special_ids=SPECIALS, max_predictions=128, **kw)


def test_rates_split_and_specials():
    seqs = _sequences(1500)
    spec = _spec()
    chosen_total = candidates_total = sequence_total = 0
    outcome = {"mask": 0, "random": 0, "kept": 0}
    for i, tokens in enumerate(seqs):
        out = mask_tokens(tokens, np.random.default_rng([7, i]), spec)
        n = int(out["mask_weights"].sum())
        pos, targets = out["positions"][:n], out["targets"][:n]
        candidates = ~np.isin(tokens, SPECIALS)
        candidates_total += candidates.sum()
        sequence_total += int((tokens != 0).sum())
        chosen_total += n
        assert candidates[pos].all(), "a special or padding token was chosen"
        np.testing.assert_array_equal(targets, tokens[pos])
        unchosen = np.ones(len(tokens), bool)
        unchosen[pos] = False
        np.testing.assert_array_equal(out["inputs"][unchosen], tokens[unchosen])  # only chosen tokens change
        new = out["inputs"][pos]
        outcome["mask"] += int((new == MASK).sum())
        outcome["kept"] += int((new == targets).sum())
        outcome["random"] += int(((new != MASK) & (new != targets)).sum())
        assert not np.isin(new[new != MASK], SPECIALS).any()  # random replacements are ordinary tokens
    # BERT's count: 15% of the sequence's tokens, [CLS] and [SEP] among them (create_pretraining_data.py,
    # create_masked_lm_predictions: num_to_predict = round(len(tokens) * masked_lm_prob), tokens with [CLS] [SEP]).
    assert chosen_total / sequence_total == pytest.approx(0.15, abs=0.003)
    assert chosen_total / candidates_total > 0.15 + 0.001  # more than 15% of the maskable ones
    total = sum(outcome.values())
    # A random replacement equals the original with probability 1/293: counted as kept.
    assert outcome["mask"] / total == pytest.approx(0.8, abs=0.015)
    assert outcome["random"] / total == pytest.approx(0.1, abs=0.01)
    assert outcome["kept"] / total == pytest.approx(0.1, abs=0.01)


def test_max_predictions_caps_and_fills_with_zero_weight():
    tokens = _sequences(1)[0]
    out = mask_tokens(tokens, np.random.default_rng(0), MaskingSpec(MASK, VOCAB, SPECIALS, max_predictions=5))
    np.testing.assert_array_equal(out["mask_weights"], np.ones(5))
    out = mask_tokens(np.array([CLS, 9, 10, SEP, 0, 0]), np.random.default_rng(0), _spec())
    assert out["mask_weights"].sum() == 1  # at least one token of a short sequence
    assert out["positions"][0] in (1, 2)
    out = mask_tokens(np.array([CLS, SEP, 0, 0]), np.random.default_rng(0), _spec())
    assert out["mask_weights"].sum() == 0  # nothing maskable: nothing chosen


def test_whole_word_masking_chooses_whole_words():
    rng = np.random.default_rng(1)
    word_starts = rng.random(VOCAB) < 0.4
    spec = _spec(word_starts=word_starts)
    for i, tokens in enumerate(_sequences(200, seed=3)):
        out = mask_tokens(tokens, np.random.default_rng(i), spec)
        chosen = np.zeros(len(tokens), bool)
        chosen[out["positions"][: int(out["mask_weights"].sum())]] = True
        candidates = ~np.isin(tokens, SPECIALS)
        words, start = [], None  # the words, as [start, end) runs of candidates cut at word starts
        for j in range(len(tokens) + 1):
            continues_word = j < len(tokens) and candidates[j] and start is not None and not word_starts[tokens[j]]
            if start is not None and not continues_word:
                words.append((start, j))
                start = None
            if j < len(tokens) and candidates[j] and start is None:
                start = j
        for a, b in words:
            assert chosen[a:b].all() or not chosen[a:b].any(), f"word {a}:{b} split"
        budget = min(candidates.sum(), max(1, round(0.15 * (tokens != 0).sum())))  # BERT: the sequence counts
        left = budget - int(chosen.sum())
        assert left >= 0
        # Filled as far as whole words allow: every word left out is longer than what the budget has left.
        assert all(b - a > left for a, b in words if not chosen[a]), (left, budget)


def test_same_seed_same_masks_and_new_seed_new_masks():
    tokens = _sequences(1)[0]
    a = mask_tokens(tokens, np.random.default_rng([0, 5]), _spec())
    b = mask_tokens(tokens, np.random.default_rng([0, 5]), _spec())
    c = mask_tokens(tokens, np.random.default_rng([0, 6]), _spec())
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["positions"], c["positions"])


def test_mask_and_random_fractions_over_one_are_refused_naming_both_fields():
    with pytest.raises(ValueError, match="data.mask_token_fraction=0.95 and data.random_token_fraction=0.1"):
        _spec(mask_fraction=0.95, random_fraction=0.1)


def test_the_budget_counts_the_whole_sequence_as_bert_does_or_the_maskable_tokens_when_asked():
    """64 tokens with [CLS] and [SEP]: BERT predicts round(0.15 × 64) = 10; counting only the 62 maskable ones
    gives round(9.3) = 9. Padding counts in neither."""
    tokens = np.concatenate([[CLS], np.arange(7, 69), [SEP], np.zeros(20, np.int64)]).astype(np.int32)
    chosen = {budget: int(mask_tokens(tokens, np.random.default_rng(0), _spec(budget=budget))["mask_weights"].sum())
              for budget in ("sequence", "maskable")}  # fmt: skip
    assert chosen == {"sequence": 10, "maskable": 9}
