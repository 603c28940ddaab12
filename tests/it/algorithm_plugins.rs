//! Algorithm libraries end to end: scaffolded with `cargo xtask new-algorithm`, built as `cdylib`s, loaded by the
//! `trinity` binary, used by name in `trinity run` / `trinity algorithm eval`, installed from a registry index.
//!
//! The libraries are built from the test with the same cargo, profile and target directory as the test binary
//! itself, so their dependencies (tch, abi_stable) come from the build that produced this test and the `.so`
//! files link the same libtorch. Temporary workspaces reuse the real root manifest (paths made absolute) and
//! lock file for the same reason.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::support::{assert_clean_failure, model_and_tasks, stderr, stdout, tiny_model_dir, trinity, workspace_root};

/// `<target>/<profile>`, where the `trinity` binary (and every library built here) lives.
fn profile_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_trinity")).parent().expect("the binary has a folder").to_owned()
}

/// Runs cargo with the target directory and profile of this test build.
fn cargo(dir: &Path, args: &[&str]) -> Output {
    let profile = profile_dir();
    let target = profile.parent().expect("profile folder has a parent");
    let name = profile.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let (subcommand, rest) = args.split_first().expect("a cargo subcommand");
    let mut command = Command::new(cargo);
    // Options go right after the subcommand: for `run`, everything after `--` belongs to the program.
    command.current_dir(dir).arg(subcommand).arg("--target-dir").arg(target);
    if *subcommand == "build" || *subcommand == "test" {
        command.args(["--profile", if name == "debug" { "dev" } else { name }]);
    }
    command.args(rest);
    // Scratch workspaces lie outside the repository, so `.cargo/config.toml` does not give them LIBTORCH; give
    // them the same absolute path it gives the repository (the same string, or torch-sys would rebuild).
    if std::env::var_os("LIBTORCH").is_none() {
        command.env("LIBTORCH", workspace_root().canonicalize().unwrap().join(".deps/libtorch/torch"));
    }
    let output = command.output().expect("cargo runs");
    assert!(output.status.success(), "cargo {args:?} in {} failed:\n{}", dir.display(), stderr(&output));
    output
}

fn library_file(crate_name: &str) -> PathBuf {
    profile_dir().join(format!("lib{}.so", crate_name.replace('-', "_")))
}

/// The two example libraries, built once per test process.
fn examples() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        cargo(&workspace_root(), &["build", "-p", "algo-example-a", "-p", "algo-example-b"]);
        (library_file("algo-example-a"), library_file("algo-example-b"))
    })
}

/// A temporary workspace whose root manifest is the real one with no members and absolute paths, plus the real
/// lock file, so crates built in it share this build's dependencies.
fn scratch_workspace() -> tempfile::TempDir {
    let root = workspace_root().canonicalize().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let start = manifest.find("members = [").unwrap();
    let end = start + manifest[start..].find(']').unwrap();
    let manifest = format!("{}members = [\n{}", &manifest[..start], &manifest[end..])
        .replace("{ path = \"", &format!("{{ path = \"{}/", root.display()));
    std::fs::write(dir.path().join("Cargo.toml"), manifest).unwrap();
    std::fs::copy(root.join("Cargo.lock"), dir.path().join("Cargo.lock")).unwrap();
    dir
}

#[test]
fn a_scaffolded_library_builds_loads_and_trains_by_name() {
    let ws = scratch_workspace();
    let root = workspace_root();
    let out = cargo(
        &root,
        &["run", "--quiet", "-p", "xtask", "--", "new-algorithm", "my_algo", "--root", ws.path().to_str().unwrap()],
    );
    assert!(stdout(&out).contains("policy loss `my_algo`"), "{}", stdout(&out));
    let manifest = ws.path().join("Cargo.toml");
    assert!(std::fs::read_to_string(&manifest).unwrap().contains("\"plugins/my_algo\","));
    // Its own unit tests pass, then the library builds.
    let tests = cargo(ws.path(), &["test", "-p", "my_algo"]);
    assert!(stdout(&tests).contains("2 passed"), "{}", stdout(&tests));
    cargo(ws.path(), &["build", "-p", "my_algo"]);
    let lib = library_file("my_algo");

    let list = trinity(ws.path(), &["plugins", "list", "--plugin", lib.to_str().unwrap()]);
    assert!(list.status.success(), "{}", stderr(&list));
    let line = stdout(&list).lines().find(|l| l.contains(" my_algo ")).map(str::to_owned);
    let line = line.unwrap_or_else(|| panic!("my_algo not listed:\n{}", stdout(&list)));
    assert!(line.starts_with("policy loss") && line.contains("libmy_algo.so"), "{line}");

    // A short GRPO run whose policy loss is the library's, loaded through the config's `plugins:`.
    let dir = ws.path();
    let rows: String = (0..4).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.join("tasks.jsonl"), rows).unwrap();
    let config = format!(
        "project: p
name: n
checkpoint_root_dir: ./ckpt
plugins: [{lib}]
algorithm:
  algorithm_type: grpo
  repeat_times: 2
  policy_loss_fn: my_algo
  policy_loss_fn_args:
    clip_range: 0.1
{tasks}    default_workflow_type: simple_workflow
",
        lib = lib.display(),
        tasks = model_and_tasks(&tiny_model_dir(), 40)
    );
    std::fs::write(dir.join("config.yaml"), config).unwrap();
    let dry = trinity(dir, &["run", "--config", "config.yaml", "--dry-run"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    let resolved = stdout(&dry);
    assert!(resolved.contains("policy_loss_fn: my_algo"), "{resolved}");
    assert!(resolved.contains("clip_range: 0.1") && resolved.contains("loss_agg_mode: token-mean"), "{resolved}");

    let run = trinity(dir, &["run", "--config", "config.yaml"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let job = dir.join("ckpt/p/n");
    let metrics = std::fs::read_to_string(job.join("monitor/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "two steps:\n{metrics}");
    // The library's loss reports pg_loss and pg_clipfrac only; the built-in ppo loss would add ppo_kl.
    assert!(metrics.contains("\"train/pg_clipfrac\"") && !metrics.contains("ppo_kl"), "{metrics}");
}

/// An eval input that uses components of both example libraries at once.
const TWO_LIBRARIES: &str = r#"{
    "advantage_fn": "group_mean",
    "policy_loss_fn": "vanilla_pg",
    "kl_loss_fn": "clamped_k2", "kl_loss_fn_args": {"kl_coef": 0.1},
    "entropy_loss_fn": "capped_entropy", "entropy_loss_fn_args": {"entropy_coef": 0.01},
    "batch": {
        "group_id": ["a", "a"], "reward": [1.0, 3.0],
        "logprob": [[-1.0, -2.0], [-3.0, -4.0]], "ref_logprob": [[-1.0, -1.0], [-1.0, -1.0]],
        "entropy": [[1.0, 9.0], [2.0, 3.0]], "action_mask": [[1, 1], [1, 1]]
    }
}"#;

#[test]
fn two_libraries_work_in_one_process() {
    let (a, b) = examples();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("input.json"), TWO_LIBRARIES).unwrap();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let out = trinity(dir.path(), &["algorithm", "eval", "--plugin", a, "--plugin", b, "--input", "input.json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let close = |key: &str, want: f64| {
        let got = v[key].as_f64().unwrap_or(f64::NAN);
        assert!((got - want).abs() < 1e-5, "{key}: {got} vs {want}\n{v:#}");
    };
    // A = r − group mean = [−1, 1]; pg = mean(−A·ℓ) = 1; KL = mean(½(ℓ − ℓ_ref)²) = 1.75; H = mean(min(H, 5)) = 2.75.
    close("pg_loss", 1.0);
    close("kl", 1.75);
    close("kl_loss", 0.175);
    close("entropy", 2.75);
    close("loss", 1.0 - 0.0275 + 0.175);
    assert_eq!(v["advantages"], serde_json::json!([[-1.0, -1.0], [1.0, 1.0]]));
    assert_eq!(v["metrics"]["group_mean/groups"], 1.0);
    assert_eq!(v["metrics"]["vanilla_pg/advantage_mean"], 0.0);
    // ∂loss/∂ℓ = −A/4 + 0.1·(ℓ − ℓ_ref)/4 through both libraries' autograd graphs.
    let grad = v["grad_logprob"][1][1].as_f64().unwrap();
    assert!((grad - (-0.25 + 0.1 * -3.0 / 4.0)).abs() < 1e-6, "{grad}");

    let list = trinity(dir.path(), &["plugins", "list", "--plugin", a, "--plugin", b]);
    assert!(list.status.success(), "{}", stderr(&list));
    let text = stdout(&list);
    for (name, file) in [("vanilla_pg", "libalgo_example_a.so"), ("vanilla", "libalgo_example_a.so")] {
        assert!(text.lines().any(|l| l.contains(&format!(" {name} ")) && l.ends_with(file)), "{name}:\n{text}");
    }
    for name in ["group_mean", "clamped_k2", "capped_entropy"] {
        assert!(
            text.lines().any(|l| l.contains(&format!(" {name} ")) && l.ends_with("libalgo_example_b.so")),
            "{name}:\n{text}"
        );
    }
}

#[test]
fn an_unknown_name_lists_what_is_available() {
    let (a, b) = examples();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("input.json"), TWO_LIBRARIES.replace("\"vanilla_pg\"", "\"vanila_pg\"")).unwrap();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let out = trinity(dir.path(), &["algorithm", "eval", "--plugin", a, "--plugin", b, "--input", "input.json"]);
    assert_clean_failure(&out, &["`vanila_pg`", "vanilla_pg", "ppo", "gspo"]);
}

#[test]
fn a_library_clashing_with_a_built_in_or_another_library_is_refused() {
    let (a, _) = examples();
    let a = a.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The same file twice is one library, not a clash.
    let out = trinity(dir.path(), &["plugins", "list", "--plugin", a, "--plugin", a]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A copy of the file is another library with the same names.
    let copy = dir.path().join("libcopy.so");
    std::fs::copy(a, &copy).unwrap();
    let out = trinity(dir.path(), &["plugins", "list", "--plugin", a, "--plugin", copy.to_str().unwrap()]);
    assert_clean_failure(&out, &["libcopy.so", "clashes with algorithm library `algo-example-a`"]);
}

#[test]
fn a_library_built_against_an_incompatible_sdk_is_refused() {
    let root = workspace_root().canonicalize().unwrap();
    let ws = scratch_workspace();
    // The SDK copied with another major version, and example A renamed so its file does not replace the real one.
    let manifest = std::fs::read_to_string(ws.path().join("Cargo.toml")).unwrap();
    let manifest = manifest
        .replacen("[workspace.package]\nversion = \"0.1.0\"", "[workspace.package]\nversion = \"9.0.0\"", 1)
        .replace(&format!("{{ path = \"{}/plugin-sdk\" }}", root.display()), "{ path = \"plugin-sdk\" }")
        .replacen("members = [\n", "members = [\n    \"plugin-sdk\",\n    \"plugins/old-sdk\",\n", 1);
    assert!(manifest.contains("version = \"9.0.0\""), "the root manifest changed shape:\n{manifest}");
    std::fs::write(ws.path().join("Cargo.toml"), manifest).unwrap();
    copy_dir(&root.join("plugin-sdk"), &ws.path().join("plugin-sdk"));
    copy_dir(&root.join("plugins/algo-example-a"), &ws.path().join("plugins/old-sdk"));
    let plugin_manifest = ws.path().join("plugins/old-sdk/Cargo.toml");
    let text =
        std::fs::read_to_string(&plugin_manifest).unwrap().replace("name = \"algo-example-a\"", "name = \"old-sdk\"");
    std::fs::write(&plugin_manifest, text).unwrap();
    cargo(ws.path(), &["build", "-p", "old-sdk"]);

    let lib = library_file("old-sdk");
    let out = trinity(ws.path(), &["plugins", "list", "--plugin", lib.to_str().unwrap()]);
    assert_clean_failure(
        &out,
        &[
            "libold_sdk.so",
            "built against trinity-plugin-sdk 9.0.0",
            "this trinity accepts 0.1.x",
            "rebuild it against trinity-plugin-sdk 0.1.0",
        ],
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn sha256_of(path: &Path) -> String {
    trinity_registry::sha256_hex(&std::fs::read(path).unwrap())
}

/// A registry index in `dir` offering example A as `artifact` with the given sha256, signed by a publisher key
/// made with `trinity plugins keygen` and `trinity plugins sign`; returns the index and the public key.
fn registry(dir: &Path, artifact: &Path, sha256: &str) -> (PathBuf, String) {
    let index = dir.join("index.toml");
    let body = format!(
        "[[plugin]]\nname = \"algo-example-a\"\nkind = \"algorithm\"\nversion = \"0.1.0\"\napi = \"^0.1\"\n\
         url = \"{}\"\nsha256 = \"{sha256}\"\n",
        artifact.file_name().unwrap().to_str().unwrap()
    );
    std::fs::write(&index, body).unwrap();
    let keygen = trinity(dir, &["plugins", "keygen", "--out", "publisher.key"]);
    assert!(keygen.status.success(), "{}", stderr(&keygen));
    let public = stdout(&keygen).trim().to_owned();
    let signed = trinity(dir, &["plugins", "sign", "index.toml", "--key", "publisher.key"]);
    assert!(signed.status.success(), "{}", stderr(&signed));
    assert!(std::fs::read_to_string(&index).unwrap().contains("signature = "));
    (index, public)
}

/// `trinity plugins trust KEY` in `project`.
fn trust(project: &Path, key: &str) {
    let out = trinity(project, &["plugins", "trust", key]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn an_installed_plugin_is_pinned_loaded_by_name_and_a_tampered_one_refused() {
    let (a, _) = examples();
    let reg = tempfile::tempdir().unwrap();
    let artifact = reg.path().join("libalgo_example_a.so");
    std::fs::copy(a, &artifact).unwrap();
    let (index, publisher) = registry(reg.path(), &artifact, &sha256_of(&artifact));
    let project = tempfile::tempdir().unwrap();
    let url = format!("file://{}", index.display());
    // Nobody trusted yet: refused, saying how to trust the publisher.
    let out = trinity(project.path(), &["plugins", "install", "algo-example-a@0.1.0", "--registry", &url]);
    assert_clean_failure(&out, &["no publisher key is trusted", "trinity plugins trust KEY"]);
    trust(project.path(), &publisher);
    let out = trinity(project.path(), &["plugins", "install", "algo-example-a@0.1.0", "--registry", &url]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lock = std::fs::read_to_string(project.path().join("trinity-plugins.lock")).unwrap();
    assert!(lock.contains("name = \"algo-example-a\"") && lock.contains(&sha256_of(&artifact)), "{lock}");
    let stored = project.path().join(".trinity/plugins/algo-example-a/0.1.0/libalgo_example_a.so");
    assert_eq!(sha256_of(&stored), sha256_of(&artifact));

    // Used by name: the lock resolves it; `plugins list` shows it installed.
    let input = r#"{"policy_loss_fn": "vanilla_pg", "batch": {"logprob": [[-1.0]], "advantages": [[2.0]], "action_mask": [[1]]}}"#;
    std::fs::write(project.path().join("input.json"), input).unwrap();
    let out = trinity(project.path(), &["algorithm", "eval", "--plugin", "algo-example-a", "--input", "input.json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("\"pg_loss\": 2.0"), "{}", stdout(&out));
    let list = trinity(project.path(), &["plugins", "list"]);
    assert!(stdout(&list).lines().any(|l| l.starts_with("installed algorithm") && l.contains("algo-example-a")));

    // `trinity run` loads it by name from `plugins:`, and the library's preset drives the algorithm section.
    let config = format!(
        "plugins: [algo-example-a]
algorithm:
  algorithm_type: vanilla
{}    default_workflow_type: simple_workflow
",
        model_and_tasks(&tiny_model_dir(), 40)
    );
    std::fs::write(project.path().join("config.yaml"), config).unwrap();
    std::fs::write(project.path().join("tasks.jsonl"), "{\"prompt\": \"a\", \"response\": \"b\"}\n").unwrap();
    let dry = trinity(project.path(), &["run", "--config", "config.yaml", "--dry-run"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    let resolved = stdout(&dry);
    assert!(resolved.contains("policy_loss_fn: vanilla_pg") && resolved.contains("advantage_fn: grpo"), "{resolved}");

    // Changed after install: refused at load.
    let mut bytes = std::fs::read(&stored).unwrap();
    bytes.extend_from_slice(b"tampered");
    std::fs::write(&stored, bytes).unwrap();
    let out = trinity(project.path(), &["algorithm", "eval", "--plugin", "algo-example-a", "--input", "input.json"]);
    assert_clean_failure(&out, &["installed plugin `algo-example-a`", "refusing to load it"]);

    // Tampered in the registry: refused at install, nothing pinned.
    let fresh = tempfile::tempdir().unwrap();
    trust(fresh.path(), &publisher);
    let mut bytes = std::fs::read(&artifact).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&artifact, bytes).unwrap();
    let out = trinity(fresh.path(), &["plugins", "install", "algo-example-a", "--registry", index.to_str().unwrap()]);
    assert_clean_failure(&out, &["plugin `algo-example-a` 0.1.0", "refusing it (tampered or corrupted)"]);
    assert!(trinity_registry::Lock::read(fresh.path()).unwrap().plugins.is_empty(), "nothing pinned");
    assert!(!fresh.path().join(".trinity").exists());
}
