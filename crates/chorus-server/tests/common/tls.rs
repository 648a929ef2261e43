//! A certificate authority for the TLS tests: certificates for "localhost" written as
//! PEM files.

#![allow(dead_code)]

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

/// A CA whose certificate is `NAME.pem` in the directory it was made in.
pub struct Ca {
    params: CertificateParams,
    key: KeyPair,
}

impl Ca {
    /// A new CA, its certificate written as `NAME.pem` in `dir`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        std::fs::write(dir.join(format!("{name}.pem")), pem).unwrap();
        Self { params, key }
    }

    /// Writes `NAME.pem` and `NAME.key`: a certificate for "localhost" signed by this CA.
    pub fn issue(&self, dir: &Path, name: &str) {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let cert = params
            .signed_by(&key, &Issuer::from_params(&self.params, &self.key))
            .unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}
