//! A throwaway certificate authority and Redis servers that speak TLS with its
//! certificates, made at test time with `rcgen`.
//!
//! Every server keeps its plain port (what the support code probes, and what tests use to
//! look at the server) and serves TLS on a second one, `--tls-port`.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::redis::{RedisServer, reserve_port};

/// A CA, a server certificate for `127.0.0.1` and `localhost`, and a client certificate,
/// each as PEM and as a file in a temporary directory (removed on drop).
pub struct Pki {
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl Pki {
    /// A fresh CA and the certificates it signs.
    pub fn new() -> Pki {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "tollgate test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();

        let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose, cn: &str| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        // The server's certificate serves as its client certificate too (replication,
        // the cluster bus, sentinels), as redis.conf's `tls-cert-file` does by default.
        let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        let (server_cert, server_key) = {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(names).unwrap();
            params
                .distinguished_name
                .push(DnType::CommonName, "tollgate test redis");
            params.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            (
                params.signed_by(&key, &ca).unwrap().pem(),
                key.serialize_pem(),
            )
        };
        let (client_cert, client_key) = leaf(
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
            "tollgate test client",
        );

        let dir = tempfile::Builder::new()
            .prefix("tollgate-tls-")
            .tempdir()
            .unwrap();
        let pki = Pki {
            ca: ca.pem(),
            server_cert,
            server_key,
            client_cert,
            client_key,
            dir,
        };
        for (name, pem) in [
            ("ca.pem", &pki.ca),
            ("server.pem", &pki.server_cert),
            ("server.key", &pki.server_key),
            ("client.pem", &pki.client_cert),
            ("client.key", &pki.client_key),
        ] {
            std::fs::write(pki.dir.path().join(name), pem).unwrap();
        }
        pki
    }

    /// The file `name` (`ca.pem`, `server.pem`, `server.key`, `client.pem`, `client.key`).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The `redis-server` options of TLS on `port` with these certificates; client
    /// certificates required when `mutual`.
    pub fn server_args(&self, port: u16, mutual: bool) -> Vec<String> {
        let path = |name: &str| self.file(name).display().to_string();
        vec![
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            path("server.pem"),
            "--tls-key-file".into(),
            path("server.key"),
            "--tls-ca-cert-file".into(),
            path("ca.pem"),
            "--tls-auth-clients".into(),
            if mutual { "yes" } else { "no" }.into(),
        ]
    }
}

/// A server with TLS on a port of its own, and that port. A `redis-server` built without
/// TLS refuses `--tls-port`: the start then fails with its log, which says so.
pub fn start_tls(pki: &Pki, mutual: bool, extra: &[&str]) -> (RedisServer, u16) {
    let port = reserve_port();
    let mut args = pki.server_args(port, mutual);
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    (RedisServer::start_with(args, Some(port)), port)
}
