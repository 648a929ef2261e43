//! TLS and bearer tokens for the client API: how this process's clients reach nodes whose
//! `api_listen` serves TLS (`[api_tls]` in a node's configuration) or requires a token
//! (`[api_auth]`, docs/operations.md).
//!
//! A process sets it once ([`set_default_tls`]): the `chorus` CLI from `--ca`, `--cert`,
//! `--key` and `--tls-name` (or `CHORUS_CA`, `CHORUS_CERT`, `CHORUS_KEY`,
//! `CHORUS_TLS_NAME`), a node from its `[api_tls]` for its own calls to other nodes (the
//! control plane's agent and duties, chunk copies). Every connection opened after that —
//! [`crate::Client`], [`crate::VolumeClient`] — is TLS: an endpoint written `host:port` or
//! `http://host:port` is dialled as `https://host:port`, since a node serving TLS refuses
//! plain text anyway. Without it, connections are plain text, as before.
//!
//! A token ([`set_default_token`]: the CLI's `--token` or `CHORUS_TOKEN`, a node's
//! `api_auth.node_token_file`) goes on every call as `authorization: Bearer <token>`.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The TLS a client presents and checks.
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// The CA certificate(s) (PEM) that sign the nodes' API certificates.
    pub ca_pem: Vec<u8>,
    /// This client's certificate chain and private key (PEM), for nodes that require
    /// client certificates (mutual TLS); `None` presents none.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the nodes' certificates carry, checked instead of the endpoint's host
    /// (`None`: the host as written in the endpoint).
    pub server_name: Option<String>,
}

/// Why TLS settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{what} `{path}`: {source}")]
    Read {
        /// Which setting (`--ca`, `--cert`, `--key`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A certificate without its key, or a key without its certificate.
    #[error(
        "a client certificate needs its key and a key its certificate (--cert and --key together)"
    )]
    Unpaired,
    /// A file is not PEM of what it should hold.
    #[error("{what} `{path}` holds no PEM {kind}")]
    NotPem {
        /// Which setting.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What it should hold.
        kind: &'static str,
    },
}

impl ClientTls {
    /// Loads the files: `ca` (PEM certificates), and `cert` with `key` (both or neither).
    pub fn load(
        ca: &Path,
        cert: Option<&Path>,
        key: Option<&Path>,
        server_name: Option<String>,
    ) -> Result<Self, TlsError> {
        let read = |what, path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                what,
                path: path.to_path_buf(),
                source,
            })
        };
        let pem = |what, path: &Path, kind, bytes: &[u8]| {
            if String::from_utf8_lossy(bytes).contains("-----BEGIN ") {
                Ok(())
            } else {
                Err(TlsError::NotPem {
                    what,
                    path: path.to_path_buf(),
                    kind,
                })
            }
        };
        let ca_pem = read("--ca", ca)?;
        pem("--ca", ca, "certificate", &ca_pem)?;
        let identity = match (cert, key) {
            (Some(c), Some(k)) => {
                let (cp, kp) = (read("--cert", c)?, read("--key", k)?);
                pem("--cert", c, "certificate", &cp)?;
                pem("--key", k, "private key", &kp)?;
                Some((cp, kp))
            }
            (None, None) => None,
            _ => return Err(TlsError::Unpaired),
        };
        Ok(Self {
            ca_pem,
            identity,
            server_name,
        })
    }

    fn config(&self) -> ClientTlsConfig {
        let mut c = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            c = c.identity(Identity::from_pem(cert, key));
        }
        if let Some(n) = &self.server_name {
            c = c.domain_name(n.clone());
        }
        c
    }
}

static DEFAULT: RwLock<Option<ClientTls>> = RwLock::new(None);

/// Sets (or with `None` clears) the TLS of every connection this process opens from now
/// on (module docs).
pub fn set_default_tls(tls: Option<ClientTls>) {
    *DEFAULT.write().unwrap_or_else(|e| e.into_inner()) = tls;
}

/// The TLS set by [`set_default_tls`], if any.
pub fn default_tls() -> Option<ClientTls> {
    DEFAULT.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// `ep` as a URI: `host:port` gets a scheme, `http` when connections are plain text and
/// `https` when [`set_default_tls`] set TLS (which also upgrades an `http://` endpoint);
/// any other scheme is left as written (an unknown one is refused when connecting).
pub fn uri(ep: &str) -> String {
    let tls = DEFAULT.read().unwrap_or_else(|e| e.into_inner()).is_some();
    match (ep.split_once("://"), tls) {
        (Some(("http", rest)), true) => format!("https://{rest}"),
        (Some(_), _) => ep.to_string(),
        (None, true) => format!("https://{ep}"),
        (None, false) => format!("http://{ep}"),
    }
}

/// An endpoint for `ep` ([`uri`]) with this process's TLS applied, if any.
pub fn endpoint(ep: &str) -> Result<Endpoint, String> {
    let e = Endpoint::from_shared(uri(ep)).map_err(|e| e.to_string())?;
    match default_tls() {
        Some(t) => e.tls_config(t.config()).map_err(|e| e.to_string()),
        None => Ok(e),
    }
}

static TOKEN: RwLock<Option<AsciiMetadataValue>> = RwLock::new(None);

/// Why a token was refused.
#[derive(Debug, thiserror::Error)]
#[error("the token is not printable ASCII (a bearer token is sent as an HTTP header)")]
pub struct BadToken;

/// Sets (or with `None` clears) the bearer token every call opened from now on carries.
pub fn set_default_token(token: Option<&str>) -> Result<(), BadToken> {
    let v = match token {
        Some(t) => {
            let t = t.trim();
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(BadToken);
            }
            Some(
                AsciiMetadataValue::try_from(format!("Bearer {t}").as_str())
                    .map_err(|_| BadToken)?,
            )
        }
        None => None,
    };
    *TOKEN.write().unwrap_or_else(|e| e.into_inner()) = v;
    Ok(())
}

/// Adds `authorization: Bearer <token>` to every request (nothing without a token).
#[derive(Clone, Debug)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            r.metadata_mut().insert("authorization", v.clone());
        }
        Ok(r)
    }
}

/// A connection whose calls carry this process's token ([`set_default_token`]).
pub type Conn = InterceptedService<Channel, Bearer>;

/// `ch` with this process's token on every call.
pub fn authed(ch: Channel) -> Conn {
    let token = TOKEN.read().unwrap_or_else(|e| e.into_inner()).clone();
    InterceptedService::new(ch, Bearer(token))
}
