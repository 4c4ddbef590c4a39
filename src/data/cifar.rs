//! The CIFAR-10 and CIFAR-100 binary format (Krizhevsky 2009, "the binary version"): records of one label byte
//! (CIFAR-100: a coarse and a fine label byte) followed by 3·32·32 pixel bytes, the red plane, then green, then
//! blue, each row-major. CIFAR-10 ships `data_batch_1.bin` … `data_batch_5.bin` and `test_batch.bin`; CIFAR-100
//! `train.bin` and `test.bin`. Pixels become values in [0, 1] (byte / 255), as torchvision's `ToTensor`.

use std::path::{Path, PathBuf};

use super::{Dataset, TrainTest};
use crate::limits::{check_bytes, f32_bytes, max_memory};
use crate::{Error, Result, Tensor};

/// Which CIFAR file layout, and for CIFAR-100 which label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cifar {
    /// CIFAR-10: one label byte (10 classes).
    Ten,
    /// CIFAR-100 with its 100 fine labels (the second label byte).
    HundredFine,
    /// CIFAR-100 with its 20 coarse labels (the first label byte).
    HundredCoarse,
}

impl Cifar {
    fn label_bytes(self) -> usize {
        match self {
            Cifar::Ten => 1,
            _ => 2,
        }
    }

    fn classes(self) -> usize {
        match self {
            Cifar::Ten => 10,
            Cifar::HundredFine => 100,
            Cifar::HundredCoarse => 20,
        }
    }

    /// The data set's name: `cifar-10`, `cifar-100` or `cifar-100-coarse`.
    pub fn name(self) -> &'static str {
        match self {
            Cifar::Ten => "cifar-10",
            Cifar::HundredFine => "cifar-100",
            Cifar::HundredCoarse => "cifar-100-coarse",
        }
    }
}

/// Pixel bytes per image.
const PIXELS: usize = 3 * 32 * 32;

/// Decodes the records of CIFAR binary files (`bytes` of `path`, for error messages).
///
/// Errors: a length that is not a whole number of records (naming the record size and the stray bytes), no
/// record, a label outside the variant's classes (naming the record), more images than the memory budget.
pub fn decode_cifar(bytes: &[u8], variant: Cifar, path: &Path) -> Result<Dataset> {
    let record = variant.label_bytes() + PIXELS;
    if bytes.is_empty() || !bytes.len().is_multiple_of(record) {
        return Err(Error::bad_file(
            path,
            format!(
                "{} bytes is not a whole number of {} records of {record} bytes ({} label byte(s) + 3×32×32 pixels): \
                 not a CIFAR binary file, or truncated",
                bytes.len(),
                variant.name(),
                variant.label_bytes()
            ),
        ));
    }
    let n = bytes.len() / record;
    check_bytes(
        || format!("{} images of {}", n, path.display()),
        f32_bytes("CIFAR images", &[n, PIXELS])?,
        max_memory(),
    )?;
    let mut values = Vec::with_capacity(n * PIXELS);
    let mut labels = Vec::with_capacity(n);
    for (i, r) in bytes.chunks_exact(record).enumerate() {
        let label = match variant {
            Cifar::Ten | Cifar::HundredCoarse => r[0],
            Cifar::HundredFine => r[1],
        } as usize;
        if label >= variant.classes() {
            return Err(Error::bad_file(
                path,
                format!("record {i} has label {label}, but {} has {} classes", variant.name(), variant.classes()),
            ));
        }
        labels.push(label);
        values.extend(r[variant.label_bytes()..].iter().map(|&b| b as f32 / 255.0));
    }
    Dataset::new(Tensor::from_vec(values, &[n, 3, 32, 32])?, labels, variant.classes())
}

fn read(paths: &[PathBuf], variant: Cifar) -> Result<Dataset> {
    let mut bytes = Vec::new();
    for p in paths {
        let len = std::fs::metadata(p).map_err(|e| Error::io(p, e))?.len();
        check_bytes(|| format!("{}", p.display()), len as u128 * 4, max_memory())?;
        bytes.extend(std::fs::read(p).map_err(|e| Error::io(p, e))?);
    }
    decode_cifar(&bytes, variant, &paths[0])
}

/// Where a directory's CIFAR files are: CIFAR-10's training batches and test batch, or CIFAR-100's two files.
enum Layout {
    Ten { dir: PathBuf, test: PathBuf },
    Hundred { dir: PathBuf, train: PathBuf, test: PathBuf },
}

/// The CIFAR layout of `dir` or of its `cifar-10-batches-bin` / `cifar-100-binary` subdirectory, as the archives
/// unpack.
fn layout(dir: &Path) -> Option<Layout> {
    [dir.to_path_buf(), dir.join("cifar-10-batches-bin"), dir.join("cifar-100-binary")].into_iter().find_map(|d| {
        let (test10, train, test) = (d.join("test_batch.bin"), d.join("train.bin"), d.join("test.bin"));
        if test10.is_file() {
            Some(Layout::Ten { dir: d, test: test10 })
        } else if train.is_file() && test.is_file() {
            Some(Layout::Hundred { dir: d, train, test })
        } else {
            None
        }
    })
}

/// Loads CIFAR-10 (`data_batch_1.bin` … `data_batch_5.bin`, `test_batch.bin`) or CIFAR-100 (`train.bin`,
/// `test.bin`, with `labels` choosing fine or coarse) from `dir` (or its `cifar-10-batches-bin` /
/// `cifar-100-binary` subdirectory, as the archives unpack). A CIFAR-10 directory with fewer training batches
/// loads those it has.
///
/// Errors: no CIFAR files in `dir` (naming what was looked for), and [`decode_cifar`]'s.
pub fn load_cifar_dir(dir: impl AsRef<Path>, hundred_labels: Cifar) -> Result<TrainTest> {
    let dir = dir.as_ref();
    match layout(dir) {
        Some(Layout::Ten { dir: d, test }) => {
            let train: Vec<PathBuf> =
                (1..=5).map(|k| d.join(format!("data_batch_{k}.bin"))).filter(|p| p.is_file()).collect();
            if train.is_empty() {
                return Err(Error::DataNotFound(vec![format!(
                    "{} (test_batch.bin but no data_batch_K.bin)",
                    d.display()
                )]));
            }
            let (train, test) = (read(&train, Cifar::Ten)?, read(&[test], Cifar::Ten)?);
            TrainTest::new(train, test, Cifar::Ten.name(), d.display().to_string())
        }
        Some(Layout::Hundred { dir: d, train, test }) => {
            let v = if hundred_labels == Cifar::Ten { Cifar::HundredFine } else { hundred_labels };
            TrainTest::new(read(&[train], v)?, read(&[test], v)?, v.name(), d.display().to_string())
        }
        None => Err(Error::DataNotFound(vec![format!(
            "{} (no CIFAR-10 data_batch_K.bin + test_batch.bin, nor CIFAR-100 train.bin + test.bin)",
            dir.display()
        )])),
    }
}

/// Whether `dir` holds a CIFAR binary data set ([`load_cifar_dir`] would find it).
pub fn is_cifar_dir(dir: &Path) -> bool {
    layout(dir).is_some()
}
