//! A loopback HTTP(S) server for the tests: canned replies by path, one connection at a time, every request
//! recorded. HTTPS uses a throwaway CA made with rcgen, which the client is told to trust.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// How a reply's body is delimited.
#[derive(Debug, Clone, Copy)]
pub enum Length {
    /// `Content-Length` is the body's length.
    Exact,
    /// `Content-Length` says this many bytes, then the connection closes after the body (a truncated transfer
    /// when larger than the body).
    Declared(u64),
    /// No `Content-Length`: the body ends when the connection closes.
    UntilClose,
}

/// One canned reply.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub length: Length,
}

impl Reply {
    pub fn ok(body: impl Into<Vec<u8>>) -> Reply {
        Reply { status: 200, headers: Vec::new(), body: body.into(), length: Length::Exact }
    }

    pub fn redirect(to: &str) -> Reply {
        Reply { status: 302, headers: vec![("Location".into(), to.into())], body: Vec::new(), length: Length::Exact }
    }

    pub fn with_length(self, length: Length) -> Reply {
        Reply { length, ..self }
    }
}

type Routes = Arc<Mutex<HashMap<String, Reply>>>;

/// A running server; stops when dropped.
pub struct Server {
    port: u16,
    scheme: &'static str,
    routes: Routes,
    hits: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// A CA and the server certificate it signed for 127.0.0.1.
pub struct TestCa {
    pub ca_der: Vec<u8>,
    config: Arc<rustls::ServerConfig>,
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "trinity registry test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca).unwrap();
        let chain = vec![cert.der().clone(), CertificateDer::from(ca.der().to_vec())];
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .unwrap();
        TestCa { ca_der: ca.der().to_vec(), config: Arc::new(config) }
    }
}

impl Server {
    /// A plain HTTP server.
    pub fn http() -> Server {
        Server::start(None)
    }

    /// An HTTPS server with a certificate from `ca`.
    pub fn https(ca: &TestCa) -> Server {
        Server::start(Some(Arc::clone(&ca.config)))
    }

    fn start(tls: Option<Arc<rustls::ServerConfig>>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let routes: Routes = Arc::default();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let scheme = if tls.is_some() { "https" } else { "http" };
        let thread = {
            let (routes, hits, stop) = (Arc::clone(&routes), Arc::clone(&hits), Arc::clone(&stop));
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    // A client that gives up mid-transfer (an oversized body) breaks the pipe: not the test's concern.
                    let _ = serve(stream, tls.clone(), &routes, &hits);
                }
            })
        };
        Server { port, scheme, routes, hits, stop, thread: Some(thread) }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}://127.0.0.1:{}{path}", self.scheme, self.port)
    }

    pub fn route(&self, path: &str, reply: Reply) {
        self.routes.lock().unwrap().insert(path.to_owned(), reply);
    }

    /// Paths requested so far.
    pub fn hits(&self) -> Vec<String> {
        self.hits.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(
    tcp: TcpStream,
    tls: Option<Arc<rustls::ServerConfig>>,
    routes: &Routes,
    hits: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    tcp.set_write_timeout(Some(Duration::from_secs(5)))?;
    match tls {
        None => answer(tcp, routes, hits).map(drop),
        Some(config) => {
            let connection = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
            let mut stream = rustls::StreamOwned::new(connection, tcp);
            // A body that ends at the close needs TLS's close_notify to be complete; a truncated one goes without.
            if !matches!(answer(&mut stream, routes, hits)?, Length::Declared(_)) {
                stream.conn.send_close_notify();
                stream.flush()?;
            }
            Ok(())
        }
    }
}

fn answer(mut stream: impl Read + Write, routes: &Routes, hits: &Mutex<Vec<String>>) -> std::io::Result<Length> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 << 10 {
        if stream.read(&mut byte)? == 0 {
            return Ok(Length::Exact);
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
    hits.lock().unwrap().push(path.clone());
    let reply = routes.lock().unwrap().get(&path).cloned().unwrap_or(Reply {
        status: 404,
        headers: Vec::new(),
        body: b"not found".to_vec(),
        length: Length::Exact,
    });
    let mut out = format!("HTTP/1.1 {} X\r\nConnection: close\r\n", reply.status);
    for (name, value) in &reply.headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    match reply.length {
        Length::Exact => out.push_str(&format!("Content-Length: {}\r\n", reply.body.len())),
        Length::Declared(n) => out.push_str(&format!("Content-Length: {n}\r\n")),
        Length::UntilClose => {}
    }
    out.push_str("\r\n");
    stream.write_all(out.as_bytes())?;
    stream.write_all(&reply.body)?;
    stream.flush()?;
    Ok(reply.length)
}
