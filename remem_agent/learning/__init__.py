"""Learning from outcomes: credit assignment, staleness/supersession and retention.

``feedback.apply_feedback`` is the body of ``ReMem.feedback``'s transaction; the other modules are the
policies it applies in order (credit -> staleness -> retention). Every state change they decide goes
through the ledger's lifecycle table (``store/lifecycle.py``), which says which moves are legal.
"""
