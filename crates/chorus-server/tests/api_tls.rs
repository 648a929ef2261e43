//! TLS on the client API (`[api_tls]`), through the real `chorus` CLI against a real
//! `chorus server`: with mutual TLS, a client presenting a certificate from the clients'
//! CA is served; one presenting none, one speaking plain text and one trusting another
//! CA are refused, and nothing they asked for happens. The node's own calls to the
//! control plane (its agent's heartbeats, over the same API) go over mutual TLS too: the
//! node registers. A bad `--ca` is refused by name before anything is sent.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;
use common::tls::Ca;
use common::{free_port, Server};

fn chorus(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_chorus"))
        .current_dir(dir)
        .env_remove("CHORUS_CA")
        .env_remove("CHORUS_CERT")
        .env_remove("CHORUS_KEY")
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_client_api_serves_mutual_tls_and_refuses_everyone_else() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let nodes = Ca::new(dir, "nodes-ca");
    nodes.issue(dir, "node1");
    let clients = Ca::new(dir, "clients-ca");
    clients.issue(dir, "client");
    let other = Ca::new(dir, "other-ca");
    other.issue(dir, "stranger");
    // The CAs whose clients are served: the clients' and the nodes' (a node calling the
    // control plane presents its own certificate).
    let bundle = format!(
        "{}{}",
        std::fs::read_to_string(dir.join("clients-ca.pem")).unwrap(),
        std::fs::read_to_string(dir.join("nodes-ca.pem")).unwrap()
    );
    std::fs::write(dir.join("client-cas.pem"), bundle).unwrap();

    let (api, repl) = (free_port(), free_port());
    let ep = format!("127.0.0.1:{api}");
    let cfg = dir.join("n1.toml");
    let mut f = std::fs::File::create(&cfg).unwrap();
    write!(
        f,
        "node = 1\ndata_dir = \"{d}/n1\"\nlisten = \"127.0.0.1:{repl}\"\napi_listen = \"{ep}\"\n\
         io_workers = 1\nlog_filter = \"info\"\n\n[peers]\n\n\
         [[groups]]\nid = 1\nvoters = [1]\n\n\
         [api_tls]\ncert = \"{d}/node1.pem\"\nkey = \"{d}/node1.key\"\nca = \"{d}/nodes-ca.pem\"\n\
         client_ca = \"{d}/client-cas.pem\"\nserver_name = \"localhost\"\n\n\
         [control]\ngroup = 1\nendpoints = [\"{ep}\"]\nheartbeat_ms = 200\n",
        d = dir.display(),
    )
    .unwrap();
    let mut node = Server::new(cfg, dir.join("n1.log"));
    node.start();

    let tls = [
        "--ca",
        "nodes-ca.pem",
        "--cert",
        "client.pem",
        "--key",
        "client.key",
        "--tls-name",
        "localhost",
    ];
    // A client with the clients' CA's certificate: served (the group elects itself).
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let mut args = vec!["append", "-g", "1", "--endpoints", &ep];
        args.extend(tls);
        args.push("hello");
        let o = chorus(dir, &args);
        if o.status.success() {
            break;
        }
        assert!(
            Instant::now() < end,
            "append over mutual TLS: {}\n{}",
            text(&o),
            std::fs::read_to_string(dir.join("n1.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let read = |extra: &[&str]| {
        let mut args = vec!["read", "-g", "1", "--endpoints", &ep];
        args.extend(extra);
        chorus(dir, &args)
    };
    let o = read(&tls);
    assert!(
        o.status.success() && text(&o).contains("hello"),
        "{}",
        text(&o)
    );

    // Refused: no client certificate, plain text, and a client trusting another CA.
    let no_cert = ["--ca", "nodes-ca.pem", "--tls-name", "localhost"];
    let o = read(&no_cert);
    assert!(!o.status.success(), "served without a client certificate");
    let o = read(&[]);
    assert!(!o.status.success(), "served in plain text: {}", text(&o));
    let wrong_ca = [
        "--ca",
        "other-ca.pem",
        "--cert",
        "client.pem",
        "--key",
        "client.key",
        "--tls-name",
        "localhost",
    ];
    let o = read(&wrong_ca);
    assert!(!o.status.success(), "trusted a node the CA did not sign");
    let stranger = [
        "--ca",
        "nodes-ca.pem",
        "--cert",
        "stranger.pem",
        "--key",
        "stranger.key",
        "--tls-name",
        "localhost",
    ];
    // A refused client changes nothing: its append is not in the log.
    let mut args = vec!["append", "-g", "1", "--endpoints", &ep];
    args.extend(stranger);
    args.push("intruder");
    let o = chorus(dir, &args);
    assert!(!o.status.success(), "a stranger's certificate was served");
    let o = read(&tls);
    assert!(!text(&o).contains("intruder"), "{}", text(&o));

    // The node's agent reached its control plane over the same mutual TLS.
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let mut args = vec!["node", "list", "--control", &ep];
        args.extend(tls);
        let o = chorus(dir, &args);
        if o.status.success() && text(&o).contains(&ep) {
            break;
        }
        assert!(Instant::now() < end, "node never registered: {}", text(&o));
        std::thread::sleep(Duration::from_millis(300));
    }

    // A --ca that is not PEM is refused by name.
    std::fs::write(dir.join("junk.pem"), "not a certificate").unwrap();
    let o = read(&["--ca", "junk.pem"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("junk.pem") && text(&o).contains("PEM"),
        "{}",
        text(&o)
    );
    node.kill9();
}
