//! Bearer tokens and authorization on the client API (`[api_auth]`), through the real
//! `chorus` CLI against a real `chorus server` serving TLS: a call without a token, or
//! with one no identity holds, is UNAUTHENTICATED; an identity outside its groups or
//! classes is PERMISSION_DENIED; each names what was missing, and a refused call changes
//! nothing. The node's own calls to its control plane carry its node token.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;
use common::tls::Ca;
use common::{free_port, Server};

const APP: &str = "app-token-1111111111111111";
const READER: &str = "reader-token-22222222222222";
const OPS: &str = "ops-token-3333333333333333";

/// `chorus ARGS` over TLS with `token` (none: no token).
fn chorus(dir: &Path, ep: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_chorus"));
    c.current_dir(dir)
        .env_remove("CHORUS_TOKEN")
        .env("CHORUS_CA", dir.join("nodes-ca.pem"))
        .env("CHORUS_TLS_NAME", "localhost")
        .env("CHORUS_ENDPOINTS", ep)
        .env("CHORUS_CONTROL", ep)
        .args(args);
    if let Some(t) = token {
        c.env("CHORUS_TOKEN", t);
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Asserts `o` failed with `code` (as the CLI prints it) and `why` in its message.
fn refused(o: &Output, code: &str, why: &str) {
    let t = text(o);
    assert!(!o.status.success(), "served: {t}");
    assert!(
        t.contains(code) && t.contains(why),
        "want {code} / {why}: {t}"
    );
}

#[test]
fn tokens_name_identities_and_each_is_held_to_its_groups_and_classes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let nodes = Ca::new(dir, "nodes-ca");
    nodes.issue(dir, "node1");
    for (name, token) in [("app", APP), ("reader", READER), ("ops", OPS)] {
        std::fs::write(dir.join(format!("{name}.token")), format!("{token}\n")).unwrap();
    }
    let (api, repl) = (free_port(), free_port());
    let ep = format!("127.0.0.1:{api}");
    let cfg = dir.join("n1.toml");
    let mut f = std::fs::File::create(&cfg).unwrap();
    write!(
        f,
        "node = 1\ndata_dir = \"{d}/n1\"\nlisten = \"127.0.0.1:{repl}\"\napi_listen = \"{ep}\"\n\
         io_workers = 1\nlog_filter = \"info\"\n\n[peers]\n\n\
         [[groups]]\nid = 1\nvoters = [1]\n\n[[groups]]\nid = 2\nvoters = [1]\n\n\
         [api_tls]\ncert = \"{d}/node1.pem\"\nkey = \"{d}/node1.key\"\nca = \"{d}/nodes-ca.pem\"\n\
         server_name = \"localhost\"\n\n\
         [api_auth]\nnode_token_file = \"{d}/ops.token\"\n\n\
         [[api_auth.identities]]\nname = \"app\"\ntoken_file = \"{d}/app.token\"\ngroups = [1]\nallow = [\"read\", \"append\"]\n\n\
         [[api_auth.identities]]\nname = \"reader\"\ntoken_file = \"{d}/reader.token\"\nallow = [\"read\"]\n\n\
         [[api_auth.identities]]\nname = \"ops\"\ntoken_file = \"{d}/ops.token\"\nallow = [\"read\", \"append\", \"admin\"]\n\n\
         [control]\ngroup = 1\nendpoints = [\"{ep}\"]\nheartbeat_ms = 200\n",
        d = dir.display(),
    )
    .unwrap();
    let mut node = Server::new(cfg, dir.join("n1.log"));
    node.start();

    // The application appends to its group once it leads.
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let o = chorus(dir, &ep, Some(APP), &["append", "-g", "1", "first"]);
        if o.status.success() {
            break;
        }
        assert!(
            Instant::now() < end,
            "append: {}\n{}",
            text(&o),
            std::fs::read_to_string(dir.join("n1.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Who is calling: no token, or a token no identity holds.
    let o = chorus(dir, &ep, None, &["read", "-g", "1"]);
    refused(&o, "Unauthenticated", "no bearer token");
    let o = chorus(
        dir,
        &ep,
        Some("nobody-token-0000000000"),
        &["read", "-g", "1"],
    );
    refused(&o, "Unauthenticated", "not one of this node's identities");
    // What it may do: the application only its group, the reader only reads, and no one
    // but operators administers.
    let o = chorus(dir, &ep, Some(APP), &["append", "-g", "2", "stray"]);
    refused(&o, "PermissionDenied", "may not use group 2");
    let o = chorus(dir, &ep, Some(READER), &["append", "-g", "1", "stray"]);
    refused(&o, "PermissionDenied", "identity `reader` may not append");
    let o = chorus(dir, &ep, Some(APP), &["trim", "-g", "1", "--lsn", "1"]);
    refused(&o, "PermissionDenied", "identity `app` may not admin");
    let o = chorus(dir, &ep, Some(APP), &["status", "-g", "0"]);
    refused(&o, "PermissionDenied", "covers every group");
    // Follower reads and the role stream are reads, held to the same rules.
    let o = chorus(dir, &ep, None, &["watch-role", "-g", "1"]);
    refused(&o, "Unauthenticated", "no bearer token");
    let o = chorus(dir, &ep, Some(APP), &["watch-role", "-g", "2"]);
    refused(&o, "PermissionDenied", "may not use group 2");
    let o = chorus(
        dir,
        &ep,
        Some(APP),
        &["read", "-g", "2", "--min-csn", "1", "--wait", "1s"],
    );
    refused(&o, "PermissionDenied", "may not use group 2");
    let o = chorus(
        dir,
        &ep,
        Some(APP),
        &["tail", "-f", "-g", "2", "--min-csn", "1", "--wait", "1s"],
    );
    refused(&o, "PermissionDenied", "may not use group 2");
    // What each may do, it does; nothing refused happened.
    for (token, group) in [(READER, "1"), (READER, "2"), (APP, "1"), (OPS, "2")] {
        let o = chorus(dir, &ep, Some(token), &["read", "-g", group, "-o", "json"]);
        assert!(o.status.success(), "{}", text(&o));
        let t = text(&o);
        assert!(!t.contains("stray"), "a refused append was appended: {t}");
        assert_eq!(t.contains("first"), group == "1", "{t}");
    }
    let o = chorus(dir, &ep, Some(OPS), &["append", "-g", "2", "by-ops"]);
    assert!(o.status.success(), "{}", text(&o));
    // The control plane: the node's agent registered with its node token; listing the
    // nodes covers every group, so the application may not and the reader may.
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let o = chorus(dir, &ep, Some(READER), &["node", "list"]);
        if o.status.success() && text(&o).contains(&ep) {
            break;
        }
        assert!(Instant::now() < end, "node never registered: {}", text(&o));
        std::thread::sleep(Duration::from_millis(300));
    }
    let o = chorus(dir, &ep, Some(APP), &["node", "list"]);
    refused(&o, "PermissionDenied", "covers every group");
    node.kill9();
}
