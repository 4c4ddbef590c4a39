//! `armoury::data`: IDX files, data sets, the embedded sample, full-data search, image folders and PNG grids.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use armoury::data::{
    self, full_data_candidates, load_idx_dir, perturbation_image, save_png_grid, Dataset, GridRow, Idx, IdxData,
    ImageFolderOptions, GRID_GAP,
};
use armoury::{Error, Tensor};

/// A fresh, empty directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "armoury-data-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Images whose values are exact multiples of 1/255 (so a u8 round trip is lossless).
fn byte_images(n: usize, c: usize, h: usize, w: usize) -> Tensor {
    let v: Vec<f32> = (0..n * c * h * w).map(|i| ((i * 37 + 11) % 256) as f32 / 255.0).collect();
    Tensor::from_vec(v, &[n, c, h, w]).unwrap()
}

fn is_bad_file(r: &armoury::Result<impl std::fmt::Debug>) -> bool {
    matches!(r, Err(Error::BadFile { .. }))
}

fn toy(n: usize) -> Dataset {
    Dataset::new(byte_images(n, 1, 3, 2), (0..n).map(|i| i % 4).collect(), 4).unwrap()
}

#[test]
fn idx_round_trip_plain_and_gz() {
    let tmp = TempDir::new("rt");
    for (c, h, w) in [(1, 28, 28), (1, 5, 7), (3, 4, 9), (3, 1, 1)] {
        for name in ["x-idx-ubyte", "x-idx-ubyte.gz"] {
            let x = byte_images(6, c, h, w);
            let p = tmp.path(name);
            data::write_idx_images(&p, &x).unwrap();
            let bytes = std::fs::read(&p).unwrap();
            assert_eq!(bytes.starts_with(&[0x1f, 0x8b]), name.ends_with(".gz"), "{name}");
            let idx = Idx::read(&p).unwrap();
            let expected_dims = if c == 1 { vec![6, h, w] } else { vec![6, h, w, c] };
            assert_eq!(idx.dims(), &expected_dims[..]);
            let y = data::read_idx_images(&p).unwrap();
            assert_eq!(y.shape(), x.shape());
            assert_eq!(y.to_vec(), x.to_vec(), "{c}x{h}x{w} {name}");
        }
    }
    let labels = vec![0, 9, 3, 3, 7];
    data::write_idx_labels(tmp.path("l.gz"), &labels).unwrap();
    assert_eq!(data::read_idx_labels(tmp.path("l.gz")).unwrap(), labels);
    let big = vec![1000, 70000];
    data::write_idx_labels(tmp.path("big"), &big).unwrap();
    assert_eq!(data::read_idx_labels(tmp.path("big")).unwrap(), big);
    // No temporary files are left behind.
    let left: Vec<_> = std::fs::read_dir(&tmp.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().ends_with(".tmp")), "{left:?}");
}

#[test]
fn idx_other_dtypes() {
    let src = Path::new("mem");
    for data in [
        IdxData::I8(vec![0, 1, 2]),
        IdxData::I16(vec![0, 300, 2]),
        IdxData::I32(vec![0, 1, 70000]),
        IdxData::F32(vec![0.0, 1.0, 2.0]),
        IdxData::F64(vec![0.0, 5.0, 2.0]),
    ] {
        let idx = Idx::new(vec![3], data.clone()).unwrap();
        let back = Idx::decode(&idx.encode(), src).unwrap();
        assert_eq!(back, idx);
        assert_eq!(back.to_labels(src).unwrap().len(), 3);
    }
    assert!(is_bad_file(&Idx::new(vec![2], IdxData::I8(vec![0, -1])).unwrap().to_labels(src)));
    assert!(is_bad_file(&Idx::new(vec![2], IdxData::F32(vec![0.0, 0.5])).unwrap().to_labels(src)));
    // Float images are kept as they are; out-of-range floats and signed integers are rejected.
    let f = Idx::new(vec![1, 1, 2], IdxData::F64(vec![0.25, 1.0])).unwrap();
    assert_eq!(f.to_images(src).unwrap().to_vec(), vec![0.25, 1.0]);
    assert!(is_bad_file(&Idx::new(vec![1, 1, 2], IdxData::F32(vec![0.25, 1.5])).unwrap().to_images(src)));
    assert!(is_bad_file(&Idx::new(vec![1, 1, 2], IdxData::I16(vec![0, 1])).unwrap().to_images(src)));
    // Rank-4 images must be channels-last with 1 or 3 channels.
    assert!(is_bad_file(&Idx::new(vec![1, 1, 1, 2], IdxData::U8(vec![0, 1])).unwrap().to_images(src)));
    assert!(Idx::new(vec![2, 2], IdxData::U8(vec![0; 3])).is_err());
}

#[test]
fn idx_corrupt_files_are_bad_file_errors() {
    let src = Path::new("mem");
    let good = Idx::new(vec![2, 3, 3], IdxData::U8((0..18).collect())).unwrap().encode();
    assert!(Idx::decode(&good, src).is_ok());
    for n in [0, 2, 4, 10, 16, 20, good.len() - 1] {
        assert!(is_bad_file(&Idx::decode(&good[..n], src)), "truncated to {n}");
    }
    let mut extra = good.clone();
    extra.push(0);
    assert!(is_bad_file(&Idx::decode(&extra, src)));
    let mut magic = good.clone();
    magic[0] = 1;
    assert!(is_bad_file(&Idx::decode(&magic, src)));
    let mut dtype = good.clone();
    dtype[2] = 0x07;
    assert!(is_bad_file(&Idx::decode(&dtype, src)));
    let mut count = good.clone();
    count[7] = 3; // N = 3 but only two images of data
    let err = Idx::decode(&count, src).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    let mut huge = good.clone();
    huge[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(is_bad_file(&Idx::decode(&huge, src)));
    // A truncated gzip stream.
    let tmp = TempDir::new("gz");
    Idx::decode(&good, src).unwrap().write(tmp.path("a.gz")).unwrap();
    let gz = std::fs::read(tmp.path("a.gz")).unwrap();
    assert!(is_bad_file(&Idx::decode(&gz[..gz.len() / 2], src)));
    std::fs::write(tmp.path("cut.gz"), &gz[..gz.len() - 4]).unwrap();
    assert!(is_bad_file(&data::read_idx_images(tmp.path("cut.gz"))));
    assert!(matches!(data::read_idx_images(tmp.path("missing")), Err(Error::Io { .. })));
}

#[test]
fn label_count_mismatch_is_an_error() {
    let tmp = TempDir::new("mismatch");
    data::write_idx_images(tmp.path("x"), &byte_images(4, 1, 2, 2)).unwrap();
    data::write_idx_labels(tmp.path("y"), &[0, 1, 2]).unwrap();
    let err = Dataset::from_idx_files(tmp.path("x"), tmp.path("y")).unwrap_err();
    assert!(matches!(err, Error::BadFile { .. }), "{err}");
    assert!(Dataset::new(byte_images(4, 1, 2, 2), vec![0, 1, 2], 3).is_err());
    assert!(Dataset::new(byte_images(0, 1, 2, 2), vec![], 3).is_err());
    assert!(matches!(
        Dataset::new(byte_images(2, 1, 2, 2), vec![0, 5], 3),
        Err(Error::LabelOutOfRange { label: 5, .. })
    ));
}

#[test]
fn embedded_sample() {
    let fm = data::sample().unwrap();
    assert_eq!(fm.name, "fashion-mnist-sample");
    assert_eq!((fm.train.len(), fm.test.len()), (2000, 1000));
    assert_eq!(fm.train.image_shape(), [1, 28, 28]);
    assert_eq!(fm.test.image_shape(), [1, 28, 28]);
    assert_eq!((fm.train.num_classes(), fm.test.num_classes()), (10, 10));
    assert!(fm.train.labels().iter().chain(fm.test.labels()).all(|&l| l < 10));
    assert_eq!(&fm.test.labels()[..5], &[9, 2, 1, 1, 6]);
    let px = fm.train.images().value();
    assert!(px.iter().all(|&v| (0.0..=1.0).contains(&v)));
    assert!(px.iter().any(|&v| v == 1.0));
    // Agrees with the Debian package's files, when they are installed.
    let deb = Path::new(data::DEBIAN_FASHION_MNIST_DIR);
    if deb.join("t10k-labels-idx1-ubyte.gz").is_file() {
        let labels = data::read_idx_labels(deb.join("t10k-labels-idx1-ubyte.gz")).unwrap();
        assert_eq!(&labels[..1000], fm.test.labels());
        let train =
            Dataset::from_idx_files(deb.join("train-images-idx3-ubyte.gz"), deb.join("train-labels-idx1-ubyte.gz"))
                .unwrap();
        assert_eq!(train.len(), 60000);
        let first = train.take(2000).unwrap();
        assert_eq!(first.labels(), fm.train.labels());
        assert_eq!(first.images().to_vec(), fm.train.images().to_vec());
    }
}

#[test]
fn shuffle_is_seeded_and_non_mutating() {
    let d = toy(50);
    let before = (d.images().to_vec(), d.labels().to_vec());
    let (a, b, c) = (d.shuffled(7), d.shuffled(7), d.shuffled(8));
    assert_eq!(a.labels(), b.labels());
    assert_eq!(a.images().to_vec(), b.images().to_vec());
    assert_ne!(a.images().to_vec(), c.images().to_vec());
    assert_ne!(a.images().to_vec(), d.images().to_vec());
    assert_eq!((d.images().to_vec(), d.labels().to_vec()), before);
    // A permutation: same multiset of labels, and every image still carries its label.
    let mut sorted = a.labels().to_vec();
    sorted.sort();
    let mut orig = d.labels().to_vec();
    orig.sort();
    assert_eq!(sorted, orig);
    for i in 0..a.len() {
        let j = (0..d.len()).find(|&j| d.image(j) == a.image(i)).unwrap();
        assert_eq!(a.labels()[i], d.labels()[j]);
    }
}

#[test]
fn split_subset_take_repeat_batches() {
    let d = toy(10);
    let (a, b) = d.split(7).unwrap();
    assert_eq!((a.len(), b.len()), (7, 3));
    assert_eq!(b.image(0), d.image(7));
    assert_eq!(a.num_classes(), 4);
    assert!(d.split(0).is_err() && d.split(10).is_err());
    let s = d.subset(&[9, 0, 9]).unwrap();
    assert_eq!(s.labels(), &[1, 0, 1]);
    assert_eq!(s.image(2), d.image(9));
    assert!(d.subset(&[10]).is_err() && d.subset(&[]).is_err());
    assert_eq!(d.take(4).unwrap().len(), 4);
    assert_eq!(d.take(40).unwrap().len(), 10);
    assert!(d.take(0).is_err());
    let r = d.repeat_to(25).unwrap();
    assert_eq!(r.len(), 25);
    assert_eq!(r.image(23), d.image(3));
    assert_eq!(r.labels()[21], d.labels()[1]);
    let sizes: Vec<(Vec<usize>, usize)> = d.batches(4).unwrap().map(|(x, y)| (x.shape().to_vec(), y.len())).collect();
    assert_eq!(sizes, vec![(vec![4, 1, 3, 2], 4), (vec![4, 1, 3, 2], 4), (vec![2, 1, 3, 2], 2)]);
    assert_eq!(d.batches(4).unwrap().len(), 3);
    assert!(d.batches(0).is_err());
    let (x, y) = d.batch(2..5).unwrap();
    assert_eq!((x.shape(), y.as_slice()), (&[3, 1, 3, 2][..], &[2, 3, 0][..]));
    assert_eq!(&x.to_vec()[..6], d.image(2).unwrap());
    assert!(d.batch(5..5).is_err() && d.batch(8..11).is_err());
    assert_eq!(d.image_tensor(1).unwrap().shape(), &[1, 3, 2]);
    assert!(d.image(10).is_none());
}

#[test]
fn idx_dir_and_full_data_search() {
    let tmp = TempDir::new("dir");
    let dir = tmp.path("my-set");
    std::fs::create_dir(&dir).unwrap();
    data::write_idx_images(dir.join("train-images-idx3-ubyte.gz"), &byte_images(5, 1, 4, 4)).unwrap();
    data::write_idx_labels(dir.join("train-labels-idx1-ubyte.gz"), &[0, 1, 2, 0, 1]).unwrap();
    data::write_idx_images(dir.join("t10k-images.idx3-ubyte"), &byte_images(2, 1, 4, 4)).unwrap();
    data::write_idx_labels(dir.join("t10k-labels.idx1-ubyte"), &[4, 0]).unwrap();
    let tt = load_idx_dir(&dir).unwrap();
    assert_eq!(tt.name, "my-set");
    assert_eq!((tt.train.len(), tt.test.len(), tt.train.num_classes(), tt.test.num_classes()), (5, 2, 5, 5));

    // The search order, without touching the process environment.
    let bogus = tmp.path("nothing-here");
    let no_system = tmp.path("no-debian");
    let locs = full_data_candidates(Some(&bogus), None, &no_system);
    assert_eq!(locs.len(), 3);
    let Err(Error::DataNotFound(tried)) = data::find_full_data_in(&locs) else { panic!("expected DataNotFound") };
    assert_eq!(tried.len(), 3, "{tried:?}");
    assert!(tried[0].contains("nothing-here"), "{tried:?}");
    assert!(tried[1].contains("ARMOURY_DATA (unset)"), "{tried:?}");
    assert!(tried[2].contains("no-debian"), "{tried:?}");
    let msg = Error::DataNotFound(tried).to_string();
    assert!(msg.contains("ARMOURY_DATA (unset)") && msg.contains("nothing-here"), "{msg}");
    // A bogus directory falls through to the variable, then to the system directory.
    let locs = full_data_candidates(Some(&bogus), Some(OsStr::new(dir.as_os_str())), &no_system);
    assert!(data::find_full_data_in(&locs).unwrap().source.starts_with("ARMOURY_DATA="));
    let locs = full_data_candidates(Some(&bogus), None, &dir);
    assert_eq!(data::find_full_data_in(&locs).unwrap().train.len(), 5);
    // An incomplete set is an error, not a silent fall-through.
    std::fs::remove_file(dir.join("t10k-labels.idx1-ubyte")).unwrap();
    assert!(is_bad_file(&data::find_full_data_in(&full_data_candidates(Some(&dir), None, &no_system))));
    assert!(matches!(load_idx_dir(&dir), Err(Error::DataNotFound(_))));
}

#[test]
fn full_data_from_debian_package() {
    if !Path::new(data::DEBIAN_FASHION_MNIST_DIR).join("train-images-idx3-ubyte.gz").is_file()
        || std::env::var_os(data::DATA_ENV_VAR).is_some()
    {
        return; // Not installed here, or the variable points elsewhere.
    }
    let bogus = std::env::temp_dir().join("armoury-data-surely-not-here");
    let fm = data::find_full_data(Some(&bogus)).unwrap();
    assert_eq!((fm.train.len(), fm.test.len(), fm.train.num_classes()), (60000, 10000, 10));
    assert!(fm.source.contains(data::DEBIAN_FASHION_MNIST_DIR), "{}", fm.source);
    assert_eq!(fm.name, "fashion-mnist");
    assert_eq!(data::load_default(None).unwrap().train.len(), 60000);
}

#[test]
fn image_folder() {
    let tmp = TempDir::new("folder");
    let root = tmp.path("imgs");
    for (class, shade) in [("b_dark", 40u8), ("a_light", 200u8)] {
        std::fs::create_dir_all(root.join(class)).unwrap();
        for k in 0..3u8 {
            let img = image::RgbImage::from_fn(6, 4, |x, _| image::Rgb([shade, shade / 2 + k, x as u8 * 10]));
            img.save(root.join(class).join(format!("{k}.png"))).unwrap();
        }
    }
    std::fs::write(root.join("a_light").join("notes.txt"), "not an image").unwrap();
    let (d, names) = data::load_image_folder(&root, ImageFolderOptions::default()).unwrap();
    assert_eq!(names, vec!["a_light", "b_dark"]);
    assert_eq!((d.len(), d.num_classes(), d.image_shape()), (6, 2, [3, 4, 6]));
    assert_eq!(d.labels(), &[0, 0, 0, 1, 1, 1]);
    let px = d.image(0).unwrap();
    assert_eq!(px[0], 200.0 / 255.0); // R plane
    assert_eq!(px[24], 100.0 / 255.0); // G plane
    assert_eq!(px[48 + 5], 50.0 / 255.0); // B plane, x = 5
    let gray = ImageFolderOptions { size: Some((3, 5)), channels: 1, ..Default::default() };
    let (g, _) = data::load_image_folder(&root, gray).unwrap();
    assert_eq!(g.image_shape(), [1, 5, 3]);
    assert!(g.images().value().iter().all(|&v| (0.0..=1.0).contains(&v)));
    assert!(data::load_image_folder(&root, ImageFolderOptions { channels: 2, ..Default::default() }).is_err());
    // Different sizes without resizing.
    image::GrayImage::new(5, 5).save(root.join("b_dark").join("odd.png")).unwrap();
    assert!(data::load_image_folder(&root, ImageFolderOptions::default()).is_err());
    assert_eq!(data::load_image_folder(&root, gray).unwrap().0.len(), 7);
    // An undecodable image.
    std::fs::write(root.join("b_dark").join("broken.png"), b"\x89PNG not really").unwrap();
    assert!(matches!(data::load_image_folder(&root, gray), Err(Error::Image { .. })));
    // No class folders.
    let empty = tmp.path("empty");
    std::fs::create_dir(&empty).unwrap();
    assert!(data::load_image_folder(&empty, gray).is_err());
}

/// torchvision's evaluation transform on an image folder: the shorter side resized (aspect kept), then the
/// centre cut out at torchvision's offsets; an image smaller than the crop is an error naming it.
#[test]
fn image_folder_resize_shorter_side_and_center_crop() {
    let tmp = TempDir::new("crop");
    let root = tmp.path("imgs");
    std::fs::create_dir_all(root.join("only")).unwrap();
    // 7×4: pixel (x, y) has red 10·x + y.
    let img = image::RgbImage::from_fn(7, 4, |x, y| image::Rgb([(10 * x + y) as u8, 0, 0]));
    img.save(root.join("only").join("a.png")).unwrap();
    // The centre 3×2 of 7×4: left = round(4 / 2) = 2, top = round(2 / 2) = 1.
    let crop = ImageFolderOptions { center_crop: Some((3, 2)), ..Default::default() };
    let (d, _) = data::load_image_folder(&root, crop).unwrap();
    assert_eq!(d.image_shape(), [3, 2, 3]);
    let red: Vec<f32> = d.image(0).unwrap()[..6].iter().map(|v| (v * 255.0).round()).collect();
    assert_eq!(red, vec![21.0, 31.0, 41.0, 22.0, 32.0, 42.0]);
    // Halves round to even, as Python's round in torchvision's CenterCrop: the 2×3 centre of 7×4 starts at
    // left = round(2.5) = 2, top = round(0.5) = 0 (rounding halves up would start at 3, 1).
    let half = ImageFolderOptions { center_crop: Some((2, 3)), ..Default::default() };
    let (d, _) = data::load_image_folder(&root, half).unwrap();
    let red: Vec<f32> = d.image(0).unwrap()[..6].iter().map(|v| (v * 255.0).round()).collect();
    assert_eq!(red, vec![20.0, 30.0, 21.0, 31.0, 22.0, 32.0]);
    // Shorter side 2: 7×4 → ⌊2·7/4⌋ × 2 = 3×2, then a 2×2 centre.
    let both = ImageFolderOptions { shorter_side: Some(2), center_crop: Some((2, 2)), ..Default::default() };
    assert_eq!(data::load_image_folder(&root, both).unwrap().0.image_shape(), [3, 2, 2]);
    let tall = ImageFolderOptions { shorter_side: Some(8), ..Default::default() };
    assert_eq!(data::load_image_folder(&root, tall).unwrap().0.image_shape(), [3, 8, 14]);
    let imagenet = data::load_image_folder(&root, ImageFolderOptions::imagenet()).unwrap().0;
    assert_eq!(imagenet.image_shape(), [3, 224, 224], "448×256, then the 224×224 centre");
    let wide = ImageFolderOptions { center_crop: Some((8, 2)), ..Default::default() };
    let err = data::load_image_folder(&root, wide).unwrap_err().to_string();
    assert!(err.contains("a.png is 7x4, smaller than the 8x2 centre crop"), "{err}");
    let zero = ImageFolderOptions { shorter_side: Some(0), ..Default::default() };
    assert!(data::load_image_folder(&root, zero).is_err());
}

#[test]
fn png_grid() {
    let tmp = TempDir::new("grid");
    let fm = data::sample().unwrap();
    let clean: Vec<Tensor> = (0..4).map(|i| fm.test.image_tensor(i).unwrap()).collect();
    let noisy: Vec<Tensor> = clean.iter().map(|x| Tensor::new(x.value().mapv(|v| (v + 0.1).min(1.0)))).collect();
    let pert: Vec<Tensor> = clean.iter().zip(&noisy).map(|(c, a)| perturbation_image(c, a, 4.0).unwrap()).collect();
    assert!(pert[0].value().iter().all(|&v| (0.5..=0.9 + 1e-6).contains(&v)));
    let rgb = Tensor::full(&[3, 28, 28], 0.5);
    let rows = vec![
        GridRow { label: String::new(), images: clean.clone() },
        GridRow { label: String::new(), images: noisy },
        GridRow { label: String::new(), images: vec![pert[0].clone(), rgb] },
    ];
    let scale = 2;
    let p = tmp.path("grid.png");
    save_png_grid(&p, &rows, scale).unwrap();
    let img = image::open(&p).unwrap();
    assert_eq!(img.width(), 4 * 28 * scale + 3 * GRID_GAP);
    assert_eq!(img.height(), 3 * 28 * scale + 2 * GRID_GAP);
    // With labels the grid is wider, not taller.
    let labelled = vec![GridRow::new("clean", clean.clone()), GridRow::new("PGD ε=0.1 (acc 12%)", clean.clone())];
    save_png_grid(tmp.path("labels.png"), &labelled, 3).unwrap();
    let img = image::open(tmp.path("labels.png")).unwrap().to_rgb8();
    assert!(img.width() > 4 * 28 * 3 + 3 * GRID_GAP);
    assert_eq!(img.height(), 2 * 28 * 3 + GRID_GAP);
    assert!(img.pixels().any(|p| p.0 == [0, 0, 0]));
    // Misuse.
    assert!(save_png_grid(tmp.path("x.png"), &[], 1).is_err());
    assert!(save_png_grid(tmp.path("x.png"), &rows, 0).is_err());
    let mixed = vec![GridRow { label: String::new(), images: vec![clean[0].clone(), Tensor::zeros(&[1, 5, 5])] }];
    assert!(save_png_grid(tmp.path("x.png"), &mixed, 1).is_err());
    assert!(perturbation_image(&clean[0], &Tensor::zeros(&[1, 5, 5]), 1.0).is_err());
    assert!(!tmp.path("x.png").exists());
}
