//! Learning-rate schedules, evaluated per epoch (or per step, by passing a fractional epoch).

/// A learning-rate schedule: the rate at a (possibly fractional) epoch, given the base rate.
#[derive(Clone, Debug, PartialEq)]
pub enum LrSchedule {
    /// Always the base rate.
    Constant,
    /// Multiply by `gamma` every `step_size` epochs (PyTorch StepLR).
    Step {
        /// Epochs between decays.
        step_size: usize,
        /// Decay factor.
        gamma: f32,
    },
    /// Multiply by `gamma` at each listed epoch (PyTorch MultiStepLR).
    MultiStep {
        /// Epochs at which to decay.
        milestones: Vec<usize>,
        /// Decay factor.
        gamma: f32,
    },
    /// Cosine annealing from the base rate to `eta_min` over `t_max` epochs (PyTorch CosineAnnealingLR).
    Cosine {
        /// Epochs of one half-period.
        t_max: f32,
        /// Final rate.
        eta_min: f32,
    },
    /// Triangular cyclic rate: 0 → base at `peak` epochs → 0 at `total` (fast adversarial training, Wong et al.).
    Triangular {
        /// Where the rate peaks.
        peak: f32,
        /// Where it returns to zero.
        total: f32,
    },
}

impl LrSchedule {
    /// The learning rate at `epoch` (0-based; fractional for per-step schedules).
    pub fn lr_at(&self, base: f32, epoch: f32) -> f32 {
        match self {
            LrSchedule::Constant => base,
            LrSchedule::Step { step_size, gamma } => {
                base * gamma.powi((epoch.floor() as usize / (*step_size).max(1)) as i32)
            }
            LrSchedule::MultiStep { milestones, gamma } => {
                base * gamma.powi(milestones.iter().filter(|&&m| epoch.floor() as usize >= m).count() as i32)
            }
            LrSchedule::Cosine { t_max, eta_min } => {
                let t = epoch.min(*t_max) / t_max.max(f32::MIN_POSITIVE);
                eta_min + (base - eta_min) * 0.5 * (1.0 + (std::f32::consts::PI * t).cos())
            }
            LrSchedule::Triangular { peak, total } => {
                if epoch <= *peak {
                    base * epoch / peak.max(f32::MIN_POSITIVE)
                } else {
                    (base * (total - epoch) / (total - peak).max(f32::MIN_POSITIVE)).max(0.0)
                }
            }
        }
    }
}
