"""Bad inputs to the attention ops are errors that name the argument, in every impl (once silently
accepted int32 inputs, float masks, causal="no", γ ≤ 0, T = 0 and negative features)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import LinearAttentionOptions, ReluAttentionOptions

IMPLS = ["reference", "xla", "pallas"]


def _qkv(t=8, dtype=jnp.float32):
    x = jax.random.uniform(jax.random.key(0), (1, t, 2, 16)).astype(dtype)
    return x, x + 0.5, x - 0.5


def _relu(impl, q, k, v, **kw):
    return kernels.relu_attention(q, k, v, options=ReluAttentionOptions(impl=impl), **kw)


def _linear(impl, q, k, v, **kw):
    return kernels.linear_attention(q, k, v, options=LinearAttentionOptions(impl=impl), **kw)


BAD = {
    "integer inputs": (dict(), lambda q, k, v: (q.astype(jnp.int32), k, v), r"q must be a floating-point array"),
    "float mask": (dict(key_mask=jnp.ones((1, 8), jnp.float32)), None, r"key_mask must be a bool array"),
    "causal as a string": (dict(causal="no"), None, r"causal must be a bool, got 'no'"),
    "mask as a list": (dict(key_mask=[[True] * 8]), None, r"key_mask must be a bool array .*, got a list"),
    "empty sequence": (dict(), lambda q, k, v: (q[:, :0], k[:, :0], v[:, :0]), r"query_length is 0"),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", sorted(BAD))
@pytest.mark.parametrize("op", [_relu, _linear])
def test_bad_input_names_the_argument(op, kind, impl):
    kwargs, transform, message = BAD[kind]
    q, k, v = _qkv()
    if transform is not None:
        q, k, v = transform(q, k, v)
    if op is _linear and kind == "integer inputs":
        message = message.replace("q must", "phi_q must")
    with pytest.raises(ValueError, match=message):
        op(impl, q, k, v, **kwargs)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("gamma", [0.0, -1.0, jnp.array([1.0, -0.5])])
def test_relu_gamma_must_be_positive(impl, gamma):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="gamma must be positive"):
        _relu(impl, q, k, v, gamma=gamma)


def test_gamma_is_not_checked_inside_jit():
    # A traced γ (a model parameter) cannot be checked without a host round trip: the op still runs.
    q, k, v = _qkv()
    out = jax.jit(lambda g: _relu("xla", q, k, v, gamma=g))(jnp.array([1.0, 2.0]))
    assert out.shape == v.shape


@pytest.mark.parametrize("impl", IMPLS)
def test_linear_attention_refuses_negative_features_in_every_impl(impl):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"phi_k must be non-negative .* minimum -0\.4"):
        _linear(impl, q, k - 1.0, v)
    # A masked key's features are never used, negative or not; NaN reaches the output outside the reference.
    mask = jnp.array([[True] * 6 + [False] * 2])
    assert _linear(impl, q, k.at[:, 7].set(-1.0), v, key_mask=mask).shape == v.shape
    if impl != "reference":
        assert jnp.isnan(_linear(impl, q.at[0, 2, 0, 0].set(jnp.nan), k, v)[0, 2, 0]).all()
    jax.jit(lambda k: _linear(impl, q, k, v))(k - 1.0)  # traced features cannot be checked: the op runs


def test_good_inputs_still_pass_in_every_impl():
    q, k, v = _qkv()
    mask = jnp.array([[True] * 6 + [False] * 2])
    for impl in IMPLS:
        assert _relu(impl, q, k, v, key_mask=mask, causal=True, gamma=0.5).shape == v.shape
        assert _linear(impl, q, k, v, key_mask=mask, causal=True).shape == v.shape


@pytest.mark.parametrize("impl", ["reference", "xla", "pallas"])
@pytest.mark.parametrize("causal", [False, True])
def test_nan_or_inf_in_padded_rows_never_reaches_an_output_or_gradient(impl, causal):
    """A masked key has weight 0, but 0 × NaN is NaN: padding must be unable to matter whatever it holds."""
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (2, 24, 2, 16)) for key in (kq, kk, kv))
    mask = jnp.arange(24)[None] < jnp.array([[24], [15]])
    padded = ~mask[:, :, None, None]
    poisoned = [jnp.where(padded, bad, x) for x, bad in ((k, jnp.nan), (v, jnp.inf))]
    cleaned = [jnp.where(padded, 0.0, x) for x in (k, v)]

    def relu(k, v):
        return _relu(impl, q, k, v, key_mask=mask, causal=causal)

    def linear(phi_k, v):  # φ(k) as the op takes it: a NaN row there is padding the caller did not clean
        return _linear(impl, jax.nn.softplus(q), jnp.abs(phi_k), v, key_mask=mask, causal=causal)

    for op in (relu, linear):
        out = op(*poisoned)
        assert bool(jnp.all(jnp.isfinite(out))), op.__name__  # every row, padded queries' too
        np.testing.assert_allclose(out, op(*cleaned), rtol=1e-5, atol=1e-5)
        grads = jax.grad(lambda k, v, op=op: jnp.sum(op(k, v)), argnums=(0, 1))(*poisoned)
        assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads), op.__name__


def test_another_op_s_options_and_numpy_scalars_are_met_by_name():
    q, k, v = _qkv()
    for op, name, options, message in [
        (kernels.relu_attention, "relu_attention", LinearAttentionOptions(), "got LinearAttentionOptions"),
        (kernels.linear_attention, "linear_attention", ReluAttentionOptions(), "got ReluAttentionOptions"),
        (kernels.softmax_attention, "softmax_attention", ReluAttentionOptions(), "got ReluAttentionOptions"),
    ]:
        with pytest.raises(ValueError, match=rf"{name}: options must be a \w+AttentionOptions, {message}"):
            op(q, k, v, options=options)
    with pytest.raises(ValueError, match=r"eps=np.float32\(-1.0\) must be a finite number > 0"):
        kernels.linear_attention(q, k, v, eps=np.float32(-1.0))
    rate = np.float32(0.25)  # a numpy scalar is a number like any other
    out = kernels.softmax_attention(q, k, v, dropout_rate=rate, dropout_key=jax.random.key(1))
    again = kernels.softmax_attention(q, k, v, dropout_rate=0.25, dropout_key=jax.random.key(1))
    np.testing.assert_array_equal(out, again)
    state = kernels.linear_attention_init_state(1, 2, 16, 16)
    with pytest.raises(ValueError, match=r"unknown linear_attention eps_mode 'Add'; valid: add, guard"):
        kernels.linear_attention_step(state, q[:, 0], k[:, 0], v[:, 0], eps_mode="Add")


@pytest.mark.parametrize("impl", ["reference", "xla"])
@pytest.mark.parametrize("op", ["relu", "linear", "softmax"])
def test_float64_inputs_return_float64_at_float32_accuracy(op, impl):
    # What kernels/README.md says: every impl computes in float32 and returns v's dtype.
    def run(q, k, v):
        if op == "relu":
            return _relu(impl, q, k, v, causal=True)
        if op == "linear":
            return _linear(impl, q, k, v, causal=True)
        return kernels.softmax_attention(q, k, v, causal=True, options=kernels.SoftmaxAttentionOptions(impl=impl))

    inputs = [np.asarray(x) for x in _qkv(16)]
    single = run(*inputs)
    with jax.enable_x64(True):
        double = run(*(jnp.asarray(x, jnp.float64) for x in inputs))
        assert double.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(double), np.asarray(single, np.float64), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_traced_values_are_checked_under_checkify_and_cost_nothing_outside_it(impl):
    from jax.experimental import checkify

    q, k, v = _qkv()
    relu = jax.jit(lambda gamma: kernels.relu_attention(q, k, v, gamma=gamma, impl=impl))
    linear = jax.jit(lambda phi, eps: kernels.linear_attention(phi, k, v, eps=eps, impl=impl))
    cases = [
        (relu, (jnp.array([0.5, -1.0]),), r"gamma must be positive, got \[ 0.5 -1. \]"),
        (linear, (q, jnp.float32(-1.0)), r"linear_attention eps=-1.0 must be a finite number > 0"),
        (linear, (q - 1.0, jnp.float32(1e-6)), r"phi_q must be non-negative"),
    ]
    if impl == "pallas":  # a kernel compiles ε in: a traced one is refused by name, whatever its value
        with pytest.raises(ValueError, match=r"impl='\w+' compiles eps into its kernels: give it as a number"):
            linear(q, jnp.float32(1e-6))
        linear = jax.jit(lambda phi, eps: kernels.linear_attention(phi, k, v, impl=impl))
        cases = [cases[0], (linear, (q - 1.0, None), r"phi_q must be non-negative")]
    for call, args, message in cases:
        error, _ = checkify.checkify(call)(*args)
        with pytest.raises(checkify.JaxRuntimeError, match=message):
            error.throw()
        call(*args)  # outside checkify: no check, no error (the op's output is then the caller's to judge)
    error, _ = checkify.checkify(relu)(jnp.array([0.5, 1.0]))
    error.throw()  # good values pass
    assert "debug_check" not in str(jax.make_jaxpr(relu)(jnp.array([0.5, 1.0])))  # nothing left outside checkify


def _step(state=None, phi_q=None, phi_k=None, v=None, **kw):
    """`linear_attention_step` on one token of `_qkv`'s φ(q), φ(k), v `[1, 2, 16]`, each replaceable."""
    q, k, v_ = (x[:, 0] for x in _qkv())
    state = kernels.linear_attention_init_state(1, 2, 16, 16) if state is None else state
    return kernels.linear_attention_step(state, q if phi_q is None else phi_q, k if phi_k is None else phi_k,
                                         v_ if v is None else v, **kw)  # fmt: skip


STEP_BAD = {
    "v of another head_dim": (
        dict(v=jnp.ones((1, 2, 17))),
        r"state S shape \(1, 2, 16, 16\) must be \(1, 2, 16, 17\) for phi_k shape \(1, 2, 16\) and v shape "
        r"\(1, 2, 17\) \(linear_attention_init_state\(batch, heads, m, d_v\)\)",
    ),
    "key_mask of another batch": (
        dict(key_mask=jnp.ones((2,), bool)),
        r"key_mask shape \(2,\) must be \[batch\] = \(1,\)",
    ),
    "int32 key_mask": (dict(key_mask=jnp.ones((1,), jnp.int32)), r"key_mask must be a bool array .*, got dtype int32"),
    "4-d inputs": (
        dict(phi_q=jnp.ones((1, 1, 2, 16)), phi_k=jnp.ones((1, 1, 2, 16)), v=jnp.ones((1, 1, 2, 16))),
        r"phi_q, phi_k, v must be \[batch, heads, dim\] \(one token\); got shapes \(1, 1, 2, 16\), ",
    ),
    "phi_k of another dim": (dict(phi_k=jnp.ones((1, 2, 8))), r"phi_k shape \(1, 2, 8\) does not match phi_q shape"),
    "v of another batch": (
        dict(v=jnp.ones((2, 2, 16))),
        r"v shape \(2, 2, 16\) does not match phi_k shape \(1, 2, 16\) \(batch, heads\)",
    ),
    "z of another dim": (
        dict(state=(jnp.zeros((1, 2, 16, 16)), jnp.zeros((1, 2, 8)))),
        r"state z shape \(1, 2, 8\) must be \(1, 2, 16\)",
    ),
    "a state that is not (S, z)": (dict(state=jnp.zeros((1, 2, 16, 16))), r"state must be the pair \(S, z\)"),
    "integer features": (dict(phi_q=jnp.ones((1, 2, 16), jnp.int32)), r"phi_q must be a floating-point array"),
    "negative features": (dict(phi_k=-jnp.ones((1, 2, 16))), r"phi_k must be non-negative .* got minimum -1.0"),
    "a list": (dict(v=[[[0.0] * 16] * 2]), r"^v must be a jax or numpy array, got list$"),
    "eps 0": (dict(eps=0.0), r"linear_attention_step eps=0.0 must be a finite number > 0"),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(STEP_BAD))
def test_a_linear_attention_step_names_its_bad_input(kind):
    kwargs, message = STEP_BAD[kind]
    with pytest.raises(ValueError, match=message):
        _step(**kwargs)


def test_a_step_s_values_are_checked_only_where_concrete():
    negative = -jnp.ones((1, 2, 16))
    # A padded token's features are never used, negative or not.
    assert _step(phi_k=negative, key_mask=jnp.zeros((1,), bool))[1].shape == (1, 2, 16)
    step = jax.jit(lambda phi_k: _step(phi_k=phi_k))
    step(negative)  # traced features cannot be checked without a host round trip: the step runs
    assert "debug_check" not in str(jax.make_jaxpr(step)(negative))  # and costs nothing outside checkify
    from jax.experimental import checkify

    error, _ = checkify.checkify(step)(negative)
    with pytest.raises(checkify.JaxRuntimeError, match="phi_k must be non-negative"):
        error.throw()


def test_every_op_names_an_input_that_is_not_an_array():
    q, k, v = _qkv()
    ops = {
        "q": [kernels.relu_attention, kernels.softmax_attention, kernels.relu_attention_and_row_stats],
        "phi_q": [kernels.linear_attention],
    }
    for name, fns in ops.items():
        for op in fns:
            with pytest.raises(ValueError, match=rf"^{name} must be a jax or numpy array, got list$"):
                op(q.tolist(), k, v)
    with pytest.raises(ValueError, match=r"^k must be a jax or numpy array, got tuple$"):
        kernels.relu_attention_row_stats(q, tuple(k.tolist()))
    assert kernels.relu_attention(np.asarray(q), np.asarray(k), np.asarray(v)).shape == v.shape  # numpy is fine
