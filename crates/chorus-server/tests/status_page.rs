//! The node's status page in a real browser: three `chorus server` processes, records
//! appended to an ordered and an out-of-order group, then Debian's Chromium, headless,
//! loads the leader's page (`GET /` on its metrics listener) and dumps the DOM after the
//! page's script fetched `/status.json`: it must show the group, its leader, a committed
//! LSN at least the number of records appended, each follower's lag, and the rates with
//! a sparkline. The plain HTTP side (routes, 404, the JSON's fields) is checked too.
//!
//! Chromium is `$CHORUS_CHROMIUM` (default `/usr/bin/chromium`, Debian's `chromium`
//! package). Without it the browser test warns and passes, unless
//! `CHORUS_REQUIRE_CHROMIUM=1`, where it fails.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
#[path = "common/status_cluster.rs"]
mod status_cluster;
use status_cluster::{http_get, Cluster, ORDERED, PARALLEL};

/// Records appended to the ordered group.
const RECORDS: usize = 200;

/// The Chromium binary to drive, if there is one; `None` (with a warning) when it is
/// missing and not required.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("CHORUS_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if path.exists() {
        return Some(path);
    }
    let required = std::env::var("CHORUS_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "CHORUS_REQUIRE_CHROMIUM=1 but there is no Chromium at {} (apt-get install chromium, \
         or set CHORUS_CHROMIUM)",
        path.display()
    );
    eprintln!(
        "warning: no Chromium at {} (apt-get install chromium, or set CHORUS_CHROMIUM): \
         the status page's browser test is skipped",
        path.display()
    );
    None
}

/// Runs headless Chromium on `url` with `args` added, killed after `timeout`; returns
/// its standard output.
fn run_chromium(browser: &PathBuf, url: &str, args: &[&str], timeout: Duration) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", browser.display()));
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let end = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    match status {
        Some(st) if st.success() => out,
        Some(st) => panic!("chromium exited with {st}; stderr:\n{err}"),
        None => panic!("chromium did not finish within {timeout:?}; stderr:\n{err}"),
    }
}

/// The value of attribute `attr` of the first element whose opening tag contains
/// `marker`, in serialized HTML `html`.
fn attr_of(html: &str, marker: &str, attr: &str) -> Option<String> {
    let at = html.find(marker)?;
    let start = html[..at].rfind('<')?;
    let end = at + html[at..].find('>')?;
    let tag = &html[start..end];
    let key = format!("{attr}=\"");
    let v = tag.find(&key)? + key.len();
    Some(tag[v..v + tag[v..].find('"')?].to_string())
}

/// The text of the element whose opening tag contains `marker` (up to the next tag).
fn text_of(html: &str, marker: &str) -> Option<String> {
    let at = html.find(marker)?;
    let open_end = at + html[at..].find('>')? + 1;
    let close = open_end + html[open_end..].find('<')?;
    Some(html[open_end..close].to_string())
}

/// The part of `html` from the element `<tag id="id"` to its first `</tag>`.
fn element<'a>(html: &'a str, tag: &str, id: &str) -> Option<&'a str> {
    let start = html.find(&format!("<{tag} id=\"{id}\""))?;
    let len = html[start..].find(&format!("</{tag}>"))?;
    Some(&html[start..start + len])
}

/// The status of the node at `addr`, parsed.
fn status_json(addr: &str) -> Option<Value> {
    match http_get(addr, "/status.json") {
        Some((200, body)) => serde_json::from_str(&body).ok(),
        _ => None,
    }
}

fn group(status: &Value, id: u64) -> Option<&Value> {
    status["groups"]
        .as_array()?
        .iter()
        .find(|g| g["id"].as_u64() == Some(id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_the_groups_their_lag_and_the_rates_in_a_real_browser() {
    let browser = chromium();
    let t0 = Instant::now();
    let cluster = Cluster::start();
    cluster.wait_leaders(Duration::from_secs(60)).await;
    let started = t0.elapsed();
    let last_lsn = cluster.append_ordered(RECORDS).await;
    cluster.append_parallel(30).await;

    // The ordered group's leader, once its sampler has counted the appends (one sample
    // every 5 s) and it has heard from both followers.
    let end = Instant::now() + Duration::from_secs(40);
    let (addr, status) = loop {
        let found = cluster.metrics.iter().find_map(|addr| {
            let s = status_json(addr)?;
            let g = group(&s, ORDERED)?;
            let rated = s["rates"]["samples"]
                .as_array()?
                .iter()
                .any(|r| r["appends_per_sec"].as_f64() > Some(0.0));
            (g["role"] == "leader"
                && s["rates"]["samples"].as_array()?.len() >= 2
                && g["replicas"].as_array()?.len() == 2
                && g["committed_lsn"].as_u64()? >= last_lsn
                && rated)
                .then(|| (addr.clone(), s))
        });
        if let Some(f) = found {
            break f;
        }
        if Instant::now() > end {
            cluster.dump_logs();
            let all: Vec<_> = cluster.metrics.iter().map(|a| status_json(a)).collect();
            panic!("no leader of group {ORDERED} with rates in its status: {all:#?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let node = status["node"].as_u64().unwrap();

    // The JSON: every documented field of a node, an ordered and an out-of-order group.
    for f in [
        "node",
        "replication_addr",
        "now_ms",
        "disk_free_bytes",
        "disk_low",
        "groups",
        "rates",
    ] {
        assert!(status.get(f).is_some(), "status.json lacks {f}: {status}");
    }
    let ord = group(&status, ORDERED).unwrap();
    assert_eq!(ord["mode"], "ordered");
    assert_eq!(ord["leader"].as_u64(), Some(node));
    assert!(ord["term"].as_u64().unwrap() > 0, "{ord}");
    assert_eq!(ord["voters"], serde_json::json!([1, 2, 3]));
    for r in ord["replicas"].as_array().unwrap() {
        assert_eq!(r["lag_unit"], "bytes");
        assert!(r["matched"].as_u64().unwrap() <= ord["end_lsn"].as_u64().unwrap());
    }
    let par = group(&status, PARALLEL).expect("the parallel group");
    assert_eq!(par["mode"], "parallel");
    assert!(par["committed_seq"].as_u64().is_some(), "{par}");
    assert!(par["applied_seq"].as_u64().is_some(), "{par}");
    assert!(par["committed_lsn"].is_null(), "{par}");
    // Its leader (wherever it is) reports its followers' progress in slots.
    let par_leader = par["leader"].as_u64().unwrap();
    let ps = status_json(&cluster.metrics[(par_leader - 1) as usize]).unwrap();
    let pl = group(&ps, PARALLEL).unwrap();
    let reps = pl["replicas"].as_array().unwrap();
    assert_eq!(reps.len(), 2, "{pl}");
    assert!(reps.iter().all(|r| r["lag_unit"] == "slots"), "{pl}");
    assert_eq!(status["rates"]["interval_secs"], 5);
    assert!(status["rates"]["appends_total"].as_u64().unwrap() >= RECORDS as u64);

    // The routes: the page at / and /status, the exposition, 404 elsewhere.
    let (code, page) = http_get(&addr, "/").unwrap();
    assert_eq!(code, 200);
    assert!(
        page.contains("status.json") && page.contains("<svg"),
        "{page}"
    );
    // Self-contained: nothing loaded from elsewhere.
    for external in ["src=", "<link", "@import", "url("] {
        assert!(!page.contains(external), "the page refers to {external}...");
    }
    assert_eq!(http_get(&addr, "/status").unwrap().0, 200);
    assert_eq!(http_get(&addr, "/status.json?x=1").unwrap().0, 200);
    let (code, metrics) = http_get(&addr, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(metrics.contains("chorus_appends_total{"), "{metrics}");
    assert_eq!(http_get(&addr, "/nope").unwrap().0, 404);
    assert_eq!(http_get(&addr, "/status.json/x").unwrap().0, 404);

    let Some(browser) = browser else {
        return;
    };
    let t1 = Instant::now();
    let dom = run_chromium(
        &browser,
        &format!("http://{addr}/"),
        &["--dump-dom", "--virtual-time-budget=6000"],
        Duration::from_secs(90),
    );
    let browsed = t1.elapsed();
    let show = || {
        let mut d = dom.clone();
        d.truncate(20_000);
        d
    };
    assert!(
        attr_of(&dom, "<body", "data-loaded").is_some(),
        "the page's script did not render a status:\n{}",
        show()
    );
    assert_eq!(
        text_of(&dom, "id=\"title\"").as_deref(),
        Some(format!("Chorus node {node}").as_str()),
        "{}",
        show()
    );
    let row = element(&dom, "tr", &format!("group-{ORDERED}"))
        .unwrap_or_else(|| panic!("no row for group {ORDERED}:\n{}", show()));
    let num = |html: &str, class: &str| -> u64 {
        attr_of(html, &format!("class=\"{class}"), "data-value")
            .unwrap_or_else(|| panic!("no {class} in {html}"))
            .parse()
            .unwrap()
    };
    assert_eq!(num(row, "leader"), node, "{row}");
    assert!(
        text_of(row, "class=\"leader\"")
            .unwrap()
            .contains(&format!("node {node}")),
        "{row}"
    );
    assert!(text_of(row, "class=\"role").unwrap() == "leader", "{row}");
    let committed = num(row, "committed");
    assert!(
        committed >= RECORDS as u64 && committed >= last_lsn,
        "committed LSN {committed} shown, {RECORDS} records appended up to LSN {last_lsn}: {row}"
    );
    assert!(
        element(&dom, "tr", &format!("group-{PARALLEL}")).is_some(),
        "{}",
        show()
    );
    // The followers' lag, on the leader's page.
    for f in (1..=3u64).filter(|f| *f != node) {
        let lag = element(&dom, "tr", &format!("lag-{ORDERED}-{f}"))
            .unwrap_or_else(|| panic!("no lag row for follower {f}:\n{}", show()));
        assert!(lag.contains("bytes"), "{lag}");
        assert!(num(lag, "matched") <= num(row, "end"), "{lag} {row}");
    }
    // The rates: a value and a sparkline drawn from the sampler's ring.
    let rates = element(&dom, "section", "rates")
        .unwrap_or_else(|| panic!("no rates section:\n{}", show()));
    let appends: f64 = attr_of(rates, "id=\"appends-rate\"", "data-value")
        .unwrap_or_else(|| panic!("no appends rate shown: {rates}"))
        .parse()
        .unwrap();
    assert!(appends >= 0.0, "{rates}");
    assert!(
        attr_of(rates, "id=\"fsyncs-rate\"", "data-value").is_some(),
        "{rates}"
    );
    // The appends were counted in some interval: its peak is above 0.
    let peak = text_of(rates, "id=\"appends-peak\"").unwrap();
    let peak: f64 = peak
        .strip_prefix("peak ")
        .and_then(|p| p.split("/s").next())
        .map(|p| p.replace(',', ""))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no peak appends rate shown: {peak}"));
    assert!(peak > 0.0, "{rates}");
    for svg in ["appends-spark", "fsyncs-spark"] {
        let spark = element(&dom, "svg", svg).unwrap();
        assert!(spark.contains("<polyline"), "no sparkline drawn: {spark}");
    }
    eprintln!(
        "timings: cluster up in {started:?}, browser in {browsed:?}, test {:?}",
        t0.elapsed()
    );
}
