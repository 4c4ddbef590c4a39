//! Image folders: one sub-folder of PNG/JPEG images per class.

use std::path::{Path, PathBuf};

use image::imageops::FilterType;
use image::ImageReader;

use super::{Dataset, TrainTest};
use crate::{Error, Result, Tensor};

const OP: &str = "load_image_folder";

/// How [`load_image_folder`] converts images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageFolderOptions {
    /// Resize every image to `(width, height)` with a triangle (bilinear) filter; `None` keeps the original
    /// size, and then every image must have the same size.
    pub size: Option<(u32, u32)>,
    /// 1 for grayscale (luma), 3 for RGB; alpha is dropped.
    pub channels: usize,
    /// Resize so that the shorter side has this length, keeping the aspect ratio (torchvision's `Resize(int)`:
    /// the longer side becomes `⌊side · long / short⌋`); after `size`, if both are given.
    pub shorter_side: Option<u32>,
    /// Then cut the `(width, height)` centre out (torchvision's `CenterCrop`: offsets `(w − cw) / 2` rounded half
    /// to even, as Python's `round`);
    /// an image smaller than the crop is an error.
    pub center_crop: Option<(u32, u32)>,
}

impl ImageFolderOptions {
    /// torchvision's ImageNet evaluation transform: the shorter side resized to 256, the 224×224 centre, RGB.
    pub fn imagenet() -> ImageFolderOptions {
        ImageFolderOptions { shorter_side: Some(256), center_crop: Some((224, 224)), ..Default::default() }
    }
}

impl Default for ImageFolderOptions {
    /// Original size, RGB.
    fn default() -> Self {
        ImageFolderOptions { size: None, channels: 3, shorter_side: None, center_crop: None }
    }
}

/// `size`, then `shorter_side`, then `center_crop` of `options` applied to one image.
fn geometry<P>(
    mut img: image::ImageBuffer<P, Vec<u8>>,
    options: &ImageFolderOptions,
    path: &Path,
) -> Result<image::ImageBuffer<P, Vec<u8>>>
where
    P: image::Pixel<Subpixel = u8> + 'static,
{
    if let Some((w, h)) = options.size {
        img = image::imageops::resize(&img, w, h, FilterType::Triangle);
    }
    if let Some(side) = options.shorter_side {
        let (w, h) = img.dimensions();
        let (short, long) = (w.min(h) as u64, w.max(h) as u64);
        let other = (side as u64 * long / short.max(1)) as u32;
        let (nw, nh) = if w <= h { (side, other) } else { (other, side) };
        if (nw, nh) != (w, h) {
            img = image::imageops::resize(&img, nw, nh, FilterType::Triangle);
        }
    }
    if let Some((cw, ch)) = options.center_crop {
        let (w, h) = img.dimensions();
        if cw > w || ch > h {
            return Err(Error::invalid(
                OP,
                format!("{} is {w}x{h}, smaller than the {cw}x{ch} centre crop", path.display()),
            ));
        }
        // torchvision: int(round((w - cw) / 2.0)), and Python rounds halves to even.
        let left = ((w - cw) as f64 / 2.0).round_ties_even() as u32;
        let top = ((h - ch) as f64 / 2.0).round_ties_even() as u32;
        img = image::imageops::crop_imm(&img, left, top, cw, ch).to_image();
    }
    Ok(img)
}

/// Loads a folder with one sub-folder per class (`dir/cat/*.png`, `dir/dog/*.jpg`, …) and returns the data set
/// and the class names.
///
/// Classes are the sub-folders sorted by name (label = position); hidden folders are skipped. Files ending in
/// `.png`, `.jpg` or `.jpeg` (any case) are loaded in name order, other files are ignored. Pixels are u8 / 255,
/// in `[0,1]`.
///
/// Errors: no class folders, a class folder with no images, an image that cannot be decoded
/// ([`Error::Image`]), `channels` other than 1 or 3, a zero target size, and images of different sizes when
/// `size` is `None`.
pub fn load_image_folder(dir: impl AsRef<Path>, options: ImageFolderOptions) -> Result<(Dataset, Vec<String>)> {
    let dir = dir.as_ref();
    let ImageFolderOptions { size, channels, shorter_side, center_crop } = options;
    if channels != 1 && channels != 3 {
        return Err(Error::invalid(OP, format!("channels must be 1 or 3, got {channels}")));
    }
    if let Some((w, h)) = size.or(center_crop) {
        if w == 0 || h == 0 {
            return Err(Error::invalid(OP, format!("sizes must be positive, got {w}x{h}")));
        }
    }
    if shorter_side == Some(0) {
        return Err(Error::invalid(OP, "shorter_side must be positive"));
    }
    let classes = sorted_entries(dir, |p| p.is_dir())?;
    if classes.is_empty() {
        return Err(Error::invalid(OP, format!("{}: no class sub-folders", dir.display())));
    }
    let mut names = Vec::with_capacity(classes.len());
    let mut pixels = Vec::new();
    let mut labels = Vec::new();
    let mut shape: Option<(u32, u32, PathBuf)> = None;
    for (label, class_dir) in classes.iter().enumerate() {
        names.push(file_name(class_dir));
        let files = sorted_entries(class_dir, |p| p.is_file() && is_image(p))?;
        if files.is_empty() {
            return Err(Error::invalid(OP, format!("{}: no PNG or JPEG images", class_dir.display())));
        }
        for file in files {
            let (w, h) = load_one(&file, &options, &mut pixels)?;
            let bytes = pixels.len() as u128 * 4;
            crate::limits::check_bytes(
                || format!("{}: the images so far", dir.display()),
                bytes,
                crate::limits::max_memory(),
            )?;
            match &shape {
                None => shape = Some((w, h, file.clone())),
                Some((w0, h0, first)) if (*w0, *h0) != (w, h) => {
                    return Err(Error::invalid(
                        OP,
                        format!(
                            "{} is {w}x{h} but {} is {w0}x{h0}; set ImageFolderOptions::size to resize",
                            file.display(),
                            first.display()
                        ),
                    ))
                }
                Some(_) => {}
            }
            labels.push(label);
        }
    }
    let (w, h, _) = shape.expect("at least one image was loaded");
    let images = Tensor::from_vec(pixels, &[labels.len(), channels, h as usize, w as usize])?;
    Ok((Dataset::new(images, labels, classes.len())?, names))
}

/// The splits [`load_image_folder_set`] looks for: training, then evaluation (first found).
const TRAIN_DIR: &str = "train";
const EVAL_DIRS: [&str; 2] = ["val", "test"];

/// Whether `dir` is an image folder: a class sub-folder holding a PNG or JPEG image, directly or under `train/`,
/// `val/` or `test/`.
pub fn is_image_folder(dir: &Path) -> bool {
    let has_class = |d: &Path| {
        sorted_entries(d, |p| p.is_dir())
            .unwrap_or_default()
            .iter()
            .any(|c| sorted_entries(c, |p| p.is_file() && is_image(p)).is_ok_and(|f| !f.is_empty()))
    };
    has_class(dir) || [TRAIN_DIR].iter().chain(&EVAL_DIRS).any(|s| has_class(&dir.join(s)))
}

/// Loads an image-folder data set as torchvision's `ImageFolder` reads one: `dir/train` and `dir/val` (or
/// `dir/test`) when they exist, each with one sub-folder per class, else `dir` alone as evaluation images with no
/// training split ([`TrainTest::test_only`]). Both splits must have the same classes; the class names are the
/// folders'. The name is the directory's name.
pub fn load_image_folder_set(dir: impl AsRef<Path>, options: ImageFolderOptions) -> Result<TrainTest> {
    let dir = dir.as_ref();
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "images".into());
    let eval = EVAL_DIRS.iter().map(|s| dir.join(s)).find(|d| d.is_dir());
    let (mut set, names) = match (dir.join(TRAIN_DIR), eval) {
        (train, Some(eval)) if train.is_dir() => {
            let (train_set, train_names) = load_image_folder(&train, options)?;
            let (test_set, names) = load_image_folder(&eval, options)?;
            if train_names != names {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "{} has classes {train_names:?} but {} has {names:?}: both splits need the same class folders",
                        train.display(),
                        eval.display()
                    ),
                ));
            }
            (TrainTest::new(train_set, test_set, name, dir.display().to_string())?, names)
        }
        (train, None) if train.is_dir() => {
            return Err(Error::invalid(OP, format!("{} has train/ but no val/ or test/ split", dir.display())))
        }
        (_, eval) => {
            let eval = eval.unwrap_or_else(|| dir.to_path_buf());
            let (test_set, names) = load_image_folder(&eval, options)?;
            let source = format!("{} (evaluation images only)", eval.display());
            (TrainTest::test_only(test_set, name, source), names)
        }
    };
    set.class_names = Some(names);
    Ok(set)
}

/// Decodes one image, converts it, resizes and crops it ([`geometry`]), appends its pixels (C×H×W) and returns
/// (width, height).
fn load_one(path: &Path, options: &ImageFolderOptions, out: &mut Vec<f32>) -> Result<(u32, u32)> {
    let mut reader = ImageReader::open(path).and_then(|r| r.with_guessed_format()).map_err(|e| Error::io(path, e))?;
    // The decoder refuses an image whose declared size needs more than the memory budget (a 100000×100000 PNG
    // header is a few bytes).
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(crate::limits::max_memory());
    reader.limits(limits);
    let img = reader.decode().map_err(|source| Error::Image { path: path.into(), source })?;
    if options.channels == 1 {
        let g = geometry(img.to_luma8(), options, path)?;
        out.extend(g.as_raw().iter().map(|&v| f32::from(v) / 255.0));
        Ok(g.dimensions())
    } else {
        let rgb = geometry(img.to_rgb8(), options, path)?;
        let raw = rgb.as_raw();
        for c in 0..3 {
            out.extend(raw.iter().skip(c).step_by(3).map(|&v| f32::from(v) / 255.0));
        }
        Ok(rgb.dimensions())
    }
}

fn is_image(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| ["png", "jpg", "jpeg"].iter().any(|x| e.eq_ignore_ascii_case(x)))
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The non-hidden entries of `dir` that pass `keep`, sorted by name.
fn sorted_entries(dir: &Path, keep: impl Fn(&Path) -> bool) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        if !file_name(&path).starts_with('.') && keep(&path) {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}
