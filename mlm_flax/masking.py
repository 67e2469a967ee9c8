"""BERT's masking (docs/tasks.md) as a pure numpy function of the tokens and a random generator.

`rate` (15%) of the sequence's tokens are chosen, as BERT's create_pretraining_data.py counts them: every token
but padding, [CLS] and [SEP] included (`budget="sequence"`); `budget="maskable"` counts only the tokens that may be
chosen. At most `max_predictions` per sequence, never a special symbol; a chosen token becomes [MASK] with
probability 0.8, a random ordinary token with 0.1, and stays itself with 0.1. The loss is taken at the chosen
positions only, which come out as a fixed-size list (`positions`, `targets`, `weights`; unused slots have weight
0) so the model computes the vocabulary projection only where it is needed. Whole-word masking chooses whole words
(a word-start piece and the pieces that continue it) until the budget is reached.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np


@dataclasses.dataclass(frozen=True)
class MaskingSpec:
    mask_id: int
    vocab_size: int
    special_ids: tuple[int, ...]  # never chosen, never drawn as random replacements
    max_predictions: int
    rate: float = 0.15
    mask_fraction: float = 0.8
    random_fraction: float = 0.1
    word_starts: np.ndarray | None = None  # [vocab] bool; set for whole-word masking
    pad_id: int = 0  # not a token of the sequence when the budget is counted
    budget: str = "sequence"  # what `rate` is a share of (module docstring): "sequence" (BERT's) or "maskable"

    def __post_init__(self):
        if self.mask_fraction + self.random_fraction > 1:  # each field's own range is its declared rule
            raise ValueError(
                f"data.mask_token_fraction={self.mask_fraction} and data.random_token_fraction={self.random_fraction} "
                "must sum to at most 1"
            )

    @functools.cached_property
    def ordinary_ids(self) -> np.ndarray:
        """Ids a random replacement is drawn from (computed once: masking runs per example)."""
        ids = np.ones((self.vocab_size,), bool)
        ids[list(self.special_ids)] = False
        return np.flatnonzero(ids)


def _choose_whole_words(candidates: np.ndarray, starts: np.ndarray, budget: int, rng) -> np.ndarray:
    """Positions of whole words (candidate runs cut at word starts) in random order while they fit the budget."""
    new_word = starts | ~np.concatenate([[False], candidates[:-1]])
    word_of = np.cumsum(new_word & candidates) - 1
    words = [np.flatnonzero(candidates & (word_of == w)) for w in range(int(word_of[candidates].max()) + 1)]
    chosen: list[int] = []
    for w in rng.permutation(len(words)):
        if len(chosen) + len(words[w]) <= budget:
            chosen.extend(words[w].tolist())
        if len(chosen) == budget:
            break
    return np.sort(np.asarray(chosen, np.int64))


def mask_tokens(tokens: np.ndarray, rng: np.random.Generator, spec: MaskingSpec) -> dict[str, np.ndarray]:
    """tokens `[length]` → {inputs `[length]`, positions, targets, mask_weights `[max_predictions]`}."""
    tokens = np.asarray(tokens, np.int32)
    candidates = ~np.isin(tokens, spec.special_ids)
    count = int(candidates.sum())
    positions = np.zeros((spec.max_predictions,), np.int32)
    targets = np.zeros((spec.max_predictions,), np.int32)
    weights = np.zeros((spec.max_predictions,), np.float32)
    inputs = tokens.copy()
    if count == 0:
        return {"inputs": inputs, "positions": positions, "targets": targets, "mask_weights": weights}
    counted = count if spec.budget == "maskable" else int(np.count_nonzero(tokens != spec.pad_id))
    budget = min(spec.max_predictions, count, max(1, round(spec.rate * counted)))
    if spec.word_starts is not None:
        chosen = _choose_whole_words(candidates, spec.word_starts[tokens], budget, rng)
    else:
        chosen = np.sort(rng.choice(np.flatnonzero(candidates), size=budget, replace=False))
    action = rng.random(len(chosen))
    to_mask = action < spec.mask_fraction
    to_random = (action >= spec.mask_fraction) & (action < spec.mask_fraction + spec.random_fraction)
    inputs[chosen[to_mask]] = spec.mask_id
    inputs[chosen[to_random]] = rng.choice(spec.ordinary_ids, size=int(to_random.sum()))
    n = len(chosen)
    positions[:n], targets[:n], weights[:n] = chosen, tokens[chosen], 1.0
    return {"inputs": inputs, "positions": positions, "targets": targets, "mask_weights": weights}
