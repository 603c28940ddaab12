//! Algorithm libraries loaded at run time (`--plugin libmy_algo.so`, `plugins:` in a config, installed plugins):
//! `cdylib`s built with trinity-plugin-sdk's `algorithm` feature, loaded through its abi_stable ABI.
//!
//! [`register_file`] loads a file, checks it (SDK, ABI layout, tch and libtorch versions, names) and adds its
//! components to a process-global list, which this crate offers to trinity-algorithm's registry once through
//! [`trinity_algorithm::external::ExternalComponents`]; from then on configs, `trinity algorithm eval` and the
//! trainer use the components by name exactly like built-ins. The dependency points this way (this crate on
//! trinity-algorithm) so the algorithm math never links abi_stable or libloading.

mod error;
mod library;

pub use error::LibraryError;
pub use library::{API_VERSION, ComponentInfo, LibraryInfo, loaded, register_file};
