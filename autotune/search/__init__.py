"""What a study searches: the knob table and its domains, the search space, the systems probe
that settles the speed-only knobs, and the out-of-memory boundary. Imports neither torch nor Optuna.
"""
