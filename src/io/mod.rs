//! Files: safetensors model files, and atomic writes for everything Armoury saves.

mod safetensors;

pub use self::safetensors::{
    load_module, load_module_from, load_tensors, load_tensors_any, read_i64, save_module, save_module_with_metadata,
    save_tensors, save_tensors_any, AnyTensor, SafetensorsFile,
};

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Error, Result};

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, flushed, then renamed over
/// `path`. Readers never see a half-written file; on error the temporary file is removed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name =
        path.file_name().ok_or_else(|| Error::invalid("write", format!("{} does not name a file", path.display())))?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp_name =
        format!(".{}.{}.{}.tmp", name.to_string_lossy(), std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}
