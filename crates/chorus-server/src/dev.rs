//! `chorus dev`: a local cluster of `chorus server` processes on loopback, one command.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use chorus_client::Client;
use clap::{Args, ValueEnum};

use crate::config::{GroupSpec, ServerConfig};
use crate::server::MODE_MISMATCH;
use crate::{AnyResult, EXIT_UNREACHABLE};

/// Flags of `chorus dev`.
#[derive(Args, Debug)]
pub struct DevArgs {
    /// Directory for the nodes' data, configuration files and logs.
    #[arg(long, default_value = "chorus-dev")]
    pub dir: PathBuf,
    /// Number of nodes (replicas of group 1).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=7))]
    pub nodes: u64,
    /// Node i serves the API on base+i, replication (every group's, of any mode) on
    /// base+100+i, metrics on base+200+i.
    #[arg(long, default_value_t = 7000, value_parser = clap::value_parser!(u16).range(1024..=65000))]
    pub base_port: u16,
    /// Delete data from an earlier run first (otherwise it is reused).
    #[arg(long)]
    pub fresh: bool,
    /// Start the nodes, wait for a leader, print how to use them and exit, leaving them
    /// running (stop them with `kill $(cat DIR/pids)`).
    #[arg(long)]
    pub detach: bool,
    /// Group 1's mode: ordered (PALF), parallel (ParallelRaft: records declare the 4 KiB
    /// blocks they write, a block volume applies them) or dependent (DP-Raft: records
    /// declare read and write sets, a key-value store applies them). Reusing a data
    /// directory keeps the mode it was created with (use --fresh to change it).
    #[arg(long, value_enum, default_value_t = DevMode::Ordered)]
    pub mode: DevMode,
    /// The storage layer: group 1 (ordered, on nodes 1–3) holds the control plane's state,
    /// and every node is a chunk server in a rack of its own, heartbeating to it (chunks
    /// of 64 MiB). Use with `--nodes 5` to have room to re-replicate.
    #[arg(long, conflicts_with = "mode")]
    pub storage: bool,
    /// With --storage: bytes per second the scrubber compares across replicas (`[control]
    /// scrub_bytes_per_sec`; 0 turns scrubbing off).
    #[arg(long, requires = "storage", value_parser = crate::volume_cli::parse_bytes)]
    pub scrub_rate: Option<u64>,
    /// With --storage: make a volume `fs`, make a file system on it (PolarFS section 6)
    /// and mount it at this directory (FUSE; needs /dev/fuse and root or fusermount3).
    /// It is unmounted when the cluster stops.
    #[arg(long, requires = "storage")]
    pub fs: Option<PathBuf>,
    /// With --fs: the volume's size.
    #[arg(long, requires = "fs", default_value = "256M", value_parser = crate::volume_cli::parse_bytes)]
    pub fs_size: u64,
    /// A secured cluster: a CA, node and client certificates and an operator token are
    /// generated in DIR/tls (kept across runs); replication and the client API are mutual
    /// TLS, and the API needs the operator's token (`[tls]`, `[api_tls]`, `[api_auth]`).
    /// Prints the environment variables client commands need.
    #[arg(long)]
    pub tls: bool,
}

/// Group 1's mode in `chorus dev`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DevMode {
    /// The PALF replica: in-order log.
    Ordered,
    /// ParallelRaft.
    Parallel,
    /// DP-Raft.
    Dependent,
}

impl DevMode {
    /// The mode's name in a group spec and in `Status` (`ordered`, `parallel`, `dependent`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            DevMode::Ordered => "ordered",
            DevMode::Parallel => "parallel",
            DevMode::Dependent => "dependent",
        }
    }
}

/// With `--tls`: generates DIR/tls once — `ca.pem` and `ca.key`, `node<i>.pem` and
/// `.key` for every node, `client.pem` and `.key`, and `operator.token` — every
/// certificate naming "localhost". A later run reuses what is there (a node added by a
/// larger `--nodes` gets its certificate then).
fn tls_files(dir: &Path, nodes: u64) -> AnyResult<PathBuf> {
    use rcgen::KeyPair;
    use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer};
    let t = dir.join("tls");
    std::fs::create_dir_all(&t)?;
    let (ca_pem, ca_key) = (t.join("ca.pem"), t.join("ca.key"));
    // Each certificate has a subject of its own (CN "Chorus dev CA", "node1", "client"):
    // OpenSSL and BoringSSL (Python's and Go's gRPC) refuse a chain whose leaf has the
    // same subject as its issuer. Files made before subjects were set are made anew.
    let marker = t.join("subjects-v2");
    if !marker.exists() {
        for e in std::fs::read_dir(&t)? {
            let p = e?.path();
            if matches!(p.extension().and_then(|x| x.to_str()), Some("pem" | "key")) {
                std::fs::remove_file(p)?;
            }
        }
        std::fs::write(&marker, "certificates name their subjects\n")?;
    }
    let dn = |cn: &str| {
        let mut d = DistinguishedName::new();
        d.push(DnType::OrganizationName, "Chorus dev");
        d.push(DnType::CommonName, cn);
        d
    };
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = dn("Chorus dev CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = if ca_key.exists() {
        KeyPair::from_pem(&std::fs::read_to_string(&ca_key)?)?
    } else {
        let key = KeyPair::generate()?;
        std::fs::write(&ca_pem, params.self_signed(&key)?.pem())?;
        std::fs::write(&ca_key, key.serialize_pem())?;
        key
    };
    let issuer = Issuer::from_params(&params, &key);
    let names = (1..=nodes)
        .map(|i| format!("node{i}"))
        .chain(["client".to_string()]);
    for name in names {
        let (cert, k) = (t.join(format!("{name}.pem")), t.join(format!("{name}.key")));
        if cert.exists() && k.exists() {
            continue;
        }
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(vec!["localhost".to_string()])?;
        p.distinguished_name = dn(&name);
        let c = p.signed_by(&key, &issuer)?;
        std::fs::write(&cert, c.pem())?;
        std::fs::write(&k, key.serialize_pem())?;
    }
    let token = t.join("operator.token");
    if !token.exists() {
        let mut b = [0u8; 24];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut b)?;
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        std::fs::write(&token, hex + "\n")?;
    }
    Ok(t)
}

fn node_config(a: &DevArgs, dir: &Path, i: u64) -> ServerConfig {
    let p = |off: u64, j: u64| format!("127.0.0.1:{}", a.base_port as u64 + off + j);
    let t = dir.join("tls");
    let (cert, key) = (
        t.join(format!("node{i}.pem")),
        t.join(format!("node{i}.key")),
    );
    ServerConfig {
        tls: a.tls.then(|| crate::config::TlsSection {
            ca: t.join("ca.pem"),
            cert: cert.clone(),
            key: key.clone(),
            server_name: "localhost".into(),
        }),
        api_tls: a.tls.then(|| crate::config::ApiTlsSection {
            cert: cert.clone(),
            key: key.clone(),
            ca: t.join("ca.pem"),
            client_ca: Some(t.join("ca.pem")),
            server_name: Some("localhost".into()),
        }),
        api_auth: a.tls.then(|| crate::auth::ApiAuthSection {
            node_token_file: Some(t.join("operator.token")),
            identities: vec![crate::auth::IdentitySection {
                name: "operator".into(),
                token_file: t.join("operator.token"),
                groups: None,
                allow: vec!["read".into(), "append".into(), "admin".into()],
            }],
        }),
        node: i,
        data_dir: dir.join(format!("n{i}")),
        listen: p(100, i),
        api_listen: p(0, i),
        metrics_listen: p(200, i),
        peers: (1..=a.nodes)
            .filter(|j| *j != i)
            .map(|j| (j.to_string(), p(100, j)))
            .collect(),
        groups: if a.storage && i > 3 {
            vec![]
        } else {
            let voters = if a.storage { a.nodes.min(3) } else { a.nodes };
            vec![{
                let mut g = GroupSpec::ordered(1, (1..=voters).collect(), vec![]);
                if a.mode != DevMode::Ordered {
                    g.mode = a.mode.name().into();
                }
                g
            }]
        },
        control: if a.storage {
            crate::config::ControlSection {
                group: if i <= 3 { 1 } else { 0 },
                endpoints: (1..=a.nodes.min(3)).map(|j| p(0, j)).collect(),
                rack: format!("rack{i}"),
                chunk_bytes: 64 << 20,
                scrub_bytes_per_sec: a
                    .scrub_rate
                    .unwrap_or(crate::config::ControlSection::default().scrub_bytes_per_sec),
                ..Default::default()
            }
        } else {
            Default::default()
        },
        ..ServerConfig::default()
    }
}

/// Runs `chorus dev`.
pub fn run(a: DevArgs) -> AnyResult<ExitCode> {
    if a.fresh && a.dir.exists() {
        std::fs::remove_dir_all(&a.dir).map_err(|e| format!("remove {}: {e}", a.dir.display()))?;
    }
    std::fs::create_dir_all(&a.dir).map_err(|e| format!("create {}: {e}", a.dir.display()))?;
    let dir = std::fs::canonicalize(&a.dir)?;
    let exe = std::env::current_exe()?;
    // A secured cluster: this process polls it as the operator, over mutual TLS.
    let tls_env = if a.tls {
        let t = tls_files(&dir, a.nodes)?;
        chorus_client::security::set_default_tls(Some(chorus_client::security::ClientTls::load(
            &t.join("ca.pem"),
            Some(&t.join("client.pem")),
            Some(&t.join("client.key")),
            Some("localhost".into()),
        )?));
        let token = crate::auth::read_token("operator.token", &t.join("operator.token"))?;
        chorus_client::security::set_default_token(Some(&token))?;
        Some(format!(
            "export CHORUS_CA={d}/ca.pem CHORUS_CERT={d}/client.pem CHORUS_KEY={d}/client.key CHORUS_TLS_NAME=localhost CHORUS_TOKEN=$(cat {d}/operator.token)",
            d = t.display()
        ))
    } else {
        None
    };
    let mut children: Vec<(u64, Child)> = Vec::new();
    let mut endpoints = Vec::new();
    for i in 1..=a.nodes {
        let cfg = node_config(&a, &dir, i);
        let scheme = if a.tls { "https" } else { "http" };
        endpoints.push(format!("{scheme}://{}", cfg.api_listen));
        let cfg_path = dir.join(format!("n{i}.toml"));
        std::fs::write(&cfg_path, toml::to_string(&cfg)?)?;
        let log = std::fs::File::create(dir.join(format!("n{i}.log")))?;
        let child = Command::new(&exe)
            .arg("server")
            .arg("--config")
            .arg(&cfg_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("start node {i}: {e}"))?;
        children.push((i, child));
    }
    let pids: Vec<String> = children.iter().map(|(_, c)| c.id().to_string()).collect();
    std::fs::write(dir.join("pids"), pids.join(" ") + "\n")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        let exited = children
            .iter_mut()
            .find_map(|(i, c)| c.try_wait().ok().flatten().map(|st| (*i, st)));
        if let Some((i, st)) = exited {
            {
                let log = dir.join(format!("n{i}.log"));
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(10).collect();
                stop_all(&mut children);
                // The data directory kept a group of another mode: say how to start over.
                let hint = if tail.iter().any(|l| l.contains(MODE_MISMATCH)) {
                    format!(
                        "\n{} holds group 1 in another mode from an earlier run: `chorus dev \
                         --fresh --mode {}` deletes that data first, `--dir` picks another \
                         directory",
                        dir.display(),
                        a.mode.name()
                    )
                } else {
                    String::new()
                };
                return Err(format!(
                    "node {i} exited ({st}); last lines of {}:\n{}{hint}",
                    log.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
                .into());
            }
        }
        let found = rt.block_on(async {
            let mut c = Client::new(endpoints.clone());
            // In a storage cluster nodes past the third host no group 1.
            for (_, r) in
                c.status_all(1)
                    .await
                    .into_iter()
                    .take(if a.storage { 3 } else { usize::MAX })
            {
                if let Ok(s) = r {
                    if s.groups.iter().any(|g| {
                        g.group == 1 && g.role == "leader" && (g.mode == "ordered" || g.serving)
                    }) {
                        return Some(s.node);
                    }
                }
            }
            None
        });
        if let Some(l) = found {
            break l;
        }
        if Instant::now() > deadline {
            stop_all(&mut children);
            eprintln!(
                "chorus dev: no leader within 30 s; see the logs in {}",
                dir.display()
            );
            return Ok(ExitCode::from(EXIT_UNREACHABLE));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let eps = endpoints.join(",");
    println!(
        "Chorus dev cluster: {} nodes, group 1 ({} mode), node {leader} leads.",
        a.nodes,
        a.mode.name()
    );
    println!();
    for (i, ep) in endpoints.iter().enumerate() {
        println!(
            "  node {}  api {ep}  metrics http://127.0.0.1:{}/metrics  data {}",
            i + 1,
            a.base_port as usize + 201 + i,
            dir.join(format!("n{}", i + 1)).display()
        );
    }
    println!();
    // Name the binary as the user can type it from here.
    let me = std::env::current_dir()
        .ok()
        .and_then(|cwd| {
            exe.strip_prefix(&cwd)
                .ok()
                .map(|p| format!("./{}", p.display()))
        })
        .unwrap_or_else(|| exe.display().to_string());
    let flag = if a.base_port == 7000 && a.nodes == 3 {
        String::new()
    } else {
        format!(" --endpoints {eps}")
    };
    if let Some(env) = &tls_env {
        println!("Secured (mutual TLS, operator token): client commands need, in their shell:");
        println!("  {env}");
        println!();
    }
    println!("Try, in another terminal:");
    if a.storage {
        let ctl = if a.base_port == 7000 {
            String::new()
        } else {
            format!(
                " --control {}",
                (1..=a.nodes.min(3))
                    .map(|j| format!("127.0.0.1:{}", a.base_port as u64 + j))
                    .collect::<Vec<_>>()
                    .join(",")
            )
        };
        println!(
            "  {me} node list{ctl}                        # chunk servers, racks, liveness, load"
        );
        println!(
            "  {me} volume create{ctl} db --size 256M     # 4 chunks of 64 MiB, 3 replicas each"
        );
        println!("  {me} volume write{ctl} db --offset 1M hello");
        println!("  {me} volume read{ctl} db --offset 1M --len 5");
        println!("  {me} volume stat{ctl} db                   # the chunk map and its version");
        println!("  {me} node drain{ctl} 4");
        if let Some(at) = &a.fs {
            let control: Vec<String> = (1..=a.nodes.min(3))
                .map(|j| format!("127.0.0.1:{}", a.base_port as u64 + j))
                .collect();
            match mount_fs(&exe, &a, &dir, &control.join(","), at) {
                Ok((child, at)) => {
                    children.insert(0, (0, child));
                    let pids: Vec<String> =
                        children.iter().map(|(_, c)| c.id().to_string()).collect();
                    std::fs::write(dir.join("pids"), pids.join(" ") + "\n")?;
                    println!();
                    println!(
                        "File system on volume `fs` ({} bytes), mounted read-write as host 1 at {}:",
                        a.fs_size,
                        at.display()
                    );
                    println!("  ls -la {}", at.display());
                    println!(
                        "  sqlite3 {}/app.db 'create table t(x); insert into t values (1); select * from t'",
                        at.display()
                    );
                    println!(
                        "  mkdir -p /tmp/ro && {me} fs mount{ctl} fs /tmp/ro --read-only --host-id 2 &   # a reading host"
                    );
                    println!("  {me} fs stat{ctl} fs                        # the journal's writer and anchor");
                    println!("  mount log: {}", dir.join("fs-mount.log").display());
                }
                Err(e) => {
                    stop_all(&mut children);
                    return Err(e);
                }
            }
        }
        return detach_or_wait(&a, &rt, &mut children, &dir);
    }
    println!("  {me} status{flag}");
    match a.mode {
        DevMode::Ordered => {
            println!("  {me} append{flag} hello world");
            println!("  {me} read{flag}");
            println!("  {me} tail -f{flag}");
            println!("  {me} bench{flag} --clients 100");
            println!("  {me} leader transfer{flag} --to 2");
        }
        DevMode::Parallel => {
            println!("  {me} append{flag} --blocks 10+2 hello     # writes blocks 10 and 11 (padded with zeros)");
            println!("  {me} state blocks{flag} 10 --count 2      # as every replica applied them");
        }
        DevMode::Dependent => {
            println!("  {me} append{flag} --reads 1 --writes 2 v1  # a transaction that read key 1 and wrote key 2");
            println!("  {me} state keys{flag} 1 2                 # as every replica applied them");
        }
    }
    if a.mode != DevMode::Ordered {
        println!(
            "  {me} read{flag}                           # the log: committed slots in slot order"
        );
        println!("  {me} tail -f{flag}                        # and on as more commit");
        println!(
            "  {me} bench{flag} --clients 32               # closed-loop {} over gRPC",
            if a.mode == DevMode::Parallel {
                "4 KiB random block writes"
            } else {
                "YCSB-like transactions"
            }
        );
    }
    detach_or_wait(&a, &rt, &mut children, &dir)
}

/// Makes volume `fs`, a file system on it, and mounts it at `at` in a child process
/// (logging to DIR/fs-mount.log): the child and the mount point's absolute path.
fn mount_fs(
    exe: &Path,
    a: &DevArgs,
    dir: &Path,
    control: &str,
    at: &Path,
) -> AnyResult<(Child, PathBuf)> {
    std::fs::create_dir_all(at).map_err(|e| format!("create {}: {e}", at.display()))?;
    let at = std::fs::canonicalize(at)?;
    let size = a.fs_size.to_string();
    let run = |args: &[&str]| Command::new(exe).args(args).output();
    // The chunk servers join the control plane by heartbeats: retry until they have.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let o = run(&[
            "volume",
            "create",
            "--control",
            control,
            "fs",
            "--size",
            &size,
        ])?;
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        if o.status.success() || err.contains("exists") {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("creating volume fs: {err}").into());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // A volume that holds a file system from an earlier run is mounted as it is.
    let o = run(&["fs", "stat", "--control", control, "fs"])?;
    if !o.status.success() {
        let o = run(&["fs", "mkfs", "--control", control, "fs"])?;
        if !o.status.success() {
            return Err(format!("mkfs: {}", String::from_utf8_lossy(&o.stderr)).into());
        }
    }
    let log = std::fs::File::create(dir.join("fs-mount.log"))?;
    let mut child = Command::new(exe)
        .args(["fs", "mount", "--control", control, "fs"])
        .arg(&at)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        if mounts.lines().any(|l| l.split(' ').nth(1) == at.to_str()) {
            return Ok((child, at));
        }
        if let Ok(Some(st)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("fs-mount.log")).unwrap_or_default();
            return Err(format!("chorus fs mount exited ({st}): {}", log.trim()).into());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{} was not mounted within 30 s", at.display()).into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Says where the logs are, then leaves the nodes running (`--detach`) or waits for a
/// stop.
fn detach_or_wait(
    a: &DevArgs,
    rt: &tokio::runtime::Runtime,
    children: &mut [(u64, Child)],
    dir: &Path,
) -> AnyResult<ExitCode> {
    println!();
    println!("Logs: {}/n*.log", dir.display());
    if a.detach {
        println!(
            "Running in the background; stop with: kill $(cat {}/pids)",
            dir.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    wait_for_stop(rt, children, dir)
}

/// Waits for Ctrl-C or SIGTERM (reporting nodes that exit meanwhile), then stops them.
fn wait_for_stop(
    rt: &tokio::runtime::Runtime,
    children: &mut [(u64, Child)],
    dir: &Path,
) -> AnyResult<ExitCode> {
    println!("Press Ctrl-C to stop the cluster.");
    let code = rt.block_on(async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
                _ = async { match &mut term { Some(t) => { t.recv().await; } None => std::future::pending().await } } => return ExitCode::SUCCESS,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {
                    for (i, c) in children.iter_mut() {
                        if let Ok(Some(st)) = c.try_wait() {
                            if *i == 0 {
                                eprintln!("chorus dev: the file-system mount exited ({st}); see {}/fs-mount.log", dir.display());
                            } else {
                                eprintln!("chorus dev: node {i} exited ({st}); see {}/n{i}.log", dir.display());
                            }
                        }
                    }
                }
            }
        }
    });
    stop_all(children);
    println!("stopped");
    Ok(code)
}

fn stop_all(children: &mut [(u64, Child)]) {
    // The file-system mount (number 0) first, while the volume it unmounts from is up.
    if let [(0, _), ..] = children {
        let (mount, nodes) = children.split_at_mut(1);
        stop_some(mount);
        stop_some(nodes);
    } else {
        stop_some(children);
    }
}

fn stop_some(children: &mut [(u64, Child)]) {
    for (_, c) in children.iter() {
        // SIGTERM: the server shuts down cleanly.
        // SAFETY: kill(2) with a pid we spawned and a valid signal number.
        unsafe {
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for (_, c) in children.iter_mut() {
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}
