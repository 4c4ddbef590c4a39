//! Every attack by name, for the examples' `--attack` flag.
#![allow(dead_code)]

use armoury::{Attack, Error, Result};
use armoury_attacks::{Epsilon, Llc, Norm, Pgd, RFgsm, UniformNoise};

/// Settings the command line can give.
#[derive(Clone, Debug)]
pub struct AttackArgs {
    pub name: String,
    pub eps: f32,
    pub norm: Option<Norm>,
    pub steps: Option<usize>,
    pub step_size: Option<f32>,
    pub restarts: usize,
    pub queries: Option<usize>,
    pub seed: u64,
}

/// The attack named by `a.name`.
pub fn build(a: &AttackArgs) -> Result<Box<dyn Attack>> {
    let eps = a.eps;
    let norm = a.norm.unwrap_or(Norm::Linf);
    let iterative = |mut p: Pgd| {
        if let Some(s) = a.steps {
            p.steps = s;
        }
        if let Some(s) = a.step_size {
            p.step_size = s;
        }
        p.restarts = a.restarts.max(1);
        p.seed = a.seed;
        p
    };
    let attack: Box<dyn Attack> = match a.name.as_str() {
        "fgsm" => Box::new(Pgd::fgsm(eps)),
        "fgm" => Box::new(Pgd::fgm(norm, eps)),
        "rfgsm" => Box::new(RFgsm { seed: a.seed, ..RFgsm::new(eps) }),
        "llc" => Box::new(Llc { eps, random: false, seed: a.seed }),
        "rllc" => Box::new(Llc { eps, random: true, seed: a.seed }),
        "bim" => Box::new(iterative(Pgd::bim(eps, eps / 10.0, 10))),
        "pgd" => Box::new(iterative(Pgd { norm, eps: Epsilon::Scalar(eps), ..Pgd::linf(eps) })),
        "mifgsm" => Box::new(iterative(Pgd::mi_fgsm(eps))),
        "difgsm" => Box::new(iterative(Pgd::di_fgsm(eps))),
        "mdifgsm" => Box::new(iterative(Pgd::m_di_fgsm(eps))),
        "vmifgsm" => Box::new(iterative(Pgd::vmi_fgsm(eps))),
        "vnifgsm" => Box::new(iterative(Pgd::vni_fgsm(eps))),
        "noise" => Box::new(UniformNoise { norm, eps: Epsilon::Scalar(eps), seed: a.seed }),
        other => {
            return Err(Error::invalid(
                "--attack",
                format!("unknown attack '{other}'; known: {}", NAMES.join(", ")),
            ))
        }
    };
    Ok(attack)
}

/// The names `build` accepts.
pub const NAMES: &[&str] =
    &["fgsm", "fgm", "rfgsm", "llc", "rllc", "bim", "pgd", "mifgsm", "difgsm", "mdifgsm", "vmifgsm", "vnifgsm", "noise"];
