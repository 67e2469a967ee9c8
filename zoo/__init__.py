"""The model zoo: interchangeable token mixers, layers, models and the shared training harness.

`zoo.mixers` and `zoo.models` never import `zoo.training`; task packages import all three.
"""
