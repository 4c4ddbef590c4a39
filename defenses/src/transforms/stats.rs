//! The statistics randomized smoothing needs, in f64: the standard normal quantile Φ⁻¹ (Wichura's AS241), the
//! regularized incomplete beta function and its inverse, the one-sided Clopper–Pearson lower bound and the
//! two-sided binomial test at p = ½.

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms; relative error about 1e-15).
pub fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let a = C.iter().enumerate().skip(1).fold(C[0], |a, (i, c)| a + c / (x + i as f64));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The continued fraction of the incomplete beta function (modified Lentz).
fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..10_000 {
        let m = m as f64;
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        d = if d.abs() < TINY { TINY } else { d };
        c = 1.0 + aa / c;
        c = if c.abs() < TINY { TINY } else { c };
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        d = if d.abs() < TINY { TINY } else { d };
        c = 1.0 + aa / c;
        c = if c.abs() < TINY { TINY } else { c };
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

/// The regularized incomplete beta function I_x(a, b) for a, b > 0 and x in [0, 1].
pub fn beta_inc(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front = (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_cf(a, b, x) / a
    } else {
        1.0 - front * beta_cf(b, a, 1.0 - x) / b
    }
}

/// The q-quantile of Beta(a, b): the x with I_x(a, b) = q, by bisection to machine precision.
pub fn beta_ppf(q: f64, a: f64, b: f64) -> f64 {
    if q <= 0.0 {
        return 0.0;
    }
    if q >= 1.0 {
        return 1.0;
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if beta_inc(a, b, mid) < q {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The one-sided (1 − α) Clopper–Pearson lower confidence bound on a binomial proportion from `k` successes in
/// `n` trials: the α-quantile of Beta(k, n − k + 1), 0 when k = 0. Cohen et al.'s
/// `proportion_confint(k, n, alpha=2α, method="beta")[0]`.
pub fn clopper_pearson_lower(k: u64, n: u64, alpha: f64) -> f64 {
    if k == 0 || n == 0 {
        return 0.0;
    }
    beta_ppf(alpha, k as f64, (n - k) as f64 + 1.0)
}

/// The two-sided exact binomial test of `k` successes in `n` trials against p = ½ (scipy's `binomtest`):
/// `min(1, 2·P(X ≥ max(k, n − k)))`.
pub fn binomial_test_half(k: u64, n: u64) -> f64 {
    if n == 0 {
        return 1.0;
    }
    let m = k.max(n - k) as f64;
    // P(X ≥ m) for X ~ Bin(n, ½) is I_½(m, n − m + 1).
    (2.0 * beta_inc(m, n as f64 - m + 1.0, 0.5)).min(1.0)
}

/// Φ⁻¹(p), the standard normal quantile (Wichura 1988, algorithm AS241 PPND16; relative error about 1e-16).
/// The coefficients keep all the digits Wichura published.
#[allow(clippy::excessive_precision)]
pub fn normal_ppf(p: f64) -> f64 {
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    let poly = |c: &[f64], r: f64| c.iter().rev().fold(0.0, |acc, &v| acc * r + v);
    let q = p - 0.5;
    if q.abs() <= 0.425 {
        let r = 0.180625 - q * q;
        const A: [f64; 8] = [
            3.387_132_872_796_366_608,
            1.331_416_678_917_843_774_5e2,
            1.971_590_950_306_551_442_7e3,
            1.373_169_376_550_946_112_5e4,
            4.592_195_393_154_987_145_7e4,
            6.726_577_092_700_870_085_3e4,
            3.343_057_558_358_812_810_5e4,
            2.509_080_928_730_122_672_7e3,
        ];
        const B: [f64; 8] = [
            1.0,
            4.231_333_070_160_091_125_2e1,
            6.871_870_074_920_579_083e2,
            5.394_196_021_424_751_107_7e3,
            2.121_379_430_158_659_586_7e4,
            3.930_789_580_009_271_061e4,
            2.872_908_573_572_194_267_4e4,
            5.226_495_278_852_854_561e3,
        ];
        return q * poly(&A, r) / poly(&B, r);
    }
    let r = if q < 0.0 { p } else { 1.0 - p };
    let r = (-r.ln()).sqrt();
    let v = if r <= 5.0 {
        let r = r - 1.6;
        const C: [f64; 8] = [
            1.423_437_110_749_683_577_34,
            4.630_337_846_156_545_295_9,
            5.769_497_221_460_691_405_5,
            3.647_848_324_763_204_605_04,
            1.270_458_252_452_368_382_58,
            2.417_807_251_774_506_117_7e-1,
            2.272_384_498_926_918_458_33e-2,
            7.745_450_142_783_414_076_4e-4,
        ];
        const D: [f64; 8] = [
            1.0,
            2.053_191_626_637_758_821_87,
            1.676_384_830_183_803_849_4,
            6.897_673_349_851_000_045_5e-1,
            1.481_039_764_274_800_745_9e-1,
            1.519_866_656_361_645_719_66e-2,
            5.475_938_084_995_344_946e-4,
            1.050_750_071_644_416_843_24e-9,
        ];
        poly(&C, r) / poly(&D, r)
    } else {
        let r = r - 5.0;
        const E: [f64; 8] = [
            6.657_904_643_501_103_777_2,
            5.463_784_911_164_114_369_9,
            1.784_826_539_917_291_335_8,
            2.965_605_718_285_048_912_3e-1,
            2.653_218_952_657_612_309_3e-2,
            1.242_660_947_388_078_438_6e-3,
            2.711_555_568_743_487_578_15e-5,
            2.010_334_399_292_288_132_65e-7,
        ];
        const F: [f64; 8] = [
            1.0,
            5.998_322_065_558_879_376_9e-1,
            1.369_298_809_227_358_053_1e-1,
            1.487_536_129_085_061_485_25e-2,
            7.868_691_311_456_132_591e-4,
            1.846_318_317_510_054_681_8e-5,
            1.421_511_758_316_445_888_7e-7,
            2.044_263_103_389_939_785_64e-15,
        ];
        poly(&E, r) / poly(&F, r)
    };
    if q < 0.0 {
        -v
    } else {
        v
    }
}
