//! Data: IDX files, data sets, image folders, PNG grids, the embedded sample and the full-data loader.
//!
//! - [`Dataset`]: N×C×H×W f32 images in `[0,1]` (u8 / 255) with labels; shuffling (seeded), splitting, subsets and
//!   batches all return new data sets, never mutating the original.
//! - [`sample()`]: the first 2,000 training and 1,000 test images of Fashion-MNIST, embedded in the crate.
//! - [`find_full_data`] looks for the full set (the caller's directory, then `$ARMOURY_DATA`, then the Debian
//!   package `dataset-fashion-mnist`); [`load_default`] falls back to the sample.
//! - [`Idx`] reads and writes IDX files (MNIST's format; plain or gzip), [`load_idx_dir`] loads any IDX set.
//! - [`load_image_folder`] reads one sub-folder of PNG/JPEG images per class; [`load_image_folder_set`] a
//!   `train/` + `val/` pair of them (or evaluation images alone), as torchvision's `ImageFolder` does.
//! - [`save_png_grid`] draws rows of images (clean, adversarial, [`perturbation_image`]) into one PNG.
//!
//! ```
//! use armoury::data;
//! let fm = data::sample()?;
//! assert_eq!(fm.train.image_shape(), [1, 28, 28]);
//! let (x, y) = fm.test.batches(128)?.next().expect("the test set is not empty");
//! assert_eq!((x.shape(), y.len()), (&[128, 1, 28, 28][..], 128));
//! # Ok::<(), armoury::Error>(())
//! ```

mod cifar;
mod classes;
mod dataset;
mod folder;
mod grid;
mod idx;
mod sample;

pub use cifar::{decode_cifar, is_cifar_dir, load_cifar_dir, Cifar};
pub use classes::{builtin_class_names, read_class_list, read_class_names};
pub use dataset::{load_idx_dir, Batches, Dataset, TrainTest};
pub use folder::{is_image_folder, load_image_folder, load_image_folder_set, ImageFolderOptions};
pub use grid::{perturbation_image, png_grid_bytes, save_png_grid, GridRow, GRID_GAP};
pub use idx::{read_idx_images, read_idx_labels, write_idx_images, write_idx_labels, Idx, IdxData, IdxType};
pub use sample::{
    find_full_data, find_full_data_in, full_data_candidates, load_default, sample, DataLocation, DATA_ENV_VAR,
    DEBIAN_FASHION_MNIST_DIR, SAMPLE_NAME,
};
