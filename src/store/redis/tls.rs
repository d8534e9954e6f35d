//! [`RedisTls`]: the certificates of `rediss://` connections (feature `redis-tls`).

use std::fmt;
use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::base::error::ConfigError;

/// The certificates of a TLS connection to Redis (feature `redis-tls`): the certificate
/// authorities the server's certificate must chain to, and a client certificate for mutual
/// TLS (a server started with `tls-auth-clients yes`).
///
/// Without a CA the platform's root certificates are trusted, as managed services' servers
/// need; a CA given replaces them (a private CA, or a self-signed server). The server's
/// certificate must name the host of the URL (a DNS name, or the IP address as an IP
/// SAN). Every PEM is checked when it is given: a bad one is a [`ConfigError`] naming the
/// field (`tls.ca`, `tls.client_cert`, `tls.client_key`), never its content. `Debug`
/// shows which parts are set, not the key.
///
/// ```
/// # fn run(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<(), tollgate::ConfigError> {
/// use tollgate::store::RedisTls;
///
/// let tls = RedisTls::new().ca_pem(ca)?.client_pem(cert, key)?;
/// // or from files: RedisTls::new().ca_file("ca.pem")?.client_files("client.pem", "client.key")?
/// # let _ = tls; Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct RedisTls {
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTls")
            .field(
                "ca",
                &if self.ca.is_some() {
                    "given"
                } else {
                    "platform roots"
                },
            )
            .field("client_cert", &self.client.is_some())
            .field("client_key", &self.client.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl RedisTls {
    /// The platform's root certificates, no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the certificate authorities of `pem` (one or more `CERTIFICATE` blocks)
    /// instead of the platform's.
    pub fn ca_pem(mut self, pem: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        let pem = pem.as_ref();
        certificates(pem, "tls.ca")?;
        self.ca = Some(pem.to_vec());
        Ok(self)
    }

    /// [`ca_pem`](Self::ca_pem) read from the file at `path`.
    pub fn ca_file(self, path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let pem = read(path.as_ref(), "tls.ca")?;
        self.ca_pem(pem)
    }

    /// Presents the client certificate `cert` (PEM, the chain from the client's own
    /// certificate up) with its private key `key` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub fn client_pem(
        mut self,
        cert: impl AsRef<[u8]>,
        key: impl AsRef<[u8]>,
    ) -> Result<Self, ConfigError> {
        let (cert, key) = (cert.as_ref(), key.as_ref());
        certificates(cert, "tls.client_cert")?;
        if PrivateKeyDer::from_pem_slice(key).is_err() {
            return Err(ConfigError::new(
                "tls.client_key",
                "no private key in PEM (PKCS#8, PKCS#1 or SEC1)",
            ));
        }
        self.client = Some((cert.to_vec(), key.to_vec()));
        Ok(self)
    }

    /// [`client_pem`](Self::client_pem) read from the files at `cert` and `key`.
    pub fn client_files(
        self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, ConfigError> {
        let cert = read(cert.as_ref(), "tls.client_cert")?;
        let key = read(key.as_ref(), "tls.client_key")?;
        self.client_pem(cert, key)
    }

    /// The same certificates as the `redis` crate takes them, for a client built by hand
    /// (`ClusterClientBuilder::certs`, `Client::build_with_tls`).
    ///
    /// Also makes rustls's ring provider the process default if none is, as
    /// [`RedisStore::open_tls`](super::RedisStore::open_tls) does.
    pub fn certificates(&self) -> redis::TlsCertificates {
        install_provider();
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        }
    }
}

/// Makes rustls's ring provider the process default, unless one is installed already:
/// with more than one provider compiled in (another crate's choice), rustls would
/// otherwise refuse to pick one.
pub(super) fn install_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Checks that `pem` holds at least one certificate and nothing unreadable.
fn certificates(pem: &[u8], field: &'static str) -> Result<(), ConfigError> {
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        if cert.is_err() {
            return Err(ConfigError::new(
                field,
                "a certificate in PEM does not parse",
            ));
        }
        count += 1;
    }
    if count == 0 {
        return Err(ConfigError::new(field, "no CERTIFICATE block in PEM"));
    }
    Ok(())
}

fn read(path: &Path, field: &'static str) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path)
        .map_err(|e| ConfigError::new(field, format!("reading {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_pem_is_an_error_naming_the_field_not_the_content() {
        let err = RedisTls::new().ca_pem("not a certificate").unwrap_err();
        assert_eq!(err.field(), "tls.ca");
        let key = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0IGtleQ==\n-----END PRIVATE KEY-----\n";
        let err = RedisTls::new().client_pem("nothing", key).unwrap_err();
        assert_eq!(err.field(), "tls.client_cert");
        let err = RedisTls::new()
            .ca_file("/nonexistent/tollgate-ca.pem")
            .unwrap_err();
        assert_eq!(err.field(), "tls.ca");
        assert!(
            err.reason().contains("/nonexistent/tollgate-ca.pem"),
            "{err}"
        );
    }

    #[test]
    fn debug_shows_what_is_set_not_the_key() {
        let tls = RedisTls {
            ca: None,
            client: Some((b"cert".to_vec(), b"very secret key".to_vec())),
        };
        let shown = format!("{tls:?}");
        assert!(shown.contains("platform roots"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
        let certs = tls.certificates();
        assert!(certs.root_cert.is_none());
        assert!(!format!("{certs:?}").contains("secret"));
    }
}
