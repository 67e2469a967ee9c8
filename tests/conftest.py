import os

# Tests run on the CPU with the default single device unless a test spawns its own process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
