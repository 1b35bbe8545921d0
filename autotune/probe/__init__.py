"""The systems probe: the loader and compute settings measured apart and end to end, the one
chosen for the trials, and its figures at their micro-batches (run.py is its sequence). Its
model, without torch, is model/; here torch is used, never Optuna, and nothing of the layers
above it (study, report, export, the commands).
"""
