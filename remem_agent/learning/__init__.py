"""Learning from outcomes: credit assignment, the lifecycle, staleness/supersession and retention.

``feedback.apply_feedback`` is the body of ``ReMem.feedback``'s transaction; the other modules are the
policies it applies in order (credit -> staleness -> retention), each through ``lifecycle``'s table.
"""
