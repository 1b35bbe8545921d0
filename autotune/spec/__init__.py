"""The study file, read once and validated strictly into a frozen StudySpec.

Imports neither torch nor Optuna: a study file's mistakes are found before either loads.
"""
