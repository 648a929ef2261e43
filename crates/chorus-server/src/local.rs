//! Local tools that work on a data directory without a running server: `demo` and
//! `inspect`.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use chorus_core::format::block::{BlockHeader, BLOCK_HEADER_SIZE};
use chorus_core::format::group::{
    block_remaining, encode_padding, fits_in_block, verify_entries, GroupHeader, SealParams,
    GROUP_HEADER_SIZE,
};
use chorus_core::format::{entry, group};
use chorus_storage::fs::{FileSystem, RealFs};
use chorus_storage::log::block_file_name;
use chorus_storage::{LogOptions, LogStorage};
use serde::Serialize;

use crate::{AnyResult, Output};

#[derive(Serialize)]
struct DemoReport {
    dir: String,
    records: u64,
    record_bytes: u64,
    groups: u64,
    syncs: u64,
    seconds: f64,
    records_per_sec: f64,
    mb_per_sec: f64,
    end_lsn: u64,
    reopen_ms: f64,
    recovered_end_lsn: u64,
}

/// `chorus demo DIR`: appends `records` records to a fresh local log in `dir`, in groups of
/// `group_records`, reopens it and reports the rates and the recovered end.
pub fn demo(dir: &Path, records: u64, group_records: u64, output: Output) -> AnyResult<ExitCode> {
    let fs: Arc<dyn FileSystem> = Arc::new(RealFs::new());
    fs.create_dir_all(dir)?;
    let opts = LogOptions::default();
    let mut log = if fs.exists(&dir.join("log"))? {
        let id = first_block_header(dir)?.log_id;
        LogStorage::open(fs.clone(), dir, opts, id)?.0
    } else {
        let id = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64
            ^ ((std::process::id() as u64) << 32);
        // A single-replica membership, so the meta file beside the log is real too.
        let meta = chorus_core::format::meta::MetaRecord {
            log_id: id,
            block_size: opts.block_size,
            membership: chorus_core::format::meta::Membership {
                voters: vec![1],
                ..Default::default()
            },
            ..Default::default()
        };
        chorus_storage::MetaStorage::create(fs.clone(), dir, &meta)?;
        LogStorage::create(fs.clone(), dir, opts, id)?
    };
    let record = vec![0x5Au8; 512];
    let started = Instant::now();
    let (mut groups, mut syncs, mut done) = (0u64, 0u64, 0u64);
    let mut buf = Vec::new();
    while done < records {
        let n = group_records.min(records - done);
        buf.clear();
        let mut chain = log.chain();
        let size = GROUP_HEADER_SIZE as u64 + n * entry::entry_size(512) as u64;
        if !fits_in_block(chain.end_lsn, size, opts.block_size) {
            let pad = block_remaining(chain.end_lsn, opts.block_size);
            chain = encode_padding(&mut buf, &chain, 1, chain.end_lsn, pad).chain_after();
            groups += 1;
        }
        let recs: Vec<(u64, &[u8])> = (0..n)
            .map(|i| (chain.max_csn + 1 + i, &record[..]))
            .collect();
        let params = SealParams {
            proposal_id: 1,
            committed_end_lsn: log.flushed_end(),
            flags: 0,
        };
        group::encode_group(&mut buf, &chain, params, &recs);
        log.append(&buf)?;
        log.sync()?;
        groups += 1;
        syncs += 1;
        done += n;
    }
    let seconds = started.elapsed().as_secs_f64();
    let end_lsn = log.end_lsn();
    let log_id = log.log_id();
    drop(log);
    let t = Instant::now();
    let (log, _) = LogStorage::open(fs, dir, opts, log_id)?;
    let reopen_ms = t.elapsed().as_secs_f64() * 1e3;
    let r = DemoReport {
        dir: dir.display().to_string(),
        records,
        record_bytes: 512,
        groups,
        syncs,
        seconds,
        records_per_sec: records as f64 / seconds,
        mb_per_sec: (records * 512) as f64 / seconds / 1e6,
        end_lsn,
        reopen_ms,
        recovered_end_lsn: log.end_lsn(),
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&r)?),
        Output::Table => {
            println!(
                "appended {} records of 512 B in {} groups ({} fdatasyncs) in {:.2} s: \
                 {:.0} records/s, {:.1} MB/s of payload",
                r.records, r.groups, r.syncs, r.seconds, r.records_per_sec, r.mb_per_sec
            );
            println!(
                "reopened through recovery in {:.2} ms; log end lsn {} (recovered {})",
                r.reopen_ms, r.end_lsn, r.recovered_end_lsn
            );
            println!("look inside: chorus inspect {} --verify", r.dir);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn first_block_header(dir: &Path) -> AnyResult<BlockHeader> {
    let log_dir = dir.join("log");
    let mut names: Vec<String> = std::fs::read_dir(&log_dir)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".blk"))
        .collect();
    names.sort();
    let first = names
        .first()
        .ok_or_else(|| format!("no block files in {}", log_dir.display()))?;
    let bytes = std::fs::read(log_dir.join(first))?;
    BlockHeader::decode(&bytes)
        .map_err(|e| format!("{}: {e}", log_dir.join(first).display()).into())
}

#[derive(Serialize, Clone)]
struct GroupRow {
    lsn: u64,
    size: u64,
    proposal_id: u64,
    committed_end_lsn: u64,
    entries: u32,
    csn_first: Option<u64>,
    csn_last: u64,
    padding: bool,
    checksums_ok: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    entry_list: Vec<EntryRow>,
}

#[derive(Serialize, Clone)]
struct EntryRow {
    lsn: u64,
    size: u64,
    csn: u64,
    checksums_ok: bool,
    problem: Option<String>,
}

#[derive(Serialize)]
struct BlockRow {
    file: String,
    block_id: u64,
    start_lsn: u64,
    /// Log bytes in the file: its length after the header while a problem is found.
    log_bytes: u64,
    groups: u64,
    end_lsn: u64,
    problem: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    group_list: Vec<GroupRow>,
}

#[derive(Serialize)]
struct MetaSlotRow {
    slot: usize,
    seq: Option<u64>,
    promised_proposal_id: Option<u64>,
    voted_for: Option<u64>,
    config_version: Option<String>,
    voters: Vec<u64>,
    learners: Vec<u64>,
    barrier_lsn: Option<u64>,
    access_mode: Option<String>,
    base_lsn: Option<u64>,
    problem: Option<String>,
}

#[derive(Serialize)]
struct InspectReport {
    dir: String,
    log_id: Option<u64>,
    block_size: Option<u64>,
    /// The two meta slots (absent when the directory has no meta file).
    meta: Vec<MetaSlotRow>,
    blocks: Vec<BlockRow>,
    first_problem: Option<String>,
}

/// Walks every block file with the same checks recovery and reads apply, without opening
/// the log for writing: inspecting never changes a byte.
pub fn inspect(
    dir: &Path,
    verify: bool,
    list: bool,
    list_entries: bool,
    output: Output,
) -> AnyResult<ExitCode> {
    if !dir.join("log").exists() && (dir.join("entries.log").exists() || dir.join("hard").exists())
    {
        return inspect_ooo(dir, verify, list, output);
    }
    let log_dir = dir.join("log");
    let mut names: Vec<String> = std::fs::read_dir(&log_dir)
        .map_err(|e| format!("{}: {e}", log_dir.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    let mut report = InspectReport {
        dir: dir.display().to_string(),
        log_id: None,
        block_size: None,
        meta: inspect_meta(dir),
        blocks: Vec::new(),
        first_problem: None,
    };
    // Both slots bad is a real problem; one stale or torn slot is what a crash mid-save
    // leaves and the next open repairs.
    if !report.meta.is_empty() && report.meta.iter().all(|m| m.problem.is_some()) {
        report.first_problem = Some(format!(
            "{}: both meta slots are unreadable",
            dir.join("meta").display()
        ));
    }
    let mut prev_chain = None;
    for name in names {
        let path = log_dir.join(&name);
        let bytes = std::fs::read(&path)?;
        let mut row = BlockRow {
            file: name.clone(),
            block_id: 0,
            start_lsn: 0,
            log_bytes: bytes.len().saturating_sub(BLOCK_HEADER_SIZE) as u64,
            groups: 0,
            end_lsn: 0,
            problem: None,
            group_list: Vec::new(),
        };
        let h = match BlockHeader::decode(&bytes) {
            Ok(h) => h,
            Err(e) => {
                row.problem = Some(format!("{}: offset 0: {e}", path.display()));
                note(&mut report.first_problem, &row.problem);
                report.blocks.push(row);
                continue;
            }
        };
        if name != block_file_name(h.block_id) {
            row.problem = Some(format!("{} holds block {}", path.display(), h.block_id));
        }
        if *report.log_id.get_or_insert(h.log_id) != h.log_id {
            row.problem = Some(format!(
                "{} belongs to log {:#x}, not {:#x}",
                path.display(),
                h.log_id,
                report.log_id.unwrap_or_default()
            ));
        }
        report.block_size.get_or_insert(h.block_size);
        row.block_id = h.block_id;
        row.start_lsn = h.start_lsn();
        let mut chain = h.start_chain();
        if let Some(prev) = prev_chain {
            if verify && prev != chain && row.problem.is_none() {
                row.problem = Some(format!(
                    "{}: block header chain {:?} does not continue the previous block {:?}",
                    path.display(),
                    chain,
                    prev
                ));
            }
        }
        let data = &bytes[BLOCK_HEADER_SIZE.min(bytes.len())..];
        let mut off = 0usize;
        while off < data.len() && row.problem.is_none() {
            let at = |e: &dyn std::fmt::Display| {
                format!(
                    "{}: file offset {} (lsn {}): {e}",
                    path.display(),
                    BLOCK_HEADER_SIZE + off,
                    h.start_lsn() + off as u64
                )
            };
            let g = match GroupHeader::decode(&data[off..]) {
                Ok(g) => g,
                Err(e) if data[off..].iter().all(|b| *b == 0) => {
                    let _ = e;
                    break; // unwritten space after the tail
                }
                Err(e) => {
                    row.problem = Some(at(&e));
                    break;
                }
            };
            let end = off + g.total_len() as usize;
            let mut ok = end <= data.len()
                && g.verify_chain(&chain).is_ok()
                && fits_in_block(g.lsn, g.total_len(), h.block_size);
            let mut first_csn = None;
            if ok {
                let body = &data[off + GROUP_HEADER_SIZE..end];
                let checked = g.verify_body(body).and_then(|_| {
                    if verify {
                        verify_entries(&g, body)
                    } else {
                        Ok(())
                    }
                });
                if let Err(e) = checked {
                    row.problem = Some(at(&e));
                    ok = false;
                } else if !g.is_padding() {
                    first_csn = entry::EntryIter::new(body)
                        .next()
                        .and_then(|e| e.ok())
                        .map(|e| e.csn);
                }
            } else {
                let why = match g.verify_chain(&chain) {
                    Err(e) => e.to_string(),
                    Ok(()) => "group runs past the block's data or breaks placement".into(),
                };
                row.problem = Some(at(&why));
            }
            row.groups += 1;
            let mut entry_rows = Vec::new();
            if list_entries && end <= data.len() {
                let body = &data[off + GROUP_HEADER_SIZE..end];
                for e in entry::EntryIter::new(body) {
                    match e {
                        Ok(e) => entry_rows.push(EntryRow {
                            lsn: group::entry_lsn(g.lsn, e.offset),
                            size: entry::entry_size(e.data.len()) as u64,
                            csn: e.csn,
                            checksums_ok: true,
                            problem: None,
                        }),
                        Err(err) => entry_rows.push(EntryRow {
                            lsn: g.lsn,
                            size: 0,
                            csn: 0,
                            checksums_ok: false,
                            problem: Some(err.to_string()),
                        }),
                    }
                }
            }
            if list {
                row.group_list.push(GroupRow {
                    entry_list: entry_rows,
                    lsn: g.lsn,
                    size: g.total_len(),
                    proposal_id: g.proposal_id,
                    committed_end_lsn: g.committed_end_lsn,
                    entries: g.entry_count,
                    csn_first: first_csn,
                    csn_last: g.max_csn,
                    padding: g.is_padding(),
                    checksums_ok: ok,
                });
            }
            if !ok {
                break;
            }
            chain = g.chain_after();
            off = end;
        }
        row.end_lsn = chain.end_lsn;
        if row.problem.is_none() {
            // The log's bytes, not the zeros written ahead of them (chorus_storage::log).
            row.log_bytes = row.end_lsn - row.start_lsn;
        }
        prev_chain = Some(chain);
        note(&mut report.first_problem, &row.problem);
        report.blocks.push(row);
    }
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Table => print_table(&report),
    }
    if verify && report.first_problem.is_some() {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `chorus inspect` of an out-of-order group replica (`DATA_DIR/groups/<id>`, the one
/// holding `entries.log` and `hard`).
#[derive(Serialize)]
struct OooInspectReport {
    dir: String,
    kind: &'static str,
    /// The hard state, if it decodes.
    term: Option<u64>,
    voted_for: Option<u64>,
    committed_head: Option<u64>,
    base: Option<u64>,
    leader_start: Option<(u64, u64)>,
    /// Not 0 while the replica recovers entries it lost on disk.
    lost_below: Option<u64>,
    /// The saved membership (`None`: the configured voters).
    voters: Option<Vec<u64>>,
    prev_voters: Option<Vec<u64>>,
    membership_version: Option<(u64, u64)>,
    entries_bytes: u64,
    records: u64,
    slots: u64,
    first_slot: Option<u64>,
    last_slot: Option<u64>,
    /// Bytes after the last valid record that no valid record follows (a crash before
    /// their sync; the next start cuts them).
    torn_tail_bytes: u64,
    /// Damaged stretches that valid records follow.
    damaged: Vec<OooDamageRow>,
    /// `entries.damaged` is present: a copy of an entries file found damaged earlier.
    damaged_copy: bool,
    record_list: Vec<OooRecordRow>,
    first_problem: Option<String>,
}

#[derive(Serialize)]
struct OooDamageRow {
    file_offset: u64,
    len: u64,
    detail: String,
}

#[derive(Serialize)]
struct OooRecordRow {
    file_offset: u64,
    len: u64,
    slot: u64,
    term: u64,
    eid: u64,
}

/// Reads an out-of-order group replica's files as the next start would, changing nothing:
/// the hard state, the membership, and every record of the entries file (damage before
/// the tail is a problem: the node would recover it from its peers, or refuse to start
/// in a group with no other voter).
fn inspect_ooo(dir: &Path, verify: bool, list: bool, output: Output) -> AnyResult<ExitCode> {
    let mut r = OooInspectReport {
        dir: dir.display().to_string(),
        kind: "out-of-order",
        term: None,
        voted_for: None,
        committed_head: None,
        base: None,
        leader_start: None,
        lost_below: None,
        voters: None,
        prev_voters: None,
        membership_version: None,
        entries_bytes: 0,
        records: 0,
        slots: 0,
        first_slot: None,
        last_slot: None,
        torn_tail_bytes: 0,
        damaged: Vec::new(),
        damaged_copy: dir.join("entries.damaged").exists(),
        record_list: Vec::new(),
        first_problem: None,
    };
    let hard = dir.join("hard");
    if hard.exists() {
        match chorus_storage::ooo::decode_hard_file(&std::fs::read(&hard)?) {
            Ok(h) => {
                r.term = Some(h.term);
                r.voted_for = h.voted_for;
                r.committed_head = Some(h.committed_head);
                r.base = Some(h.base);
                r.leader_start = Some(h.leader_start);
                r.lost_below = Some(h.lost_below);
            }
            Err(e) => r.first_problem = Some(format!("{}: offset 0: {e}", hard.display())),
        }
    }
    let members = dir.join("members");
    if members.exists() {
        match chorus_storage::ooo::decode_membership_file(&std::fs::read(&members)?) {
            Ok(m) => {
                r.voters = Some(m.voters.clone());
                r.prev_voters = m.prev.clone();
                r.membership_version = Some(m.version);
            }
            Err(e) => {
                let p = Some(format!("{}: offset 0: {e}", members.display()));
                note(&mut r.first_problem, &p);
            }
        }
    }
    let path = dir.join("entries.log");
    if path.exists() {
        let bytes = std::fs::read(&path)?;
        let scan = chorus_storage::ooo::scan_entries(&path, &bytes);
        r.entries_bytes = bytes.len() as u64;
        r.records = scan.records.len() as u64;
        r.slots = scan.slots.len() as u64;
        r.first_slot = scan.slots.keys().next().copied();
        r.last_slot = scan.slots.keys().next_back().copied();
        r.torn_tail_bytes = scan.torn;
        if let Some(d) = scan.damaged.first() {
            note(&mut r.first_problem, &Some(d.to_error().to_string()));
        }
        r.damaged = scan
            .damaged
            .into_iter()
            .map(|d| OooDamageRow {
                file_offset: d.file_offset,
                len: d.len,
                detail: d.detail,
            })
            .collect();
        if list {
            r.record_list = scan
                .records
                .into_iter()
                .map(|(file_offset, len, slot, term, eid)| OooRecordRow {
                    file_offset,
                    len,
                    slot,
                    term,
                    eid,
                })
                .collect();
        }
    }
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&r)?),
        Output::Table => print_ooo_table(&r),
    }
    if verify && r.first_problem.is_some() {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

fn print_ooo_table(r: &OooInspectReport) {
    let opt = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
    println!("out-of-order group replica {}", r.dir);
    println!(
        "hard state: term {} voted {} committed head {} base {} leader start {}{}",
        opt(r.term),
        r.voted_for.map_or("-".into(), |v| v.to_string()),
        opt(r.committed_head),
        opt(r.base),
        r.leader_start
            .map_or("?".into(), |(t, s)| format!("term {t} slot {s}")),
        match r.lost_below {
            Some(0) | None => String::new(),
            Some(t) => format!(" (recovering entries lost on disk: acknowledged below term {t})"),
        }
    );
    match (&r.voters, &r.prev_voters) {
        (None, _) => println!("membership: the configured voters (none saved)"),
        (Some(v), None) => println!("membership: voters {v:?}"),
        (Some(v), Some(p)) => println!("membership: voters {v:?} (joint with {p:?})"),
    }
    println!(
        "entries.log: {} bytes, {} records, {} slots ({}..={}), torn tail {} bytes{}",
        r.entries_bytes,
        r.records,
        r.slots,
        opt(r.first_slot),
        opt(r.last_slot),
        r.torn_tail_bytes,
        if r.damaged_copy {
            ", entries.damaged kept from an earlier loss"
        } else {
            ""
        }
    );
    for d in &r.damaged {
        println!(
            "DAMAGED at file offset {} ({} bytes, a valid record follows): {}",
            d.file_offset, d.len, d.detail
        );
    }
    if !r.record_list.is_empty() {
        println!(
            "{:>12} {:>8} {:>10} {:>8} {:>20}",
            "file offset", "bytes", "slot", "term", "eid"
        );
        for x in &r.record_list {
            println!(
                "{:>12} {:>8} {:>10} {:>8} {:>20}",
                x.file_offset, x.len, x.slot, x.term, x.eid
            );
        }
    }
    if let Some(p) = &r.first_problem {
        println!("problem: {p}");
    }
}

/// Decodes both slots of the meta file read-only (opening `MetaStorage` would repair a
/// stale slot, and inspecting never writes).
fn inspect_meta(dir: &Path) -> Vec<MetaSlotRow> {
    let path = dir.join("meta");
    let Ok(bytes) = std::fs::read(&path) else {
        return Vec::new();
    };
    let size = chorus_storage::meta::SLOT_SIZE;
    (0..2)
        .map(|i| {
            let mut row = MetaSlotRow {
                slot: i,
                seq: None,
                promised_proposal_id: None,
                voted_for: None,
                config_version: None,
                voters: Vec::new(),
                learners: Vec::new(),
                barrier_lsn: None,
                access_mode: None,
                base_lsn: None,
                problem: None,
            };
            let slot = bytes.get(i * size..(i + 1) * size).unwrap_or(&[]);
            match chorus_storage::meta::decode_slot(slot) {
                Ok((seq, m)) => {
                    row.seq = Some(seq);
                    row.promised_proposal_id = Some(m.vote.promised_proposal_id);
                    row.voted_for = m.vote.voted_for;
                    let v = m.membership.version;
                    row.config_version = Some(format!("{}.{}", v.proposal_id, v.seq));
                    row.voters = m.membership.voters;
                    row.learners = m.membership.learners;
                    row.barrier_lsn = Some(m.membership.barrier_lsn);
                    row.access_mode = Some(m.membership.access_mode.name().to_string());
                    row.base_lsn = Some(m.base_lsn);
                }
                Err(e) => {
                    row.problem = Some(format!(
                        "{}: slot {i} at offset {}: {e}",
                        path.display(),
                        i * size
                    ))
                }
            }
            row
        })
        .collect()
}

fn note(first: &mut Option<String>, problem: &Option<String>) {
    if first.is_none() {
        first.clone_from(problem);
    }
}

fn print_table(r: &InspectReport) {
    println!(
        "log {}  id {}  block size {}",
        r.dir,
        r.log_id.map_or("?".into(), |i| format!("{i:#018x}")),
        r.block_size.map_or("?".into(), |b| b.to_string())
    );
    for m in &r.meta {
        match &m.problem {
            None => println!(
                "meta slot {}: seq {} promised {} voted {} config {} voters {:?} learners {:?} \
                 barrier {} mode {} base lsn {}",
                m.slot,
                m.seq.unwrap_or_default(),
                m.promised_proposal_id.unwrap_or_default(),
                m.voted_for.map_or("-".into(), |v| v.to_string()),
                m.config_version.as_deref().unwrap_or("?"),
                m.voters,
                m.learners,
                m.barrier_lsn.unwrap_or_default(),
                m.access_mode.as_deref().unwrap_or("?"),
                m.base_lsn.unwrap_or_default()
            ),
            Some(p) => println!("meta slot {}: {p}", m.slot),
        }
    }
    println!(
        "{:<26} {:>14} {:>14} {:>10} {:>12}  status",
        "block file", "start lsn", "end lsn", "groups", "bytes"
    );
    for b in &r.blocks {
        println!(
            "{:<26} {:>14} {:>14} {:>10} {:>12}  {}",
            b.file,
            b.start_lsn,
            b.end_lsn,
            b.groups,
            b.log_bytes,
            b.problem.as_deref().unwrap_or("ok")
        );
        if !b.group_list.is_empty() {
            println!(
                "    {:>14} {:>9} {:>9} {:>14} {:>7} {:>21}  checksums",
                "lsn", "size", "proposal", "committed end", "entries", "csn range"
            );
        }
        for g in &b.group_list {
            let csn = if g.padding {
                "padding".to_string()
            } else {
                format!("{}..={}", g.csn_first.unwrap_or(g.csn_last), g.csn_last)
            };
            println!(
                "    {:>14} {:>9} {:>9} {:>14} {:>7} {:>21}  {}",
                g.lsn,
                g.size,
                g.proposal_id,
                g.committed_end_lsn,
                g.entries,
                csn,
                if g.checksums_ok { "ok" } else { "BAD" }
            );
            for e in &g.entry_list {
                println!(
                    "        entry lsn {:>14} size {:>8} csn {:>10}  {}",
                    e.lsn,
                    e.size,
                    e.csn,
                    e.problem.as_deref().unwrap_or("ok")
                );
            }
        }
    }
    if let Some(p) = &r.first_problem {
        println!("first problem: {p}");
    }
}
