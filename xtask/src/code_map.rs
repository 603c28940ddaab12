//! The code map's import rules, checked: `docs/architecture.md` says, per crate, what it must never import
//! (`Never imports: ...`), and a test compares that with the dependency graph `cargo metadata` resolves. A map
//! that only describes drifts; one the test command reads stays true.
//!
//! A rule names crates in backticks. `trinity-*` stands for every other crate of the workspace whose name starts
//! with `trinity`; "`trinity-*` (but `a`, `b`)" excepts those. Only normal dependencies count, direct or
//! transitive: a crate's tests and build scripts may use more.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// One crate's section of the map.
#[derive(Debug, PartialEq)]
pub struct Rule {
    /// The package name the section's heading gives (`### `path` (`name`)`).
    pub package: String,
    /// The crates named after `Never imports:` (patterns unexpanded).
    pub never: Vec<String>,
    /// With `trinity-*`: the crates named after its `but`.
    pub except: Vec<String>,
}

/// The rules of every section of `markdown` that has a `Never imports:` line.
pub fn parse_rules(markdown: &str) -> Result<Vec<Rule>, String> {
    let mut rules = Vec::new();
    let mut package: Option<String> = None;
    for (number, line) in markdown.lines().enumerate() {
        if let Some(heading) = line.strip_prefix("### ") {
            package = backticked(heading).get(1).cloned();
        } else if let Some(rest) = line.strip_prefix("Never imports:") {
            let package = package.clone().ok_or_else(|| {
                format!("line {}: `Never imports:` outside a \"### `path` (`package`)\" section", number + 1)
            })?;
            let (never, except) = match rest.split_once("(but ") {
                Some((before, after)) => {
                    let (except, after) = after
                        .split_once(')')
                        .ok_or_else(|| format!("line {}: `(but ...` without its closing parenthesis", number + 1))?;
                    (backticked(&format!("{before}{after}")), backticked(except))
                }
                None => (backticked(rest), Vec::new()),
            };
            if never.is_empty() {
                return Err(format!("line {}: `Never imports:` names no crate in backticks", number + 1));
            }
            if !except.is_empty() && !never.iter().any(|n| n == "trinity-*") {
                return Err(format!("line {}: `(but ...)` only excepts from `trinity-*`", number + 1));
            }
            rules.push(Rule { package, never, except });
        }
    }
    Ok(rules)
}

/// The texts between pairs of backticks, in order.
fn backticked(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// Each workspace package's normal dependencies, direct and transitive, by name, from `cargo metadata`'s JSON.
pub fn closures(metadata: &Value) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let names: BTreeMap<&str, &str> = metadata["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?)))
        .collect();
    let normal_deps: BTreeMap<&str, Vec<&str>> = metadata["resolve"]["nodes"]
        .as_array()
        .ok_or("cargo metadata: no resolve graph")?
        .iter()
        .filter_map(|node| {
            let deps = node["deps"].as_array()?.iter().filter(|dep| {
                dep["dep_kinds"].as_array().is_some_and(|kinds| kinds.iter().any(|k| k["kind"].is_null()))
            });
            Some((node["id"].as_str()?, deps.filter_map(|dep| dep["pkg"].as_str()).collect()))
        })
        .collect();
    let mut out = BTreeMap::new();
    for member in metadata["workspace_members"].as_array().ok_or("cargo metadata: no workspace members")? {
        let member = member.as_str().ok_or("cargo metadata: a member id that is not a string")?;
        let mut seen = BTreeSet::new();
        let mut stack = vec![member];
        while let Some(id) = stack.pop() {
            for dep in normal_deps.get(id).into_iter().flatten() {
                if seen.insert(*dep) {
                    stack.push(dep);
                }
            }
        }
        let name = names.get(member).ok_or_else(|| format!("cargo metadata: no package {member}"))?;
        out.insert((*name).to_owned(), seen.iter().filter_map(|id| names.get(id).map(|n| (*n).to_owned())).collect());
    }
    Ok(out)
}

/// Every way the graph breaks the rules, one line each; empty when the map holds. A rule for a package the
/// workspace does not have is a violation too (the map names what is not there).
pub fn violations(rules: &[Rule], closures: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let workspace: Vec<&String> = closures.keys().filter(|name| name.starts_with("trinity")).collect();
    let mut out = Vec::new();
    for rule in rules {
        let Some(deps) = closures.get(&rule.package) else {
            out.push(format!("the code map has a section for `{}`, which is not a workspace crate", rule.package));
            continue;
        };
        let mut forbidden = BTreeSet::new();
        for name in &rule.never {
            if name == "trinity-*" {
                let others = workspace.iter().filter(|w| **w != &rule.package && !rule.except.contains(w));
                forbidden.extend(others.map(|w| w.to_string()));
            } else {
                forbidden.insert(name.clone());
            }
        }
        for name in forbidden.intersection(deps) {
            out.push(format!("`{}` imports `{name}`, which the code map says it must never import", rule.package));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    use serde_json::json;

    use super::*;

    const MAP: &str = "\
### `runtime/a` (`trinity-a`)
Owns things.
Never imports: `trinity-*` (but `trinity-b`), `tch`.

### `runtime/b` (`trinity-b`)
Never imports: `trinity-*`.
";

    /// Packages a → b → c, c → tch; `kind` is the kind of the edge b → c.
    fn metadata(kind: Value) -> Value {
        let package = |name: &str| json!({"id": format!("{name} 0.1"), "name": name});
        let dep = |name: &str, kind: Value| json!({"pkg": format!("{name} 0.1"), "dep_kinds": [{"kind": kind}]});
        json!({
            "packages": [package("trinity-a"), package("trinity-b"), package("trinity-c"), package("tch")],
            "workspace_members": ["trinity-a 0.1", "trinity-b 0.1", "trinity-c 0.1"],
            "resolve": {"nodes": [
                {"id": "trinity-a 0.1", "deps": [dep("trinity-b", Value::Null)]},
                {"id": "trinity-b 0.1", "deps": [dep("trinity-c", kind)]},
                {"id": "trinity-c 0.1", "deps": [dep("tch", Value::Null)]},
                {"id": "tch 0.1", "deps": []},
            ]},
        })
    }

    #[test]
    fn sections_give_their_package_its_forbidden_crates() {
        let rules = parse_rules(MAP).unwrap();
        assert_eq!(
            rules,
            vec![
                Rule {
                    package: "trinity-a".into(),
                    never: vec!["trinity-*".into(), "tch".into()],
                    except: vec!["trinity-b".into()],
                },
                Rule { package: "trinity-b".into(), never: vec!["trinity-*".into()], except: vec![] },
            ]
        );
        assert!(parse_rules("Never imports: `tch`.").unwrap_err().contains("outside"));
        assert!(parse_rules("### `x` (`y`)\nNever imports: nothing").unwrap_err().contains("no crate"));
    }

    #[test]
    fn a_transitive_normal_dependency_breaks_a_rule_and_a_dev_dependency_does_not() {
        let rules = parse_rules(MAP).unwrap();
        let broken = violations(&rules, &closures(&metadata(Value::Null)).unwrap());
        assert_eq!(
            broken,
            vec![
                "`trinity-a` imports `tch`, which the code map says it must never import",
                "`trinity-a` imports `trinity-c`, which the code map says it must never import",
                "`trinity-b` imports `trinity-c`, which the code map says it must never import",
            ]
        );
        assert!(violations(&rules, &closures(&metadata(json!("dev"))).unwrap()).is_empty());
    }

    #[test]
    fn a_section_for_a_crate_that_is_gone_is_reported() {
        let rules = parse_rules("### `runtime/z` (`trinity-z`)\nNever imports: `tch`.\n").unwrap();
        let broken = violations(&rules, &closures(&metadata(Value::Null)).unwrap());
        assert_eq!(broken, vec!["the code map has a section for `trinity-z`, which is not a workspace crate"]);
    }

    /// The real map against the real graph: every library crate under `runtime/` has its rule, and every rule holds.
    #[test]
    fn the_workspace_imports_nothing_the_code_map_forbids() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let map = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
        let rules = parse_rules(&map).unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        // Only the host's graph: offline, cargo can resolve only packages it has downloaded, and a fresh machine
        // has downloaded none of the other platforms' dependencies (android_system_properties, windows-sys, ...).
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
        let host = Command::new(rustc).args(["--print", "host-tuple"]).output().unwrap();
        assert!(host.status.success(), "rustc --print host-tuple: {}", String::from_utf8_lossy(&host.stderr));
        let host = String::from_utf8(host.stdout).unwrap();
        let output = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--offline", "--locked", "--filter-platform", host.trim()])
            .current_dir(root)
            .output()
            .unwrap();
        assert!(output.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&output.stderr));
        let closures = closures(&serde_json::from_slice(&output.stdout).unwrap()).unwrap();
        let broken = violations(&rules, &closures);
        assert!(broken.is_empty(), "docs/architecture.md's import rules are broken:\n{}", broken.join("\n"));
        let libraries = std::fs::read_dir(root.join("runtime")).unwrap().filter_map(|entry| {
            let manifest = std::fs::read_to_string(entry.ok()?.path().join("Cargo.toml")).ok()?;
            let name =
                manifest.lines().find_map(|l| l.strip_prefix("name = \"")?.strip_suffix('"').map(str::to_owned))?;
            (name != "trinity").then_some(name)
        });
        let unmapped: Vec<String> = libraries.filter(|name| !rules.iter().any(|r| &r.package == name)).collect();
        assert!(unmapped.is_empty(), "crates without a `Never imports:` rule in docs/architecture.md: {unmapped:?}");
    }
}
