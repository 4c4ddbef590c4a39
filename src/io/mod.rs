//! Files: safetensors model files, and atomic writes for everything Armoury saves.

mod safetensors;

pub use self::safetensors::{
    load_module, load_module_from, load_tensors, load_tensors_any, read_i64, save_module, save_module_with_metadata,
    save_tensors, save_tensors_any, AnyTensor, SafetensorsFile,
};

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use rand::Rng;

use crate::{Error, Result};

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, written, flushed to disk, given
/// the permissions of the file it replaces, then renamed over `path`, and the directory flushed so that the rename
/// itself survives a crash. Readers never see a half-written file; on error the temporary file is removed.
///
/// The temporary name carries 64 random bits and is opened with `create_new` (`O_EXCL`), so a file or symlink
/// planted under a predictable name is never opened or followed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name =
        path.file_name().ok_or_else(|| Error::invalid("write", format!("{} does not name a file", path.display())))?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let original = std::fs::metadata(path).ok().map(|m| m.permissions());
    let (mut f, tmp) = create_temp(dir, &name.to_string_lossy()).map_err(|e| Error::io(path, e))?;
    let result = (|| {
        f.write_all(bytes)?;
        if let Some(p) = original {
            f.set_permissions(p)?;
        }
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// A new file `.<name>.<random>.tmp` in `dir`, created exclusively (retried on the astronomically unlikely
/// collision).
fn create_temp(dir: &Path, name: &str) -> std::io::Result<(File, PathBuf)> {
    let mut rng = rand::rng();
    let mut last = None;
    for _ in 0..16 {
        let tmp = dir.join(format!(".{name}.{:016x}.tmp", rng.random::<u64>()));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((f, tmp)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no temporary name available")))
}

/// Flushes a directory's entries (the rename) to disk, where the platform can.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}
