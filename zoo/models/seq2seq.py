"""Generative models: a causal language model and an encoder-decoder, both with incremental decoding.

Decoding state is an explicit pytree (`init_cache` → `decode` → new cache), so it jits and scans; each
mixer keeps what it needs: a key-value cache (softmax, ReLU, sparse), the running (S, z) (linear), or
the gate inputs seen so far (SGU).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from zoo.layers import TokenEmbedding, add_positions, compute_dtype, dense
from zoo.layers.dropout import Dropout
from zoo.layers.embeddings import sinusoidal_positions
from zoo.models.classifiers import PAD_ID
from zoo.models.config import check_model
from zoo.models.encoder import Decoder, Encoder


def _check_length(name: str, tokens: jax.Array, max_length: int) -> None:
    """The caches, the learned positions and the decoding limits are sized for model.max_length."""
    if tokens.shape[-1] > max_length:
        raise ValueError(f"{name} length {tokens.shape[-1]} exceeds model.max_length={max_length}")


class _Generator(nnx.Module):
    """What both models share: the output projection (or the tied target embedding) and the decoding cache."""

    def _output(self, cfg: ml_collections.ConfigDict, tie: str, vocab: int, rngs: nnx.Rngs) -> None:
        self.positional, self.max_length = cfg.positional, cfg.max_length
        dtype = compute_dtype(cfg.dtype)
        self.logits = None if tie != "none" else dense(cfg.d_model, vocab, ("embed", "vocab"), dtype=dtype, rngs=rngs)
        self.dropout = Dropout(cfg.dropout, rngs=rngs)

    def _project(self, x: jax.Array, embed: TokenEmbedding) -> jax.Array:
        return (embed.attend(x) if self.logits is None else self.logits(x)).astype(jnp.float32)

    def init_cache(self, batch: int, max_length: int | None = None) -> dict:
        max_length = self.max_length if max_length is None else max_length
        return {"layers": self.decoder.init_cache(batch, max_length), "index": jnp.zeros((), jnp.int32)}

    def _step(self, token: jax.Array, cache: dict, embed: TokenEmbedding, **context) -> tuple[jax.Array, dict]:
        """token `[batch, 1]` at position cache["index"] → (logits `[batch, 1, vocab]`, cache)."""
        if token.ndim != 2 or token.shape[1] != 1:
            raise ValueError(f"a decoding step takes token [batch, 1], got shape {token.shape}")
        x = embed(token)
        if self.positional != "none":
            row = jax.lax.dynamic_slice_in_dim(sinusoidal_positions(self.max_length, x.shape[-1]), cache["index"], 1)
            x = x + row[None].astype(x.dtype)
        x, layers = self.decoder.decode(x, cache["layers"], **context)
        return self._project(x, embed), {"layers": layers, "index": cache["index"] + 1}


class CausalLM(_Generator):
    """tokens `[batch, length]` → next-token logits `[batch, length, vocab]` (float32).

    model.tie_embeddings "decoder" (or "all"): the output projection is the input embedding table.
    """

    def __init__(self, cfg: ml_collections.ConfigDict, *, vocab_size: int, rngs: nnx.Rngs):
        check_model(cfg, "CausalLM", vocab_size=vocab_size)
        tie = cfg.get("tie_embeddings", "none")  # its one_of rule: check_model
        dtype = compute_dtype(cfg.dtype)
        self.embed = TokenEmbedding(vocab_size, cfg.d_model, dtype=dtype, rngs=rngs, scale=cfg.embed_scale)
        self.decoder = Decoder(cfg, rngs=rngs, checked=True)
        self._output(cfg, tie, vocab_size, rngs)

    def __call__(self, tokens: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        _check_length("input", tokens, self.max_length)
        x = add_positions(self.embed(tokens), self.positional)
        x = self.decoder(self.dropout(x, rngs=rngs), mask=tokens != PAD_ID, rngs=rngs)
        return self._project(x, self.embed)

    def decode(self, token: jax.Array, cache: dict) -> tuple[jax.Array, dict]:
        return self._step(token, cache, self.embed)


class EncoderDecoder(_Generator):
    """(source, target prefix) → logits; the decoder cross-attends through `model.cross_mixer`.

    model.tie_embeddings (fairseq's flags): "decoder" = the target embedding is also the output projection
    (--share-decoder-input-output-embed); "all" = source, target and output share one table
    (--share-all-embeddings, needs one joint vocabulary).
    """

    def __init__(self, cfg: ml_collections.ConfigDict, *, src_vocab: int, tgt_vocab: int, rngs: nnx.Rngs):
        check_model(cfg, "EncoderDecoder", src_vocab=src_vocab, tgt_vocab=tgt_vocab)
        dtype = compute_dtype(cfg.dtype)
        tie = cfg.get("tie_embeddings", "none")  # its one_of rule: check_model
        if tie == "all" and src_vocab != tgt_vocab:
            raise ValueError(
                f"model.tie_embeddings='all' needs one joint vocabulary; got {src_vocab} source and {tgt_vocab} "
                "target tokens"
            )
        self.tgt_embed = TokenEmbedding(tgt_vocab, cfg.d_model, dtype=dtype, rngs=rngs, scale=cfg.embed_scale)
        # "all": one module referenced twice (NNX keeps shared references: one parameter, summed gradients).
        self.src_embed = (
            self.tgt_embed
            if tie == "all"
            else TokenEmbedding(src_vocab, cfg.d_model, dtype=dtype, rngs=rngs, scale=cfg.embed_scale)
        )
        self.encoder = Encoder(cfg, rngs=rngs, checked=True)
        num_layers = cfg.num_decoder_layers or cfg.num_layers
        self.decoder = Decoder(cfg, num_layers=num_layers, cross=True, rngs=rngs, checked=True)
        self._output(cfg, tie, tgt_vocab, rngs)

    def encode(self, src: jax.Array, *, rngs: nnx.Rngs | None = None) -> tuple[jax.Array, jax.Array]:
        _check_length("source", src, self.max_length)
        mask = src != PAD_ID
        x = add_positions(self.src_embed(src), self.positional)
        return self.encoder(self.dropout(x, rngs=rngs), mask=mask, rngs=rngs), mask

    def __call__(self, src: jax.Array, tgt_in: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        enc, src_mask = self.encode(src, rngs=rngs)
        _check_length("target", tgt_in, self.max_length)
        y = add_positions(self.tgt_embed(tgt_in), self.positional)
        y = self.decoder(
            self.dropout(y, rngs=rngs), mask=tgt_in != PAD_ID, context=enc, context_mask=src_mask, rngs=rngs
        )
        return self._project(y, self.tgt_embed)

    def project_context(self, enc: jax.Array) -> list:
        """Cross-attention keys/values of every decoder layer, computed once per source for `decode`."""
        return self.decoder.project_context(enc)

    def decode(self, token, cache, enc, src_mask, context_kv: list | None = None) -> tuple[jax.Array, dict]:
        """As `CausalLM.decode`, cross-attending to `enc`; pass `context_kv` to skip re-projecting it."""
        return self._step(token, cache, self.tgt_embed, context=enc, context_mask=src_mask, context_kv=context_kv)
