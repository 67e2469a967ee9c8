"""The decoding benchmark measures what it says: linear attention's state is O(1) in length, a KV cache O(L)."""

from mt_flax import bench_decode


def test_decode_state_sizes_by_mixer_family():
    kw = dict(batch=2, d_model=32, layers=1, vocab=50, repeats=1)
    linear = [bench_decode.bench_one("linear", n, **kw) for n in (16, 64)]
    softmax = [bench_decode.bench_one("softmax", n, **kw) for n in (16, 64)]
    mib, ints = 2**20, 2 * 4  # two int32 step counters (the model's, the layer's)
    # Softmax: a float32 K and V per layer, [batch, length, d_model]; linear: the state S [heads, m, m] and z
    # [heads, m] per row (head dim m = 32 / 4 heads = 8), whatever the length.
    for r in softmax:
        assert r["decode_state_mib"] * mib == 2 * 2 * r["length"] * 32 * 4 + ints, r
    for r in linear:
        assert r["decode_state_mib"] * mib == 2 * (4 * 8 * 8 + 4 * 8) * 4 + ints, r
    assert all(r["tokens_per_s"] > 0 and r["length"] in (16, 64) for r in linear + softmax)
