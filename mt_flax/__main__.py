from mt_flax.main import run

run()
