//! `chorus server`: one node of a cluster — the runtime environment, the gRPC service and
//! the metrics endpoint, until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;

use chorus_client::pb::chorus_server::ChorusServer;
use chorus_client::pb::control_server::ControlServer;
use chorus_runtime::{Env, Error};
use clap::Args;

use crate::config::{parse_group, parse_peer, ServerConfig};
use crate::metrics_http::serve_metrics_with;
use crate::service::Service;
use crate::{AnyResult, EXIT_USAGE};

/// What a node says when its configuration names a group's mode other than the one the
/// group was created with in its data directory (`chorus dev` recognises it to name the
/// way out).
pub(crate) const MODE_MISMATCH: &str = "but exists here as";

/// Flags of `chorus server` (each overrides the config file and the environment).
#[derive(Args, Debug, Default)]
pub struct ServerArgs {
    /// TOML configuration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// This node's id.
    #[arg(long)]
    pub node: Option<u64>,
    /// Data directory.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Replication listen address.
    #[arg(long)]
    pub listen: Option<String>,
    /// gRPC API listen address.
    #[arg(long)]
    pub api_listen: Option<String>,
    /// Prometheus metrics listen address.
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// A peer, `ID=HOST:PORT` (repeatable).
    #[arg(long = "peer")]
    pub peers: Vec<String>,
    /// A group to create at start if missing, `ID:VOTER,VOTER,...` (repeatable).
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

fn effective(a: &ServerArgs) -> AnyResult<ServerConfig> {
    let mut c = ServerConfig::load(a.config.as_deref())?;
    c.apply_env(std::env::vars())?;
    if let Some(v) = a.node {
        c.node = v;
    }
    if let Some(v) = &a.data_dir {
        c.data_dir = v.clone();
    }
    if let Some(v) = &a.listen {
        c.listen = v.clone();
    }
    if let Some(v) = &a.api_listen {
        c.api_listen = v.clone();
    }
    if let Some(v) = &a.metrics_listen {
        c.metrics_listen = v.clone();
    }
    for p in &a.peers {
        let (id, addr) = parse_peer(p)?;
        c.peers.insert(id, addr);
    }
    for g in &a.groups {
        c.groups.push(parse_group(g)?);
    }
    Ok(c)
}

/// Runs the node until a signal.
pub fn run(a: ServerArgs) -> AnyResult<ExitCode> {
    let cfg = effective(&a)?;
    if a.print_config {
        print!("{}", toml::to_string(&cfg)?);
        return Ok(ExitCode::SUCCESS);
    }
    let (env_cfg, api, metrics) = cfg.to_env_config()?;
    // TLS on the client API, checked before anything starts: a file missing or not PEM
    // is named now rather than at the first connection.
    let api_tls = match &cfg.api_tls {
        Some(t) => Some(api_tls(t)?),
        None => None,
    };
    // Who may call (`auth`): token files read now, a bad one named at start.
    let authz = std::sync::Arc::new(match &cfg.api_auth {
        Some(a) => {
            if let Some(f) = &a.node_token_file {
                let t = crate::auth::read_token("api_auth.node_token_file", f)?;
                chorus_client::security::set_default_token(Some(&t))
                    .map_err(|e| format!("api_auth.node_token_file: {e}"))?;
            }
            crate::auth::Authz::load(a)?
        }
        None => crate::auth::Authz::default(),
    });
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cfg.log_filter))
        .map_err(|e| crate::config::ConfigError {
            setting: "log_filter".into(),
            value: cfg.log_filter.clone(),
            accepted: format!("a tracing filter such as `info` ({e})"),
        })?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or journald gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // The archive (`[archive]`): opened now, so bad settings or key files are named at
    // start; nothing is read from it until the archiver runs.
    let archive = match &cfg.archive {
        Some(a) => Some((crate::archive::Archive::open(&a.target()?)?, a.clone())),
        None => None,
    };
    let env = Env::open(env_cfg)?;
    for g in &cfg.groups {
        if let Some(spec) = crate::ooo::parse_spec(g, cfg.node)? {
            if env.group(g.id).is_ok() {
                return Err(format!(
                    "group {} is configured as {} {MODE_MISMATCH} an ordered group",
                    g.id, g.mode
                )
                .into());
            }
            match env.create_ooo_group(spec) {
                // A damaged group stays as found (logged when the node opened it).
                Ok(_) | Err(Error::GroupDamaged { .. }) => {}
                Err(Error::GroupExists(id)) => {
                    return Err(format!("group {id} already exists (with a different spec)").into())
                }
                Err(e) => return Err(e.into()),
            }
            continue;
        }
        if env.ooo_group(g.id).is_ok() {
            return Err(format!(
                "group {} is configured as ordered {MODE_MISMATCH} an out-of-order group",
                g.id
            )
            .into());
        }
        let mode = crate::config::parse_access_mode(&g.access_mode)
            .map_err(|e| format!("group {}: {e}", g.id))?;
        match env.create_group_in_mode(g.id, &g.voters, &g.learners, mode) {
            // A damaged group stays as found (logged when the node opened it).
            Ok(_) | Err(Error::GroupExists(_)) | Err(Error::GroupDamaged { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    tracing::info!(
        node = cfg.node,
        replication = %env.replication_addr(),
        api = %api,
        groups = ?env.list_groups().iter().map(|g| g.id).collect::<Vec<_>>(),
        "chorus server started"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let code = rt.block_on(async move {
        if authz.enabled() && api_tls.is_none() {
            tracing::warn!(
                "[api_auth] without [api_tls]: bearer tokens cross the network in plain text"
            );
        }
        let archive_stats = archive.as_ref().map(|(a, section)| {
            let stats = std::sync::Arc::new(crate::archive::archiver::ArchiverStats::default());
            tokio::spawn(crate::archive::archiver::run(
                env.clone(),
                a.clone(),
                section.clone(),
                stats.clone(),
            ));
            stats
        });
        let svc = Service::with_auth(env.clone(), authz.clone())
            .with_archive(archive.map(|(a, section)| (a, section.groups)));
        let svc = ChorusServer::new(svc)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        // The control plane: served here if this node hosts the control group.
        let controller = if cfg.control.group != 0 {
            let c = crate::ctrl::Controller::start(env.clone(), cfg.control.clone())?;
            tokio::spawn(crate::ctrl::duties::run(std::sync::Arc::downgrade(&c)));
            Some(c)
        } else {
            None
        };
        if let Some(m) = metrics {
            let l = tokio::net::TcpListener::bind(m).await?;
            let (ctl, arch) = (controller.clone(), archive_stats.clone());
            let extra = (ctl.is_some() || arch.is_some()).then(|| {
                std::sync::Arc::new(move || {
                    let mut b = ctl.as_ref().map(|c| c.render_metrics()).unwrap_or_default();
                    if let Some(a) = &arch {
                        b.push_str(&a.render_metrics());
                    }
                    b
                }) as crate::metrics_http::ExtraMetrics
            });
            tokio::spawn(serve_metrics_with(env.clone(), l, extra));
        }
        let control_svc = controller.clone().map(|c| {
            ControlServer::new(crate::ctrl::service::ControlService::new(c, authz.clone()))
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20)
        });
        if !cfg.control.endpoints.is_empty() {
            let me = crate::ctrl::agent::Identity {
                node: cfg.node,
                repl_addr: cfg
                    .advertise
                    .clone()
                    .unwrap_or_else(|| env.replication_addr().to_string()),
                client_addr: cfg
                    .control
                    .advertise_api
                    .clone()
                    .unwrap_or_else(|| api.to_string()),
                rack: cfg.control.rack.clone(),
            };
            tokio::spawn(crate::ctrl::agent::run(
                env.clone(),
                me,
                cfg.control.endpoints.clone(),
                std::time::Duration::from_millis(cfg.control.heartbeat_ms.max(10)),
            ));
        }
        let listener = tokio::net::TcpListener::bind(api).await.map_err(|e| {
            Box::<dyn std::error::Error>::from(format!("bind api_listen {api}: {e}"))
        })?;
        // Nagle on the answers would add a delayed-ACK stall (40 ms) to some appends:
        // every accepted API connection gets TCP_NODELAY (the builder's setting does not
        // reach a custom listener).
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |s| {
                if let Ok(s) = &s {
                    let _ = s.set_nodelay(true);
                }
                s
            },
        );
        let shutdown = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("signal handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            tracing::info!("shutting down");
        };
        // The standard services (`standard`): health per group, and reflection.
        let (health, health_svc) = tonic_health::server::health_reporter();
        tokio::spawn(crate::standard::run_health(
            env.clone(),
            health,
            controller.is_some(),
        ));
        let (reflect_v1, reflect_v1alpha) = crate::standard::reflection(controller.is_some())?;
        let mut builder = tonic::transport::Server::builder();
        if let Some(t) = api_tls {
            builder = builder.tls_config(t)?;
        }
        builder
            .tcp_nodelay(true)
            .add_service(svc)
            .add_optional_service(control_svc)
            .add_service(health_svc)
            .add_service(reflect_v1)
            .add_service(reflect_v1alpha)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await?;
        if let Some(c) = controller {
            c.stop();
        }
        let e2 = env.clone();
        tokio::task::spawn_blocking(move || e2.shutdown()).await?;
        Ok::<_, Box<dyn std::error::Error>>(ExitCode::SUCCESS)
    });
    match code {
        Ok(c) => Ok(c),
        Err(e) => {
            eprintln!("chorus server: {e}");
            Ok(ExitCode::from(EXIT_USAGE))
        }
    }
}

/// The client API's TLS from `[api_tls]`: the server's side, and (set as this process's
/// default, [`chorus_client::security`]) this node's side when it calls other nodes.
fn api_tls(t: &crate::config::ApiTlsSection) -> AnyResult<tonic::transport::ServerTlsConfig> {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let read = |what: &str, p: &std::path::Path| {
        std::fs::read(p).map_err(|e| format!("api_tls.{what} `{}`: {e}", p.display()))
    };
    let (cert, key) = (read("cert", &t.cert)?, read("key", &t.key)?);
    let mut server = ServerTlsConfig::new().identity(Identity::from_pem(&cert, &key));
    if let Some(ca) = &t.client_ca {
        server = server.client_ca_root(Certificate::from_pem(read("client_ca", ca)?));
    }
    let (cert_path, key_path) = (t.cert.as_path(), t.key.as_path());
    let client = chorus_client::security::ClientTls::load(
        &t.ca,
        t.client_ca.is_some().then_some(cert_path),
        t.client_ca.is_some().then_some(key_path),
        t.server_name.clone(),
    )
    .map_err(|e| format!("api_tls: {e}"))?;
    chorus_client::security::set_default_tls(Some(client));
    Ok(server)
}
