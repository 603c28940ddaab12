//! `launch` with torchrun's environment, end to end: the launched ranks read it, rank 0 hosts the store and all
//! of them form a group.

use std::ffi::OsString;
use std::time::Duration;

use tch::Tensor;
use trinity_collective::{DistEnv, LaunchOptions, ReduceOp, launch};

/// The entry point of a launched rank; returns at once in an ordinary test run.
#[test]
fn launched_child() {
    let Some(env) = DistEnv::from_env().unwrap() else { return };
    let (_store, group) = env.process_group("launched", Duration::from_secs(20)).unwrap();
    let mut t = Tensor::from_slice(&[env.rank as f32 + 1.0]);
    group.allreduce(&mut t, ReduceOp::Sum).unwrap();
    assert_eq!(t.double_value(&[0]), 3.0);
    assert_eq!(env.local_rank, env.rank);
}

#[test]
fn launched_processes_form_a_group_from_the_environment() {
    let exe: OsString = std::env::current_exe().unwrap().into();
    let args: Vec<OsString> = ["launched::launched_child", "--exact", "--nocapture"].map(OsString::from).to_vec();
    let options =
        LaunchOptions { nproc_per_node: 2, master_port: 0, grace: Duration::from_secs(5), ..Default::default() };
    launch(&options, &exe, &args).unwrap();
}
