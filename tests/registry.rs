//! Defenses and detectors by name (`armoury_defenses::registry`): an unknown or misspelt name is an error that
//! lists the known ones — `magnett` once ran MagNet silently.

use std::sync::Arc;

use armoury::{Classifier, Tensor};
use armoury_defenses::detectors::MagnetConfig;
use armoury_defenses::registry::{self, check_detector, detector, transform, DetectorBuild};

use crate::attack_props::fixture_cnn;

#[test]
fn registry_defenses_by_name() {
    for (spec, name) in [
        ("median", "MedianFilter"),
        ("median:5", "MedianFilter"),
        ("bit-depth:3", "BitDepth"),
        ("mean", "MeanFilter"),
        ("gaussian:0.5", "Gaussian"),
        ("jpeg:50", "Jpeg"),
        ("tv", "TotalVariation"),
        ("noise:0.1", "GaussianNoise"),
    ] {
        assert!(transform(spec).unwrap().name().contains(name), "{spec}");
    }
    let err = transform("medain").err().expect("unknown").to_string();
    assert!(err.contains("unknown defense 'medain'"), "{err}");
    for known in registry::DEFENSES {
        assert!(err.contains(known), "{err} lists {known}");
    }
    assert!(transform("median:x").is_err(), "a bad parameter");
    assert!(transform("median:0").is_err(), "an invalid one");
}

#[test]
fn registry_an_unknown_detector_is_an_error_listing_the_known_ones() {
    for spec in
        ["squeeze", "lid", "mahalanobis", "ensemble", "magnet", "magnet:200,1", "magnet-l2-i", "region", "similarity"]
    {
        check_detector(spec).unwrap();
    }
    for spec in ["magnett", "magnetx:1,2", "squeez", "regions", "magnet:2", "squeeze:4"] {
        assert!(check_detector(spec).is_err(), "{spec}");
    }
    let err = check_detector("magnett").unwrap_err().to_string();
    assert!(err.contains("unknown detector 'magnett'"), "{err}");
    for known in registry::DETECTORS {
        assert!(err.contains(known), "{err} lists {known}");
    }
    // What an evaluation checks before its cascade runs.
    let specs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    armoury_defenses::eval::check_specs(&specs(&["median", "jpeg:50"]), &specs(&["squeeze", "magnet:10,1"])).unwrap();
    assert!(armoury_defenses::eval::check_specs(&specs(&["median"]), &specs(&["magnett"])).is_err());
    assert!(armoury_defenses::eval::check_specs(&specs(&["medain"]), &[]).is_err());

    // Building one: the name is checked before anything is fitted or trained.
    let model: Arc<dyn Classifier> = Arc::new(fixture_cnn());
    let set = armoury::data::sample().unwrap();
    let attack = |x: &Tensor, _: &[usize]| Ok(x.clone());
    let b = DetectorBuild {
        model: &model,
        set: &set,
        fit: 50,
        layers: &["fc1_relu"],
        attack: &attack,
        magnet: MagnetConfig {
            cache: std::env::temp_dir().join("armoury-registry-never-written"),
            ..Default::default()
        },
        magnet_progress: &|_| panic!("no auto-encoder is trained for a misspelt name"),
    };
    let err = detector(&b, "magnett").err().expect("magnett is not MagNet").to_string();
    assert!(err.contains("'magnett'") && err.contains("squeeze"), "{err}");
    assert!(detector(&b, "similarity").is_err(), "a stateful detector is not a per-input one");
    let d = detector(&b, "squeeze").unwrap();
    assert_eq!(d.name(), "feature-squeezing");
}
