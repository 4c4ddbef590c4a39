//! The classes' names: built in for Fashion-MNIST, MNIST and CIFAR-10 (recognised by the data set's name), or read
//! from a file with one name per line (`--class-names FILE`), checked against the model's class count.

use std::path::Path;

use crate::{Error, Result};

const FASHION_MNIST: [&str; 10] =
    ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"];
const MNIST: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
const CIFAR10: [&str; 10] = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"];

/// The built-in names of a data set with `classes` classes, recognised by its name (`fashion-mnist…`,
/// `mnist…`, `cifar-10…`/`cifar10…`, any case); `None` for other data sets or another class count.
pub fn builtin_class_names(data_name: &str, classes: usize) -> Option<Vec<String>> {
    let n = data_name.to_ascii_lowercase();
    let names: &[&str] = if n.starts_with("fashion-mnist") || n.starts_with("fashion_mnist") {
        &FASHION_MNIST
    } else if n.starts_with("mnist") {
        &MNIST
    } else if n.starts_with("cifar-10") || n.starts_with("cifar10") {
        &CIFAR10
    } else {
        return None;
    };
    (names.len() == classes).then(|| names.iter().map(|s| s.to_string()).collect())
}

/// Reads class names from `path`, one per line (blank lines at the end ignored).
///
/// Errors: the file cannot be read, or a name is empty.
pub fn read_class_list(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let names: Vec<String> = text.trim_end().lines().map(|l| l.trim().to_string()).collect();
    if let Some(k) = names.iter().position(String::is_empty) {
        return Err(Error::bad_file(path, format!("line {} is empty: one class name per line", k + 1)));
    }
    Ok(names)
}

/// [`read_class_list`], checking there are exactly `classes` names.
///
/// Errors: the file cannot be read, a name is empty, or the count differs from the model's classes.
pub fn read_class_names(path: &Path, classes: usize) -> Result<Vec<String>> {
    let names = read_class_list(path)?;
    if names.len() != classes {
        return Err(Error::bad_file(
            path,
            format!(
                "{} class names, but the model has {classes} classes (one name per line, in class order)",
                names.len()
            ),
        ));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_names_by_data_set_and_count() {
        assert_eq!(builtin_class_names("fashion-mnist-sample", 10).unwrap()[9], "Ankle boot");
        assert_eq!(builtin_class_names("CIFAR-10", 10).unwrap()[0], "airplane");
        assert_eq!(builtin_class_names("mnist", 10).unwrap()[3], "3");
        assert!(builtin_class_names("fashion-mnist", 11).is_none());
        assert!(builtin_class_names("my-data", 10).is_none());
    }

    #[test]
    fn a_names_file_must_match_the_class_count() {
        let dir = std::env::temp_dir().join(format!("armoury-classes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("names.txt");
        std::fs::write(&p, "cat\ndog\n\n").unwrap();
        assert_eq!(read_class_names(&p, 2).unwrap(), vec!["cat", "dog"]);
        let e = read_class_names(&p, 3).unwrap_err().to_string();
        assert!(e.contains("2 class names") && e.contains("3 classes"), "{e}");
        std::fs::write(&p, "cat\n\ndog\n").unwrap();
        assert!(read_class_names(&p, 3).unwrap_err().to_string().contains("line 2 is empty"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
