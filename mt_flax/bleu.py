"""Translation metrics with sacreBLEU: BLEU (13a) and chrF on detokenised text, and tokenised BLEU.

`bleu_tokenized` scores the text as the corpus holds it, split on whitespace (tokenize="none"): for
fairseq-prepared IWSLT (Moses-tokenised, lower-cased) that is what fairseq's `score` reports.
"""

from __future__ import annotations

from collections.abc import Sequence

import sacrebleu


def score(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """Corpus scores and sacreBLEU signatures; lists must align one hypothesis per reference."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    hyps, refs = list(hypotheses), [list(references)]
    bleu = sacrebleu.metrics.BLEU(tokenize="13a")
    chrf = sacrebleu.metrics.CHRF()
    tok = sacrebleu.metrics.BLEU(tokenize="none")
    return {
        "bleu": bleu.corpus_score(hyps, refs).score,
        "chrf": chrf.corpus_score(hyps, refs).score,
        "bleu_tokenized": tok.corpus_score(hyps, refs).score,
        "sacrebleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }
