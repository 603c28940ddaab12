//! Test helpers: run `eval` on JSON and compare with the fixtures made from Trinity-RFT's Python.
//!
//! A fixture file `tests/fixtures/<name>.json` holds `{"cases": [{"name", "input", "expected"}]}` where
//! `expected` is the eval output computed by `tests/gen_fixtures.py`, or `{"error": "<substring>"}`.

use serde_json::Value;
pub(crate) use serde_json::json;

/// Absolute and relative tolerance of the agreement with Trinity-RFT.
const ATOL: f64 = 1e-5;
const RTOL: f64 = 1e-4;

/// Runs eval on a JSON input and returns the output as JSON; panics on error (tests only).
pub(crate) fn eval_json(input: Value) -> Value {
    let out = crate::eval::eval_str(&input.to_string()).unwrap_or_else(|e| panic!("eval failed: {e}"));
    serde_json::to_value(out).unwrap()
}

/// Runs eval on a JSON input that must fail and returns the error message.
/// Asserts that a JSON number from `algorithm eval` is `want` within 1e-5 (expected numbers restated from
/// Trinity-RFT's formulas in double precision, against our f32 tensors).
#[track_caller]
pub(crate) fn assert_close(got: &Value, want: f64) {
    let g = got.as_f64().unwrap_or(f64::NAN);
    assert!((g - want).abs() < 1e-5, "got {g}, want {want}");
}

pub(crate) fn eval_err(input: Value) -> String {
    match crate::eval::eval_str(&input.to_string()) {
        Ok(out) => panic!("expected an error, got {}", serde_json::to_string(&out).unwrap()),
        Err(e) => e.to_string(),
    }
}

fn close(path: &str, got: &Value, want: &Value, problems: &mut Vec<String>) {
    match (got, want) {
        (Value::Number(g), Value::Number(w)) => {
            let (g, w) = (g.as_f64().unwrap(), w.as_f64().unwrap());
            if (g - w).abs() > ATOL + RTOL * w.abs() {
                problems.push(format!("{path}: got {g}, Trinity {w}"));
            }
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => {
            for (i, (g, w)) in g.iter().zip(w).enumerate() {
                close(&format!("{path}[{i}]"), g, w, problems);
            }
        }
        (Value::Object(g), Value::Object(w)) => {
            let mut gk: Vec<_> = g.keys().collect();
            let mut wk: Vec<_> = w.keys().collect();
            gk.sort();
            wk.sort();
            if gk != wk {
                problems.push(format!("{path}: keys {gk:?}, Trinity {wk:?}"));
            }
            for (k, w) in w {
                if let Some(g) = g.get(k) {
                    close(&format!("{path}.{k}"), g, w, problems);
                }
            }
        }
        (Value::Null, Value::Null) => {}
        // Python writes NaN as null: accept a NaN on our side.
        (Value::Null, w) | (w, Value::Null) => problems.push(format!("{path}: null vs {w}")),
        (g, w) => problems.push(format!("{path}: got {g}, Trinity {w}")),
    }
}

/// Checks every case of one fixture file.
pub(crate) fn check_fixtures(name: &str) {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let doc: Value = serde_json::from_str(&text).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(!cases.is_empty(), "{path} has no cases");
    let mut failures = Vec::new();
    for case in cases {
        let case_name = case["name"].as_str().unwrap();
        let expected = &case["expected"];
        if let Some(substring) = expected.get("error").and_then(Value::as_str) {
            match crate::eval::eval_str(&case["input"].to_string()) {
                Ok(_) => failures.push(format!("{case_name}: expected an error containing `{substring}`")),
                Err(e) if !e.to_string().contains(substring) => {
                    failures.push(format!("{case_name}: error `{e}` lacks `{substring}`"))
                }
                Err(_) => {}
            }
            continue;
        }
        let got = match crate::eval::eval_str(&case["input"].to_string()) {
            Ok(out) => serde_json::to_value(out).unwrap(),
            Err(e) => {
                failures.push(format!("{case_name}: {e}"));
                continue;
            }
        };
        let mut problems = Vec::new();
        for (key, want) in expected.as_object().unwrap() {
            close(key, &got[key], want, &mut problems);
        }
        failures.extend(problems.into_iter().map(|p| format!("{case_name}: {p}")));
    }
    assert!(failures.is_empty(), "{} mismatches in {path}:\n{}", failures.len(), failures.join("\n"));
}
