//! Publisher signatures on index entries (ed25519).
//!
//! A sha256 in an index only says which bytes the index vouches for; whoever can change the index (a compromised
//! mirror, a hijacked domain) can change the hash with it. So every release carries a `signature`: ed25519, by the
//! publisher's key, over the release's identity and hash ([`signed_message`]: name, kind, version, API range,
//! sha256, size and platform, in a fixed text form). A project trusts publishers explicitly
//! (`trinity plugins trust KEY` pins the key in the lock file, [`crate::Lock::trust`]), and an install refuses a
//! release that is unsigned or whose signature no trusted key made, before anything is downloaded or written.
//!
//! The artifact's URL and description are not signed: a mirror may move the file, and the sha256 binds its bytes.
//! The version and API range are: an attacker cannot relabel an old, vulnerable release as a new one, or widen
//! the range of hosts it claims to work with. Keys and signatures are written as lowercase hex (64 and 128 digits).

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::error::RegistryError;
use crate::index::Release;

/// The first line of every signed message: a signature made for anything else never verifies as a release's.
const DOMAIN: &str = "trinity-plugin-release-v1";

/// The bytes a publisher signs for `release`.
pub fn signed_message(release: &Release) -> Vec<u8> {
    let size = release.size.map_or_else(|| "-".to_owned(), |n| n.to_string());
    format!(
        "{DOMAIN}\nname={}\nkind={}\nversion={}\napi={}\nsha256={}\nsize={size}\nplatform={}\n",
        release.name,
        release.kind,
        release.version,
        release.api,
        release.sha256,
        release.platform.as_deref().unwrap_or("-"),
    )
    .into_bytes()
}

/// Parses a publisher's public key (64 hex digits), refusing anything that is not a valid ed25519 point.
pub fn parse_public_key(text: &str) -> Result<VerifyingKey, RegistryError> {
    let bad = |message: String| RegistryError::Key { key: text.to_owned(), message };
    let bytes: [u8; 32] = hex_bytes(text.trim())
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| bad("an ed25519 public key is 64 hex digits".to_owned()))?;
    VerifyingKey::from_bytes(&bytes).map_err(|e| bad(format!("not a valid ed25519 public key: {e}")))
}

/// Parses a publisher's secret key (its 32-byte seed, 64 hex digits).
pub fn parse_secret_key(text: &str) -> Result<SigningKey, RegistryError> {
    let bytes: [u8; 32] = hex_bytes(text.trim()).and_then(|b| b.try_into().ok()).ok_or_else(|| RegistryError::Key {
        key: "(secret key)".to_owned(),
        message: "an ed25519 secret key is its 32-byte seed, 64 hex digits".to_owned(),
    })?;
    Ok(SigningKey::from_bytes(&bytes))
}

/// The public key of `secret`, as hex.
pub fn public_key_hex(secret: &SigningKey) -> String {
    public_key_hex_of(&secret.verifying_key())
}

/// `key` as the lock file writes it (lowercase hex).
pub fn public_key_hex_of(key: &VerifyingKey) -> String {
    hex(key.as_bytes())
}

/// `release`'s signature by `secret`, as hex: what a publisher writes into the index's `signature`.
pub fn sign_release(release: &Release, secret: &SigningKey) -> String {
    hex(&secret.sign(&signed_message(release)).to_bytes())
}

/// Checks that `release` is signed by one of `trusted` (hex public keys, as the lock file holds them).
pub fn verify_release(release: &Release, trusted: &[String], lock: &std::path::Path) -> Result<(), RegistryError> {
    let plugin = format!("`{}` {}", release.name, release.version);
    if trusted.is_empty() {
        return Err(RegistryError::NoTrustedKey { plugin, lock: lock.to_owned() });
    }
    let Some(text) = &release.signature else {
        return Err(RegistryError::Unsigned { plugin });
    };
    let signature = hex_bytes(text)
        .and_then(|b| <[u8; 64]>::try_from(b).ok())
        .map(|bytes| Signature::from_bytes(&bytes))
        .ok_or_else(|| RegistryError::BadSignature {
            plugin: plugin.clone(),
            message: "a signature is 128 hex digits".to_owned(),
        })?;
    let message = signed_message(release);
    for key in trusted {
        // Keys were checked when they were trusted; one that no longer parses cannot have signed anything.
        if let Ok(key) = parse_public_key(key)
            && key.verify_strict(&message, &signature).is_ok()
        {
            return Ok(());
        }
    }
    Err(RegistryError::BadSignature { plugin, message: format!("no key trusted in {} made it", lock.display()) })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Lowercase or uppercase hex digits as bytes; `None` for anything else.
fn hex_bytes(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| text.get(i..i + 2).and_then(|pair| u8::from_str_radix(pair, 16).ok())).collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn release() -> Release {
        let text = "[[plugin]]\nname = \"x\"\nkind = \"algorithm\"\nversion = \"0.3.0\"\napi = \"^0.1\"\n\
                    url = \"libx.so\"\nsha256 = \"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\"\n";
        let location = crate::fetch::Location::parse("/r/index.toml", Path::new("/")).unwrap();
        crate::Index::parse(text, location).unwrap().releases.remove(0)
    }

    #[test]
    fn a_signature_covers_the_version_and_hash_and_only_a_trusted_key_verifies() {
        let publisher = SigningKey::from_bytes(&[7; 32]);
        let stranger = SigningKey::from_bytes(&[9; 32]);
        let trusted = vec![public_key_hex(&publisher)];
        let lock = Path::new("/p/trinity-plugins.lock");
        let mut signed = release();
        signed.signature = Some(sign_release(&signed, &publisher));
        verify_release(&signed, &trusted, lock).unwrap();
        // Relabelled as another version, or another hash: the signature no longer verifies.
        let mut relabelled = signed.clone();
        relabelled.version = semver::Version::new(9, 9, 9);
        assert!(matches!(verify_release(&relabelled, &trusted, lock), Err(RegistryError::BadSignature { .. })));
        let mut rehashed = signed.clone();
        rehashed.sha256 = "0".repeat(64);
        assert!(matches!(verify_release(&rehashed, &trusted, lock), Err(RegistryError::BadSignature { .. })));
        // Signed by someone else, unsigned, or nobody trusted.
        let mut foreign = release();
        foreign.signature = Some(sign_release(&foreign, &stranger));
        let err = verify_release(&foreign, &trusted, lock).unwrap_err().to_string();
        assert!(err.contains("`x` 0.3.0") && err.contains("no key trusted in /p/trinity-plugins.lock"), "{err}");
        assert!(matches!(verify_release(&release(), &trusted, lock), Err(RegistryError::Unsigned { .. })));
        assert!(matches!(verify_release(&signed, &[], lock), Err(RegistryError::NoTrustedKey { .. })));
    }

    #[test]
    fn keys_are_checked_when_parsed() {
        let key = SigningKey::from_bytes(&[7; 32]);
        assert_eq!(public_key_hex(&parse_secret_key(&hex(&[7; 32])).unwrap()), public_key_hex(&key));
        parse_public_key(&public_key_hex(&key)).unwrap();
        assert!(parse_public_key("abc").unwrap_err().to_string().contains("64 hex digits"));
        assert!(parse_public_key(&"zz".repeat(32)).is_err());
    }
}
