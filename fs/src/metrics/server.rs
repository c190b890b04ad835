//! `tierfs mount --metrics-addr ADDR`: the metrics over HTTP, for a scraper.
//!
//! **Contract.** `GET /metrics` (any query string) answers the text of [`super::render`] with
//! its `Content-Type`; `GET /stats` the stats document (JSON, as `.tierfs/stats`); `GET /` a
//! self-contained page (no script, style or font from elsewhere) that draws every model's
//! residency strip and the mount's figures from `/stats`, refreshed every second. Any other path
//! gets 404, any other method 405. One thread serves the
//! requests one after another (`tiny_http`): a scrape renders in well under a millisecond, and
//! a scraper asks every few seconds. A bare port means the loopback interface (`9567` is
//! `127.0.0.1:9567`): the metrics name the models in use, so exposing them on other interfaces
//! is asked for explicitly (`0.0.0.0:9567`). The server stops when the mount's [`MetricsServer`]
//! is dropped.
//!
//! **Who is answered** ([`check_host`]): a request whose `Host` names a loopback name
//! (`localhost`, `*.localhost`) or the address the server is bound to (any address of the
//! machine when bound to `0.0.0.0`/`[::]`). Anything else gets 403 with the reason. A web page a
//! browser opened elsewhere can point a name it controls at 127.0.0.1 (DNS rebinding) and read
//! the answers as its own; its requests then carry that name, never a loopback name or an
//! address, so they are refused.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use anyhow::{anyhow, Context, Result};
use tiny_http::{Header, Method, Response, Server};

/// What a request asks the mount for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// The metrics, as exposition text.
    Metrics,
    /// The stats document, as JSON.
    Stats,
}

/// The dashboard page served at `/`.
const DASHBOARD: &str = include_str!("dashboard.html");

/// `--metrics-addr`: `PORT` (loopback) or `HOST:PORT` / `[V6]:PORT`.
pub fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    text.parse::<SocketAddr>()
        .map_err(|e| format!("{text:?} is neither a port nor an address:port ({e})"))
}

/// The running endpoint.
pub struct MetricsServer {
    server: Arc<Server>,
    thread: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

impl MetricsServer {
    /// Listens on `addr` and answers each request for a [`Page`] with `render(page)`.
    pub fn start(
        addr: SocketAddr,
        render: impl Fn(Page) -> Vec<u8> + Send + 'static,
    ) -> Result<MetricsServer> {
        let server = Server::http(addr)
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .with_context(|| format!("the metrics server on {addr} has no IP address"))?;
        let server = Arc::new(server);
        let serving = Arc::clone(&server);
        let thread = thread::Builder::new()
            .name("tierfs-metrics".into())
            .spawn(move || serve(&serving, &render))
            .context("cannot start the metrics thread")?;
        tracing::info!(%addr, "serving metrics at http://{addr}/metrics");
        Ok(MetricsServer {
            server,
            thread: Some(thread),
            addr,
        })
    }

    /// Where it listens (the port chosen, if `addr` asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the metrics thread panicked");
            }
        }
    }
}

/// Whether a request whose `Host` header is `host` (None: absent) is answered by a server bound
/// to `bound`; `Err` says why not.
pub fn check_host(host: Option<&str>, bound: IpAddr) -> Result<(), String> {
    let Some(host) = host.map(str::trim).filter(|h| !h.is_empty()) else {
        return Err("the request names no Host".into());
    };
    let name = host_name(host).to_ascii_lowercase();
    let name = name.strip_suffix('.').unwrap_or(&name);
    if name == "localhost" || name.ends_with(".localhost") {
        return Ok(());
    }
    match name.parse::<IpAddr>() {
        Ok(ip) if ip == bound || bound.is_unspecified() => Ok(()),
        Ok(ip) => Err(format!(
            "Host {host:?} is the address {ip}, not the one this server is bound to ({bound})"
        )),
        Err(_) => Err(format!(
            "Host {host:?} is not a loopback name or an address of this server: refused, as a \
             page elsewhere could have pointed that name here (DNS rebinding); ask by address"
        )),
    }
}

/// The host part of a `Host` header: without its port, a v6 address without its brackets.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

fn serve(server: &Server, render: &dyn Fn(Page) -> Vec<u8>) {
    let bound = server
        .server_addr()
        .to_ip()
        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |addr| addr.ip());
    for request in server.incoming_requests() {
        let host = request
            .headers()
            .iter()
            .find(|h| h.field.equiv("Host"))
            .map(|h| h.value.as_str());
        if let Err(why) = check_host(host, bound) {
            tracing::debug!(%why, "refused a metrics request");
            let response =
                Response::from_string(format!("forbidden: {why}\n")).with_status_code(403);
            if let Err(e) = request.respond(response) {
                tracing::debug!(error = %e, "a refused request went away before its answer");
            }
            continue;
        }
        let path = request.url().split('?').next().unwrap_or_default();
        let response = match (request.method(), path) {
            (Method::Get | Method::Head, "/metrics") => {
                typed(render(Page::Metrics), super::CONTENT_TYPE)
            }
            (Method::Get | Method::Head, "/stats") => {
                typed(render(Page::Stats), "application/json")
            }
            (Method::Get | Method::Head, "/") => {
                typed(DASHBOARD.as_bytes().to_vec(), "text/html; charset=utf-8")
            }
            (Method::Get | Method::Head, _) => {
                Response::from_string("not found: the metrics are at /metrics\n")
                    .with_status_code(404)
            }
            _ => Response::from_string("method not allowed\n").with_status_code(405),
        };
        if let Err(e) = request.respond(response) {
            tracing::debug!(error = %e, "a metrics scrape went away before its answer");
        }
    }
}

fn typed(body: Vec<u8>, content_type: &str) -> Response<std::io::Cursor<Vec<u8>>> {
    let mut response = Response::from_data(body);
    if let Ok(header) = Header::from_bytes("Content-Type", content_type) {
        response.add_header(header);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_port_is_loopback_and_an_address_is_kept() {
        assert_eq!(parse_addr("9567"), Ok("127.0.0.1:9567".parse().unwrap()));
        assert_eq!(parse_addr("0.0.0.0:80"), Ok("0.0.0.0:80".parse().unwrap()));
        assert_eq!(parse_addr("[::1]:9567"), Ok("[::1]:9567".parse().unwrap()));
        assert!(parse_addr("localhost:x").is_err());
        assert!(parse_addr("70000").is_err());
    }

    #[test]
    fn only_loopback_names_and_the_bound_address_are_answered() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let any: IpAddr = "0.0.0.0".parse().unwrap();
        for ok in [
            "localhost",
            "localhost:9567",
            "LOCALHOST.",
            "tierfs.localhost:80",
            "127.0.0.1:9567",
            "127.0.0.1",
        ] {
            assert_eq!(check_host(Some(ok), lo), Ok(()), "{ok}");
        }
        assert_eq!(
            check_host(Some("[::1]:9567"), "::1".parse().unwrap()),
            Ok(())
        );
        assert_eq!(check_host(Some("10.1.2.3:9567"), any), Ok(()));
        for bad in [
            "attacker.example",
            "attacker.example:9567",
            "localhost.attacker.example",
            "127.0.0.1.nip.example",
            "10.1.2.3:9567",
            "[::1]:9567",
            "",
        ] {
            assert!(check_host(Some(bad), lo).is_err(), "{bad}");
        }
        assert!(check_host(None, lo).is_err());
        assert!(check_host(Some("attacker.example"), any).is_err());
    }
}
