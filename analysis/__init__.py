"""Analysis of a dlcompare campaign: the result store, tables, figures, HTML report, summary.

Deliberately imports nothing here: ``analysis.record`` must stay importable from a
framework's own environment (standard library only), without pulling in pandas or seaborn.
The analysis knows no framework by name; it groups by the record's ``framework_label`` and
``mode`` columns.
"""
