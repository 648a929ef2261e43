//! How the scripts print what replicas exchange and do: one short line per message or
//! action, so that a golden file reads like a trace.
//!
//! - an entry is `SLOT@TERM` (`:null` for a NULL entry a merge decided), and a record's
//!   identity `rT.N` (the N-th append of the leader of term T; kept when a merge
//!   re-stamps the record at a later term);
//! - a commit window is `commit<H` (every slot below H committed) followed by
//!   `+S,S` for the slots committed past the head;
//! - a vote log is `last=SLOT@TERM head=H` (the newest entry held and the first slot not
//!   known committed, DP-Raft section 4.4's two vote rules).

use chorus_core::ooo::dependent::VoteLog;
use chorus_core::ooo::replica::{Body, Entry, Msg};
use chorus_core::ooo::CommitWindow;

/// A record's identity: `rT.N`, or `-` for none (NULL entries).
pub fn eid(eid: u64) -> String {
    if eid == 0 {
        "-".into()
    } else {
        format!("r{}.{}", eid >> 32, eid & 0xffff_ffff)
    }
}

/// `SLOT@TERM`, with `:null` for a NULL entry.
pub fn entry(e: &Entry) -> String {
    format!(
        "{}@{}{}",
        e.seq,
        e.term,
        if e.is_null() { ":null" } else { "" }
    )
}

/// A list of entries: `[4@2 5@2]`.
pub fn entries<'a>(es: impl IntoIterator<Item = &'a Entry>) -> String {
    let v: Vec<String> = es.into_iter().map(entry).collect();
    format!("[{}]", v.join(" "))
}

/// What an entry carries besides its slot and term: identity, blocks or keys, the
/// look-behind buffer (parallel mode), dependencies (dependent mode).
pub fn body(e: &Entry) -> String {
    match &e.body {
        Body::Null => "NULL".into(),
        Body::Parallel {
            ranges,
            look_behind,
            after,
            ..
        } => {
            let lb: Vec<String> = look_behind.iter().map(|r| ranges_str(r)).collect();
            let mut s = format!(
                "{} blocks={} look-behind=[{}]",
                eid(e.eid),
                ranges_str(ranges),
                lb.join(" ")
            );
            if !after.is_empty() {
                s.push_str(&format!(" after={}", list(after)));
            }
            s
        }
        Body::Dependent {
            deps, write_set, ..
        } => {
            let mut s = format!("{} write={}", eid(e.eid), list(write_set));
            if !deps.raw.is_empty() {
                s.push_str(&format!(" raw={}", list(&deps.raw)));
            }
            if !deps.waw.is_empty() {
                s.push_str(&format!(" waw={}", list(&deps.waw)));
            }
            s
        }
    }
}

fn ranges_str(r: &[chorus_core::ooo::parallel::BlockRange]) -> String {
    let v: Vec<String> = r
        .iter()
        .map(|r| format!("{}..{}", r.start, r.end))
        .collect();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(",")
    }
}

/// `a,b,c` (or `-` when empty).
pub fn list(v: &[u64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// `commit<H` then `+S,S` for the slots committed past the head.
pub fn window(w: &CommitWindow) -> String {
    let above: Vec<u64> = w.committed_above_head().collect();
    if above.is_empty() {
        format!("commit<{}", w.head())
    } else {
        format!("commit<{}+{}", w.head(), list(&above))
    }
}

fn vote_log(l: &VoteLog) -> String {
    let mut s = format!(
        "last={}@{} head={}",
        l.last_seq, l.last_term, l.first_uncommitted
    );
    if l.base != 0 {
        s.push_str(&format!(" base={}", l.base));
    }
    s
}

/// Whether a message is a bare heartbeat or an acknowledgement of nothing: `run` leaves
/// them out of its trace.
pub fn is_chatter(m: &Msg) -> bool {
    match m {
        Msg::Append { entries, .. } => entries.is_empty(),
        Msg::Ack { seqs, .. } => seqs.is_empty(),
        _ => false,
    }
}

/// The message's kind, as the `kind=` filter names it.
pub fn kind(m: &Msg) -> &'static str {
    match m {
        Msg::Vote { .. } => "Vote",
        Msg::VoteReply { .. } => "VoteReply",
        Msg::VotePart { .. } => "VotePart",
        Msg::VoteMore { .. } => "VoteMore",
        Msg::Append { .. } => "Append",
        Msg::Ack { .. } => "Ack",
        Msg::Snapshot { .. } => "Snapshot",
        Msg::PreVote { .. } => "PreVote",
        Msg::PreVoteReply { .. } => "PreVoteReply",
        Msg::TimeoutNow { .. } => "TimeoutNow",
        Msg::Config { .. } => "Config",
        Msg::Newer { .. } => "Newer",
        Msg::AskEnd { .. } => "AskEnd",
        Msg::End { .. } => "End",
        Msg::ReadProbe { .. } => "ReadProbe",
        Msg::ReadProbeAck { .. } => "ReadProbeAck",
        Msg::ConfigAck { .. } => "ConfigAck",
    }
}

/// Whether the message concerns slot `s`: an append carrying it, an acknowledgement of it,
/// a vote reply with a version of it.
pub fn touches(m: &Msg, s: u64) -> bool {
    match m {
        Msg::Append { entries, .. } => entries.iter().any(|e| e.seq == s),
        Msg::Ack { seqs, .. } => seqs.iter().any(|x| x.0 == s),
        Msg::VoteReply { entries, .. } | Msg::VotePart { entries, .. } => {
            entries.iter().any(|x| x.0.seq == s)
        }
        _ => false,
    }
}

/// One message.
pub fn msg(m: &Msg) -> String {
    match m {
        Msg::Vote {
            term, head, log, ..
        } => {
            debug_assert_eq!(*head, log.first_uncommitted);
            format!("Vote t{term} {}", vote_log(log))
        }
        Msg::VoteReply {
            term,
            granted,
            entries,
            leader_start,
        } => {
            if !granted {
                return format!("VoteReply t{term} refused");
            }
            let v: Vec<String> = entries
                .iter()
                .map(|(e, c)| format!("{}{}", entry(e), if *c { "(c)" } else { "" }))
                .collect();
            format!(
                "VoteReply t{term} granted [{}] leader-start={}@t{}",
                v.join(" "),
                leader_start.1,
                leader_start.0
            )
        }
        Msg::VotePart {
            term,
            from,
            next,
            entries,
            ..
        } => {
            let v: Vec<String> = entries
                .iter()
                .map(|(e, c)| format!("{}{}", entry(e), if *c { "(c)" } else { "" }))
                .collect();
            let end = next.map_or("end".to_string(), |n| n.to_string());
            format!("VotePart t{term} {from}..{end} [{}]", v.join(" "))
        }
        Msg::VoteMore { term, from } => format!("VoteMore t{term} from {from}"),
        Msg::Append {
            term,
            entries: es,
            commits,
            ..
        } => {
            if es.is_empty() {
                format!("Append t{term} heartbeat {}", window(commits))
            } else {
                format!("Append t{term} {} {}", entries(es), window(commits))
            }
        }
        Msg::Ack {
            term,
            seqs,
            head,
            applied,
        } => {
            let s: Vec<u64> = seqs.iter().map(|x| x.0).collect();
            format!(
                "Ack t{term} [{}] head={head} applied={applied}",
                s.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
            )
        }
        Msg::Snapshot {
            term,
            base,
            offset,
            total,
            part,
            data,
        } => format!(
            "Snapshot t{term} base={base} {} bytes {}..{} of {total}",
            part.map_or("whole".to_string(), |f| format!("partial-from={f}")),
            offset,
            offset + data.len() as u64
        ),
        Msg::PreVote { term, log, .. } => format!("PreVote t{term} {}", vote_log(log)),
        Msg::PreVoteReply { term, granted } => format!(
            "PreVoteReply t{term} {}",
            if *granted { "granted" } else { "refused" }
        ),
        Msg::TimeoutNow { term } => format!("TimeoutNow t{term}"),
        Msg::Config { term, membership } => format!(
            "Config t{term} v{}.{} voters={:?}{}",
            membership.version.0,
            membership.version.1,
            membership.voters,
            membership
                .prev
                .as_ref()
                .map_or(String::new(), |p| format!(" joint-with={p:?}"))
        ),
        Msg::Newer { membership } => format!(
            "Newer v{}.{} voters={:?}",
            membership.version.0, membership.version.1, membership.voters
        ),
        Msg::AskEnd { term, .. } => format!("AskEnd t{term}"),
        Msg::End { term, end } => format!("End t{term} end={end}"),
        Msg::ReadProbe { term, probe } => format!("ReadProbe t{term} #{probe}"),
        Msg::ReadProbeAck { term, probe } => format!("ReadProbeAck t{term} #{probe}"),
        Msg::ConfigAck {
            term,
            version,
            head,
        } => format!("ConfigAck t{term} v{}.{} head={head}", version.0, version.1),
    }
}
