//! Authentication and authorization on the client API (`[api_auth]`).
//!
//! **Bearer tokens**, not client certificates, name callers. A token works from any
//! client language and through a proxy or balancer that terminates TLS, and is rotated by
//! editing one file on each node rather than by reissuing certificates; transport
//! security stays TLS's job (`[api_tls]`, optionally mutual). A call carries
//! `authorization: Bearer <token>`; the node finds the identity whose token it is.
//!
//! **Authorization** is per operation class and per group: an identity is allowed some
//! of `read` (reads, tails, status, block and key reads, volume listings), `append`
//! (appends, out-of-order appends, mirror writes) and `admin` (creating, deleting,
//! restarting and trimming groups, membership, leadership, priority, access mode,
//! snapshots and scrubs, volumes and nodes), on its `groups` (every group when not
//! listed). An operation that names no one group (the status of every group, the control
//! plane's) needs an identity allowed every group.
//!
//! With no identity configured, the API is open, as before. The health and reflection
//! services stay open either way (load balancers, tooling): they change nothing and show
//! no data.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tonic::metadata::MetadataMap;
use tonic::Status;

/// An operation class (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Reads of logs, state and status.
    Read,
    /// Appends.
    Append,
    /// Everything that changes a group's or the storage layer's configuration.
    Admin,
}

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::Read => "read",
            Class::Append => "append",
            Class::Admin => "admin",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "read" => Some(Class::Read),
            "append" => Some(Class::Append),
            "admin" => Some(Class::Admin),
            _ => None,
        }
    }
}

/// `[api_auth]`: who may call this node's API.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ApiAuthSection {
    /// The token this node presents when it calls other nodes' APIs (the control plane's
    /// agent and duties, chunk copies): an identity allowed `admin` on every group there.
    #[serde(default)]
    pub node_token_file: Option<PathBuf>,
    /// The identities allowed to call.
    #[serde(default)]
    pub identities: Vec<IdentitySection>,
}

/// One caller: `[[api_auth.identities]]`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct IdentitySection {
    /// Its name, in refusals and logs.
    pub name: String,
    /// A file holding its token (one line; at least 16 printable ASCII characters).
    pub token_file: PathBuf,
    /// The groups it may use; omitted: every group.
    #[serde(default)]
    pub groups: Option<Vec<u64>>,
    /// Its classes: some of "read", "append", "admin".
    pub allow: Vec<String>,
}

/// A caller as loaded. Invariant: `token` is non-empty printable ASCII, unique among the
/// identities.
#[derive(Debug)]
struct Caller {
    name: String,
    token: Vec<u8>,
    /// `None`: every group.
    groups: Option<BTreeSet<u64>>,
    allow: BTreeSet<Class>,
}

/// The loaded `[api_auth]`. Invariant: `callers` empty means the API is open.
#[derive(Debug, Default)]
pub struct Authz {
    callers: Vec<Caller>,
}

/// Reads a token file: one line, at least 16 printable ASCII characters.
pub fn read_token(what: &str, path: &std::path::Path) -> Result<String, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("{what} `{}`: {e}", path.display()))?;
    let t = text.trim();
    if t.len() < 16 || !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{what} `{}`: a token is one line of at least 16 printable ASCII characters",
            path.display()
        ));
    }
    Ok(t.to_string())
}

/// Equality whose time does not depend on where the inputs first differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Authz {
    /// Loads the identities (their token files read now: a bad one stops the node at
    /// start, by name).
    pub fn load(s: &ApiAuthSection) -> Result<Self, String> {
        let mut callers: Vec<Caller> = Vec::new();
        for i in &s.identities {
            let token = read_token(
                &format!("api_auth identity `{}` token_file", i.name),
                &i.token_file,
            )?;
            let mut allow = BTreeSet::new();
            for a in &i.allow {
                allow.insert(Class::parse(a).ok_or_else(|| {
                    format!(
                        "api_auth identity `{}`: allow `{a}`: one of read, append, admin",
                        i.name
                    )
                })?);
            }
            if let Some(c) = callers.iter().find(|c| same(&c.token, token.as_bytes())) {
                return Err(format!(
                    "api_auth identities `{}` and `{}` have the same token",
                    c.name, i.name
                ));
            }
            callers.push(Caller {
                name: i.name.clone(),
                token: token.into_bytes(),
                groups: i.groups.as_ref().map(|g| g.iter().copied().collect()),
                allow,
            });
        }
        Ok(Self { callers })
    }

    /// Whether calls must carry a token.
    pub fn enabled(&self) -> bool {
        !self.callers.is_empty()
    }

    /// Checks a call of `class` on `group` (`None`: no one group, so every group is
    /// needed): UNAUTHENTICATED without a known token, PERMISSION_DENIED outside what
    /// its identity is allowed, each naming what was missing.
    pub fn check(&self, md: &MetadataMap, class: Class, group: Option<u64>) -> Result<(), Status> {
        if self.callers.is_empty() {
            return Ok(());
        }
        let Some(v) = md.get("authorization") else {
            return Err(Status::unauthenticated(
                "no bearer token: this node's API needs `authorization: Bearer <token>` (chorus --token, or CHORUS_TOKEN)",
            ));
        };
        let token = v
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| {
                Status::unauthenticated("the authorization header is not `Bearer <token>`")
            })?;
        let Some(c) = self
            .callers
            .iter()
            .find(|c| same(&c.token, token.as_bytes()))
        else {
            return Err(Status::unauthenticated(
                "the bearer token is not one of this node's identities ([api_auth])",
            ));
        };
        if !c.allow.contains(&class) {
            let allowed: Vec<&str> = c.allow.iter().map(|a| a.name()).collect();
            return Err(Status::permission_denied(format!(
                "identity `{}` may not {} (allowed: {})",
                c.name,
                class.name(),
                if allowed.is_empty() {
                    "nothing".to_string()
                } else {
                    allowed.join(", ")
                }
            )));
        }
        match (&c.groups, group) {
            (None, _) => Ok(()),
            (Some(g), Some(id)) if g.contains(&id) => Ok(()),
            (Some(g), Some(id)) => Err(Status::permission_denied(format!(
                "identity `{}` may not use group {id} (its groups: {:?})",
                c.name, g
            ))),
            (Some(g), None) => Err(Status::permission_denied(format!(
                "identity `{}` may use only groups {:?}: this operation covers every group",
                c.name, g
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(token: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(t) = token {
            m.insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        m
    }

    #[test]
    fn tokens_classes_and_groups_are_checked_and_refusals_say_what_was_missing() {
        let dir = tempfile::tempdir().unwrap();
        let write = |n: &str, t: &str| {
            let p = dir.path().join(n);
            std::fs::write(&p, format!("{t}\n")).unwrap();
            p
        };
        let s = ApiAuthSection {
            node_token_file: None,
            identities: vec![
                IdentitySection {
                    name: "app".into(),
                    token_file: write("app", "app-token-0123456789"),
                    groups: Some(vec![1]),
                    allow: vec!["read".into(), "append".into()],
                },
                IdentitySection {
                    name: "ops".into(),
                    token_file: write("ops", "ops-token-0123456789"),
                    groups: None,
                    allow: vec!["read".into(), "admin".into()],
                },
            ],
        };
        let a = Authz::load(&s).unwrap();
        let app = md(Some("app-token-0123456789"));
        let ops = md(Some("ops-token-0123456789"));
        assert!(a.check(&app, Class::Append, Some(1)).is_ok());
        assert!(a.check(&app, Class::Read, Some(1)).is_ok());
        let e = a.check(&app, Class::Admin, Some(1)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("may not admin"), "{}", e.message());
        let e = a.check(&app, Class::Append, Some(2)).unwrap_err();
        assert!(e.message().contains("group 2"), "{}", e.message());
        assert!(a.check(&app, Class::Read, None).is_err());
        assert!(a.check(&ops, Class::Admin, Some(9)).is_ok());
        assert!(a.check(&ops, Class::Read, None).is_ok());
        assert!(a.check(&ops, Class::Append, Some(1)).is_err());
        let e = a.check(&md(None), Class::Read, Some(1)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = a
            .check(&md(Some("app-token-0123456780")), Class::Read, Some(1))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        // Open without identities.
        let open = Authz::load(&ApiAuthSection::default()).unwrap();
        assert!(open.check(&md(None), Class::Admin, None).is_ok());
        // Bad settings are refused by name.
        let mut bad = s.clone();
        bad.identities[1].allow = vec!["write".into()];
        assert!(Authz::load(&bad).unwrap_err().contains("allow `write`"));
        let mut bad = s.clone();
        bad.identities[1].token_file = write("short", "short");
        assert!(Authz::load(&bad).unwrap_err().contains("at least 16"));
        let mut bad = s;
        bad.identities[1].token_file = write("dup", "app-token-0123456789");
        assert!(Authz::load(&bad).unwrap_err().contains("same token"));
    }
}
