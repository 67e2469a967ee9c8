"""Linear attention with fixed, random or trainable feature maps (docs/mixers.md).

Feature maps φ (applied head-wise, the same φ for queries and keys, weights `[heads, d, d]` per head):
  elu1           ELU(x) + 1 (Katharopoulos et al. 2020)
  relu           ReLU(x) + 1e-6
  favor          FAVOR+ positive orthogonal random features (Performer); non-trainable state
  softplus       Softplus(x W)
  orth_softplus  Softplus(x W), W orthogonal at init, regulariser λ·mean((W Wᵀ − I)²)
  glu            Softplus(x W_f) ⊙ σ(x W_g)
  oglu           as glu with W_f orthogonal + regulariser, W_g He init
  aoglu          as oglu with a low-rank gate σ((x A) B), rank r = d/4 by default
`kernel_depth` = k stacks k trainable kernels (the inner ones without Softplus). The orthogonality regulariser is
sown as `AuxLoss` in training. `eps_mode` "auto": "guard" (Performer's) for favor, "add" for the rest.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

import kernels
from zoo.config_fields import BOOLEAN, Field, above, at_least, integer, one_of
from zoo.layers.common import AuxLoss, collects_aux_loss
from zoo.mixers.attention import MultiHeadMixer
from zoo.mixers.inputs import check_decode_input
from zoo.mixers.registry import IMPL_OPTION, register

FEATURE_MAPS = ("elu1", "relu", "favor", "softplus", "orth_softplus", "glu", "oglu", "aoglu")
_FIXED = ("elu1", "relu", "favor")
_ORTHOGONAL = ("orth_softplus", "oglu", "aoglu")


class RandomFeatures(nnx.Variable):
    """FAVOR+ projection ω: state, but not a trainable parameter."""


def orthogonal_random_features(key: jax.Array, num_features: int, dim: int) -> jax.Array:
    """`[num_features, dim]`: stacked orthogonal blocks, rows rescaled to Gaussian norms (Performer)."""
    blocks = -(-num_features // dim)
    keys = jax.random.split(key, blocks + 1)
    rows = [jnp.linalg.qr(jax.random.normal(k, (dim, dim)))[0].T for k in keys[:blocks]]
    w = jnp.concatenate(rows, axis=0)[:num_features]
    norms = jnp.linalg.norm(jax.random.normal(keys[-1], (num_features, dim)), axis=1)
    return w * norms[:, None]


def favor_features(x, omega, *, is_query: bool, mask, causal: bool) -> jax.Array:
    """φ(x) = m^(−½)(exp(ωᵀx̂ − ‖x̂‖²/2 − stabiliser) + 1e-6), x̂ = x·d^(−¼); x `[B, T, H, d]`.

    Queries subtract their own row max (it cancels in the normaliser). Keys share one stabiliser: the max over
    real keys when not causal (padding cannot change it), none when causal (future keys must not change the past).
    """
    d, m = x.shape[-1], omega.shape[0]
    xs = x.astype(jnp.float32) * d**-0.25
    proj = jnp.einsum("bthd,md->bthm", xs, omega.astype(jnp.float32))
    log_phi = proj - 0.5 * jnp.sum(xs * xs, axis=-1, keepdims=True)
    if is_query:
        stab = jnp.max(proj, axis=-1, keepdims=True)
    elif causal:
        stab = jnp.zeros((), jnp.float32)
    else:
        real = jnp.ones(x.shape[:2], bool) if mask is None else mask
        stab = jnp.max(jnp.where(real[:, :, None, None], proj, -jnp.inf), axis=(1, 3), keepdims=True)
        stab = jnp.where(jnp.isfinite(stab), stab, 0.0)
    return (jnp.exp(log_phi - jax.lax.stop_gradient(stab)) + 1e-6) / math.sqrt(m)


def orthogonality_penalty(w: jax.Array) -> jax.Array:
    """mean((W Wᵀ − I)²) over heads; ≈ 0 for orthogonal W."""
    eye = jnp.eye(w.shape[-1], dtype=jnp.float32)
    gram = jnp.einsum("hij,hkj->hik", w, w)
    return jnp.mean((gram - eye) ** 2)


class KernelLayer(nnx.Module):
    """One trainable feature-map layer on `[B, T, H, d]`: (Softplus or identity)(x W_f) [⊙ gate(x)]."""

    def __init__(self, kind: str, heads: int, d: int, *, positive: bool, gate_rank: int, rngs: nnx.Rngs):
        lecun = jax.nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
        he = jax.nn.initializers.he_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
        self.orthogonal = kind in _ORTHOGONAL
        if self.orthogonal:
            orthogonal = jax.nn.initializers.orthogonal()
            w_f = jax.vmap(lambda k: orthogonal(k, (d, d), jnp.float32))(jax.random.split(rngs.params(), heads))
        else:
            w_f = lecun(rngs.params(), (heads, d, d))
        self.w_f = nnx.Param(w_f, logical_axes=("heads", None, None))
        self.positive = positive
        self.gate_kind = None
        if kind in ("glu", "oglu"):
            self.gate_kind = "full"
            init = he if kind == "oglu" else lecun
            self.w_g = nnx.Param(init(rngs.params(), (heads, d, d)), logical_axes=("heads", None, None))
        elif kind == "aoglu":
            self.gate_kind = "low_rank"
            self.gate_a = nnx.Param(he(rngs.params(), (heads, d, gate_rank)), logical_axes=("heads", None, None))
            self.gate_b = nnx.Param(he(rngs.params(), (heads, gate_rank, d)), logical_axes=("heads", None, None))

    def __call__(self, x: jax.Array) -> jax.Array:
        f = jnp.einsum("bthd,hde->bthe", x, self.w_f[...].astype(x.dtype))
        if self.positive:
            f = jax.nn.softplus(f)
        if self.gate_kind == "full":
            f = f * jax.nn.sigmoid(jnp.einsum("bthd,hde->bthe", x, self.w_g[...].astype(x.dtype)))
        elif self.gate_kind == "low_rank":
            a = jnp.einsum("bthd,hdr->bthr", x, self.gate_a[...].astype(x.dtype))
            f = f * jax.nn.sigmoid(jnp.einsum("bthr,hrd->bthd", a, self.gate_b[...].astype(x.dtype)))
        return f

    def penalty(self) -> jax.Array:
        return orthogonality_penalty(self.w_f[...]) if self.orthogonal else jnp.zeros((), jnp.float32)


class FeatureMap(nnx.Module):
    def __init__(self, cfg, heads: int, d: int, *, rngs: nnx.Rngs):
        kind, depth = cfg.feature_map, cfg.kernel_depth
        if kind in _FIXED and depth != 1:  # the option's own rule (one of, ≥ 1) is checked by mixers.build
            raise ValueError(f"mixer 'linear': kernel_depth={depth} is not valid for feature_map {kind!r}")
        self.kind = kind
        favor = kind == "favor"
        self.omega = RandomFeatures(orthogonal_random_features(rngs.params(), cfg.num_features, d)) if favor else None
        self.redraw = favor and cfg.favor_redraw
        # Redraws come from a stream of their own, kept (and checkpointed) as state.
        self.redraw_rngs = nnx.Rngs(favor=rngs.params()) if self.redraw else None
        rank = cfg.gate_rank or max(1, d // 4)
        # A Dict keyed "0", "1", ..., not a List: inside a scanned block nnx.capture adds a string-keyed entry to
        # every module, which a List's integer keys cannot be sorted beside.
        self.depth = depth if kind not in _FIXED else 0
        layers = {
            str(i): KernelLayer(kind, heads, d, positive=(i == depth - 1), gate_rank=rank, rngs=rngs)
            for i in range(self.depth)
        }
        self.layers = nnx.Dict(layers) if kind not in _FIXED else None
        self.deterministic = False

    def kernels(self) -> list[KernelLayer]:
        """The stacked kernels, innermost first."""
        return [self.layers[str(i)] for i in range(self.depth)]

    def __call__(self, x, *, is_query: bool, mask, causal: bool) -> jax.Array:
        if self.kind == "elu1":
            return jax.nn.elu(x) + 1.0
        if self.kind == "relu":
            return jax.nn.relu(x) + 1e-6
        if self.kind == "favor":
            if self.redraw and not self.deterministic and is_query:  # once per forward, before the queries
                self.omega[...] = orthogonal_random_features(self.redraw_rngs.favor(), *self.omega.shape)
            return favor_features(x, self.omega[...], is_query=is_query, mask=mask, causal=causal).astype(x.dtype)
        for layer in self.kernels():
            x = layer(x)
        return x

    def penalty(self) -> jax.Array:
        return sum((layer.penalty() for layer in self.kernels()), jnp.zeros((), jnp.float32))


class LinearAttention(MultiHeadMixer):
    def __init__(self, cfg, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.feature_map = FeatureMap(cfg, self.num_heads, self.head_dim, rngs=rngs)
        self.eps = cfg.eps
        self.options = kernels.LinearAttentionOptions(impl=cfg.impl, chunk_size=cfg.chunk_size)
        self.eps_mode = cfg.eps_mode if cfg.eps_mode != "auto" else ("guard" if cfg.feature_map == "favor" else "add")
        self.orth_loss_weight = cfg.orth_loss_weight if cfg.feature_map in _ORTHOGONAL else 0.0
        self.deterministic = False

    @staticmethod
    def forward_flops(cfg, length: int, *, causal: bool) -> float:
        """Projections, the feature maps of q and k, and the state products φ(k)ᵀv, φ(q)·S (causal or not)."""
        t, d, heads = length, cfg.d_model, cfg.num_heads
        d_qkv = cfg.qkv_dim or d
        d_h = d_qkv // heads
        kind = cfg.feature_map
        m = cfg.num_features if kind == "favor" else d_h
        if kind == "favor":
            features = 2 * t * d_qkv * m
        elif kind in ("elu1", "relu"):
            features = 0.0
        else:
            per_layer = 2 * t * d_qkv * d_h  # x W_f per head
            if kind in ("glu", "oglu"):
                per_layer *= 2
            elif kind == "aoglu":
                rank = cfg.gate_rank or max(1, d_h // 4)
                per_layer += 4 * t * heads * d_h * rank
            features = per_layer * cfg.kernel_depth
        state = 4 * t * heads * m * d_h + 2 * t * heads * m
        return MultiHeadMixer.projection_flops(cfg, length) + 2 * features + state

    def _features(self, q, k, mask, causal):
        phi_q = self.feature_map(q, is_query=True, mask=None, causal=causal)
        phi_k = self.feature_map(k, is_query=False, mask=mask, causal=causal)
        regulariser = f"mixer {self.name!r}: orth_loss_weight"
        if self.orth_loss_weight and not self.deterministic and collects_aux_loss(self, regulariser):
            self.sow(AuxLoss, "orthogonality", self.orth_loss_weight * self.feature_map.penalty())
        return phi_q, phi_k

    def attend(self, q, k, v, mask, causal):
        phi_q, phi_k = self._features(q, k, mask, causal)
        return kernels.linear_attention(
            phi_q,
            phi_k,
            v,
            causal=causal,
            key_mask=mask,
            eps=self.eps,
            eps_mode=self.eps_mode,
            options=self.options,
        )

    def init_cache(self, batch: int, max_length: int) -> dict:
        m = self.feature_map.omega.shape[0] if self.feature_map.kind == "favor" else self.head_dim
        s, z = kernels.linear_attention_init_state(batch, self.num_heads, m, self.head_dim)
        return {"s": s, "z": z, "index": jnp.zeros((), jnp.int32)}

    def decode(self, x, cache):
        """O(1) memory per token: the running (S, z) replaces the key-value cache."""
        check_decode_input(self.name, x, self.d_model, cache, "s", positions=False)
        q, k, v = (self._split(proj(x)) for proj in (self.query, self.key, self.value))
        phi_q, phi_k = self._features(q, k, None, True)
        (s, z), o = kernels.linear_attention_step(
            (cache["s"], cache["z"]), phi_q[:, 0], phi_k[:, 0], v[:, 0], eps=self.eps, eps_mode=self.eps_mode
        )
        y = self.out(self.combine(o.reshape(x.shape[0], 1, -1)))
        return y, {"s": s, "z": z, "index": cache["index"] + 1}


OPTIONS = (
    Field("feature_map", "elu1", one_of(*FEATURE_MAPS), "φ, one map for q and k (docs/mixers.md)"),
    Field("kernel_depth", 1, integer(1, 64), "trainable maps stacked (1×, 2×, 3× in the kernel paper's table)"),
    Field("num_features", 256, integer(1, 2**16), "favor: m random features"),
    Field("favor_redraw", False, BOOLEAN, "favor: draw fresh features at every training forward pass"),
    Field("gate_rank", 0, integer(0, 2**16), "aoglu: rank r of the gate (0: head_dim // 4)"),
    Field("orth_loss_weight", 0.1, at_least(0), "λ of the orthogonality regulariser (the authors' later code)"),
    Field("eps", 1e-6, above(0), "ε of the denominator"),
    Field(
        "eps_mode",
        "auto",
        one_of("auto", *kernels.EPS_MODES),
        "how ε enters the denominator (auto: the map's reference's)",
    ),
    Field("chunk_size", 64, integer(1, 2**16), "causal chunk length of the xla implementation"),
    IMPL_OPTION,
)


register("linear", LinearAttention, OPTIONS)
