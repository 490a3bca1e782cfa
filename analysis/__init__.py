"""Analysis of a dlcompare campaign: the result store, tables, figures, HTML report, summary,
and the performance model (`perfmodel`: the equations; `calibration`: fitting alpha, beta,
gamma; `predict`: a prediction for every stored run and the what-if CLI).

Deliberately imports nothing here: ``analysis.record`` and ``analysis.perfmodel`` must stay
importable from a framework's own environment (standard library only; the worker splits
backward time by FLOPs with the model's function), without pulling in pandas or seaborn.
The analysis knows no framework by name; it groups by the record's ``framework_label`` and
``mode`` columns, and takes each scheme from what the adapter describes
(``extra["comm_scheme"]``).
"""
