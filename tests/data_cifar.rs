//! `armoury::data`'s CIFAR-10/100 binary reader, on files the test writes: pixel planes in R, G, B order,
//! bytes / 255, labels (fine and coarse), the archives' subdirectories, and clear errors on bad files.

use std::path::{Path, PathBuf};

use armoury::data::{builtin_class_names, decode_cifar, is_cifar_dir, load_cifar_dir, Cifar};
use armoury::Error;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("armoury-cifar-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Record `i` of a file: label bytes, then pixel (c, y, x) = (i + 7c + 3y + x) mod 256.
fn record(labels: &[u8], i: usize) -> Vec<u8> {
    let mut r = labels.to_vec();
    for c in 0..3 {
        for y in 0..32 {
            for x in 0..32 {
                r.push(((i + 7 * c + 3 * y + x) % 256) as u8);
            }
        }
    }
    r
}

fn write(path: &Path, records: &[Vec<u8>]) {
    std::fs::write(path, records.concat()).unwrap();
}

#[test]
fn cifar10_batches_load_as_rgb_in_the_unit_range() {
    let root = scratch("ten");
    let dir = root.join("cifar-10-batches-bin");
    std::fs::create_dir_all(&dir).unwrap();
    write(&dir.join("data_batch_1.bin"), &[record(&[3], 0), record(&[9], 1)]);
    write(&dir.join("data_batch_2.bin"), &[record(&[0], 2)]);
    write(&dir.join("test_batch.bin"), &[record(&[5], 10), record(&[1], 11), record(&[8], 12)]);
    assert!(is_cifar_dir(&root));
    let set = load_cifar_dir(&root, Cifar::Ten).unwrap();
    assert_eq!(set.name, "cifar-10");
    assert_eq!((set.train.len(), set.test.len()), (3, 3));
    assert_eq!(set.test.image_shape(), [3, 32, 32]);
    let (x, y) = set.train.batch(0..3).unwrap();
    assert_eq!(y, vec![3, 9, 0], "labels in file order, batch 1 before batch 2");
    let v = x.value();
    // Sample 1, green plane (c = 1), row 2, column 5: (1 + 7 + 6 + 5) / 255.
    assert_eq!(v[[1, 1, 2, 5]], 19.0 / 255.0);
    assert_eq!(v[[2, 2, 31, 31]], 140.0 / 255.0);
    assert!(v.iter().all(|&p| (0.0..=1.0).contains(&p)));
    assert_eq!(builtin_class_names(&set.name, 10).unwrap()[3], "cat");
}

#[test]
fn cifar100_fine_and_coarse_labels() {
    let dir = scratch("hundred");
    write(&dir.join("train.bin"), &[record(&[4, 72], 0), record(&[19, 99], 1)]);
    write(&dir.join("test.bin"), &[record(&[0, 7], 2)]);
    let fine = load_cifar_dir(&dir, Cifar::HundredFine).unwrap();
    assert_eq!((fine.name.as_str(), fine.train.batch(0..2).unwrap().1), ("cifar-100", vec![72, 99]));
    assert_eq!(fine.test.num_classes(), 100);
    let coarse = load_cifar_dir(&dir, Cifar::HundredCoarse).unwrap();
    assert_eq!((coarse.name.as_str(), coarse.train.batch(0..2).unwrap().1), ("cifar-100-coarse", vec![4, 19]));
    assert_eq!(coarse.test.num_classes(), 20);
}

#[test]
fn bad_cifar_files_are_errors_in_the_users_terms() {
    let p = Path::new("data_batch_1.bin");
    let mut bytes = record(&[1], 0);
    bytes.pop();
    let e = decode_cifar(&bytes, Cifar::Ten, p).unwrap_err();
    assert!(matches!(e, Error::BadFile { .. }) && e.to_string().contains("3073 bytes"), "{e}");
    let e = decode_cifar(&record(&[10], 0), Cifar::Ten, p).unwrap_err().to_string();
    assert!(e.contains("record 0 has label 10") && e.contains("10 classes"), "{e}");
    let e = decode_cifar(&[], Cifar::Ten, p).unwrap_err();
    assert!(matches!(e, Error::BadFile { .. }));
    // A CIFAR-100 file read as CIFAR-10 does not divide into records.
    let e = decode_cifar(&[record(&[1, 2], 0), record(&[1, 2], 1)].concat(), Cifar::Ten, p).unwrap_err();
    assert!(e.to_string().contains("not a whole number"), "{e}");
    let empty = scratch("empty");
    assert!(!is_cifar_dir(&empty));
    let e = load_cifar_dir(&empty, Cifar::Ten).unwrap_err();
    assert!(matches!(e, Error::DataNotFound(_)) && e.to_string().contains("test_batch.bin"), "{e}");
}
