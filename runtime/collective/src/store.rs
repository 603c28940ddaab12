//! c10d's key-value store over TCP: where processes meet before they form a process group.
//!
//! One process hosts the store ([`Store::server`]; torchrun's `MASTER_ADDR:MASTER_PORT` on rank 0, the trainer for
//! weight sync), the others connect ([`Store::client`]). Every blocking call ends with an error after the store's
//! timeout. Keys live as long as the server: a group built twice on the same store needs a fresh prefix each time
//! ([`Store::with_prefix`]).

use std::ffi::{CString, c_char};
use std::ptr::NonNull;
use std::time::Duration;

use crate::error::{CollectiveError, Result};
use crate::ffi::{self, RawStore, millis, take_bytes, take_error};

/// A TCPStore, or a prefixed view of one.
#[derive(Debug)]
pub struct Store {
    raw: NonNull<RawStore>,
    timeout: Duration,
}

// SAFETY: c10d's TCPStore client serialises its operations behind its own mutex and PrefixStore only forwards to
// it; the handle may be used and dropped from any thread.
unsafe impl Send for Store {}
// SAFETY: see `Send`; every method goes through the thread-safe c10d store.
unsafe impl Sync for Store {}

fn c_string(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| CollectiveError::InvalidArgument(format!("{what} {s:?} contains a NUL byte")))
}

impl Store {
    /// Hosts a store on `host:port` (port 0 picks a free port; see [`Store::port`]). `host` is the address clients
    /// use; the server listens on every interface, as c10d's does.
    pub fn server(host: &str, port: u16, timeout: Duration) -> Result<Self> {
        Self::tcp(host, port, true, timeout)
    }

    /// Connects to the store at `host:port`, retrying until `timeout` while the server is not up yet.
    pub fn client(host: &str, port: u16, timeout: Duration) -> Result<Self> {
        Self::tcp(host, port, false, timeout)
    }

    fn tcp(host: &str, port: u16, is_server: bool, timeout: Duration) -> Result<Self> {
        let c_host = c_string("host", host)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `c_host` outlives the call; `raw` is written only on success.
        let result = unsafe { ffi::trinity_store_tcp(c_host.as_ptr(), port, is_server, -1, millis(timeout), &mut raw) };
        let op = if is_server { "store server" } else { "store client" };
        take_error(result).map_err(|m| CollectiveError::from_backend(op, format!("{host}:{port}: {m}"), timeout))?;
        let raw = NonNull::new(raw)
            .ok_or_else(|| CollectiveError::Backend { op, message: "the shim returned no store".into() })?;
        Ok(Store { raw, timeout })
    }

    /// The TCP port of the underlying TCPStore (the one chosen when the server asked for port 0).
    pub fn port(&self) -> u16 {
        // SAFETY: `raw` is a live store handle.
        unsafe { ffi::trinity_store_port(self.raw.as_ptr()) }
    }

    /// The timeout of blocking calls ([`Store::get`], and the group rendezvous built on it).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Changes the timeout of blocking calls.
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<()> {
        // SAFETY: `raw` is a live store handle.
        take_error(unsafe { ffi::trinity_store_set_timeout(self.raw.as_ptr(), millis(timeout)) })
            .map_err(|message| CollectiveError::Backend { op: "store timeout", message })?;
        self.timeout = timeout;
        Ok(())
    }

    /// A view of this store whose keys all start with `prefix` (c10d's PrefixStore; it adds a `/`).
    pub fn with_prefix(&self, prefix: &str) -> Result<Store> {
        let c_prefix = c_string("store prefix", prefix)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `self.raw` is live, `c_prefix` outlives the call; `raw` is written only on success.
        take_error(unsafe { ffi::trinity_store_prefix(self.raw.as_ptr(), c_prefix.as_ptr(), &mut raw) })
            .map_err(|message| CollectiveError::Backend { op: "store prefix", message })?;
        let raw = NonNull::new(raw).ok_or_else(|| CollectiveError::Backend {
            op: "store prefix",
            message: "the shim returned no store".into(),
        })?;
        Ok(Store { raw, timeout: self.timeout })
    }

    fn fail(&self, op: &'static str, key: &str, message: String) -> CollectiveError {
        CollectiveError::from_backend(op, format!("key {key:?}: {message}"), self.timeout)
    }

    /// Sets `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let c_key = c_string("key", key)?;
        // SAFETY: pointers are valid for the call; the shim copies the value.
        take_error(unsafe { ffi::trinity_store_set(self.raw.as_ptr(), c_key.as_ptr(), value.as_ptr(), value.len()) })
            .map_err(|m| self.fail("store set", key, m))
    }

    /// The value of `key`, waiting up to the store's timeout for it to be set.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        let c_key = c_string("key", key)?;
        let (mut data, mut len) = (std::ptr::null_mut(), 0usize);
        // SAFETY: pointers are valid for the call; `data`/`len` are written only on success.
        take_error(unsafe { ffi::trinity_store_get(self.raw.as_ptr(), c_key.as_ptr(), &mut data, &mut len) })
            .map_err(|m| self.fail("store get", key, m))?;
        // SAFETY: on success the shim handed over a malloc'd buffer of `len` bytes.
        Ok(unsafe { take_bytes(data, len) })
    }

    /// Adds `delta` to the integer at `key` (0 when unset) and returns the new value; atomic across clients.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let c_key = c_string("key", key)?;
        let mut out = 0i64;
        // SAFETY: pointers are valid for the call.
        take_error(unsafe { ffi::trinity_store_add(self.raw.as_ptr(), c_key.as_ptr(), delta, &mut out) })
            .map_err(|m| self.fail("store add", key, m))?;
        Ok(out)
    }

    /// Atomically sets `key` to `desired` when its value is `expected` (an unset key matches an empty
    /// `expected`); returns the value it holds afterwards.
    pub fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let c_key = c_string("key", key)?;
        let (mut data, mut len) = (std::ptr::null_mut(), 0usize);
        // SAFETY: pointers are valid for the call; `data`/`len` are written only on success.
        take_error(unsafe {
            ffi::trinity_store_compare_set(
                self.raw.as_ptr(),
                c_key.as_ptr(),
                expected.as_ptr(),
                expected.len(),
                desired.as_ptr(),
                desired.len(),
                &mut data,
                &mut len,
            )
        })
        .map_err(|m| self.fail("store compare_set", key, m))?;
        // SAFETY: on success the shim handed over a malloc'd buffer of `len` bytes.
        Ok(unsafe { take_bytes(data, len) })
    }

    /// Whether every key in `keys` is set (does not wait).
    pub fn check(&self, keys: &[&str]) -> Result<bool> {
        let c_keys = keys.iter().map(|k| c_string("key", k)).collect::<Result<Vec<_>>>()?;
        let ptrs: Vec<*const c_char> = c_keys.iter().map(|k| k.as_ptr()).collect();
        let mut out = false;
        // SAFETY: `ptrs` points into `c_keys`, both alive for the call.
        take_error(unsafe { ffi::trinity_store_check(self.raw.as_ptr(), ptrs.as_ptr(), ptrs.len(), &mut out) })
            .map_err(|m| self.fail("store check", &keys.join(","), m))?;
        Ok(out)
    }

    /// Waits until every key in `keys` is set, up to `timeout`.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let c_keys = keys.iter().map(|k| c_string("key", k)).collect::<Result<Vec<_>>>()?;
        let ptrs: Vec<*const c_char> = c_keys.iter().map(|k| k.as_ptr()).collect();
        // SAFETY: `ptrs` points into `c_keys`, both alive for the call.
        take_error(unsafe { ffi::trinity_store_wait(self.raw.as_ptr(), ptrs.as_ptr(), ptrs.len(), millis(timeout)) })
            .map_err(|m| CollectiveError::from_backend("store wait", format!("keys {keys:?}: {m}"), timeout))
    }

    /// Deletes `key`; returns whether it existed.
    pub fn delete(&self, key: &str) -> Result<bool> {
        let c_key = c_string("key", key)?;
        let mut out = false;
        // SAFETY: pointers are valid for the call.
        take_error(unsafe { ffi::trinity_store_delete(self.raw.as_ptr(), c_key.as_ptr(), &mut out) })
            .map_err(|m| self.fail("store delete", key, m))?;
        Ok(out)
    }

    pub(crate) fn raw(&self) -> *mut RawStore {
        self.raw.as_ptr()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: `raw` came from the shim and is freed once; groups built on it hold their own reference.
        unsafe { ffi::trinity_store_free(self.raw.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_and_a_client_share_keys() {
        let server = Store::server("127.0.0.1", 0, Duration::from_secs(5)).unwrap();
        assert_ne!(server.port(), 0);
        let client = Store::client("127.0.0.1", server.port(), Duration::from_secs(5)).unwrap();
        client.set("a", b"hello").unwrap();
        assert_eq!(server.get("a").unwrap(), b"hello");
        assert_eq!(server.add("n", 2).unwrap(), 2);
        assert_eq!(client.add("n", 3).unwrap(), 5);
        assert!(client.check(&["a", "n"]).unwrap());
        assert!(!client.check(&["missing"]).unwrap());
        assert_eq!(client.compare_set("c", b"", b"1").unwrap(), b"1");
        assert_eq!(server.compare_set("c", b"", b"2").unwrap(), b"1");
        let prefixed = client.with_prefix("p").unwrap();
        prefixed.set("a", b"other").unwrap();
        assert_eq!(server.get("p/a").unwrap(), b"other");
        assert!(server.delete("a").unwrap());
    }

    #[test]
    fn a_missing_key_times_out_with_an_error() {
        let mut server = Store::server("127.0.0.1", 0, Duration::from_secs(5)).unwrap();
        server.set_timeout(Duration::from_millis(200)).unwrap();
        let start = std::time::Instant::now();
        let err = server.get("never").unwrap_err();
        assert!(err.is_timeout(), "{err}");
        assert!(start.elapsed() < Duration::from_secs(3));
        let err = server.wait(&["never"], Duration::from_millis(100)).unwrap_err();
        assert!(err.is_timeout(), "{err}");
    }

    #[test]
    fn a_client_without_a_server_fails_within_its_timeout() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let start = std::time::Instant::now();
        let err = Store::client("127.0.0.1", port, Duration::from_millis(500)).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5), "{err}");
    }
}
