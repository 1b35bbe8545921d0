"""The only layer that writes to Optuna: the run sequence, one trial's step, the objective,
confirmation, workers, and the storage with its schema.
"""
