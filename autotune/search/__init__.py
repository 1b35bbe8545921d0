"""What a study searches: the knob table and its domains, the search space, the training recipe,
what a device can run, whether a configuration lies in a space, and the out-of-memory boundary.
Imports neither torch nor Optuna.
"""
