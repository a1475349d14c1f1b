//! TLS with rustls (on ring; no OpenSSL): the certificate the listeners present, reloaded when
//! its files change, and the client configuration for `https://` upstreams.
//!
//! The listeners share one [`ServerCertificate`]; each builds its own acceptor from it with the
//! application protocols it speaks (ALPN `h2` for gRPC, `http/1.1` for the others). A reload
//! swaps the certificate for new handshakes; connections already established keep theirs.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Why a certificate, key or CA file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct TlsFileError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it (never its contents).
    pub reason: String,
}

impl TlsFileError {
    fn new(path: &Path, reason: impl std::fmt::Display) -> Self {
        TlsFileError {
            path: path.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// Reads `path` whole.
fn read(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|e| TlsFileError::new(path, format!("cannot read: {e}")))
}

/// The certificates of the PEM file `path` (at least one).
pub fn certificates_from(
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsFileError::new(path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(TlsFileError::new(
            path,
            "no certificate in it (expected PEM `-----BEGIN CERTIFICATE-----` blocks)",
        ));
    }
    Ok(certs)
}

/// A listener that can serve TLS (`--tls-listeners`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsListener {
    /// The HTTP API (`--http`).
    Http,
    /// The gRPC API (`--grpc`).
    Grpc,
    /// The gateway (`--gateway`).
    Gateway,
    /// The WebSocket gateway (`--websocket`).
    Websocket,
}

impl TlsListener {
    /// Every listener.
    pub const ALL: [TlsListener; 4] = [
        TlsListener::Http,
        TlsListener::Grpc,
        TlsListener::Gateway,
        TlsListener::Websocket,
    ];

    /// The application protocols it offers in the handshake (ALPN).
    pub fn alpn(self) -> &'static [&'static [u8]] {
        match self {
            TlsListener::Grpc => &[b"h2"],
            _ => &[b"http/1.1"],
        }
    }
}

/// TLS on the service's listeners: the certificate and which listeners present it.
#[derive(Debug, Clone)]
pub struct ListenerTls {
    /// The certificate (reloaded in place).
    pub certificate: Arc<ServerCertificate>,
    /// The listeners that serve TLS; the others stay plain.
    pub listeners: Vec<TlsListener>,
}

impl ListenerTls {
    /// The acceptor for `listener`, if it serves TLS.
    pub fn acceptor(&self, listener: TlsListener) -> Option<tokio_rustls::TlsAcceptor> {
        self.listeners
            .contains(&listener)
            .then(|| self.certificate.acceptor(listener.alpn()))
    }
}

/// The certificate chain and private key files the listeners present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFiles {
    /// PEM certificate chain, the server's own certificate first.
    pub chain: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl CertificateFiles {
    /// The certificate chain and the key in the files now, and the bytes they were read from.
    fn read(
        &self,
    ) -> Result<
        (
            Vec<CertificateDer<'static>>,
            PrivateKeyDer<'static>,
            Vec<u8>,
        ),
        TlsFileError,
    > {
        let chain_pem = read(&self.chain)?;
        let key_pem = read(&self.key)?;
        let chain = certificates_from(&self.chain, &chain_pem)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            TlsFileError::new(
                &self.key,
                format!("no PEM private key (PKCS#8, PKCS#1 or SEC1) in it: {e}"),
            )
        })?;
        let mut both = chain_pem;
        both.extend_from_slice(&key_pem);
        Ok((chain, key, both))
    }

    /// The key pair in the files now, checked to match, and the bytes it was read from.
    fn load(&self) -> Result<(CertifiedKey, Vec<u8>), TlsFileError> {
        let (chain, key, both) = self.read()?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| TlsFileError::new(&self.key, format!("unusable private key: {e}")))?;
        let certified = CertifiedKey::new(chain, signer);
        certified.keys_match().map_err(|e| {
            TlsFileError::new(
                &self.key,
                format!(
                    "does not match the certificate in {}: {e}",
                    self.chain.display()
                ),
            )
        })?;
        Ok((certified, both))
    }
}

/// The certificate the listeners present; [`ServerCertificate::reload`] replaces it when its
/// files have changed and are valid, and keeps the running one otherwise.
#[derive(Debug)]
pub struct ServerCertificate {
    /// Where it is read from.
    files: CertificateFiles,
    /// What new handshakes present.
    current: ArcSwap<CertifiedKey>,
    /// The bytes the current one was read from (to tell whether the files changed).
    loaded_from: Mutex<Vec<u8>>,
}

/// The outcome of [`ServerCertificate::reload`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateReload {
    /// The files hold what is being presented.
    Unchanged,
    /// New handshakes present the new certificate.
    Replaced,
}

impl ServerCertificate {
    /// Loads the key pair in `files`.
    pub fn load(files: CertificateFiles) -> Result<Arc<Self>, TlsFileError> {
        let (certified, bytes) = files.load()?;
        Ok(Arc::new(ServerCertificate {
            files,
            current: ArcSwap::from_pointee(certified),
            loaded_from: Mutex::new(bytes),
        }))
    }

    /// The files it is read from (to be watched).
    pub fn files(&self) -> Vec<PathBuf> {
        vec![self.files.chain.clone(), self.files.key.clone()]
    }

    /// Reads the files again; a changed, valid pair replaces the running one. An error leaves
    /// the running certificate in place.
    pub fn reload(&self) -> Result<CertificateReload, TlsFileError> {
        let (certified, bytes) = self.files.load()?;
        let mut loaded_from = self.loaded_from.lock();
        if *loaded_from == bytes {
            return Ok(CertificateReload::Unchanged);
        }
        self.current.store(Arc::new(certified));
        *loaded_from = bytes;
        Ok(CertificateReload::Replaced)
    }

    /// An acceptor presenting this certificate (as it is at each handshake), offering the
    /// application protocols `alpn` (e.g. `[b"h2"]`).
    pub fn acceptor(self: &Arc<Self>, alpn: &[&[u8]]) -> tokio_rustls::TlsAcceptor {
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(self.clone())));
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }

    /// Reloads whenever its files change or SIGHUP arrives, until `shutdown` completes;
    /// failures are logged and the running certificate stays.
    pub async fn watch(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let paths = self.files();
        crate::config::reload::on_changes(
            paths.clone(),
            move |_| {
                match self.reload() {
                    Ok(CertificateReload::Replaced) => {
                        tracing::info!(
                            certificate = %self.files.chain.display(),
                            "TLS certificate reloaded"
                        );
                    }
                    Ok(CertificateReload::Unchanged) => {}
                    Err(e) => {
                        tracing::error!("TLS certificate not reloaded, the running one stays: {e}")
                    }
                }
                paths.clone()
            },
            shutdown,
        )
        .await;
    }
}

/// Hands every handshake the current certificate.
#[derive(Debug)]
struct Resolver(Arc<ServerCertificate>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current.load_full())
    }
}

/// The client configuration for `https://` upstreams: the roots in `ca_file` (PEM), or the
/// system's when `None`; ALPN `http/1.1`.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, TlsFileError> {
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots(ca_file, "https:// upstreams", "--upstream-ca-file")?)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The client configuration for a gRPC server (the xDS management server): the roots in
/// `ca_file` (PEM), or the system's when `None`; presenting `client`'s certificate when given
/// (checked to match its key); ALPN `h2`.
pub fn grpc_client_config(
    ca_file: Option<&Path>,
    client: Option<&CertificateFiles>,
) -> Result<Arc<rustls::ClientConfig>, TlsFileError> {
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots(
        ca_file,
        "the xDS management server",
        "--xds-ca-file",
    )?);
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some(files) => {
            files.load()?;
            let (chain, key, _) = files.read()?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| TlsFileError::new(&files.key, format!("unusable private key: {e}")))?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The roots in `ca_file` (PEM), or the system's when `None` (`what` is verified against them;
/// `flag` gives others).
fn roots(
    ca_file: Option<&Path>,
    what: &str,
    flag: &str,
) -> Result<rustls::RootCertStore, TlsFileError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let pem = read(path)?;
            for cert in certificates_from(path, &pem)? {
                roots.add(cert).map_err(|e| {
                    TlsFileError::new(path, format!("unusable CA certificate: {e}"))
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!("system CA certificates: {e}");
            }
            let (added, _ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!(
                    "no system CA certificates found: {what} will fail to verify (give {flag})"
                );
            }
        }
    }
    Ok(roots)
}

/// A connection that may be TLS: the plain one, or `T` wrapping it.
#[derive(Debug)]
pub enum MaybeTls<P, T> {
    /// No TLS.
    Plain(P),
    /// TLS over the connection.
    Tls(Box<T>),
}

impl<P, T> AsyncRead for MaybeTls<P, T>
where
    P: AsyncRead + Unpin,
    T: AsyncRead + Unpin,
{
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(p) => Pin::new(p).poll_read(cx, buf),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<P, T> AsyncWrite for MaybeTls<P, T>
where
    P: AsyncWrite + Unpin,
    T: AsyncWrite + Unpin,
{
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(p) => Pin::new(p).poll_write(cx, buf),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(p) => Pin::new(p).poll_flush(cx),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(p) => Pin::new(p).poll_shutdown(cx),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(p) => Pin::new(p).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(p) => p.is_write_vectored(),
            MaybeTls::Tls(t) => t.is_write_vectored(),
        }
    }
}
