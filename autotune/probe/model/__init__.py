"""The probe's model, without torch or Optuna: the roofline's predictions, the choice between
end-to-end figures, screening, the goodput arithmetic, and the stored outcome read back as
figures and text. The report and the exports read a study through it.
"""
