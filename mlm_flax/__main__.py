from mlm_flax.main import run

run()
