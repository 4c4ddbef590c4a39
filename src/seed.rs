//! Seeding: every random choice in Armoury comes from a ChaCha8 generator whose seed is derived here, so that
//! the same seed gives bit-identical results whatever the thread count, the batch size, the order of samples in
//! a batch or the number of shards.
//!
//! - [`mix`] (SplitMix64's finaliser) turns any 64-bit value, or a combination of values, into a well-mixed seed;
//! - [`derive`] gives the seed of a numbered stream (an epoch, a step, a restart) of a parent seed;
//! - [`sample_seed`] and [`row_seeds`] tie a sample's draws to its own values, not to its position in a batch;
//! - [`rng`] builds the generator; [`normal_vec`] draws standard-normal values; [`shuffled`] a permutation.

use ndarray::{Array2, Axis};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

/// The generator every random choice uses.
pub type SeedRng = ChaCha8Rng;

/// A ChaCha8 generator from `seed`.
pub fn rng(seed: u64) -> SeedRng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// SplitMix64's finaliser (Steele, Lea & Flood 2014): a well-mixed 64-bit value from any input.
pub fn mix(mut h: u64) -> u64 {
    h = h.wrapping_add(0x9E37_79B9_7F4A_7C15);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The seed of stream `stream` (an epoch, a training step, a restart) of `seed`: distinct streams of one seed,
/// and one stream of distinct seeds, give unrelated generators.
pub fn derive(seed: u64, stream: u64) -> u64 {
    mix(seed ^ mix(stream ^ 0xA076_1D64_78BD_642F))
}

/// A seed for one sample's random choices, derived from a seed, a stream number (restart, …) and the sample's
/// own values — so results are the same whatever the batch size, the sample's position in the batch or the
/// thread count.
pub fn sample_seed(seed: u64, stream: u64, values: &[f32]) -> u64 {
    // FNV-1a over the bit patterns, then a SplitMix64 finaliser.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ stream.rotate_left(29);
    for v in values {
        h ^= u64::from(v.to_bits());
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// [`sample_seed`] of every row of an `[N, D]` batch.
pub fn row_seeds(x: &Array2<f32>, seed: u64, stream: u64) -> Vec<u64> {
    x.axis_iter(Axis(0))
        .into_par_iter()
        .map(|r| match r.as_slice() {
            Some(s) => sample_seed(seed, stream, s),
            None => sample_seed(seed, stream, &r.to_vec()),
        })
        .collect()
}

/// `n` standard-normal samples (Marsaglia's polar method in f64, both outputs used) from `rng`. Exact like
/// Box–Muller, without its sine and cosine: a logarithm and a square root per pair, for 4/π draws of a point.
pub fn normal_vec(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let u = 2.0 * rng.random::<f64>() - 1.0;
        let v = 2.0 * rng.random::<f64>() - 1.0;
        let s = u * u + v * v;
        if s >= 1.0 || s == 0.0 {
            continue;
        }
        let f = (-2.0 * s.ln() / s).sqrt();
        out.push((u * f) as f32);
        out.push((v * f) as f32);
    }
    out.truncate(n);
    out
}

/// A uniformly random permutation of `0..n` (a ChaCha8 Fisher–Yates shuffle seeded by (`seed`, `stream`)); the
/// training loop's sample order of epoch `stream`.
pub fn shuffled(n: usize, seed: u64, stream: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut g = rng(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    order.shuffle(&mut g);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The normal samples have the standard normal's moments and quantiles: mean 0, variance 1, no skew, kurtosis
    /// 3, and the mass within 1, 2 and 3 σ (68.27%, 95.45%, 99.73%), on 400k draws (several standard errors
    /// each); odd lengths are cut from whole pairs.
    #[test]
    fn normal_vec_is_standard_normal() {
        let mut rng = rng(7);
        assert_eq!(normal_vec(&mut rng, 5).len(), 5);
        let z: Vec<f64> = normal_vec(&mut rng, 400_001).into_iter().map(f64::from).collect();
        let n = z.len() as f64;
        let moment = |k: i32| z.iter().map(|v| v.powi(k)).sum::<f64>() / n;
        assert!(moment(1).abs() < 0.01, "mean {}", moment(1));
        assert!((moment(2) - 1.0).abs() < 0.01, "variance {}", moment(2));
        assert!(moment(3).abs() < 0.03, "skew {}", moment(3));
        assert!((moment(4) - 3.0).abs() < 0.08, "kurtosis {}", moment(4));
        for (k, mass) in [(1.0, 0.682_689), (2.0, 0.954_500), (3.0, 0.997_300)] {
            let within = z.iter().filter(|v| v.abs() < k).count() as f64 / n;
            assert!((within - mass).abs() < 0.003, "within {k} σ: {within}");
        }
    }

    #[test]
    fn sample_seeds_follow_the_values_not_the_position() {
        let x = ndarray::array![[0.1f32, 0.2], [0.3, 0.4], [0.1, 0.2]];
        let s = row_seeds(&x, 5, 1);
        assert_eq!(s[0], s[2], "same values, same seed");
        assert_ne!(s[0], s[1]);
        assert_ne!(row_seeds(&x, 5, 2)[0], s[0], "another stream");
        assert_ne!(row_seeds(&x, 6, 1)[0], s[0], "another seed");
        // A column view (not contiguous) gives the seed of its values.
        let t = x.t().to_owned();
        assert_eq!(row_seeds(&t.t().to_owned(), 5, 1), s);
    }

    #[test]
    fn derived_streams_differ_and_repeat() {
        assert_eq!(derive(1, 2), derive(1, 2));
        let all: std::collections::HashSet<u64> = (0..4).flat_map(|s| (0..100).map(move |k| derive(s, k))).collect();
        assert_eq!(all.len(), 400);
    }

    #[test]
    fn shuffles_are_permutations_that_depend_on_the_stream() {
        let a = shuffled(100, 3, 0);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_eq!(a, shuffled(100, 3, 0));
        assert_ne!(a, shuffled(100, 3, 1));
    }
}
