//! The versions a host and a library must agree on, fixed when each side is compiled.
//!
//! abi_stable checks the layout of everything reachable from the root module, but tensors cross as raw libtorch
//! handles that no layout describes. Their meaning depends on tch's C++ glue (compiled into each side) and on the
//! libtorch headers it was compiled against, so those versions are compared too.

/// The SDK release this side was compiled with. Libraries and hosts must agree on it in Cargo's sense
/// (same major version, and the same minor version while the major is 0).
pub const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The tch release of the tensor glue; `Cargo.toml` pins tch to exactly this version (`=0.24.0`), which is what
/// keeps this constant true.
pub const TCH_VERSION: &str = "0.24.0";

/// The libtorch release tch's glue was compiled against, read by `build.rs` from the libtorch torch-sys linked
/// (`unknown` when it could not tell, which never matches).
pub const LIBTORCH_VERSION: &str = env!("TRINITY_LIBTORCH_VERSION");

/// The versions of one side of the boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    /// trinity-plugin-sdk.
    pub sdk: String,
    /// tch (its C++ glue).
    pub tch: String,
    /// The libtorch headers the glue was compiled against.
    pub libtorch: String,
}

impl Versions {
    /// The versions this code was compiled with.
    pub fn current() -> Self {
        Versions { sdk: SDK_VERSION.to_owned(), tch: TCH_VERSION.to_owned(), libtorch: LIBTORCH_VERSION.to_owned() }
    }
}

/// Whether a library built with SDK `library` may be loaded by a host built with SDK `host`: Cargo's
/// compatibility rule, because within it the SDK only adds (new trailing root-module fields, new helpers).
pub fn sdk_compatible(host: &str, library: &str) -> bool {
    match (parse(host), parse(library)) {
        (Some(h), Some(l)) => h.0 == l.0 && (h.0 != 0 || h.1 == l.1),
        _ => false,
    }
}

/// The range of SDK versions a host accepts, for messages (`0.1.x`, `2.x`).
pub fn sdk_range(host: &str) -> String {
    match parse(host) {
        Some((0, minor)) => format!("0.{minor}.x"),
        Some((major, _)) => format!("{major}.x"),
        None => host.to_owned(),
    }
}

fn parse(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.split(['.', '-', '+']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_compatibility() {
        assert!(sdk_compatible("0.1.0", "0.1.7"));
        assert!(!sdk_compatible("0.1.0", "0.2.0"));
        assert!(!sdk_compatible("0.1.0", "99.0.0"));
        assert!(sdk_compatible("1.2.0", "1.0.3"));
        assert!(!sdk_compatible("1.2.0", "2.0.0"));
        assert!(!sdk_compatible("0.1.0", "garbage"));
        assert_eq!(sdk_range("0.1.0"), "0.1.x");
        assert_eq!(sdk_range("3.4.5"), "3.x");
    }

    #[test]
    fn the_libtorch_version_was_found() {
        assert_ne!(LIBTORCH_VERSION, "unknown", "build.rs could not read the libtorch version");
        assert!(LIBTORCH_VERSION.starts_with(|c: char| c.is_ascii_digit()), "{LIBTORCH_VERSION}");
    }
}
