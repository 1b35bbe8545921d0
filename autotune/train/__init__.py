"""One configuration -> one result: the training loop and its recipe, the tasks, measurement,
telemetry and out-of-memory detection. Uses torch, never Optuna.
"""
