//! TLS for the receivers and the API (`tls.*`): rustls, its ring provider, TLS 1.2 and 1.3.
//!
//! The certificate chain and key are read from PEM files at start (a bad file is an error
//! then) and again whenever either file's modification time changes, checked at most once
//! a second on a handshake: a renewed certificate (cert-manager, certbot) is served without a
//! restart. A renewed pair that cannot be read is logged and the previous one kept. With
//! `tls.client_ca_file`, clients must present a certificate that CA signed (mutual TLS).
//!
//! Handshakes run on their own tasks, bounded by [`HANDSHAKE_TIMEOUT`], so a slow or
//! hostile client never holds up the accept loop; each failure is counted in
//! `stormglass_tls_handshake_failures_total{listener}`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use prometheus::{IntCounterVec, Opts, Registry};
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::server::TlsStream;

/// Longest a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often, at most, the certificate files are checked for a change.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// `tls.*` configuration. TLS is on when `cert_file` and `key_file` are set.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain, the server's certificate first.
    pub cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// PEM CA certificates; when set, clients must present a certificate signed by one.
    pub client_ca_file: Option<PathBuf>,
}

impl TlsConfig {
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => problems.push((
                format!("{prefix}.key_file"),
                "must be set with tls.cert_file".into(),
            )),
            (None, Some(_)) => problems.push((
                format!("{prefix}.cert_file"),
                "must be set with tls.key_file".into(),
            )),
            _ => {}
        }
        if self.client_ca_file.is_some() && self.cert_file.is_none() {
            problems.push((
                format!("{prefix}.client_ca_file"),
                "needs tls.cert_file and tls.key_file (client certificates are checked over TLS)"
                    .into(),
            ));
        }
        problems
    }
}

/// TLS could not be set up from the configured files.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {detail}", path.display())]
    File { path: PathBuf, detail: String },
    #[error("the TLS configuration is not usable: {0}")]
    Config(#[from] rustls::Error),
    #[error("client certificate verification: {0}")]
    Verifier(String),
    #[error("cannot register the TLS metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// The server side of TLS, shared by every listener. Cheap to clone.
#[derive(Clone)]
pub struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
    failures: IntCounterVec,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// TLS from `config`, or `None` when it is off.
    pub fn from_config(config: &TlsConfig, registry: &Registry) -> Result<Option<Tls>, TlsError> {
        let (Some(cert), Some(key)) = (&config.cert_file, &config.key_file) else {
            return Ok(None);
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let resolver = Arc::new(Reloading::new(cert, key)?);
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match &config.client_ca_file {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for certificate in read_certificates(ca)? {
                    roots.add(certificate).map_err(|e| TlsError::File {
                        path: ca.clone(),
                        detail: e.to_string(),
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| TlsError::Verifier(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut server = builder.with_cert_resolver(resolver);
        // gRPC needs HTTP/2; OTLP/HTTP and the API speak either.
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let failures = IntCounterVec::new(
            Opts::new(
                "stormglass_tls_handshake_failures_total",
                "TLS handshakes that failed or timed out (untrusted or missing client certificate, plain text on a TLS port, ...).",
            ),
            &["listener"],
        )?;
        registry.register(Box::new(failures.clone()))?;
        for listener in ["grpc", "http", "api"] {
            failures.with_label_values(&[listener]);
        }
        Ok(Some(Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            failures,
        }))
    }

    /// Accept connections on `listener` and complete their handshakes on their own tasks,
    /// until `shutdown`; `name` labels the failure counter.
    pub fn listen(
        &self,
        listener: TcpListener,
        name: &'static str,
        shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (sender, receiver) = mpsc::channel(64);
        let acceptor = self.acceptor.clone();
        let failures = self.failures.with_label_values(&[name]);
        tokio::spawn(async move {
            let stopped = crate::shutdown::wait_for(shutdown);
            tokio::pin!(stopped);
            loop {
                let (tcp, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            // Out of file descriptors and the like: wait, then go on.
                            tracing::warn!(listener = name, "accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                    () = &mut stopped => break,
                };
                let acceptor = acceptor.clone();
                let sender = sender.clone();
                let failures = failures.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = sender.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => {
                            failures.inc();
                            tracing::debug!(listener = name, %peer, "TLS handshake failed: {e}");
                        }
                        Err(_) => {
                            failures.inc();
                            tracing::debug!(listener = name, %peer, "TLS handshake timed out");
                        }
                    }
                });
            }
        });
        Ok(TlsListener { receiver, local })
    }
}

/// Connections whose TLS handshake completed: an axum [`axum::serve::Listener`], or a
/// stream for tonic ([`TlsListener::into_stream`]).
pub struct TlsListener {
    receiver: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// The connections as a stream, for tonic's `serve_with_incoming_shutdown`.
    pub fn into_stream(
        self,
    ) -> impl tokio_stream::Stream<Item = Result<TlsStream<TcpStream>, std::io::Error>> {
        use tokio_stream::StreamExt;
        tokio_stream::wrappers::ReceiverStream::new(self.receiver).map(|(stream, _)| Ok(stream))
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.receiver.recv().await {
            Some(accepted) => accepted,
            // The accept loop stopped at shutdown; axum stops on its own signal.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// The certificate, re-read from its files when they change.
#[derive(Debug)]
struct Reloading {
    cert_file: PathBuf,
    key_file: PathBuf,
    state: Mutex<CurrentCert>,
}

#[derive(Debug)]
struct CurrentCert {
    checked: Instant,
    modified: (Option<SystemTime>, Option<SystemTime>),
    key: Arc<CertifiedKey>,
}

impl Reloading {
    fn new(cert_file: &Path, key_file: &Path) -> Result<Reloading, TlsError> {
        let modified = (modified(cert_file), modified(key_file));
        let key = Arc::new(certified_key(cert_file, key_file)?);
        Ok(Reloading {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            state: Mutex::new(CurrentCert {
                checked: Instant::now(),
                modified,
                key,
            }),
        })
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let now = (modified(&self.cert_file), modified(&self.key_file));
            if now != state.modified {
                match certified_key(&self.cert_file, &self.key_file) {
                    Ok(key) => {
                        tracing::info!(cert = %self.cert_file.display(), "TLS certificate reloaded");
                        state.key = Arc::new(key);
                        state.modified = now;
                    }
                    // Often the two files are mid-replacement: try again at the next check.
                    Err(e) => tracing::warn!(
                        "TLS certificate not reloaded, keeping the previous one: {e}"
                    ),
                }
            }
        }
        Some(state.key.clone())
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The PEM certificates of a file (a chain, or CA certificates); an error names the file.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_error = |detail: String| TlsError::File {
        path: path.to_owned(),
        detail,
    };
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(e.to_string()))?;
    if certificates.is_empty() {
        return Err(file_error("no PEM certificate in it".into()));
    }
    Ok(certificates)
}

fn certified_key(cert_file: &Path, key_file: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = read_certificates(cert_file)?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| TlsError::File {
        path: key_file.to_owned(),
        detail: format!("no usable PEM private key: {e}"),
    })?;
    let signing =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| TlsError::File {
            path: key_file.to_owned(),
            detail: e.to_string(),
        })?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| TlsError::File {
        path: key_file.to_owned(),
        detail: format!("does not match {}: {e}", cert_file.display()),
    })?;
    Ok(certified)
}
