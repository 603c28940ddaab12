//! Component arguments: the accepted names with their defaults, and the typed view a component builds from.
//!
//! Trinity-RFT passes `*_args` to a component's constructor as keyword arguments, so a partial dict falls back
//! to the *constructor* defaults, which in places differ from the class's `default_args()`. We resolve one way
//! only: every accepted argument starts at the value `default_args()` gives it (or the constructor default
//! where `default_args()` is silent), the user's values replace those, and a JSON `null` means "the default".

use serde_json::{Map, Value};

use crate::error::AlgorithmError;
use crate::registry::Kind;

/// The default of one accepted argument, in a form that can live in a `static`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArgDefault {
    /// No value (Python `None`).
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'static str),
}

impl ArgDefault {
    /// The default as JSON.
    pub fn to_value(self) -> Value {
        match self {
            ArgDefault::Null => Value::Null,
            ArgDefault::Bool(b) => Value::Bool(b),
            ArgDefault::Int(i) => Value::from(i),
            ArgDefault::Float(f) => Value::from(f),
            ArgDefault::Str(s) => Value::from(s),
        }
    }
}

/// One accepted argument of a component.
#[derive(Debug, Clone, Copy)]
pub struct ArgSpec {
    pub name: &'static str,
    pub default: ArgDefault,
}

/// Shorthand for the argument tables next to each component.
pub(crate) const fn arg(name: &'static str, default: ArgDefault) -> ArgSpec {
    ArgSpec { name, default }
}

/// Every accepted argument with its default, as the JSON map `trinity algorithm list` shows.
pub fn defaults_map(specs: &[ArgSpec]) -> Map<String, Value> {
    specs.iter().map(|s| (s.name.to_owned(), s.default.to_value())).collect()
}

/// The resolved arguments of one component, read through typed getters that name the component on error.
#[derive(Debug, Clone)]
pub struct Args {
    kind: Kind,
    component: String,
    values: Map<String, Value>,
}

impl Args {
    /// Fills `user` over the defaults of `specs`; an argument outside `specs` is an error.
    pub fn resolve(
        kind: Kind,
        component: &str,
        specs: &[ArgSpec],
        user: Option<&Map<String, Value>>,
    ) -> Result<Self, AlgorithmError> {
        let mut values = defaults_map(specs);
        for (key, value) in user.into_iter().flatten() {
            if !values.contains_key(key) {
                return Err(AlgorithmError::UnknownArg {
                    kind,
                    component: component.to_owned(),
                    arg: key.clone(),
                    accepted: specs.iter().map(|s| s.name.to_owned()).collect(),
                });
            }
            if !value.is_null() {
                values.insert(key.clone(), value.clone());
            }
        }
        Ok(Args { kind, component: component.to_owned(), values })
    }

    /// The resolved values, defaults included.
    pub fn values(&self) -> &Map<String, Value> {
        &self.values
    }

    /// Replaces one argument (used for the `loss_agg_mode` override); the caller checks it is accepted.
    pub(crate) fn set(&mut self, name: &str, value: Value) {
        self.values.insert(name.to_owned(), value);
    }

    /// Whether the component accepts this argument.
    pub fn accepts(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    pub(crate) fn invalid(&self, arg: &str, problem: impl Into<String>) -> AlgorithmError {
        AlgorithmError::InvalidArg {
            kind: self.kind,
            component: self.component.clone(),
            arg: arg.to_owned(),
            problem: problem.into(),
        }
    }

    fn get(&self, name: &str) -> &Value {
        self.values.get(name).unwrap_or(&Value::Null)
    }

    /// A number, or `None` for null.
    pub fn opt_f64(&self, name: &str) -> Result<Option<f64>, AlgorithmError> {
        match self.get(name) {
            Value::Null => Ok(None),
            Value::Number(n) => n.as_f64().map(Some).ok_or_else(|| self.invalid(name, "must be a number")),
            other => Err(self.invalid(name, format!("must be a number, got {other}"))),
        }
    }

    /// A number that must be present.
    pub fn f64(&self, name: &str) -> Result<f64, AlgorithmError> {
        self.opt_f64(name)?.ok_or_else(|| self.invalid(name, "must be a number, got null"))
    }

    /// An integer (a float with no fractional part is accepted, as Python would), or `None` for null.
    pub fn opt_i64(&self, name: &str) -> Result<Option<i64>, AlgorithmError> {
        match self.get(name) {
            Value::Null => Ok(None),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Ok(Some(i))
                } else {
                    match n.as_f64() {
                        Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Some(f as i64)),
                        _ => Err(self.invalid(name, "must be an integer")),
                    }
                }
            }
            other => Err(self.invalid(name, format!("must be an integer, got {other}"))),
        }
    }

    /// An integer that must be present.
    pub fn i64(&self, name: &str) -> Result<i64, AlgorithmError> {
        self.opt_i64(name)?.ok_or_else(|| self.invalid(name, "must be an integer, got null"))
    }

    /// A boolean, or `None` for null.
    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>, AlgorithmError> {
        match self.get(name) {
            Value::Null => Ok(None),
            Value::Bool(b) => Ok(Some(*b)),
            other => Err(self.invalid(name, format!("must be true or false, got {other}"))),
        }
    }

    /// A boolean that must be present.
    pub fn bool(&self, name: &str) -> Result<bool, AlgorithmError> {
        self.opt_bool(name)?.ok_or_else(|| self.invalid(name, "must be true or false, got null"))
    }

    /// A string, or `None` for null.
    pub fn opt_str(&self, name: &str) -> Result<Option<&str>, AlgorithmError> {
        match self.get(name) {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s)),
            other => Err(self.invalid(name, format!("must be a string, got {other}"))),
        }
    }

    /// A string that must be present.
    pub fn str(&self, name: &str) -> Result<&str, AlgorithmError> {
        self.opt_str(name)?.ok_or_else(|| self.invalid(name, "must be a string, got null"))
    }

    /// A string from a closed set.
    pub fn choice(&self, name: &str, allowed: &[&str]) -> Result<String, AlgorithmError> {
        let value = self.str(name)?;
        if allowed.contains(&value) {
            Ok(value.to_owned())
        } else {
            Err(self.invalid(name, format!("must be one of {}, got `{value}`", allowed.join(", "))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SPECS: &[ArgSpec] = &[arg("clip_range", ArgDefault::Float(0.2)), arg("mode", ArgDefault::Str("a"))];

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn null_means_default_and_values_override() {
        let user = map(json!({"clip_range": null, "mode": "b"}));
        let args = Args::resolve(Kind::PolicyLoss, "ppo", SPECS, Some(&user)).unwrap();
        assert_eq!(args.f64("clip_range").unwrap(), 0.2);
        assert_eq!(args.str("mode").unwrap(), "b");
    }

    #[test]
    fn unknown_arg_names_component_and_accepted() {
        let user = map(json!({"clip": 0.1}));
        let err = Args::resolve(Kind::PolicyLoss, "ppo", SPECS, Some(&user)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("`ppo`") && msg.contains("`clip`") && msg.contains("clip_range, mode"), "{msg}");
    }

    #[test]
    fn wrong_type_is_an_error() {
        let user = map(json!({"clip_range": "x"}));
        let args = Args::resolve(Kind::PolicyLoss, "ppo", SPECS, Some(&user)).unwrap();
        assert!(args.f64("clip_range").unwrap_err().to_string().contains("clip_range"));
        assert!(args.choice("mode", &["b"]).is_err());
    }
}
