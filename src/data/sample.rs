//! The embedded Fashion-MNIST sample, and finding the full data set on this machine.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::dataset::{idx_files, load_idx_dir, Dataset, TrainTest};
use crate::{Error, Result};

/// The environment variable that may name a directory holding the full data set.
pub const DATA_ENV_VAR: &str = "ARMOURY_DATA";

/// Where the Debian package `dataset-fashion-mnist` installs Fashion-MNIST.
pub const DEBIAN_FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// The [`TrainTest::name`] of the embedded sample.
pub const SAMPLE_NAME: &str = "fashion-mnist-sample";

macro_rules! sample_file {
    ($name:literal) => {
        include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/data/fashion-mnist-sample/", $name))
    };
}

static TRAIN_IMAGES: &[u8] = sample_file!("train-images-idx3-ubyte.gz");
static TRAIN_LABELS: &[u8] = sample_file!("train-labels-idx1-ubyte.gz");
static TEST_IMAGES: &[u8] = sample_file!("t10k-images-idx3-ubyte.gz");
static TEST_LABELS: &[u8] = sample_file!("t10k-labels-idx1-ubyte.gz");

/// The embedded sample: the first 2,000 training and first 1,000 test images of Fashion-MNIST (Zalando Research,
/// MIT licence; Xiao, Rasul & Vollgraf 2017), 1×28×28 in `[0,1]`, 10 classes. Needs no files or set-up.
///
/// ```
/// let fm = armoury::data::sample()?;
/// assert_eq!((fm.train.len(), fm.test.len(), fm.test.labels()[0]), (2000, 1000, 9));
/// # Ok::<(), armoury::Error>(())
/// ```
pub fn sample() -> Result<TrainTest> {
    sample_with_source("embedded sample (first 2000 train / 1000 test images of Fashion-MNIST)".into())
}

fn sample_with_source(source: String) -> Result<TrainTest> {
    let dir = Path::new("<embedded>/fashion-mnist-sample");
    let train = Dataset::from_idx_bytes(
        TRAIN_IMAGES,
        TRAIN_LABELS,
        &dir.join("train-images-idx3-ubyte.gz"),
        &dir.join("train-labels-idx1-ubyte.gz"),
    )?;
    let test = Dataset::from_idx_bytes(
        TEST_IMAGES,
        TEST_LABELS,
        &dir.join("t10k-images-idx3-ubyte.gz"),
        &dir.join("t10k-labels-idx1-ubyte.gz"),
    )?;
    TrainTest::new(train.with_num_classes(10)?, test.with_num_classes(10)?, SAMPLE_NAME, source)
}

/// One place where [`find_full_data`] looks for the full data set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataLocation {
    /// What this place is, for messages: `"ARMOURY_DATA=/data/fm"`, `"ARMOURY_DATA (unset)"`, a path, …
    pub description: String,
    /// The directory to look in; `None` when there is nothing to look at (an unset variable).
    pub dir: Option<PathBuf>,
}

/// The places [`find_full_data`] searches, in order: the caller's directory (if any), the directory in
/// `env_value` (the value of [`DATA_ENV_VAR`]; `None` when unset), then `system_dir` (normally
/// [`DEBIAN_FASHION_MNIST_DIR`]). A pure function, so the search order can be tested without touching the
/// process environment.
pub fn full_data_candidates(dir: Option<&Path>, env_value: Option<&OsStr>, system_dir: &Path) -> Vec<DataLocation> {
    let mut out = Vec::with_capacity(3);
    if let Some(d) = dir {
        out.push(DataLocation { description: format!("{} (given directory)", d.display()), dir: Some(d.into()) });
    }
    out.push(match env_value.filter(|v| !v.is_empty()) {
        Some(v) => DataLocation {
            description: format!("{DATA_ENV_VAR}={}", Path::new(v).display()),
            dir: Some(PathBuf::from(v)),
        },
        None => DataLocation { description: format!("{DATA_ENV_VAR} (unset)"), dir: None },
    });
    out.push(DataLocation {
        description: format!("{} (apt-get install dataset-fashion-mnist)", system_dir.display()),
        dir: Some(system_dir.into()),
    });
    out
}

/// Loads the first location whose directory holds an IDX data set (see [`load_idx_dir`] for the file names).
///
/// A directory with none of the four files is skipped; one with some of them, or with a corrupt file, is an
/// error (it is almost certainly the data the caller meant). When no location has the data the error is
/// [`Error::DataNotFound`] listing every location tried.
pub fn find_full_data_in(locations: &[DataLocation]) -> Result<TrainTest> {
    let mut tried = Vec::with_capacity(locations.len());
    for loc in locations {
        let Some(dir) = &loc.dir else {
            tried.push(loc.description.clone());
            continue;
        };
        match idx_files(dir) {
            Ok(_) => {
                let mut tt = load_idx_dir(dir)?;
                tt.source = loc.description.clone();
                return Ok(tt);
            }
            Err(missing) if missing.len() < 4 => {
                return Err(Error::bad_file(
                    dir,
                    format!("{}: incomplete IDX data set, missing {}", loc.description, missing.join(", ")),
                ))
            }
            Err(_) => tried.push(format!("{}: no IDX files", loc.description)),
        }
    }
    Err(Error::DataNotFound(tried))
}

/// The full data set: looks in `dir`, then `$ARMOURY_DATA`, then the Debian package's directory
/// [`DEBIAN_FASHION_MNIST_DIR`] (`apt-get install dataset-fashion-mnist`); see [`find_full_data_in`].
pub fn find_full_data(dir: Option<&Path>) -> Result<TrainTest> {
    let env = std::env::var_os(DATA_ENV_VAR);
    find_full_data_in(&full_data_candidates(dir, env.as_deref(), Path::new(DEBIAN_FASHION_MNIST_DIR)))
}

/// The full data set when [`find_full_data`] finds it, otherwise the embedded [`sample()`]; `source` says which
/// (and, for the sample, where the full set was looked for). Errors other than "not found" are returned.
pub fn load_default(dir: Option<&Path>) -> Result<TrainTest> {
    match find_full_data(dir) {
        Err(Error::DataNotFound(tried)) => {
            sample_with_source(format!("embedded sample (full data not found; looked in: {})", tried.join(", ")))
        }
        other => other,
    }
}
