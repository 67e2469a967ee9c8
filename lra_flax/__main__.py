from lra_flax.main import run

run()
