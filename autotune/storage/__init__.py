"""Where a study lives, and keeping it whole: opening or creating its storage (opening.py), one
`autotune run` per local file (runner_lock.py), a file of something else refused
(foreign_files.py), a journal's torn record mended (torn_journal.py), a storage that fails under a
run said in one line (faults.py), the trials a dead run left recovered (recovery.py), and
optuna-dashboard on it (dashboard.py). Below the study layer: it imports nothing of study, the
probe, the runners or training, and never loads torch, so the commands that read a study use it.
"""
