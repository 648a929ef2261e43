//! Helpers shared by the runtime's integration tests: a certificate authority and node
//! certificates for mutual TLS.

#![allow(dead_code)]

use std::path::Path;

use chorus_runtime::transport::TlsFiles;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

pub struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pem: String,
}

pub fn ca() -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    Ca { params, key, pem }
}

/// Writes ca.pem, nodeN.pem and nodeN.key for a node certificate naming "localhost".
pub fn node_files(dir: &Path, ca: &Ca, n: u64) -> TlsFiles {
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let issuer = Issuer::from_params(&ca.params, &ca.key);
    let cert = params.signed_by(&key, &issuer).unwrap();
    let files = TlsFiles {
        ca: dir.join(format!("ca-for-{n}.pem")),
        cert: dir.join(format!("node{n}.pem")),
        key: dir.join(format!("node{n}.key")),
        server_name: "localhost".into(),
    };
    std::fs::write(&files.ca, &ca.pem).unwrap();
    std::fs::write(&files.cert, cert.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    files
}
