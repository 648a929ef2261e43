//! A network of real hosts on one machine: each node in a network namespace of its own,
//! joined to a bridge in the harness's namespace by a veth pair, and links cut, made
//! one-way or lossy by nftables rules in each node's namespace.
//!
//! ```text
//!   harness (10.213.X.1, bridge chbTAG)
//!      ├── veth ── namespace chorus-TAG-1: eth0 10.213.X.11
//!      ├── veth ── namespace chorus-TAG-2: eth0 10.213.X.12
//!      └── veth ── namespace chorus-TAG-3: eth0 10.213.X.13
//! ```
//!
//! A cut is a rule at the receiver: node `to` drops every packet whose source is node
//! `from` (host 0 is the harness, where the clients run). Packets vanish, as they do in a
//! real partition: nothing is refused, the sender's TCP retransmits until the link heals.
//! Cutting only `from → to` is a one-way partition at the packet level (a TCP connection
//! needs both directions, so both directions' connections stall, as in Jepsen's). Loss is
//! `numgen random mod 100 < P drop` on every packet a node receives.
//!
//! Delay and reordering (`tc netem`) are used when the kernel has `sch_netem`; the
//! kernels of some CI machines do not (`Net::has_netem` says), and the harness then says
//! so instead of pretending.
//!
//! Every namespace, veth and the bridge are removed when the `Net` is dropped. A harness
//! killed before it could clean up leaves an owner file in `/run/chorus-nemesis`; the
//! next `Net::create` removes what a dead owner left.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::Error;

const OWNERS: &str = "/run/chorus-nemesis";

/// The network of one run.
///
/// Invariants: `deaf[i]` and `loss[i]` are the rules installed in node `i + 1`'s
/// namespace (every change goes through `install`); the namespaces
/// `chorus-{tag}-{1..=n}`, their veths and bridge `chb{tag}` exist from `create` until
/// drop.
#[derive(Debug)]
pub struct Net {
    tag: String,
    octet: u8,
    n: usize,
    deaf: Vec<BTreeSet<usize>>,
    loss: Vec<u8>,
    netem: bool,
}

/// Runs `cmd`; its output, or an error naming it with what it printed.
pub(crate) fn run_cmd(cmd: &mut Command) -> Result<String, Error> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Command {
            cmd: format!("{cmd:?}"),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(Error::Command {
            cmd: format!("{cmd:?}"),
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<String, Error> {
    run_cmd(Command::new("ip").args(args))
}

/// Whether `pid` names a live process.
fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() != libc::ESRCH }
}

/// Why this machine cannot run the network, or `None` when it can: root, `ip` (iproute2)
/// and `nft` (nftables) are needed.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root".into());
    }
    for (tool, pkg) in [("ip", "iproute2"), ("nft", "nftables")] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!("`{tool}` not found (Debian package {pkg})"));
        }
    }
    None
}

/// Removes what harnesses that died without cleaning up left behind.
fn remove_stale() {
    let Ok(dir) = std::fs::read_dir(OWNERS) else {
        return;
    };
    for e in dir.flatten() {
        let tag = e.file_name().to_string_lossy().into_owned();
        let pid = std::fs::read_to_string(e.path())
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        if pid.is_some_and(alive) {
            continue;
        }
        remove_tag(&tag);
        let _ = std::fs::remove_file(e.path());
    }
}

fn remove_tag(tag: &str) {
    let prefix = format!("chorus-{tag}-");
    if let Ok(list) = std::fs::read_dir("/run/netns") {
        for ns in list.flatten() {
            let name = ns.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) {
                let _ = ip(&["netns", "del", &name]);
            }
        }
    }
    let _ = ip(&["link", "del", &format!("chb{tag}")]);
}

/// A number that differs between runs and processes (no cryptographic use).
fn entropy() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = t ^ (u64::from(std::process::id()) << 32);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 33)
}

impl Net {
    /// Creates the bridge and `n` namespaces (nodes 1..=n).
    pub fn create(n: usize) -> Result<Net, Error> {
        if let Some(why) = unavailable() {
            return Err(Error::Unavailable(why));
        }
        assert!((1..=15).contains(&n), "1 to 15 nodes");
        remove_stale();
        std::fs::create_dir_all(OWNERS).map_err(|e| Error::io(OWNERS, e))?;
        let used = ip(&["-4", "-o", "addr", "show"])?;
        let mut x = entropy();
        let (tag, octet) = loop {
            let tag = format!("{:04x}", x & 0xffff);
            let octet = ((x >> 16) % 250) as u8 + 1;
            x = x.rotate_left(17).wrapping_add(0x9e37_79b9_7f4a_7c15);
            let taken = Path::new(&format!("{OWNERS}/{tag}")).exists()
                || used.contains(&format!(" 10.213.{octet}."));
            if !taken {
                break (tag, octet);
            }
        };
        std::fs::write(format!("{OWNERS}/{tag}"), std::process::id().to_string())
            .map_err(|e| Error::io(OWNERS, e))?;
        let net = Net {
            tag,
            octet,
            n,
            deaf: vec![BTreeSet::new(); n],
            loss: vec![0; n],
            netem: false,
        };
        net.build()?;
        let mut net = net;
        net.netem = net.probe_netem();
        Ok(net)
    }

    fn build(&self) -> Result<(), Error> {
        let br = format!("chb{}", self.tag);
        ip(&["link", "add", &br, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{}/24", self.host_ip()), "dev", &br])?;
        ip(&["link", "set", &br, "up"])?;
        for i in 1..=self.n {
            let ns = self.ns(i);
            let host_end = format!("chv{}{i:x}", self.tag);
            let node_end = format!("chp{}{i:x}", self.tag);
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &host_end, "type", "veth", "peer", "name", &node_end,
            ])?;
            ip(&["link", "set", &node_end, "netns", &ns])?;
            ip(&["link", "set", &host_end, "master", &br])?;
            ip(&["link", "set", &host_end, "up"])?;
            let inside = |args: &[&str]| {
                let mut a = vec!["netns", "exec", &ns, "ip"];
                a.extend_from_slice(args);
                ip(&a)
            };
            inside(&["link", "set", &node_end, "name", "eth0"])?;
            inside(&["addr", "add", &format!("{}/24", self.ip(i)), "dev", "eth0"])?;
            inside(&["link", "set", "eth0", "up"])?;
            inside(&["link", "set", "lo", "up"])?;
            self.install(i)?;
        }
        Ok(())
    }

    fn probe_netem(&self) -> bool {
        let ns = self.ns(1);
        let ok = run_cmd(Command::new("ip").args([
            "netns", "exec", &ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay",
            "1ms",
        ]))
        .is_ok();
        if ok {
            let _ = run_cmd(Command::new("ip").args([
                "netns", "exec", &ns, "tc", "qdisc", "del", "dev", "lo", "root",
            ]));
        }
        ok
    }

    /// Whether the kernel has `sch_netem` (delay and reordering on a link).
    pub fn has_netem(&self) -> bool {
        self.netem
    }

    /// Nodes in the network.
    pub fn nodes(&self) -> usize {
        self.n
    }

    /// Node `i`'s namespace.
    pub fn ns(&self, i: usize) -> String {
        format!("chorus-{}-{i}", self.tag)
    }

    /// Node `i`'s address (host 0 is the harness).
    pub fn ip(&self, i: usize) -> String {
        if i == 0 {
            self.host_ip()
        } else {
            format!("10.213.{}.{}", self.octet, 10 + i)
        }
    }

    /// The harness's address on the bridge.
    pub fn host_ip(&self) -> String {
        format!("10.213.{}.1", self.octet)
    }

    /// A command that runs `program` inside node `i`'s namespace (`ip netns exec` execs
    /// it, so the child's pid is the program's).
    pub fn command(&self, i: usize, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(i)]).arg(program);
        c
    }

    fn install(&self, i: usize) -> Result<(), Error> {
        let mut rules = String::new();
        for &from in &self.deaf[i - 1] {
            rules.push_str(&format!("  ip saddr {} drop\n", self.ip(from)));
        }
        if self.loss[i - 1] > 0 {
            rules.push_str(&format!(
                "  numgen random mod 100 < {} drop\n",
                self.loss[i - 1]
            ));
        }
        let script = format!(
            "table inet chorus\ndelete table inet chorus\ntable inet chorus {{\n chain input {{\n  type filter hook input priority 0; policy accept;\n{rules} }}\n}}\n"
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns(i), "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::Command {
                cmd: "nft -f -".into(),
                detail: e.to_string(),
            })?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(script.as_bytes())
            .map_err(|e| Error::io("nft stdin", e))?;
        let out = child.wait_with_output().map_err(|e| Error::io("nft", e))?;
        if !out.status.success() {
            return Err(Error::Command {
                cmd: format!("nft -f - in {}", self.ns(i)),
                detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(())
    }

    /// Node `to` stops hearing `from` (0: the harness), one way.
    pub fn cut(&mut self, from: usize, to: usize) -> Result<(), Error> {
        if self.deaf[to - 1].insert(from) {
            self.install(to)?;
        }
        Ok(())
    }

    /// Every node drops `pct` percent of the packets it receives (0 heals).
    pub fn set_loss(&mut self, i: usize, pct: u8) -> Result<(), Error> {
        if self.loss[i - 1] != pct {
            self.loss[i - 1] = pct.min(100);
            self.install(i)?;
        }
        Ok(())
    }

    /// Removes every cut and all loss.
    pub fn heal(&mut self) -> Result<(), Error> {
        for i in 1..=self.n {
            if !self.deaf[i - 1].is_empty() || self.loss[i - 1] > 0 {
                self.deaf[i - 1].clear();
                self.loss[i - 1] = 0;
                self.install(i)?;
            }
        }
        Ok(())
    }

    /// The directed cuts in force, `(from, to)`.
    pub fn cuts(&self) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        for (t, froms) in self.deaf.iter().enumerate() {
            v.extend(froms.iter().map(|&f| (f, t + 1)));
        }
        v
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        remove_tag(&self.tag);
        let _ = std::fs::remove_file(format!("{OWNERS}/{}", self.tag));
    }
}
