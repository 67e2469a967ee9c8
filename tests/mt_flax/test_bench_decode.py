"""Decoding's memory: the benchmark's state sizes (linear attention's O(1) in length, a KV cache O(L)), and the check
before decoding."""

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


def test_decoding_that_needs_more_memory_than_a_device_has_is_refused_before_it_starts():
    import pytest
    from flax import nnx

    from mt_flax.configs import translation
    from mt_flax.task import build_model, check_decode_fits

    config = translation.get_config("tiny")
    model = build_model(config, vocab_size=64, rngs=nnx.Rngs(0))
    check_decode_fits(model, config, longest_source=10)  # the tiny preset's decoding fits this host
    config.train.device_memory_gib = 1e-4  # 100 KiB: less than its beams take
    beam, rows = config.decode.beam_size, config.decode.batch_size
    with pytest.raises(ValueError, match=rf"decoding {rows} sentences of up to \d+ tokens with beam {beam} needs "
                       r"[\d.]+ GiB per device .*more than the 0.00 GiB of train.device_memory_gib: lower "
                       r"decode.batch_size or the beam size"):  # fmt: skip
        check_decode_fits(model, config, longest_source=10)
