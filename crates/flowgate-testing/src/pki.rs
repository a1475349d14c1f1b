//! Certificates for the TLS tests, made fresh by each test with rcgen: a CA and leaf
//! certificates it signs for `localhost` and `127.0.0.1`, as PEM text or files. Used by
//! `crates/flowgate/tests/redis_tls.rs` and `crates/flowgate-server/tests/tls.rs`.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// A certificate authority of the test's own.
pub struct Pki {
    /// The CA: its certificate and signing key.
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate and its key, PEM.
pub struct Leaf {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PEM, PKCS#8).
    pub key_pem: String,
    /// The certificate (DER), to compare with what a server presents.
    pub cert_der: Vec<u8>,
}

impl Pki {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Pki { ca }
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// The CA certificate (DER).
    pub fn ca_der(&self) -> Vec<u8> {
        self.ca.der().to_vec()
    }

    /// A new leaf certificate (with a new key) for `localhost` and `127.0.0.1`, signed by the CA.
    pub fn leaf(&self) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let cert = params.signed_by(&key, &self.ca).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
        }
    }

    /// Writes the CA certificate to `dir/ca.pem`.
    pub fn write_ca(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, self.ca_pem()).unwrap();
        path
    }
}

impl Leaf {
    /// Writes the certificate and key to `dir/{stem}.crt` and `dir/{stem}.key`.
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, &self.cert_pem).unwrap();
        std::fs::write(&key, &self.key_pem).unwrap();
        (cert, key)
    }
}
