"""The only layer that writes to Optuna: the run sequence, one trial's step, the objective,
confirmation, workers, the prior's first trials, the goodput table stored with the study, and the
storage with its schema.
"""
