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
