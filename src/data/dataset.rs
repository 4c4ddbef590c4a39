//! [`Dataset`] (images + labels), its batches, and [`TrainTest`] pairs loaded from IDX directories.

use std::ops::Range;
use std::path::{Path, PathBuf};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::idx::Idx;
use crate::{Error, Result, Tensor};

/// A labelled image data set: N×C×H×W f32 images (in `[0,1]` when loaded from files) and N class labels.
///
/// Never empty. Cheap to clone (the images are a shared [`Tensor`]). Every method returns a new data set; none
/// changes this one.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// N×C×H×W, standard (row-major) layout, a constant (untracked) tensor.
    images: Tensor,
    labels: Vec<usize>,
    num_classes: usize,
}

impl Dataset {
    /// A data set from an N×C×H×W image tensor and N labels, each below `num_classes`.
    ///
    /// Errors: rank other than 4, N = 0, a count mismatch, a label out of range, NaN or Inf pixels.
    pub fn new(images: Tensor, labels: Vec<usize>, num_classes: usize) -> Result<Dataset> {
        const OP: &str = "Dataset::new";
        let (n, c, h, w) = images.dims4(OP)?;
        if n == 0 || c == 0 || h == 0 || w == 0 {
            return Err(Error::invalid(OP, format!("empty data set (images {:?})", images.shape())));
        }
        if labels.len() != n {
            return Err(Error::invalid(OP, format!("{n} images but {} labels", labels.len())));
        }
        if let Some(&label) = labels.iter().find(|&&l| l >= num_classes) {
            return Err(Error::LabelOutOfRange { op: OP, label, num_classes });
        }
        crate::limits::check_classes("Dataset::new: the class count", num_classes)?;
        if !images.all_finite() {
            return Err(Error::NonFinite { op: OP });
        }
        let value = images.value();
        let images = if value.is_standard_layout() {
            Tensor::new(value.clone())
        } else {
            Tensor::new(value.as_standard_layout().into_owned())
        };
        Ok(Dataset { images, labels, num_classes })
    }

    /// Loads an IDX image file and an IDX label file (each plain or .gz); `num_classes` is the largest label + 1.
    pub fn from_idx_files(images_path: impl AsRef<Path>, labels_path: impl AsRef<Path>) -> Result<Dataset> {
        let (ip, lp) = (images_path.as_ref(), labels_path.as_ref());
        let images = Idx::read(ip)?.to_images(ip)?;
        let labels = Idx::read(lp)?.to_labels(lp)?;
        Dataset::from_parts(images, labels, ip, lp)
    }

    /// Decodes IDX image and label bytes (each plain or gzip); the names are used in error messages.
    pub(crate) fn from_idx_bytes(images: &[u8], labels: &[u8], images_name: &Path, labels_name: &Path) -> Result<Self> {
        let x = Idx::decode(images, images_name)?.to_images(images_name)?;
        let y = Idx::decode(labels, labels_name)?.to_labels(labels_name)?;
        Dataset::from_parts(x, y, images_name, labels_name)
    }

    fn from_parts(images: Tensor, labels: Vec<usize>, ip: &Path, lp: &Path) -> Result<Dataset> {
        let n = images.shape()[0];
        if n != labels.len() {
            return Err(Error::bad_file(lp, format!("{} labels, but {} has {n} images", labels.len(), ip.display())));
        }
        if n == 0 {
            return Err(Error::bad_file(ip, "the file holds no images"));
        }
        let num_classes = labels.iter().max().map_or(0, |m| m + 1);
        Dataset::new(images, labels, num_classes)
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Always false: a data set holds at least one sample (kept for the `len`/`is_empty` convention).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// `[C, H, W]` of every image.
    pub fn image_shape(&self) -> [usize; 3] {
        let s = self.images.shape();
        [s[1], s[2], s[3]]
    }

    /// The number of classes (labels are in `0..num_classes`).
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// All images, N×C×H×W.
    pub fn images(&self) -> &Tensor {
        &self.images
    }

    /// All labels.
    pub fn labels(&self) -> &[usize] {
        &self.labels
    }

    /// The pixels of image `i`, `[C, H, W]` row-major; `None` when `i >= len()`.
    pub fn image(&self, i: usize) -> Option<&[f32]> {
        let per = self.image_numel();
        // Checked: in release builds `i * per` would wrap and return another image's pixels.
        let start = i.checked_mul(per)?;
        self.flat().get(start..start.checked_add(per)?)
    }

    /// Image `i` as a `[C, H, W]` tensor (for [`super::save_png_grid`], for instance).
    pub fn image_tensor(&self, i: usize) -> Result<Tensor> {
        let px = self.image(i).ok_or_else(|| self.index_error("Dataset::image_tensor", i))?;
        Tensor::from_slice(px, &self.image_shape())
    }

    /// Every label is one of a model's `classes`; else an error naming the first sample (`what` names the data,
    /// e.g. `test`) whose label is not, and its label.
    pub fn check_labels(&self, classes: usize, what: &str) -> Result<()> {
        match self.labels.iter().position(|&l| l >= classes) {
            None => Ok(()),
            Some(i) => Err(Error::invalid(
                "labels",
                format!(
                    "{what} sample {i} has label {}, but the model has {classes} classes (0..{})",
                    self.labels[i],
                    classes.saturating_sub(1)
                ),
            )),
        }
    }

    /// The same samples, declared with `num_classes` classes (at least the largest label + 1).
    pub fn with_num_classes(&self, num_classes: usize) -> Result<Dataset> {
        crate::limits::check_classes("Dataset::with_num_classes", num_classes)?;
        if let Some(&label) = self.labels.iter().find(|&&l| l >= num_classes) {
            return Err(Error::LabelOutOfRange { op: "Dataset::with_num_classes", label, num_classes });
        }
        Ok(Dataset { num_classes, ..self.clone() })
    }

    /// The samples in a random order: a ChaCha8 permutation seeded with `seed` (same seed, same order).
    pub fn shuffled(&self, seed: u64) -> Dataset {
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        self.gather(&order)
    }

    /// The first `n_first` samples and the rest; both parts must be non-empty (`0 < n_first < len`).
    pub fn split(&self, n_first: usize) -> Result<(Dataset, Dataset)> {
        if n_first == 0 || n_first >= self.len() {
            return Err(Error::invalid(
                "Dataset::split",
                format!("n_first = {n_first} must be in 1..{} so that neither part is empty", self.len()),
            ));
        }
        Ok((self.range(0..n_first), self.range(n_first..self.len())))
    }

    /// The samples at `indices`, in that order (repeats allowed); errors on an empty list or an index ≥ len.
    pub fn subset(&self, indices: &[usize]) -> Result<Dataset> {
        if indices.is_empty() {
            return Err(Error::invalid("Dataset::subset", "no indices: a data set cannot be empty"));
        }
        if let Some(&i) = indices.iter().find(|&&i| i >= self.len()) {
            return Err(self.index_error("Dataset::subset", i));
        }
        Ok(self.gather(indices))
    }

    /// The first `min(n, len)` samples; `n = 0` is an error.
    pub fn take(&self, n: usize) -> Result<Dataset> {
        if n == 0 {
            return Err(Error::invalid("Dataset::take", "n = 0: a data set cannot be empty"));
        }
        Ok(self.range(0..n.min(self.len())))
    }

    /// Exactly `n` samples, cycling through this set (sample `i` is sample `i mod len`); used to make benchmark
    /// inputs of any size. `n = 0` is an error.
    pub fn repeat_to(&self, n: usize) -> Result<Dataset> {
        if n == 0 {
            return Err(Error::invalid("Dataset::repeat_to", "n = 0: a data set cannot be empty"));
        }
        let order: Vec<usize> = (0..n).map(|i| i % self.len()).collect();
        Ok(self.gather(&order))
    }

    /// Samples `range` as a `[B, C, H, W]` tensor and B labels; the range must be non-empty and within `0..len`.
    pub fn batch(&self, range: Range<usize>) -> Result<(Tensor, Vec<usize>)> {
        if range.start >= range.end || range.end > self.len() {
            return Err(Error::invalid(
                "Dataset::batch",
                format!("range {range:?} is empty or outside 0..{}", self.len()),
            ));
        }
        Ok(self.batch_unchecked(range))
    }

    /// Consecutive batches of `batch_size` samples in order (the last may be shorter); `batch_size = 0` is an
    /// error. Shuffle first ([`Dataset::shuffled`]) for a random order.
    pub fn batches(&self, batch_size: usize) -> Result<Batches<'_>> {
        if batch_size == 0 {
            return Err(Error::invalid("Dataset::batches", "batch_size must be at least 1"));
        }
        Ok(Batches { data: self, batch_size, next: 0 })
    }

    fn image_numel(&self) -> usize {
        self.image_shape().iter().product()
    }

    fn flat(&self) -> &[f32] {
        self.images.value().as_slice().expect("Dataset::new stores images in standard layout")
    }

    fn index_error(&self, op: &'static str, i: usize) -> Error {
        Error::invalid(op, format!("index {i} out of range for {} samples", self.len()))
    }

    fn batch_unchecked(&self, range: Range<usize>) -> (Tensor, Vec<usize>) {
        let per = self.image_numel();
        let [c, h, w] = self.image_shape();
        let x = Tensor::from_slice(&self.flat()[range.start * per..range.end * per], &[range.len(), c, h, w])
            .expect("the slice holds range.len() images");
        (x, self.labels[range].to_vec())
    }

    fn range(&self, range: Range<usize>) -> Dataset {
        let (images, labels) = self.batch_unchecked(range);
        Dataset { images, labels, num_classes: self.num_classes }
    }

    /// The samples at `order` (every index < len, non-empty: checked by the callers).
    fn gather(&self, order: &[usize]) -> Dataset {
        let per = self.image_numel();
        let flat = self.flat();
        let mut px = Vec::with_capacity(order.len() * per);
        for &i in order {
            px.extend_from_slice(&flat[i * per..(i + 1) * per]);
        }
        let [c, h, w] = self.image_shape();
        let images = Tensor::from_vec(px, &[order.len(), c, h, w]).expect("order.len() images were copied");
        Dataset { images, labels: order.iter().map(|&i| self.labels[i]).collect(), num_classes: self.num_classes }
    }
}

/// Iterator over a data set's batches: `([B, C, H, W] images, B labels)`; from [`Dataset::batches`].
#[derive(Clone, Debug)]
pub struct Batches<'a> {
    data: &'a Dataset,
    batch_size: usize,
    next: usize,
}

impl Iterator for Batches<'_> {
    type Item = (Tensor, Vec<usize>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.data.len() {
            return None;
        }
        let end = (self.next + self.batch_size).min(self.data.len());
        let batch = self.data.batch_unchecked(self.next..end);
        self.next = end;
        Some(batch)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.data.len() - self.next).div_ceil(self.batch_size);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Batches<'_> {}

/// A training set and a test set, with the name of the data set and where it was loaded from.
#[derive(Clone, Debug)]
pub struct TrainTest {
    /// The training split.
    pub train: Dataset,
    /// The test split.
    pub test: Dataset,
    /// The data set's name (e.g. `fashion-mnist`, `fashion-mnist-sample`).
    pub name: String,
    /// Where it came from: a directory, or the embedded sample (and why it was used).
    pub source: String,
    /// The classes' names when the data carry them (an image folder's class folders), by label.
    pub class_names: Option<Vec<String>>,
    /// `false` when the data have no training split of their own (an image folder without `train/`): then
    /// `train` is the test split, and [`TrainTest::training`] refuses every step that would fit on it.
    pub has_train: bool,
}

impl TrainTest {
    /// Pairs two splits; both get the larger of their class counts.
    pub fn new(train: Dataset, test: Dataset, name: impl Into<String>, source: impl Into<String>) -> Result<Self> {
        let k = train.num_classes().max(test.num_classes());
        Ok(TrainTest {
            train: train.with_num_classes(k)?,
            test: test.with_num_classes(k)?,
            name: name.into(),
            source: source.into(),
            class_names: None,
            has_train: true,
        })
    }

    /// Test data only (an image folder of evaluation images): `train` is the same split, and
    /// [`TrainTest::training`] refuses to fit on it.
    pub fn test_only(test: Dataset, name: impl Into<String>, source: impl Into<String>) -> Self {
        TrainTest {
            train: test.clone(),
            test,
            name: name.into(),
            source: source.into(),
            class_names: None,
            has_train: false,
        }
    }

    /// The same data with labels renumbered to the positions of their class names in `names` (the model's classes
    /// in output order): an image folder holding some of a model's classes (`n01440764/`, … of ImageNet's 1,000)
    /// gets the model's labels instead of the folders' sorted positions.
    ///
    /// Errors: the data carry no class names, or a class of the data is not in `names` (naming it).
    pub fn relabel_by_name(&self, names: &[String]) -> Result<TrainTest> {
        const OP: &str = "TrainTest::relabel_by_name";
        let Some(own) = &self.class_names else {
            return Err(Error::invalid(OP, format!("{} carries no class names to match", self.source)));
        };
        let map = own
            .iter()
            .map(|c| {
                names.iter().position(|n| n == c).ok_or_else(|| {
                    Error::invalid(
                        OP,
                        format!("class '{c}' of {} is not one of the model's {} classes", self.source, names.len()),
                    )
                })
            })
            .collect::<Result<Vec<usize>>>()?;
        let relabel =
            |d: &Dataset| Dataset::new(d.images.clone(), d.labels.iter().map(|&l| map[l]).collect(), names.len());
        Ok(TrainTest {
            train: relabel(&self.train)?,
            test: relabel(&self.test)?,
            name: self.name.clone(),
            source: self.source.clone(),
            class_names: Some(names.to_vec()),
            has_train: self.has_train,
        })
    }

    /// The training split for `purpose` (e.g. "fitting the detectors"), or an error in the user's terms when the
    /// data have none: fitting a detector or a defense on the evaluation images would grade it on what it saw.
    pub fn training(&self, purpose: &str) -> Result<&Dataset> {
        if self.has_train {
            return Ok(&self.train);
        }
        Err(Error::invalid(
            "data",
            format!(
                "{purpose} needs training images, and {} has only evaluation images: give a directory with \
                 train/ and val/ (or test/) class folders",
                self.source
            ),
        ))
    }
}

/// The four files of an IDX data set in `dir`, or the names that were tried for each missing one.
pub(crate) fn idx_files(dir: &Path) -> std::result::Result<[PathBuf; 4], Vec<String>> {
    let mut found = Vec::with_capacity(4);
    let mut missing = Vec::new();
    for (split, kind, ranks) in [
        ("train", "images", &["idx3", "idx4"][..]),
        ("train", "labels", &["idx1"][..]),
        ("t10k", "images", &["idx3", "idx4"][..]),
        ("t10k", "labels", &["idx1"][..]),
    ] {
        let names: Vec<String> = ranks
            .iter()
            .flat_map(|r| [format!("{split}-{kind}-{r}-ubyte"), format!("{split}-{kind}.{r}-ubyte")])
            .flat_map(|n| [format!("{n}.gz"), n])
            .collect();
        match names.iter().map(|n| dir.join(n)).find(|p| p.is_file()) {
            Some(p) => found.push(p),
            None => missing.push(format!("{split}-{kind}-{}-ubyte[.gz]", ranks[0])),
        }
    }
    match <[PathBuf; 4]>::try_from(found) {
        Ok(files) if missing.is_empty() => Ok(files),
        _ => Err(missing),
    }
}

/// Loads an IDX data set (MNIST, Fashion-MNIST, …) from `dir`: `train-images-idx3-ubyte`,
/// `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`, each plain or `.gz`
/// (`train-images.idx3-ubyte` spellings and `idx4` colour images are accepted too).
///
/// The name is the directory's name; both splits share the class count (largest label + 1).
pub fn load_idx_dir(dir: impl AsRef<Path>) -> Result<TrainTest> {
    let dir = dir.as_ref();
    let [train_x, train_y, test_x, test_y] = idx_files(dir)
        .map_err(|missing| Error::DataNotFound(vec![format!("{} (missing {})", dir.display(), missing.join(", "))]))?;
    let train = Dataset::from_idx_files(&train_x, &train_y)?;
    let test = Dataset::from_idx_files(&test_x, &test_y)?;
    if train.image_shape() != test.image_shape() {
        return Err(Error::bad_file(
            &test_x,
            format!("test images are {:?} but training images are {:?}", test.image_shape(), train.image_shape()),
        ));
    }
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "idx".into());
    TrainTest::new(train, test, name, dir.display().to_string())
}
