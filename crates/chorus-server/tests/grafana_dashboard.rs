//! The Grafana dashboard (`deploy/grafana/chorus-dashboard.json`) against real nodes:
//! every metric name its panels' PromQL expressions and its variables' queries use must
//! be one that a running node serves on `/metrics` — three `chorus server` processes with
//! an ordered group, an out-of-order group and the control plane (whose chunk-server and
//! volume metrics the storage rows chart), after appends to both groups. A metric renamed
//! in the code, or misspelt in the dashboard, fails here.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
#[path = "common/status_cluster.rs"]
mod status_cluster;
use status_cluster::{http_get, Cluster};

fn dashboard_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/chorus-dashboard.json")
}

/// PromQL aggregation operators: followed by `by`/`without` or `(`, never metric names.
const AGGREGATIONS: [&str; 12] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
];

/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Other PromQL words that are not metric names.
const WORDS: [&str; 7] = ["and", "or", "unless", "bool", "offset", "inf", "nan"];

/// The metric names a PromQL expression selects: identifiers outside label matchers
/// (`{...}`), range selectors (`[...]`), strings and label lists (`by (...)`), that are
/// neither functions (followed by `(`), aggregations nor keywords.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let b: Vec<char> = expr.chars().collect();
    let mut out = BTreeSet::new();
    let (mut i, mut braces, mut brackets) = (0, 0i32, 0i32);
    let mut label_list = false;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < b.len() {
        let c = b[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < b.len() && b[i] != c {
                    if b[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            '{' => braces += 1,
            '}' => braces -= 1,
            '[' => brackets += 1,
            ']' => brackets -= 1,
            '(' if label_list => {
                while i < b.len() && b[i] != ')' {
                    i += 1;
                }
                label_list = false;
            }
            '$' => {
                // A Grafana variable: `$name` or `${name}`.
                i += 1;
                while i < b.len() && (ident(b[i]) || b[i] == '{' || b[i] == '}') {
                    i += 1;
                }
                continue;
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i < b.len() && (ident(b[i]) || b[i] == '.') {
                    i += 1;
                }
                continue;
            }
            c if ident(c) => {
                let start = i;
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
                if braces > 0 || brackets > 0 {
                    continue;
                }
                let word: String = b[start..i].iter().collect();
                let mut j = i;
                while j < b.len() && b[j].is_whitespace() {
                    j += 1;
                }
                let lw = word.to_ascii_lowercase();
                if LABEL_LISTS.contains(&lw.as_str()) {
                    label_list = true;
                } else if b.get(j) == Some(&'(')
                    || AGGREGATIONS.contains(&lw.as_str())
                    || WORDS.contains(&lw.as_str())
                {
                    // A function, an aggregation or a keyword.
                } else {
                    out.insert(word);
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The metric names a variable's query uses: `label_values(EXPR, label)` selects from
/// EXPR; `label_values(label)` and `metrics(...)` from none; anything else is PromQL.
fn variable_metric_names(query: &str) -> BTreeSet<String> {
    let q = query.trim();
    if let Some(args) = q
        .strip_prefix("label_values(")
        .and_then(|a| a.strip_suffix(')'))
    {
        return match args.rsplit_once(',') {
            Some((expr, _label)) => metric_names(expr),
            None => BTreeSet::new(),
        };
    }
    if q.starts_with("metrics(") || q.starts_with("label_names(") {
        return BTreeSet::new();
    }
    metric_names(q.strip_prefix("query_result(").unwrap_or(q))
}

/// Every panel, rows' nested panels included.
fn all_panels(dash: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

/// Whether `name` is a family or a series name in exposition `text`: a `# TYPE name`
/// header, a sample `name{...}`/`name `, or a histogram's `_bucket`, `_sum` or `_count`
/// of a family declared a histogram.
fn served(text: &str, name: &str) -> bool {
    let header = |n: &str, kind: Option<&str>| {
        text.lines().any(|l| {
            l.strip_prefix("# TYPE ")
                .and_then(|r| r.strip_prefix(n))
                .and_then(|r| r.strip_prefix(' '))
                .is_some_and(|k| kind.is_none_or(|want| k.trim() == want))
        })
    };
    if header(name, None) {
        return true;
    }
    let sample = text.lines().any(|l| {
        !l.starts_with('#')
            && l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
    });
    if sample {
        return true;
    }
    ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix)
            .is_some_and(|family| header(family, Some("histogram")))
    })
}

#[test]
fn metric_names_are_found_in_promql() {
    let n = |e: &str| metric_names(e).into_iter().collect::<Vec<_>>();
    assert_eq!(
        n(
            r#"histogram_quantile(0.99, sum by (le, mode) (rate(chorus_append_seconds_bucket{node=~"$node",group=~"a|b"}[$__rate_interval])))"#
        ),
        ["chorus_append_seconds_bucket"]
    );
    assert_eq!(
        n(
            r#"max by (group) (chorus_committed_lsn{mode="ordered"}) - min by (group) (chorus_committed_lsn)"#
        ),
        ["chorus_committed_lsn"]
    );
    assert_eq!(
        n(r#"count(sum by (group) (chorus_is_leader) != 1) or vector(0)"#),
        ["chorus_is_leader"]
    );
    assert_eq!(
        n(r#"sum(rate(a_total[5m])) / on(node) group_left(rack) b offset 5m"#),
        ["a_total", "b"]
    );
    assert_eq!(
        n(r#"max(changes(chorus_proposal_id[1m])) by (group) and chorus_up"#),
        ["chorus_proposal_id", "chorus_up"]
    );
    let v = |q: &str| variable_metric_names(q).into_iter().collect::<Vec<_>>();
    assert_eq!(
        v(r#"label_values(chorus_appends_total{node=~"$node"}, mode)"#),
        ["chorus_appends_total"]
    );
    assert!(v("label_values(node)").is_empty());
    let text = "# HELP h x\n# TYPE h histogram\n# TYPE g gauge\nc_total{a=\"1\"} 3\n";
    assert!(served(text, "h_bucket") && served(text, "h_count") && served(text, "g"));
    assert!(served(text, "c_total") && !served(text, "c") && !served(text, "g_bucket"));
}

/// Every metric name the dashboard uses, with the panels using it; checks the
/// dashboard's shape on the way (the datasource variable, a query in every panel).
fn dashboard_metrics() -> Vec<(String, Vec<String>)> {
    let text = std::fs::read_to_string(dashboard_path()).expect("read the dashboard");
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert!(
        dash["schemaVersion"].as_u64().unwrap() >= 30,
        "schemaVersion"
    );
    assert!(!dash["uid"].as_str().unwrap().is_empty(), "uid");
    let vars = dash["templating"]["list"].as_array().expect("templating");
    assert!(
        vars.iter().any(|v| v["name"] == "DS_PROMETHEUS"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "no datasource variable DS_PROMETHEUS"
    );
    let mut uses: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let ds_ok = |d: &Value| d["uid"] == "${DS_PROMETHEUS}" && d["type"] == "prometheus";
    for v in vars.iter().filter(|v| v["type"] == "query") {
        assert!(
            ds_ok(&v["datasource"]),
            "variable {}: datasource",
            v["name"]
        );
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap();
        for m in variable_metric_names(q) {
            uses.entry(m)
                .or_default()
                .push(format!("variable ${}", v["name"].as_str().unwrap()));
        }
    }
    let mut panels = 0;
    for p in all_panels(&dash) {
        if p["type"] == "row" {
            continue;
        }
        panels += 1;
        let title = p["title"].as_str().unwrap().to_string();
        assert!(ds_ok(&p["datasource"]), "panel {title}: datasource");
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("{title}"));
        assert!(!targets.is_empty(), "panel {title} has no query");
        for t in targets {
            assert!(ds_ok(&t["datasource"]), "panel {title}: target datasource");
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("{title}"));
            let names = metric_names(expr);
            assert!(!names.is_empty(), "panel {title}: no metric in {expr}");
            for m in names {
                uses.entry(m).or_default().push(title.clone());
            }
        }
    }
    assert!(panels >= 20, "{panels} panels");
    uses.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_uses_is_served_by_a_running_node() {
    let used = dashboard_metrics();
    assert!(used.len() >= 40, "only {} metric names found", used.len());
    let t0 = Instant::now();
    let cluster = Cluster::start();
    cluster.wait_leaders(Duration::from_secs(60)).await;
    cluster.append_ordered(100).await;
    cluster.append_parallel(20).await;
    // Metrics some nodes render only once they know something (the control leader's
    // view of live chunk servers, which register by heartbeat): wait for every name,
    // then name what is missing.
    let end = Instant::now() + Duration::from_secs(30);
    let missing = loop {
        let text: String = cluster
            .metrics
            .iter()
            .filter_map(|a| http_get(a, "/metrics"))
            .filter(|(code, _)| *code == 200)
            .map(|(_, body)| body)
            .collect::<Vec<_>>()
            .join("\n");
        let missing: Vec<_> = used.iter().filter(|(m, _)| !served(&text, m)).collect();
        if missing.is_empty() || Instant::now() > end {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        missing.is_empty(),
        "metrics the dashboard uses that no node serves:\n{}",
        missing
            .iter()
            .map(|(m, by)| format!("  {m} (in {})", by.join("; ")))
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!(
        "{} metric names of the dashboard served; {:?}",
        used.len(),
        t0.elapsed()
    );
}
