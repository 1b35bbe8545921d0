"""Where a trial runs: in this process, in a child process of its own, or as the user's command
(its argv, the report protocol it speaks, and the tally of its reports).
"""
