"""The campaign's result store: one SQLite file per campaign folder.

Why SQLite: the launcher appends one record as each run finishes and must resume an
interrupted campaign by asking which runs are already stored; SQLite gives atomic
appends (a crash mid-write leaves the previous state), concurrent readers while a
campaign writes (WAL mode), and needs no server.  Tables:

- ``runs``: one row per run, the columns of `analysis.record.RUN_COLUMNS` with their
  declared types, plus ``env_json`` and ``extra_json`` (the record's free dicts as JSON);
- ``phases``: a long table (run_id, phase, measured_s, predicted_s), one row per phase
  of one run, in the order the record listed them;
- ``campaign_meta``: key/value facts about the whole campaign (command line, plan, ...),
  values stored as JSON so lists and dicts round-trip;
- ``calibration``: one row per calibrated transport and topology (`launchers.calibrate`):
  the fitted T(n) = a + b n and the link-level alpha, beta, gamma of
  `analysis.calibration.CalibrationFit`; a new calibration of the same framework, mode,
  device and topology replaces the old one;
- ``calibration_points``: its timings, one row per message size (kind ``collective``) or
  local reduction size (kind ``reduction``): median, p10, p90 and the raw values as JSON.

The performance model's predictions (`analysis.predict`) are written back onto stored runs
with `set_predictions`: the run's predicted columns, the phases' ``predicted_s`` and
``extra["prediction"]``.

Records are validated on the way in (identity fields present, no unknown keys, values of
the declared type) so that a typo in an adapter fails loudly at the first run instead of
leaving a silently empty column in the report.

Nothing measured is lost to a failing store or disk:

- the schema carries its version (``PRAGMA user_version``, `SCHEMA_VERSION`); opening an
  older store runs the `MIGRATIONS` above its version, and a store newer than this code is
  refused for writing; columns the record contract gained are added whenever missing;
- every open runs ``PRAGMA quick_check`` first: a damaged store (`StoreDamaged`) is never
  written to, and `repair_campaign` salvages its readable rows into a new store, keeping
  the damaged file beside it;
- a failed write (a full disk) is one line (`StoreError`) with SQLite's own cause, and
  leaves the store as it was: SQLite may have rolled the transaction back itself, so the
  ROLLBACK that follows never hides the cause;
- each run folder keeps the run's ``record.json`` (`launchers.campaign`); `import_pending`
  stores the ones the store lacks (the next campaign with the same --out, and
  ``python -m analysis.report``);
- one writer per campaign folder (`CampaignLock`, an flock the kernel drops when its holder
  dies however it dies, so a dead campaign's lock is simply taken over).

``python -m analysis.store repair DIR`` salvages a damaged store from the command line.

The package: `schema` (the tables, their migrations, a record checked against them),
`result_store` (`ResultStore`), `frames` (its rows as pandas DataFrames), `lock`
(`CampaignLock`), `repair` (salvage), `campaign` (`open_campaign`: lock, repair, import),
`errors`. Callers import from ``analysis.store``.
"""

from analysis.store.campaign import imported_line, open_campaign
from analysis.store.errors import CampaignBusy, NoStore, StoreDamaged, StoreError
from analysis.store.lock import LOCK_FILENAME, CampaignLock
from analysis.store.repair import repair_campaign
from analysis.store.result_store import ResultStore
from analysis.store.schema import (MIGRATIONS, RECORD_FILENAME, SCHEMA_VERSION, STORE_FILENAME,
                                   TABLES, calibration_key, integrity_problem)

__all__ = ["CampaignBusy", "CampaignLock", "LOCK_FILENAME", "MIGRATIONS", "NoStore",
           "RECORD_FILENAME", "ResultStore", "SCHEMA_VERSION", "STORE_FILENAME", "StoreDamaged",
           "StoreError", "TABLES", "calibration_key", "imported_line", "integrity_problem",
           "open_campaign", "repair_campaign"]
