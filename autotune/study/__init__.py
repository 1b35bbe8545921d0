"""The run sequence, the layer that writes a run to Optuna: preparation and feasibility, beginning
a run and its one plan, one trial's step, the objective, the confirmation, workers and the goodput
table stored with the study. Where a study lives (its storage, locks and recovery) is storage/.
"""
