//! `merge-table N`: what candidate N merged in its latest campaign, read off the wire —
//! its own versions and those of the granted votes that reached it before it merged —
//! the decision the public merge rules (`chorus_core::ooo::merge`, DP-Raft's Fig. 4 table)
//! take on them, and what N actually wrote at each slot. A replica that wrote anything
//! else than the rules decide is reported as an error.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use chorus_core::format::meta::NodeId;
use chorus_core::ooo::merge::{self, Answers, MergeOptions, Outcome, Version};
use chorus_core::ooo::replica::{Body, Entry};
use chorus_core::ooo::Seq;

use super::render;
use super::world::World;

fn version(e: &Entry, committed: bool) -> Version {
    Version {
        term: e.term,
        id: e.eid,
        null: e.is_null(),
        committed,
        after: match &e.body {
            Body::Dependent { deps, .. } => deps.raw.clone(),
            Body::Parallel { after, .. } => after.clone(),
            Body::Null => Vec::new(),
        },
    }
}

pub fn table(w: &World, id: NodeId) -> Result<String, String> {
    let c = w
        .campaigns
        .get(&id)
        .ok_or(format!("n{id} never campaigned"))?;
    if !c.merged {
        return Err(format!("n{id} has not merged in term {}", c.term));
    }
    let mut held: BTreeMap<NodeId, BTreeMap<Seq, (Entry, bool)>> = BTreeMap::new();
    held.insert(id, c.own.clone());
    let mut starts = BTreeMap::new();
    starts.insert(c.own_start.0, c.own_start.1);
    for (v, es, st) in &c.replies {
        starts.insert(st.0, st.1);
        held.insert(
            *v,
            es.iter()
                .filter(|(e, _)| e.seq >= c.head)
                .map(|(e, k)| (e.seq, (e.clone(), *k)))
                .collect(),
        );
    }
    let end = held
        .values()
        .filter_map(|m| m.keys().next_back())
        .max()
        .map_or(c.head, |&t| t + 1);
    let mut answers = Answers::new();
    for s in c.head..end {
        let row = held
            .iter()
            .map(|(&n, m)| {
                (
                    n,
                    m.get(&s).map(|(e, k)| {
                        starts.insert(e.term, e.start);
                        version(e, *k)
                    }),
                )
            })
            .collect();
        answers.insert(s, row);
    }
    let dropped = merge::drop_superseded(&mut answers, &starts);
    let decisions = merge::merge(id, &answers, &MergeOptions::new(c.term));
    let voters: BTreeSet<NodeId> = held.keys().copied().collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "n{id} merged term {} from slot {} with {}",
        c.term,
        c.head,
        voters
            .iter()
            .map(|v| format!("n{v}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    if dropped > 0 {
        let _ = writeln!(out, "{dropped} superseded versions dropped");
    }
    let node = &w.nodes[&id];
    let mut bad = Vec::new();
    for (d, line) in decisions.iter().zip(merge::render(&decisions).lines()) {
        let cells: Vec<String> = voters
            .iter()
            .map(|v| {
                let cell = held[v].get(&d.seq).map_or("-".to_string(), |(e, k)| {
                    format!("{}{}", render::entry(e), if *k { "(c)" } else { "" })
                });
                format!("n{v}={cell}")
            })
            .collect();
        // The paper's servers are S1..S5: the rendering says "S" for our "n".
        let _ = writeln!(out, "  {}", cells.join(" "));
        let wrote = node.mem.get(&d.seq).map(|h| &h.entry);
        let ok = match (&d.outcome, wrote) {
            (Outcome::Entry { version, .. }, Some(e)) => {
                e.term == c.term && e.eid == version.id && e.is_null() == version.null
            }
            (Outcome::Null { .. }, Some(e)) => e.term == c.term && e.is_null(),
            (_, None) => false,
        };
        let _ = writeln!(
            out,
            "{line}; n{id} wrote {}",
            wrote.map_or("nothing".into(), |e| format!(
                "{} {}",
                render::entry(e),
                render::eid(e.eid)
            ))
        );
        if !ok {
            bad.push(d.seq);
        }
    }
    if !bad.is_empty() {
        let _ = writeln!(
            out,
            "error: n{id} wrote other versions than the merge rules decide at slots {bad:?}"
        );
    }
    Ok(out)
}
