//! The files of a sharded evaluation: where shard i of n keeps its ledger, and the check before a merge that every
//! shard has finished — one error naming all unfinished shards, so that a scheduler's merge step can say exactly
//! which array indices or pods to run again (deploy/README.md, recovery).

use std::path::{Path, PathBuf};

use super::cascade::Ledger;
use super::threat::ThreatModel;
use crate::{Error, Result};

/// The ledger file of shard `(i, n)` in `dir` (`ledger-i-of-n.json`), or of the unsharded run or the merge
/// (`ledger.json`).
pub fn ledger_file(dir: &Path, shard: Option<(usize, usize)>) -> PathBuf {
    match shard {
        Some((i, n)) => dir.join(format!("ledger-{i}-of-{n}.json")),
        None => dir.join("ledger.json"),
    }
}

/// The `n` shard ledgers of `dir`, in shard order, for [`super::merge`] — if every one exists, reads and has run
/// all its steps of `tm`. Otherwise [`Error::UnfinishedShards`] names each missing, unreadable or unfinished
/// shard and why. Whether the ledgers belong to this evaluation (identity, threat model, ranges) is
/// [`super::merge`]'s check.
pub fn load_shards(dir: &Path, n: usize, tm: &ThreatModel) -> Result<Vec<Ledger>> {
    if n == 0 {
        return Err(Error::invalid("merge", "0 shards: nothing to merge"));
    }
    let mut ledgers = Vec::with_capacity(n);
    let (mut unfinished, mut why) = (Vec::new(), Vec::new());
    for i in 0..n {
        let path = ledger_file(dir, Some((i, n)));
        let problem = match Ledger::load(&path) {
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                format!("shard {i}: no {} (never started)", file_name(&path))
            }
            Err(e) => format!("shard {i}: {e}"),
            Ok(l) if !l.is_complete(tm) => {
                format!("shard {i}: {} of {} steps done", l.steps_done, l.steps_total(tm))
            }
            Ok(l) => {
                ledgers.push(l);
                continue;
            }
        };
        unfinished.push(i);
        why.push(problem);
    }
    if unfinished.is_empty() {
        Ok(ledgers)
    } else {
        Err(Error::UnfinishedShards { dir: dir.to_path_buf(), n, unfinished, why })
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |f| f.to_string_lossy().into_owned())
}
