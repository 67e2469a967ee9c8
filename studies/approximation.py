"""How close each linear-attention feature map gets to softmax attention (trainable-kernel paper, docs/mixers.md):
fixed maps (elu1, relu), FAVOR+ against its number of random features m, and trainable kernels (softplus,
GLU, OGLU, 2×GLU, 3×AOGLU) fitted to reproduce softmax attention — error against m or parameters.

    python -m studies.approximation          # about two minutes on 2 CPU cores
    python -m studies.approximation --tiny   # seconds

q, k, v ~ N(0, 1), one head of dim 32, 256 keys and queries, no mask. The target is softmax(q·kᵀ/√d) v; a
feature map φ gives φ(q)(φ(k)ᵀ v) / (φ(q)·Σ φ(k)), computed by the project's `FeatureMap` and
`kernels.linear_attention` exactly as the `linear` mixer does. Error: ‖approx − softmax‖ / ‖softmax‖ over a
held-out draw (8 sequences). Trainable kernels: Adam (lr 1e-2) on fresh draws every step, orthogonality
regulariser included where the kernel has one; FAVOR+: mean over 4 draws of ω.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import kernels
from studies.common import study_main, study_readme, write_study
from zoo import mixers
from zoo.mixers.linear import FeatureMap
from zoo.plots import pyplot, save_figure

D, T, BATCH = 32, 256, 8
TRAINED = [("softplus", "softplus", 1), ("GLU", "glu", 1), ("OGLU", "oglu", 1), ("2×GLU", "glu", 2),
           ("3×AOGLU", "aoglu", 3)]  # fmt: skip
XLA = kernels.LinearAttentionOptions(impl="xla")


def draw(key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    return tuple(jax.random.normal(k, (BATCH, T, 1, D)) for k in jax.random.split(key, 3))


def softmax_attention(q, k, v):
    return jax.nn.dot_product_attention(q, k, v)


def feature_map(kind: str, depth: int = 1, num_features: int = 256, seed: int = 0) -> FeatureMap:
    cfg = mixers.default_config("linear")
    cfg.update(feature_map=kind, kernel_depth=depth, num_features=num_features)
    fm = FeatureMap(cfg, 1, D, rngs=nnx.Rngs(seed))
    fm.deterministic = True
    return fm


def linear_attention(fm: FeatureMap, q, k, v):
    phi_q = fm(q, is_query=True, mask=None, causal=False)
    phi_k = fm(k, is_query=False, mask=None, causal=False)
    eps_mode = "guard" if fm.kind == "favor" else "add"
    return kernels.linear_attention(phi_q, phi_k, v, causal=False, eps=1e-6, eps_mode=eps_mode, options=XLA)


def relative_error(fm: FeatureMap, q, k, v) -> float:
    target = softmax_attention(q, k, v)
    return float(jnp.linalg.norm(linear_attention(fm, q, k, v) - target) / jnp.linalg.norm(target))


def fit(fm: FeatureMap, steps: int, seed: int) -> list[float]:
    """Trains `fm` to reproduce softmax attention; returns the training loss every 50 steps."""
    optimizer = nnx.Optimizer(fm, optax.adam(1e-2), wrt=nnx.Param)
    orth = fm.kind in ("oglu", "aoglu", "orth_softplus")

    @nnx.jit
    def step(fm, optimizer, key):
        q, k, v = draw(key)

        def loss(fm):
            err = jnp.sum((linear_attention(fm, q, k, v) - softmax_attention(q, k, v)) ** 2)
            return err / jnp.sum(softmax_attention(q, k, v) ** 2) + (0.1 * fm.penalty() if orth else 0.0)

        value, grads = nnx.value_and_grad(loss)(fm)
        optimizer.update(fm, grads)
        return value

    curve = []
    for i in range(steps):
        value = step(fm, optimizer, jax.random.key(10_000 * seed + i))
        if i % 50 == 0 or i == steps - 1:
            curve.append(float(value))
    return curve


def parameters(fm: FeatureMap) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(fm, nnx.Param)))


def run(tiny: bool, out_dir: Path) -> dict:
    held_out = draw(jax.random.key(123_456))
    features = [16, 64] if tiny else [16, 64, 256, 1024]
    steps, favor_draws = (20, 1) if tiny else (600, 4)
    fixed = {kind: relative_error(feature_map(kind), *held_out) for kind in ("elu1", "relu")}
    favor = {m: sum(relative_error(feature_map("favor", num_features=m, seed=s), *held_out)
                    for s in range(favor_draws)) / favor_draws for m in features}  # fmt: skip
    trained, curves, sizes = {}, {}, {}
    for name, kind, depth in TRAINED:
        fm = feature_map(kind, depth)
        curves[name] = fit(fm, steps, seed=1)
        trained[name], sizes[name] = relative_error(fm, *held_out), parameters(fm)
    beats_fixed = all(err < min(fixed.values()) for err in trained.values())
    favor_improves = all(favor[a] > favor[b] for a, b in itertools.pairwise(features))
    verdict = "reproduced" if beats_fixed and favor_improves else "not reproduced"
    result = {"fixed": fixed, "favor": {str(m): e for m, e in favor.items()}, "trained": trained,
              "trained_parameters": sizes, "training_loss": curves, "steps": steps, "head_dim": D, "length": T,
              "verdict": verdict, "beats_fixed": beats_fixed, "favor_improves_with_m": favor_improves,
              "tiny": tiny}  # fmt: skip

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.semilogx(features, [favor[m] for m in features], "o-", label="FAVOR+")
    for kind, err in fixed.items():
        left.axhline(err, linestyle="--", color="gray" if kind == "elu1" else "k", label=kind)
    left.set_xlabel("random features m")
    left.set_ylabel("relative error vs softmax attention")
    left.legend(fontsize=8)
    right.semilogx([sizes[n] for n in trained], list(trained.values()), "s", color="C2")
    for name in trained:
        right.annotate(name, (sizes[name], trained[name]), fontsize=8, xytext=(3, 3), textcoords="offset points")
    right.set_xlabel("trainable parameters (one head)")
    right.set_title("trained to reproduce softmax")
    fig.tight_layout()
    save_figure(fig, out_dir / "approximation.png")

    rows = [f"| {kind} (fixed) | 0 | {err:.3f} |" for kind, err in fixed.items()]
    rows += [f"| FAVOR+, m = {m} | 0 | {favor[m]:.3f} |" for m in features]
    rows += [f"| {name} (trained {steps} steps) | {sizes[name]:,} | {trained[name]:.3f} |" for name in trained]
    table = "\n".join(rows)
    readme = study_readme(
        "approximation", tiny,
        title="How close each feature map gets to softmax attention",
        claim="(trainable-kernel paper, docs/mixers.md): a trainable feature map can approximate softmax attention "
        "better than fixed ones (elu1, ReLU); FAVOR+'s error falls as its number of random features m grows.",
        setting=f"q, k, v ~ N(0, 1), head dim {D}, {T} keys and queries; held-out relative error ‖approx − "
        f"softmax‖ / ‖softmax‖; trained kernels fitted with Adam for {steps} steps on fresh draws; FAVOR+ "
        f"averaged over {favor_draws} draw(s) of ω.",
        table=f"| feature map | parameters | relative error |\n|---|---|---|\n{table}",
        verdict=f"{verdict} (every trained kernel below both fixed maps: {beats_fixed}; FAVOR+ error falling "
        f"with m: {favor_improves}).",
        figure="approximation.png",
        notes="at unit-variance q and k (scores ~ N(0, 1)) softmax attention is a soft average whose output is "
        "small, and every map here leaves about half of its energy unexplained; training helps the plain softplus "
        "and GLU kernels by a few points, not the orthogonality-regularised ones (the regulariser pulls W towards "
        "orthogonal, not towards softmax). FAVOR+ is unbiased but its variance grows like exp(‖q̂‖² + ‖k̂‖²) with "
        f"‖x̂‖² ≈ √d ≈ {D**0.5:.1f} here, so even m = {features[-1]} is far off; it needs small-norm inputs (as in "
        "the unit test on FAVOR+, where the error falls below 0.03).",
    )  # fmt: skip
    write_study(out_dir, result, readme)
    return result


if __name__ == "__main__":
    study_main("approximation", __doc__, run)
