"""The home's on-disk state: the one owner of TIERGATE_HOME's layout and its operations (stdlib only).

Layout under `home()`:
  runs/<run key>/                 a result folder (result.json, outputs.npz), reused while it verifies
  runs/<run key>.shards/A-B/      finished shards of a run whose other shards are missing, until merged
  decisions/<key>.json            a decision with the hashes of every input it was made from (sealed)
  quick/<request key>.json        the fast path's entry for an unchanged `tiergate gate` (sealed)
  quick/known-files               files' sha256 by their stat, so an unchanged file is not read again (sealed)
  quick/.clock                    rewritten for its time only: the file system's clock (stamps.clock_mark)
  runtime-graphs/<key>/           the describe cache (a tier's runtime graph of an artifact)
  compiled/<key>/                 the compile cache: an artifact compiled for a class (tiergate.build.compiling: model.so,
                                  tvm-meta.json), sealed like the describe cache
  explain/<key>/                  explain's tensor dumps
  data/<sha>.npz                  content-hashed archives (loader data, early-decision chunks)
  mlflow/<key>/                   a model version's files fetched from MLflow (tiergate.mlflow_bridge), sealed;
  mlflow/watch-<key>.json         the MLflow watcher's last version seen of a registered model
  locks/<key>.lock                one fcntl lock per key: one run (or decision) of a key at a time

Everything written here is written whole or not at all: to `NAME.part-PID-TID` beside its final
place, then renamed (`part_path`, `parse_part`: the one naming, which gc reads to tell a live
writer from a dead one); a full disk is the one-line EnvironmentProblem of errors.disk_full.
The orchestrator, the fast path (quickgate) and gc all use this package; it imports no numpy.

Decision files, fast-path entries and saved runs (run.seal: every file's sha256 and the run's name) are sealed: an
HMAC-SHA256 under a key kept outside the home
(`cache_key_path`: $TIERGATE_CACHE_KEY, else ${XDG_CONFIG_HOME:-~/.config}/tiergate/cache.key, 32 random
bytes made 0600 on first use). A file whose seal is missing or wrong (edited, or restored from a home
sealed under another key) is never believed: a decision is made again from the verified runs, a run is run again.

Modules (each a home of its own; this package re-exports their public names, `from tiergate.state import X` and
`state.X` alike):
- names.py: the layout: folder and file names, where each thing lives under `home()`;
- writing.py: the part naming (`part_path`, `parse_part`) and atomic file writes (`write_text`, `write_json`);
- locks.py: key locks (`key_lock`, `try_key_lock`) and gc's probes (`flock_held`, `process_alive`);
- seal.py: the cache key and sealed documents (`write_sealed`, `read_sealed`);
- runs.py: saved runs, written whole, sealed and verified (`writing_folder`, `replace_dir`, `verified`);
- cached.py: cache folders with a sealed manifest (`publish_folder`, `cached_folder`);
- decisions.py: decisions and fast-path entries (`read_decision`, `save_decision`, `read_quick_entry`);
- stamps.py: files known by their stat (`KnownHashes`, `folder_stamp`): what the fast path need not read again;
- saved.py: what gc reads of the home (`Saved`, `saved_runs`, ...) and its removals under a key's lock.
"""

from __future__ import annotations

from tiergate.hashing import file_sha256  # noqa: F401 - re-exported (state.file_sha256)
from tiergate.paths import home  # noqa: F401 - re-exported (state.home)
from tiergate.state.cached import MANIFEST, cached_folder, discard_folder, folder_verifies, publish_folder
from tiergate.state.decisions import (classes_identity, decision_key_of, discard_decision, now_iso, policy_identity,
                                      read_decision, read_quick_entry, save_decision, save_quick_entry)
from tiergate.state.locks import flock_held, key_lock, process_alive, try_key_lock
from tiergate.state.names import (COMPILE_META, COMPILE_SOURCE, COMPILED, DATA, DECISION_SCHEMA, DECISIONS, EXPLAIN,
                                  GRAPHS, LOCKS, MLFLOW, OUTPUTS_FILE, QUICK, RESULT_FILE, RUNS, SHARDS_SUFFIX,
                                  compile_record, compiled_folder, data_root, decision_path, explain_folder,
                                  graph_folder, mlflow_folder, mlflow_watch_path, quick_entry_path, run_key,
                                  runs_root, shard_folder, shards_of, write_compile_source)
from tiergate.state.runs import (RUN_SEAL, read_result, replace_dir, run_label_hash, run_matches, run_sealed,
                                 run_verifies, seal_run, verified, writing_folder)
from tiergate.state.saved import (Saved, entries, folder_size, parse_iso, remove_compiled, remove_run,
                                  saved_compiles, saved_decisions, saved_mlflow, saved_runs)
from tiergate.state.seal import CACHE_KEY_BYTES, SEAL, cache_key, cache_key_path, read_sealed, seal_of, write_sealed
from tiergate.state.writing import (PART_MARK, is_part, parse_part, part_path, part_tag, temp_name, write_json,
                                    write_text)

__all__ = [
    "CACHE_KEY_BYTES", "COMPILED", "COMPILE_META", "COMPILE_SOURCE", "DATA", "DECISIONS", "DECISION_SCHEMA",
    "EXPLAIN", "GRAPHS", "LOCKS", "MANIFEST", "MLFLOW", "OUTPUTS_FILE", "PART_MARK", "QUICK", "RESULT_FILE", "RUNS",
    "RUN_SEAL", "SEAL", "SHARDS_SUFFIX", "Saved", "cache_key", "cache_key_path", "cached_folder", "classes_identity",
    "compile_record", "compiled_folder", "data_root", "decision_key_of", "decision_path", "discard_decision",
    "discard_folder", "entries", "explain_folder", "file_sha256", "flock_held", "folder_size", "folder_verifies",
    "graph_folder", "home", "is_part", "key_lock", "mlflow_folder", "mlflow_watch_path", "now_iso", "parse_iso",
    "parse_part", "part_path", "part_tag", "policy_identity", "process_alive", "publish_folder", "quick_entry_path",
    "read_decision", "read_quick_entry", "read_result", "read_sealed", "remove_compiled", "remove_run",
    "replace_dir", "run_key", "run_label_hash", "run_matches", "run_sealed", "run_verifies", "runs_root",
    "save_decision", "save_quick_entry", "saved_compiles", "saved_decisions", "saved_mlflow", "saved_runs",
    "seal_of", "seal_run", "shard_folder", "shards_of", "temp_name", "try_key_lock", "verified", "write_compile_source",
    "write_json", "write_sealed", "write_text", "writing_folder",
]
