"""What a study searches: the knob table and its domains, the search space, the training recipe,
what a device can run, whether a configuration lies in a space, the out-of-memory boundary, the
largest micro-batch with steps enough an epoch, and a new study's first trials from the prior.
Imports neither torch nor Optuna, and nothing of the layers above it.
"""
