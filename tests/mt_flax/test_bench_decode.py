"""The decoding benchmark measures what it says: linear attention's state is O(1) in length, a KV cache O(L)."""

import pytest

from mt_flax import bench_decode


def test_decode_state_sizes_by_mixer_family():
    kw = dict(batch=2, d_model=32, layers=1, vocab=50, repeats=1)
    linear = [bench_decode.bench_one("linear", n, **kw) for n in (16, 64)]
    softmax = [bench_decode.bench_one("softmax", n, **kw) for n in (16, 64)]
    assert linear[0]["decode_state_mib"] == linear[1]["decode_state_mib"]
    assert softmax[1]["decode_state_mib"] == pytest.approx(4 * softmax[0]["decode_state_mib"], rel=1e-3)
    assert all(r["tokens_per_s"] > 0 and r["length"] in (16, 64) for r in linear + softmax)
