"""What a study means and stores, read through Optuna's storage API: the schema, the objectives'
rules, confirmation figures, the seed scheme. No torch here: reading a study needs no training."""
