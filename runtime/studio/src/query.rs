//! Query strings of the API (`?run=p/n&name=a&name=b&reward_min=0.5`), parsed without axum's `query` feature so the
//! studio does not change the feature set (and so the build) of the crates it shares axum with.

use std::str::FromStr;

use crate::error::StudioError;

/// The decoded `key=value` pairs of a query string, in order.
#[derive(Debug, Default)]
pub(crate) struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    pub(crate) fn parse(raw: Option<&str>) -> Query {
        let pairs = form_urlencoded::parse(raw.unwrap_or_default().as_bytes()).into_owned().collect();
        Query { pairs }
    }

    /// The last value of `key`; an empty value counts as absent (an empty form field).
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().rev().find(|(k, v)| k == key && !v.is_empty()).map(|(_, v)| v.as_str())
    }

    /// Every non-empty value of `key`, in order.
    pub(crate) fn all(&self, key: &str) -> Vec<String> {
        self.pairs.iter().filter(|(k, v)| k == key && !v.is_empty()).map(|(_, v)| v.clone()).collect()
    }

    pub(crate) fn require(&self, key: &str) -> Result<&str, StudioError> {
        self.get(key).ok_or_else(|| StudioError::query(key, "missing"))
    }

    /// `key` parsed as a `T`, if present.
    pub(crate) fn parsed<T: FromStr>(&self, key: &str) -> Result<Option<T>, StudioError> {
        self.get(key)
            .map(|value| {
                value.parse().map_err(|_| StudioError::query(key, format!("`{value}` is not a valid {}", kind::<T>())))
            })
            .transpose()
    }

    /// `true`/`false` (also `1`/`0`, `yes`/`no`), if present.
    pub(crate) fn flag(&self, key: &str) -> Result<Option<bool>, StudioError> {
        self.get(key)
            .map(|value| match value {
                "true" | "1" | "yes" => Ok(true),
                "false" | "0" | "no" => Ok(false),
                other => Err(StudioError::query(key, format!("`{other}` is not true or false"))),
            })
            .transpose()
    }
}

fn kind<T>() -> &'static str {
    let name = std::any::type_name::<T>();
    if name.starts_with('f') {
        "number"
    } else if name.starts_with('u') || name.starts_with('i') {
        "whole number"
    } else {
        "value"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_repeats_and_checks_types() {
        let query = Query::parse(Some("run=p%2Fn&name=a%2Fb&name=c&step=&reward_min=0.5&limit=x&truncated=yes"));
        assert_eq!(query.get("run"), Some("p/n"));
        assert_eq!(query.all("name"), ["a/b", "c"]);
        assert_eq!(query.parsed::<u64>("step").unwrap(), None);
        assert_eq!(query.parsed::<f64>("reward_min").unwrap(), Some(0.5));
        let error = query.parsed::<usize>("limit").unwrap_err().to_string();
        assert_eq!(error, "query parameter `limit`: `x` is not a valid whole number");
        assert_eq!(query.flag("truncated").unwrap(), Some(true));
        assert!(query.require("file").unwrap_err().to_string().contains("`file`: missing"));
    }
}
