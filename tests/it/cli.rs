//! What users see from the command line itself.

use crate::support::{stdout, trinity};

#[test]
fn help_lists_the_commands_and_documents_every_flag() {
    let dir = tempfile::tempdir().unwrap();
    let output = trinity(dir.path(), &["--help"]);
    assert!(output.status.success());
    insta::assert_snapshot!("help", stdout(&output));
    let output = trinity(dir.path(), &["run", "--help"]);
    assert!(output.status.success());
    insta::assert_snapshot!("run_help", stdout(&output));
    let output = trinity(dir.path(), &["launch", "--help"]);
    assert!(output.status.success());
    insta::assert_snapshot!("launch_help", stdout(&output));
}

#[test]
fn unknown_subcommands_and_flags_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let output = trinity(dir.path(), &["rnu"]);
    assert_eq!(output.status.code(), Some(2));
    let output = trinity(dir.path(), &["run"]);
    assert_eq!(output.status.code(), Some(2), "--config is required");
}

/// The environment of a running `trinity studio` started with `set` (name, value) pairs after removing libgomp's
/// wait variables, read from `/proc` once the server has printed its address (after any re-execution).
fn environment_of_a_running_trinity(set: &[(&str, &str)]) -> String {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_trinity"));
    command
        .current_dir(dir.path())
        .args(["studio", "--root", ".", "--listen", "127.0.0.1:0"])
        .env_remove("OMP_WAIT_POLICY")
        .env_remove("GOMP_SPINCOUNT")
        .stdout(Stdio::piped());
    for (name, value) in set {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("trinity studio starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("the studio prints its address");
    let environ = std::fs::read(format!("/proc/{}/environ", child.id()));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(line.starts_with("studio: "), "unexpected first line: {line:?}");
    String::from_utf8_lossy(&environ.expect("/proc/PID/environ is readable")).replace('\0', "\n")
}

/// libgomp reads its wait variables before `main`, so trinity re-executes itself with `GOMP_SPINCOUNT=3000`
/// (threads spin briefly between parallel regions, then sleep); a user's own choice stands.
#[test]
fn openmp_threads_spin_briefly_unless_the_user_chose() {
    let environ = environment_of_a_running_trinity(&[]);
    assert!(environ.lines().any(|line| line == "GOMP_SPINCOUNT=3000"), "environment:\n{environ}");
    assert!(!environ.lines().any(|line| line.starts_with("OMP_WAIT_POLICY=")), "environment:\n{environ}");
    let environ = environment_of_a_running_trinity(&[("OMP_WAIT_POLICY", "passive")]);
    assert!(environ.lines().any(|line| line == "OMP_WAIT_POLICY=passive"), "environment:\n{environ}");
    assert!(!environ.lines().any(|line| line.starts_with("GOMP_SPINCOUNT=")), "environment:\n{environ}");
    let environ = environment_of_a_running_trinity(&[("GOMP_SPINCOUNT", "1000")]);
    assert!(environ.lines().any(|line| line == "GOMP_SPINCOUNT=1000"), "environment:\n{environ}");
}
