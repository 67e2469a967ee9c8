"""Batched greedy and beam-search decoding for `EncoderDecoder`, through each mixer's incremental state.

Both run as one jitted `lax.while_loop`: the encoder once, then one decoder step per token. Beam search keeps
`beam_size` live and `beam_size` finished hypotheses per example, reordering every cache by the surviving beams;
scores are log p / lp(length) (alpha = 0: plain log-probability, and beam size 1 is then exactly greedy). Each
example stops at its own limit `max_length_a · source length + max_length_b` (EOS is forced there).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.models.classifiers import PAD_ID

NEG_INF = -1.0e9


def decode_limits(src: jax.Array, *, max_length: int, max_length_a: float, max_length_b: int) -> jax.Array:
    """Per-example number of target tokens allowed (EOS included), at most `max_length`."""
    src_len = jnp.sum(src != PAD_ID, axis=1)
    limit = jnp.ceil(max_length_a * src_len).astype(jnp.int32) + max_length_b
    return jnp.clip(limit, 1, max_length)


def _disallow(logits: jax.Array, force_eos: jax.Array, *, bos_id: int, eos_id: int) -> jax.Array:
    """Never emit PAD or BOS; only EOS where `force_eos` (broadcast over the vocabulary axis)."""
    ids = jnp.arange(logits.shape[-1])
    banned = (ids == PAD_ID) | (ids == bos_id) | (force_eos & (ids != eos_id))
    return jnp.where(banned, NEG_INF, logits)


LENGTH_PENALTIES = ("gnmt", "fairseq")


def _length_penalty(length: jax.Array, alpha: float, form: str = "gnmt") -> jax.Array:
    """What a finished hypothesis' log-probability is divided by: GNMT's ((5 + |y|) / 6)^α (Wu et al. 2016) or
    fairseq's |y|^α (sequence_generator.py: eos_scores / (step + 1) ** len_penalty); |y| counts EOS."""
    if form not in LENGTH_PENALTIES:
        raise ValueError(f"length_penalty_form={form!r} is unknown; valid: {', '.join(LENGTH_PENALTIES)}")
    length = length.astype(jnp.float32)
    return ((5.0 + length) / 6.0) ** alpha if form == "gnmt" else length**alpha


def greedy_search(
    model,
    src: jax.Array,
    *,
    max_length: int,
    max_length_a: float = 1.5,
    max_length_b: int = 10,
    bos_id: int,
    eos_id: int,
) -> jax.Array:
    """src `[batch, S]` → tokens `[batch, max_length]` (EOS then PAD after each hypothesis ends)."""
    batch = src.shape[0]
    limits = decode_limits(src, max_length=max_length, max_length_a=max_length_a, max_length_b=max_length_b)
    enc, src_mask = model.encode(src)
    context_kv = model.project_context(enc)
    cache = model.init_cache(batch, max_length)
    out = jnp.full((batch, max_length), PAD_ID, jnp.int32)

    def cond(carry):
        t, _, _, _, done = carry
        return (t < max_length) & ~jnp.all(done)

    def body(carry):
        t, prev, cache, out, done = carry
        logits, cache = model.decode(prev[:, None], cache, enc, src_mask, context_kv)
        logits = logits[:, 0]
        logits = _disallow(logits, ((t + 1) >= limits)[:, None], bos_id=bos_id, eos_id=eos_id)
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        token = jnp.where(done, PAD_ID, token)
        out = out.at[:, t].set(token)
        return t + 1, token, cache, out, done | (token == eos_id)

    init = (jnp.int32(0), jnp.full((batch,), bos_id, jnp.int32), cache, out, jnp.zeros((batch,), bool))
    return jax.lax.while_loop(cond, body, init)[3]


def beam_search(
    model,
    src: jax.Array,
    *,
    beam_size: int,
    max_length: int,
    length_penalty: float = 0.6,
    length_penalty_form: str = "gnmt",
    max_length_a: float = 1.5,
    max_length_b: int = 10,
    bos_id: int,
    eos_id: int,
) -> jax.Array:
    """src `[batch, S]` → best hypothesis per example, `[batch, max_length]` (EOS, then PAD)."""
    batch, k = src.shape[0], beam_size
    rows = batch * k
    limits = decode_limits(src, max_length=max_length, max_length_a=max_length_a, max_length_b=max_length_b)
    enc, src_mask = model.encode(src)
    enc, src_mask = jnp.repeat(enc, k, axis=0), jnp.repeat(src_mask, k, axis=0)
    context_kv = model.project_context(enc)
    cache = model.init_cache(rows, max_length)
    alive_seq = jnp.full((batch, k, max_length + 1), PAD_ID, jnp.int32).at[:, :, 0].set(bos_id)
    alive_logp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (batch, 1))
    fin_seq = jnp.full((batch, k, max_length + 1), PAD_ID, jnp.int32)
    fin_score = jnp.full((batch, k), NEG_INF, jnp.float32)
    # The best a live beam can still reach: its log-probability only falls, and lp is largest at the limit.
    best_lp = _length_penalty(limits, length_penalty, length_penalty_form)

    def cond(carry):
        t, _, alive_logp, _, fin_score, _ = carry
        best_alive = jnp.max(alive_logp, axis=1)
        can_improve = (best_alive > NEG_INF / 2) & (best_alive / best_lp > jnp.min(fin_score, axis=1))
        return (t < max_length) & jnp.any(can_improve)

    def body(carry):
        t, alive_seq, alive_logp, fin_seq, fin_score, cache = carry
        tokens = alive_seq[:, :, t].reshape(rows, 1)
        logits, cache = model.decode(tokens, cache, enc, src_mask, context_kv)
        logp = jax.nn.log_softmax(logits[:, 0]).reshape(batch, k, -1)
        vocab = logp.shape[-1]
        logp = _disallow(logp, ((t + 1) >= limits)[:, None, None], bos_id=bos_id, eos_id=eos_id)
        cand = (alive_logp[:, :, None] + logp).reshape(batch, k * vocab)
        top_logp, top_idx = jax.lax.top_k(cand, 2 * k)
        beam, token = top_idx // vocab, (top_idx % vocab).astype(jnp.int32)
        seqs = jnp.take_along_axis(alive_seq, beam[:, :, None], axis=1).at[:, :, t + 1].set(token)
        is_eos = token == eos_id
        # Finished: EOS candidates ranked within the best k (as fairseq does, so beam size 1 is greedy), scored
        # with the length penalty and merged with the old finished set.
        finishes = is_eos & (jnp.arange(2 * k) < k) & (top_logp > NEG_INF / 2)
        lp = _length_penalty(t + 1, length_penalty, length_penalty_form)
        new_score = jnp.where(finishes, top_logp / lp, NEG_INF)
        all_score = jnp.concatenate([fin_score, new_score], axis=1)
        all_seq = jnp.concatenate([fin_seq, seqs], axis=1)
        fin_score, keep = jax.lax.top_k(all_score, k)
        fin_seq = jnp.take_along_axis(all_seq, keep[:, :, None], axis=1)
        # Alive: the best k candidates that did not end.
        alive_logp, keep = jax.lax.top_k(jnp.where(is_eos, NEG_INF, top_logp), k)
        alive_seq = jnp.take_along_axis(seqs, keep[:, :, None], axis=1)
        src_beam = jnp.take_along_axis(beam, keep, axis=1)
        index = (jnp.arange(batch)[:, None] * k + src_beam).reshape(rows)  # of every leaf with a batch axis
        cache = jax.tree.map(lambda x: x[index] if x.ndim and x.shape[0] == rows else x, cache)
        return t + 1, alive_seq, alive_logp, fin_seq, fin_score, cache

    init = (jnp.int32(0), alive_seq, alive_logp, fin_seq, fin_score, cache)
    _, alive_seq, alive_logp, fin_seq, fin_score, _ = jax.lax.while_loop(cond, body, init)
    # An example with no finished hypothesis (only possible when the loop hit max_length) keeps its best live one.
    none_finished = fin_score[:, 0] <= NEG_INF / 2
    best = jnp.where(none_finished[:, None], alive_seq[:, 0], fin_seq[:, 0])
    return best[:, 1:]


_STATIC = "graphdef beam_size max_length length_penalty length_penalty_form max_length_a max_length_b bos_id eos_id"


@functools.partial(jax.jit, static_argnames=_STATIC.split())
def _translate_jit(graphdef, state, src, *, beam_size, **kwargs):
    model = nnx.merge(graphdef, state)
    if beam_size == 1 and not kwargs["length_penalty"]:
        kwargs.pop("length_penalty")
        kwargs.pop("length_penalty_form")
        return greedy_search(model, src, **kwargs)
    return beam_search(model, src, beam_size=beam_size, **kwargs)


def translate(
    model: nnx.Module,
    src: jax.Array,
    *,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    length_penalty_form: str = "gnmt",
    max_length_a: float = 1.5,
    max_length_b: int = 10,
    **specials: int,
) -> jax.Array:
    """Jitted decoding of a batch with an `EncoderDecoder` in eval mode (greedy when beam_size == 1 and alpha == 0);
    `specials`: max_length, bos_id and eos_id, as `beam_search` takes them."""
    settings = dict(
        beam_size=beam_size, length_penalty=length_penalty, length_penalty_form=length_penalty_form,
        max_length_a=max_length_a, max_length_b=max_length_b, **specials,
    )  # fmt: skip
    graphdef, state, settings = _jit_args(model, settings)
    return _translate_jit(graphdef, state, src, **settings)


def compile_translate(model: nnx.Module, src: jax.ShapeDtypeStruct, **settings) -> jax.stages.Compiled:
    """`translate(model, src, **settings)` compiled for `src`'s shape and not run (for its memory analysis);
    `settings`: every keyword of `translate`."""
    graphdef, state, settings = _jit_args(model, settings)
    return _translate_jit.lower(graphdef, state, src, **settings).compile()


def _jit_args(model: nnx.Module, settings: dict) -> tuple[nnx.GraphDef, nnx.State, dict]:
    """The model split for `_translate_jit`, and `settings` typed as its static arguments (decode.* are validated)."""
    typed = dict(
        length_penalty=float(settings["length_penalty"]), max_length_a=float(settings["max_length_a"]),
        max_length_b=int(settings["max_length_b"]),
    )  # fmt: skip
    return *nnx.split(model), {**settings, **typed}
