//! The registry over real HTTP and HTTPS on loopback: installs, tampered and oversized artifacts, truncated
//! bodies, downgrade redirects and plain-http refusal.

mod http;
mod server;
