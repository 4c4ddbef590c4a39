//! The mutation configuration as data: a list of methods, each with candidate values per parameter (like
//! MindArmour's mutate config), read from JSON; a parameter left out is chosen automatically.
//!
//! ```json
//! {"methods": [
//!   {"method": "brightness", "params": {"beta": [-0.2, -0.1, 0.1, 0.2]}},
//!   {"method": "rotate"},
//!   {"method": "adversarial", "attack": "fgsm"}
//! ]}
//! ```
//!
//! `rotate` has no `params`: its `degrees` are drawn uniformly from the method's default range
//! ([`Method::default_range`]) — automatic parameter choice. An explicit list is sampled uniformly. Unknown
//! methods, parameters and fields, values outside a parameter's valid range and an adversarial method without an
//! attack are errors naming the field (`methods[0].params.beta[2]`).

use std::path::Path;

use rand::Rng;
use serde_json::Value;

use super::mutate::Method;
use crate::{Error, Result};

/// How a parameter's value is chosen for each mutant.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamChoice {
    /// Uniformly among these candidates.
    Values(Vec<f32>),
    /// Uniformly in [lo, hi] (automatic parameter choice).
    Range(f32, f32),
}

impl ParamChoice {
    fn draw(&self, rng: &mut impl Rng) -> f32 {
        match self {
            ParamChoice::Values(v) => v[rng.random_range(0..v.len())],
            ParamChoice::Range(lo, hi) => lo + (hi - lo) * rng.random::<f32>(),
        }
    }
}

/// One method of the configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct MethodSpec {
    /// The method.
    pub method: Method,
    /// How each of its parameters is chosen.
    pub params: [ParamChoice; 2],
    /// For [`Method::Adversarial`], the attack's name (resolved by the caller into the fuzzer's attack list).
    pub attack: Option<String>,
}

impl MethodSpec {
    /// The method with every parameter chosen automatically.
    pub fn auto(method: Method) -> MethodSpec {
        let r = method.default_range();
        MethodSpec {
            method,
            params: [ParamChoice::Range(r[0].0, r[0].1), ParamChoice::Range(r[1].0, r[1].1)],
            attack: None,
        }
    }

    /// An adversarial mutation by the attack named `name`.
    pub fn adversarial(name: &str) -> MethodSpec {
        MethodSpec { attack: Some(name.to_string()), ..MethodSpec::auto(Method::Adversarial) }
    }

    /// Draws the parameters of one mutant.
    pub fn draw(&self, rng: &mut impl Rng) -> [f32; 2] {
        [self.params[0].draw(rng), self.params[1].draw(rng)]
    }
}

/// The methods a fuzzer mutates with.
#[derive(Clone, Debug, PartialEq)]
pub struct MutationConfig {
    /// The methods, each equally likely among those a lineage may still use.
    pub methods: Vec<MethodSpec>,
}

impl Default for MutationConfig {
    /// Every pixel-value and affine method with automatic parameters; no attack.
    fn default() -> Self {
        MutationConfig { methods: Method::IMAGE.into_iter().map(MethodSpec::auto).collect() }
    }
}

impl MutationConfig {
    /// The default methods plus an adversarial mutation for each attack name.
    pub fn with_attacks(names: &[&str]) -> MutationConfig {
        let mut c = MutationConfig::default();
        c.methods.extend(names.iter().map(|n| MethodSpec::adversarial(n)));
        c
    }

    /// The attack names the configuration uses, in order of first use.
    pub fn attack_names(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for a in self.methods.iter().filter_map(|m| m.attack.as_ref()) {
            if !out.contains(a) {
                out.push(a.clone());
            }
        }
        out
    }

    /// Reads a JSON configuration file.
    pub fn load(path: impl AsRef<Path>) -> Result<MutationConfig> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        MutationConfig::from_json(&text).map_err(|e| match e {
            Error::InvalidArgument { msg, .. } => Error::bad_file(path, msg),
            other => other,
        })
    }

    /// Parses a JSON configuration; errors name the offending field.
    pub fn from_json(text: &str) -> Result<MutationConfig> {
        let bad = |field: &str, msg: String| Error::invalid("mutation config", format!("{field}: {msg}"));
        let root: Value = serde_json::from_str(text).map_err(|e| bad("(file)", format!("not JSON: {e}")))?;
        let obj = root.as_object().ok_or_else(|| bad("(root)", "not an object".into()))?;
        if let Some(k) = obj.keys().find(|k| *k != "methods") {
            return Err(bad(k, "unknown field (expected `methods`)".into()));
        }
        let list = obj
            .get("methods")
            .ok_or_else(|| bad("methods", "missing".into()))?
            .as_array()
            .ok_or_else(|| bad("methods", "not a list".into()))?;
        if list.is_empty() {
            return Err(bad("methods", "empty".into()));
        }
        let methods: Result<Vec<MethodSpec>> =
            list.iter().enumerate().map(|(i, m)| parse_method(m, &format!("methods[{i}]"))).collect();
        Ok(MutationConfig { methods: methods? })
    }
}

fn parse_method(v: &Value, at: &str) -> Result<MethodSpec> {
    let bad = |field: &str, msg: String| Error::invalid("mutation config", format!("{at}.{field}: {msg}"));
    let obj = v.as_object().ok_or_else(|| Error::invalid("mutation config", format!("{at}: not an object")))?;
    if let Some(k) = obj.keys().find(|k| !["method", "params", "attack"].contains(&k.as_str())) {
        return Err(bad(k, "unknown field (expected `method`, `params`, `attack`)".into()));
    }
    let name =
        obj.get("method").and_then(Value::as_str).ok_or_else(|| bad("method", "missing or not a string".into()))?;
    let names: Vec<&str> = Method::IMAGE.iter().chain(&[Method::Adversarial]).map(|m| m.name()).collect();
    let method = Method::from_name(name)
        .ok_or_else(|| bad("method", format!("unknown method '{name}' (one of {})", names.join(", "))))?;
    let mut spec = MethodSpec::auto(method);
    match (method, obj.get("attack")) {
        (Method::Adversarial, Some(a)) => {
            spec.attack = Some(a.as_str().ok_or_else(|| bad("attack", "not a string".into()))?.to_string())
        }
        (Method::Adversarial, None) => return Err(bad("attack", "missing for an adversarial method".into())),
        (_, Some(_)) => return Err(bad("attack", format!("only an adversarial method takes an attack, not {name}"))),
        (_, None) => {}
    }
    let Some(params) = obj.get("params") else { return Ok(spec) };
    let params = params.as_object().ok_or_else(|| bad("params", "not an object".into()))?;
    for (pname, values) in params {
        let field = format!("params.{pname}");
        let k = method.param_names().iter().position(|n| n == pname).ok_or_else(|| {
            bad(&field, format!("{name} has no parameter '{pname}' (its parameters: {:?})", method.param_names()))
        })?;
        let list = values.as_array().ok_or_else(|| bad(&field, "not a list of numbers".into()))?;
        if list.is_empty() {
            return Err(bad(&field, "empty list (leave the parameter out for automatic choice)".into()));
        }
        let (lo, hi) = method.valid_range(k);
        let mut out = Vec::with_capacity(list.len());
        for (j, x) in list.iter().enumerate() {
            let x = x.as_f64().ok_or_else(|| bad(&format!("{field}[{j}]"), "not a number".into()))? as f32;
            if !(lo..=hi).contains(&x) {
                return Err(bad(&format!("{field}[{j}]"), format!("{x} is outside [{lo}, {hi}]")));
            }
            out.push(x);
        }
        spec.params[k] = ParamChoice::Values(out);
    }
    Ok(spec)
}
