//! Installs over loopback HTTP(S): what is accepted, and every way a network can lie that is refused before
//! anything is stored or pinned.

use std::path::Path;

use trinity_registry::{
    FetchOptions, Index, Lock, PLUGIN_DIR, RegistryError, Request, Version, install_with, parse_secret_key,
    public_key_hex, sha256_hex,
};

use crate::server::{Length, Reply, Server, TestCa};

const ARTIFACT: &[u8] = b"\x7fELF pretend shared library bytes";

fn api(kind: &str) -> Option<Version> {
    (kind == "algorithm").then(|| Version::new(0, 1, 0))
}

/// The publisher's secret key (a fixed seed: tests must reproduce) and a stranger's.
const PUBLISHER: &str = "0707070707070707070707070707070707070707070707070707070707070707";
const STRANGER: &str = "0909090909090909090909090909090909090909090909090909090909090909";

/// An index with one release of `x`, unsigned, whose artifact is at `url` and hashes to `sha256`.
fn unsigned_index(url: &str, sha256: &str, size: Option<u64>) -> String {
    let size = size.map(|n| format!("size = {n}\n")).unwrap_or_default();
    format!(
        "[[plugin]]\nname = \"x\"\nkind = \"algorithm\"\nversion = \"0.3.0\"\napi = \"^0.1\"\nurl = \"{url}\"\n\
         sha256 = \"{sha256}\"\n{size}"
    )
}

/// [`unsigned_index`] signed by `secret`.
fn index_signed_by(secret: &str, url: &str, sha256: &str, size: Option<u64>) -> String {
    Index::sign(&unsigned_index(url, sha256, size), &parse_secret_key(secret).unwrap()).unwrap()
}

/// [`unsigned_index`] signed by the publisher.
fn index(url: &str, sha256: &str, size: Option<u64>) -> String {
    index_signed_by(PUBLISHER, url, sha256, size)
}

fn trusting(ca: &TestCa) -> FetchOptions {
    FetchOptions { trusted_roots: Some(vec![ca.ca_der.clone()]), ..FetchOptions::default() }
}

/// A project that trusts the publisher's key, as `trinity plugins trust KEY` leaves it.
fn trusting_project() -> tempfile::TempDir {
    let project = tempfile::tempdir().unwrap();
    let mut lock = Lock::read(project.path()).unwrap();
    assert!(lock.trust(&public_key_hex(&parse_secret_key(PUBLISHER).unwrap())).unwrap());
    lock.write().unwrap();
    project
}

fn install(
    registry: &str,
    project: &Path,
    options: &FetchOptions,
) -> Result<trinity_registry::LockedPlugin, Box<RegistryError>> {
    install_with(&Request::parse("x").unwrap(), registry, project, &api, options).map_err(Box::new)
}

/// Nothing of a failed install is left: no plugin folder, no pin, no download; the lock file holds only what was
/// there before (the trusted key).
fn nothing_stored(project: &Path) {
    assert!(!project.join(PLUGIN_DIR).exists(), "a plugin folder was created");
    assert!(Lock::read(project).unwrap().plugins.is_empty(), "something was pinned");
    let left: Vec<_> = std::fs::read_dir(project)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|name| name != trinity_registry::LOCK_FILE)
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

#[test]
fn unsigned_and_wrongly_signed_releases_are_refused_before_the_download() {
    let ca = TestCa::new();
    let server = Server::https(&ca);
    let hash = sha256_hex(ARTIFACT);
    server.route("/unsigned/index.toml", Reply::ok(unsigned_index("libx.so", &hash, None)));
    server.route("/stranger/index.toml", Reply::ok(index_signed_by(STRANGER, "libx.so", &hash, None)));
    // A genuine entry relabelled: an old release passed off as a newer version keeps the old signature.
    let relabelled = index("libx.so", &hash, None).replace("version = \"0.3.0\"", "version = \"0.4.0\"");
    server.route("/relabelled/index.toml", Reply::ok(relabelled));
    let cases = [
        ("/unsigned/index.toml", "no `signature`"),
        ("/stranger/index.toml", "no key trusted in"),
        ("/relabelled/index.toml", "does not verify"),
    ];
    for (index, why) in cases {
        server.route(&index.replace("index.toml", "libx.so"), Reply::ok(ARTIFACT));
        let project = trusting_project();
        let err = install(&server.url(index), project.path(), &trusting(&ca)).unwrap_err();
        assert!(matches!(*err, RegistryError::Unsigned { .. } | RegistryError::BadSignature { .. }), "{index}: {err}");
        assert!(err.to_string().contains("plugin `x`") && err.to_string().contains(why), "{index}: {err}");
        nothing_stored(project.path());
    }
    assert!(
        server.hits().iter().all(|hit| hit.ends_with("index.toml")),
        "an artifact was fetched: {:?}",
        server.hits()
    );
    // A project that trusts nobody installs nothing, and says how to trust a publisher.
    server.route("/index.toml", Reply::ok(index("libx.so", &hash, None)));
    let project = tempfile::tempdir().unwrap();
    let err = install(&server.url("/index.toml"), project.path(), &trusting(&ca)).unwrap_err();
    assert!(matches!(*err, RegistryError::NoTrustedKey { .. }), "{err}");
    assert!(err.to_string().contains("trinity plugins trust KEY"), "{err}");
    nothing_stored(project.path());
}

#[test]
fn installs_over_https_end_to_end() {
    let ca = TestCa::new();
    let server = Server::https(&ca);
    server
        .route("/r/index.toml", Reply::ok(index("files/libx.so", &sha256_hex(ARTIFACT), Some(ARTIFACT.len() as u64))));
    server.route("/r/files/libx.so", Reply::ok(ARTIFACT));
    let project = trusting_project();
    let pinned = install(&server.url("/r/index.toml"), project.path(), &trusting(&ca)).unwrap();
    assert_eq!(std::fs::read(project.path().join(&pinned.path)).unwrap(), ARTIFACT);
    assert_eq!(pinned.source, server.url("/r/files/libx.so"));
    assert_eq!(Lock::read(project.path()).unwrap().resolve("x").unwrap(), Some(project.path().join(&pinned.path)));
    assert_eq!(server.hits(), ["/r/index.toml", "/r/files/libx.so"]);
}

#[test]
fn an_https_redirect_within_https_is_followed() {
    let ca = TestCa::new();
    let server = Server::https(&ca);
    server.route("/old/index.toml", Reply::redirect("/r/index.toml"));
    server.route("/r/index.toml", Reply::ok(index("libx.so", &sha256_hex(ARTIFACT), None)));
    server.route("/r/libx.so", Reply::redirect(&server.url("/cdn/libx.so")));
    server.route("/cdn/libx.so", Reply::ok(ARTIFACT));
    let project = trusting_project();
    install(&server.url("/old/index.toml"), project.path(), &trusting(&ca)).unwrap();
}

#[test]
fn an_unknown_certificate_authority_is_refused() {
    let ca = TestCa::new();
    let server = Server::https(&ca);
    server.route("/index.toml", Reply::ok(index("libx.so", &sha256_hex(ARTIFACT), None)));
    let project = trusting_project();
    // Mozilla's roots do not include the test CA.
    let err = install(&server.url("/index.toml"), project.path(), &FetchOptions::default()).unwrap_err();
    assert!(matches!(*err, RegistryError::Fetch { .. }), "{err}");
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
    nothing_stored(project.path());
}

#[test]
fn plain_http_is_refused_unless_allowed() {
    let server = Server::http();
    server.route("/index.toml", Reply::ok(index("libx.so", &sha256_hex(ARTIFACT), None)));
    server.route("/libx.so", Reply::ok(ARTIFACT));
    let project = trusting_project();
    let err = install(&server.url("/index.toml"), project.path(), &FetchOptions::default()).unwrap_err();
    assert!(matches!(*err, RegistryError::InsecureHttp { .. }), "{err}");
    assert!(err.to_string().contains("vouch for nothing"), "{err}");
    assert!(server.hits().is_empty(), "the refused index was requested anyway");
    nothing_stored(project.path());

    let allowed = FetchOptions { allow_insecure_http: true, ..FetchOptions::default() };
    let pinned = install(&server.url("/index.toml"), project.path(), &allowed).unwrap();
    assert_eq!(std::fs::read(project.path().join(&pinned.path)).unwrap(), ARTIFACT);
}

#[test]
fn an_https_index_naming_an_http_artifact_is_refused() {
    let ca = TestCa::new();
    let server = Server::https(&ca);
    let plain = Server::http();
    plain.route("/libx.so", Reply::ok(ARTIFACT));
    server.route("/index.toml", Reply::ok(index(&plain.url("/libx.so"), &sha256_hex(ARTIFACT), None)));
    let project = trusting_project();
    let err = install(&server.url("/index.toml"), project.path(), &trusting(&ca)).unwrap_err();
    assert!(matches!(*err, RegistryError::InsecureHttp { .. }), "{err}");
    assert!(plain.hits().is_empty());
    nothing_stored(project.path());
}

#[test]
fn a_redirect_from_https_to_http_is_refused_even_when_http_is_allowed() {
    let ca = TestCa::new();
    let server = Server::https(&ca);
    let plain = Server::http();
    plain.route("/libx.so", Reply::ok(ARTIFACT));
    server.route("/index.toml", Reply::ok(index("libx.so", &sha256_hex(ARTIFACT), None)));
    server.route("/libx.so", Reply::redirect(&plain.url("/libx.so")));
    let project = trusting_project();
    let options = FetchOptions { allow_insecure_http: true, ..trusting(&ca) };
    let err = install(&server.url("/index.toml"), project.path(), &options).unwrap_err();
    assert!(matches!(*err, RegistryError::Downgrade { .. }), "{err}");
    assert!(err.to_string().contains(&plain.url("/libx.so")), "{err}");
    assert!(plain.hits().is_empty(), "the downgraded location was fetched");
    nothing_stored(project.path());
}

#[test]
fn a_tampered_artifact_is_refused() {
    let ca = TestCa::new();
    let server = Server::https(&ca);
    server.route("/index.toml", Reply::ok(index("libx.so", &sha256_hex(ARTIFACT), None)));
    server.route("/libx.so", Reply::ok(b"evil bytes".to_vec()));
    let project = trusting_project();
    let err = install(&server.url("/index.toml"), project.path(), &trusting(&ca)).unwrap_err();
    assert!(matches!(*err, RegistryError::Checksum { .. }), "{err}");
    assert!(err.to_string().contains(&sha256_hex(b"evil bytes")), "{err}");
    nothing_stored(project.path());
}

#[test]
fn oversized_bodies_are_refused_declared_or_not() {
    let ca = TestCa::new();
    let server = Server::https(&ca);
    let big = vec![0u8; 5000];
    server.route("/index.toml", Reply::ok(index("declared.so", &sha256_hex(&big), None)));
    server.route("/declared.so", Reply::ok(big.clone()));
    server.route("/streamed/index.toml", Reply::ok(index("big.so", &sha256_hex(&big), None)));
    server.route("/streamed/big.so", Reply::ok(big.clone()).with_length(Length::UntilClose));
    server.route("/sized/index.toml", Reply::ok(index("big.so", &sha256_hex(&big), Some(100))));
    server.route("/sized/big.so", Reply::ok(big.clone()).with_length(Length::UntilClose));
    let small = FetchOptions { max_artifact_bytes: 1000, ..trusting(&ca) };
    for (index, options) in
        [("/index.toml", &small), ("/streamed/index.toml", &small), ("/sized/index.toml", &trusting(&ca))]
    {
        let project = trusting_project();
        let err = install(&server.url(index), project.path(), options).unwrap_err();
        assert!(matches!(*err, RegistryError::TooLarge { .. }), "{index}: {err}");
        nothing_stored(project.path());
    }
    // An index over its own cap.
    let project = trusting_project();
    let tiny_index = FetchOptions { max_index_bytes: 10, ..trusting(&ca) };
    let err = install(&server.url("/index.toml"), project.path(), &tiny_index).unwrap_err();
    assert!(matches!(*err, RegistryError::TooLarge { limit: 10, .. }), "{err}");
}

#[test]
fn a_truncated_or_short_body_is_refused() {
    let ca = TestCa::new();
    let server = Server::https(&ca);
    server.route("/index.toml", Reply::ok(index("libx.so", &sha256_hex(ARTIFACT), None)));
    server.route("/libx.so", Reply::ok(&ARTIFACT[..10]).with_length(Length::Declared(ARTIFACT.len() as u64)));
    let project = trusting_project();
    let err = install(&server.url("/index.toml"), project.path(), &trusting(&ca)).unwrap_err();
    assert!(matches!(*err, RegistryError::Fetch { .. }), "{err}");
    nothing_stored(project.path());
    // A body cut short where nothing declares its length fails the index's size.
    server.route("/sized/index.toml", Reply::ok(index("libx.so", &sha256_hex(ARTIFACT), Some(ARTIFACT.len() as u64))));
    server.route("/sized/libx.so", Reply::ok(&ARTIFACT[..10]).with_length(Length::UntilClose));
    let err = install(&server.url("/sized/index.toml"), project.path(), &trusting(&ca)).unwrap_err();
    assert!(matches!(*err, RegistryError::Size { actual: 10, .. }), "{err}");
    nothing_stored(project.path());
}

#[test]
fn a_remote_index_cannot_name_a_local_file() {
    let ca = TestCa::new();
    let server = Server::https(&ca);
    let local = tempfile::tempdir().unwrap();
    std::fs::write(local.path().join("libx.so"), ARTIFACT).unwrap();
    let url = format!("file://{}", local.path().join("libx.so").display());
    server.route("/index.toml", Reply::ok(index(&url, &sha256_hex(ARTIFACT), None)));
    let project = trusting_project();
    let err = install(&server.url("/index.toml"), project.path(), &trusting(&ca)).unwrap_err();
    assert!(matches!(*err, RegistryError::LocalArtifact { .. }), "{err}");
    nothing_stored(project.path());
}
