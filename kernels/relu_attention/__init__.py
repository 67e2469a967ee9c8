"""relu attention: the public op (api.py), its reference, XLA impl and one file per kernel backend."""
