//! Group entries: several writers' records carried in one slot.
//!
//! The replica orders, commits and applies *entries*; what an entry declares (block
//! ranges, or read and write sets) is all the commit and apply rules look at. A driver that
//! takes many appends at once packs them into one entry — PALF's group entry (section
//! 4.1), ParallelRaft's and DP-Raft's "group" — whose declaration is the **union** of its
//! records' declarations and whose data is the records themselves, each with its own
//! declaration ([`crate::format::ooo::encode_group`]). This is sound because a union only
//! adds conflicts: an entry that declares more waits for more, never for less; and the
//! records of one entry that write a block or key in common are applied in their order
//! inside it (records that write nothing in common may be applied at once, on several
//! threads: [`independent_sets`], packed per thread by [`pieces`]), so what they do to
//! each other is their order in the group, exactly as if they had had consecutive slots.
//! What the group saves is everything paid per entry: header, metadata, one write, one
//! acknowledgement, one commit-window bit, one apply release.
//!
//! Every record of a group gets the group's outcome: an entry commits or fails whole, so
//! each writer still hears exactly one of Committed or Failed.

use super::parallel::BlockRange;
use super::replica::{Body, Declared, Entry, Mode, OooAppendError};
use super::OooError;
use crate::format::ooo::decode_group;
use crate::format::FormatError;

/// Records a driver puts in one group entry, at most.
pub const MAX_GROUP_RECORDS: usize = 256;

/// Record bytes a driver puts in one group entry, at most — PolarFS's catch-up piece
/// (section 5.3: 128 KiB), so that a group fits one catch-up piece; a single larger record
/// gets an entry of its own.
pub const MAX_GROUP_BYTES: usize = 128 << 10;

/// One writer's record inside a group entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// What the record declares.
    pub declared: Declared,
    /// The record's bytes.
    pub data: Vec<u8>,
}

/// Checks one record's declaration against the group's mode before it joins a group, so a
/// bad record is refused alone instead of failing the group it would have joined.
pub fn check(mode: Mode, declared: &Declared) -> Result<(), OooAppendError> {
    match (mode, declared) {
        (Mode::Parallel { .. }, Declared::Blocks(rs)) => {
            if let Some(r) = rs.iter().find(|r| r.start >= r.end) {
                return Err(OooAppendError::Refused(OooError::Malformed {
                    seq: 0,
                    detail: format!("empty block range {}..{}", r.start, r.end),
                }));
            }
            Ok(())
        }
        (Mode::Dependent, Declared::Txn { .. }) => Ok(()),
        (mode, d) => Err(OooAppendError::WrongMode {
            declared: match d {
                Declared::Blocks(_) => "block-range",
                Declared::Txn { .. } => "read/write-set",
            },
            mode,
        }),
    }
}

/// The union of the records' declarations, in canonical form: block ranges sorted with
/// overlapping and adjacent ones merged; read and write sets sorted without repeats.
/// The records must all be of one kind (checked by [`check`] against one mode); a record
/// of the other kind is left out.
pub fn union(mode: Mode, records: &[Record]) -> Declared {
    match mode {
        Mode::Parallel { .. } => {
            let mut all: Vec<BlockRange> = records
                .iter()
                .filter_map(|r| match &r.declared {
                    Declared::Blocks(rs) => Some(rs.iter().copied()),
                    Declared::Txn { .. } => None,
                })
                .flatten()
                .collect();
            all.sort_by_key(|r| (r.start, r.end));
            let mut out: Vec<BlockRange> = Vec::with_capacity(all.len());
            for r in all {
                match out.last_mut() {
                    Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                    _ => out.push(r),
                }
            }
            Declared::Blocks(out)
        }
        Mode::Dependent => {
            let (mut read_set, mut write_set) = (Vec::new(), Vec::new());
            for r in records {
                if let Declared::Txn {
                    read_set: rs,
                    write_set: ws,
                } = &r.declared
                {
                    read_set.extend_from_slice(rs);
                    write_set.extend_from_slice(ws);
                }
            }
            for s in [&mut read_set, &mut write_set] {
                s.sort_unstable();
                s.dedup();
            }
            Declared::Txn {
                read_set,
                write_set,
            }
        }
    }
}

/// Splits records, in order, into groups of at most [`MAX_GROUP_RECORDS`] records and
/// [`MAX_GROUP_BYTES`] record bytes (a record larger than that alone). Returns each
/// group's length.
pub fn split(sizes: impl IntoIterator<Item = usize>) -> Vec<usize> {
    let mut out = Vec::new();
    let (mut n, mut bytes) = (0usize, 0usize);
    for s in sizes {
        if n > 0 && (n == MAX_GROUP_RECORDS || bytes + s > MAX_GROUP_BYTES) {
            out.push(n);
            (n, bytes) = (0, 0);
        }
        n += 1;
        bytes += s;
    }
    if n > 0 {
        out.push(n);
    }
    out
}

/// Blocks a record may touch before [`waiting_last`] counts it as touching everything.
const MAX_TOUCHED: u64 = 4096;

/// The keys or blocks a record reads or writes (`None`: more blocks than are worth
/// listing, so it touches everything).
fn touched(d: &Declared) -> Option<Vec<u64>> {
    match d {
        Declared::Txn {
            read_set,
            write_set,
        } => Some(read_set.iter().chain(write_set).copied().collect()),
        Declared::Blocks(ranges) => {
            let n = ranges
                .iter()
                .map(|b| b.end.saturating_sub(b.start))
                .fold(0u64, u64::saturating_add);
            (n <= MAX_TOUCHED).then(|| ranges.iter().flat_map(|b| b.start..b.end).collect())
        }
    }
}

/// Splits records taken together into those that need not wait and those that would
/// (`would_wait`), as positions ascending. The runtime asks
/// [`super::replica::OooReplica::packs_last`]: whether a record would wait to commit for
/// an uncommitted entry (the leader's commit rule,
/// [`super::replica::OooReplica::would_wait`]) or, in dependent mode, to apply on some
/// replica after a writer of its keys that replica has not applied
/// ([`super::replica::OooReplica::would_order`]). A driver packs the first into entries
/// before the second, so that a record that would wait does not hold back the commit or
/// the followers' apply of a whole group of others (DP-Raft commits and applies per
/// transaction; a group entry commits and applies as one). Moving records after others taken later
/// must not reorder two that touch a key or block in common (their order is the order
/// the database executed them in), so a record that touches what a waiting record
/// before it touches waits with it.
pub fn waiting_last<'a>(
    records: impl IntoIterator<Item = &'a Declared>,
    mut would_wait: impl FnMut(&Declared) -> bool,
) -> (Vec<usize>, Vec<usize>) {
    let mut seen: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let mut everything = false;
    let (mut free, mut waiting) = (Vec::new(), Vec::new());
    for (i, d) in records.into_iter().enumerate() {
        // Until some record waits, nothing is moved and nothing needs noting.
        if waiting.is_empty() && !would_wait(d) {
            free.push(i);
            continue;
        }
        let keys = touched(d);
        let behind = !waiting.is_empty()
            && (everything
                || keys
                    .as_ref()
                    .is_none_or(|k| k.iter().any(|x| seen.contains(x))));
        if waiting.is_empty() || behind || would_wait(d) {
            match keys {
                Some(k) => seen.extend(k),
                None => everything = true,
            }
            waiting.push(i);
        } else {
            free.push(i);
        }
    }
    (free, waiting)
}

/// The records of a group split into sets that may be applied at the same time: two
/// records whose writes overlap (a block both write, a key both write) are in one set,
/// so a set is a chain of records that must keep their group order, and records of
/// different sets write nothing in common. Each set lists record positions ascending;
/// the sets are ordered by their first record. Reads are not looked at: what a follower
/// applies is the records' writes, blind (DP-Raft section 4.3 gates a follower's apply on
/// WAW dependencies only), and blind writes to disjoint blocks or keys commute — so
/// applying the sets in any interleaving, each in order, ends where applying the group
/// in order does.
///
/// This is what lets several apply threads share one group entry (the entry-level WAW
/// rule still orders whole entries): without it a group whose union writes a hot key is
/// applied record after record even when only a few of its records write that key.
pub fn independent_sets(records: &[Record]) -> Vec<Vec<usize>> {
    let n = records.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    fn join(parent: &mut [usize], a: usize, b: usize) {
        let (ra, rb) = (find(parent, a), find(parent, b));
        // The smaller position is the root, so a set's root is its first record.
        if ra != rb {
            let (lo, hi) = (ra.min(rb), ra.max(rb));
            parent[hi] = lo;
        }
    }
    // Block ranges: sweep them by start; a range starting before the furthest end seen
    // in the current run of overlapping ranges overlaps one of them.
    let mut ranges: Vec<(u64, u64, usize)> = Vec::new();
    let mut last_writer: std::collections::HashMap<u64, usize> = Default::default();
    for (i, r) in records.iter().enumerate() {
        match &r.declared {
            Declared::Blocks(rs) => ranges.extend(rs.iter().map(|b| (b.start, b.end, i))),
            Declared::Txn { write_set, .. } => {
                for &k in write_set {
                    if let Some(j) = last_writer.insert(k, i) {
                        join(&mut parent, i, j);
                    }
                }
            }
        }
    }
    ranges.sort_unstable();
    let mut run: Option<(u64, usize)> = None; // (furthest end, a record in the run)
    for (start, end, i) in ranges {
        match run {
            Some((far, j)) if start < far => {
                join(&mut parent, i, j);
                run = Some((far.max(end), j));
            }
            _ => run = Some((end, i)),
        }
    }
    // A set's root is its first record, so going up the positions meets each root
    // before the rest of its set.
    let mut sets: Vec<Vec<usize>> = Vec::new();
    let mut set_at = vec![usize::MAX; n];
    for i in 0..n {
        let root = find(&mut parent, i);
        if root == i {
            set_at[i] = sets.len();
            sets.push(Vec::new());
        }
        sets[set_at[root]].push(i);
    }
    sets
}

/// Packs [`independent_sets`] into at most `n` pieces for `n` apply threads: the largest
/// set first, each into the piece with the fewest records so far; each piece's places
/// ascending, which keeps every set's own order. No two pieces write a block or key in
/// common, because each set lies whole in one. Pieces come out non-empty; `n` of 0 counts
/// as 1.
pub fn pieces(sets: Vec<Vec<usize>>, n: usize) -> Vec<Vec<usize>> {
    let n = n.clamp(1, sets.len().max(1));
    let mut sets = sets;
    sets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut bins: Vec<Vec<usize>> = vec![Vec::new(); n];
    for set in sets {
        if let Some(bin) = bins.iter_mut().min_by_key(|b| b.len()) {
            bin.extend(set);
        }
    }
    bins.retain(|b| !b.is_empty());
    for b in &mut bins {
        b.sort_unstable();
    }
    bins
}

/// The records of a group entry, in their order (none for NULL). An entry whose data is
/// not a group payload, or holds a record of the other mode's kind, is an error naming
/// the slot.
pub fn records(e: &Entry) -> Result<Vec<Record>, FormatError> {
    let blocks = match &e.body {
        Body::Null => return Ok(Vec::new()),
        Body::Parallel { .. } => true,
        Body::Dependent { .. } => false,
    };
    let rs = decode_group(e.data())?;
    if let Some(i) = rs
        .iter()
        .position(|r| matches!(r.declared, Declared::Blocks(_)) != blocks)
    {
        return Err(FormatError::Malformed {
            what: "out-of-order group payload",
            detail: format!(
                "slot {}: record {i} is not of its entry's mode ({})",
                e.seq,
                if blocks { "parallel" } else { "dependent" }
            ),
        });
    }
    Ok(rs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn blocks(rs: &[(u64, u64)]) -> Record {
        Record {
            declared: Declared::Blocks(
                rs.iter()
                    .map(|&(start, end)| BlockRange { start, end })
                    .collect(),
            ),
            data: Vec::new(),
        }
    }

    #[test]
    fn block_union_merges_overlapping_and_adjacent_ranges() {
        let u = union(
            Mode::Parallel { span: 2 },
            &[
                blocks(&[(10, 12), (0, 1)]),
                blocks(&[(1, 3), (11, 15)]),
                blocks(&[(20, 21)]),
            ],
        );
        assert_eq!(
            u,
            Declared::Blocks(vec![
                BlockRange { start: 0, end: 3 },
                BlockRange { start: 10, end: 15 },
                BlockRange { start: 20, end: 21 },
            ])
        );
    }

    #[test]
    fn txn_union_is_sorted_without_repeats() {
        let t = |r: &[u64], w: &[u64]| Record {
            declared: Declared::Txn {
                read_set: r.to_vec(),
                write_set: w.to_vec(),
            },
            data: vec![1],
        };
        assert_eq!(
            union(Mode::Dependent, &[t(&[5, 1], &[9]), t(&[1], &[9, 2])]),
            Declared::Txn {
                read_set: vec![1, 5],
                write_set: vec![2, 9],
            }
        );
    }

    #[test]
    fn check_refuses_the_other_mode_and_empty_ranges() {
        let txn = Declared::Txn {
            read_set: vec![],
            write_set: vec![1],
        };
        assert!(matches!(
            check(Mode::Parallel { span: 2 }, &txn),
            Err(OooAppendError::WrongMode { .. })
        ));
        assert!(check(Mode::Dependent, &txn).is_ok());
        assert!(matches!(
            check(Mode::Parallel { span: 2 }, &blocks(&[(4, 4)]).declared),
            Err(OooAppendError::Refused(OooError::Malformed { .. }))
        ));
        assert!(matches!(
            check(Mode::Dependent, &blocks(&[(4, 5)]).declared),
            Err(OooAppendError::WrongMode { .. })
        ));
    }

    #[test]
    fn split_bounds_records_and_bytes() {
        assert_eq!(split([]), Vec::<usize>::new());
        assert_eq!(split([10; 600]), vec![256, 256, 88]);
        // 32 records of 4 KiB fill exactly one group; the 33rd starts the next.
        assert_eq!(split([4096; 33]), vec![32, 1]);
        // A record larger than the bound goes alone.
        assert_eq!(split([10, 200 << 10, 10]), vec![1, 1, 1]);
    }

    fn txn(w: &[u64]) -> Record {
        Record {
            declared: Declared::Txn {
                read_set: vec![],
                write_set: w.to_vec(),
            },
            data: vec![],
        }
    }

    #[test]
    fn independent_sets_chain_overlapping_writes_only() {
        // 0 and 2 write key 7, 2 and 4 write key 9: one chain; 1 and 3 alone. Reads
        // do not join sets.
        let mut r1 = txn(&[1]);
        r1.declared = Declared::Txn {
            read_set: vec![7, 9],
            write_set: vec![1],
        };
        let recs = [txn(&[7]), r1, txn(&[9, 7]), txn(&[3]), txn(&[9])];
        assert_eq!(
            independent_sets(&recs),
            vec![vec![0, 2, 4], vec![1], vec![3]]
        );
        // Blocks: 0..4 and 3..5 overlap; 5..6 only touches 3..5; 10..12 and 0..1 join
        // record 0 through its second range.
        let recs = [
            blocks(&[(0, 4)]),
            blocks(&[(5, 6)]),
            blocks(&[(3, 5)]),
            blocks(&[(10, 12), (0, 1)]),
        ];
        assert_eq!(independent_sets(&recs), vec![vec![0, 2, 3], vec![1]]);
        assert!(independent_sets(&[]).is_empty());
    }

    proptest! {
        /// Every block a record writes is in the union, and the union holds no block that
        /// no record writes; its ranges are sorted, disjoint and not adjacent.
        #[test]
        fn block_union_covers_exactly_the_records_blocks(
            recs in proptest::collection::vec(
                proptest::collection::vec((0u64..60, 1u64..6), 0..4), 0..8)
        ) {
            let records: Vec<Record> = recs
                .iter()
                .map(|rs| blocks(&rs.iter().map(|&(s, n)| (s, s + n)).collect::<Vec<_>>()))
                .collect();
            let Declared::Blocks(u) = union(Mode::Parallel { span: 2 }, &records) else {
                panic!("parallel union is blocks");
            };
            for w in u.windows(2) {
                prop_assert!(w[0].end < w[1].start);
            }
            for b in 0..70u64 {
                let written = recs.iter().flatten().any(|&(s, n)| s <= b && b < s + n);
                let covered = u.iter().any(|r| r.start <= b && b < r.end);
                prop_assert_eq!(written, covered, "block {}", b);
            }
        }

        /// `waiting_last` puts every record in one list once, each ascending; every record
        /// the rule says would wait is in the second; and no two records that touch a
        /// key or block in common change order (free records go first).
        #[test]
        fn waiting_last_keeps_conflicting_records_in_order(
            recs in proptest::collection::vec(
                (any::<bool>(), any::<bool>(),
                 proptest::collection::vec((0u64..30, 1u64..4), 0..3)), 0..24)
        ) {
            let decl: Vec<Declared> = recs
                .iter()
                .map(|(is_block, _, ws)| if *is_block {
                    blocks(&ws.iter().map(|&(s, n)| (s, s + n)).collect::<Vec<_>>()).declared
                } else {
                    Declared::Txn {
                        read_set: ws.iter().map(|&(s, _)| s).collect(),
                        write_set: ws.iter().map(|&(s, n)| s + n).collect(),
                    }
                })
                .collect();
            let (free, waiting) = waiting_last(&decl, |d| {
                let k = decl.iter().position(|x| std::ptr::eq(x, d)).unwrap();
                recs[k].1
            });
            let order: Vec<usize> = free.iter().chain(&waiting).copied().collect();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..decl.len()).collect::<Vec<_>>());
            prop_assert!(free.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(waiting.windows(2).all(|w| w[0] < w[1]));
            for (k, r) in recs.iter().enumerate() {
                if r.1 {
                    prop_assert!(waiting.contains(&k), "record {} would wait", k);
                }
            }
            let at: Vec<usize> = {
                let mut at = vec![0; decl.len()];
                for (pos, &k) in order.iter().enumerate() {
                    at[k] = pos;
                }
                at
            };
            for a in 0..decl.len() {
                for b in a + 1..decl.len() {
                    let (ta, tb) = (touched(&decl[a]).unwrap(), touched(&decl[b]).unwrap());
                    if ta.iter().any(|x| tb.contains(x)) {
                        prop_assert!(at[a] < at[b], "records {} and {} touch a key in common", a, b);
                    }
                }
            }
        }

        /// The sets hold every record once, each ascending, and two records of different
        /// sets write no block or key in common.
        #[test]
        fn independent_sets_partition_and_share_no_write(
            recs in proptest::collection::vec(
                (any::<bool>(), proptest::collection::vec((0u64..40, 1u64..6), 0..4)), 0..24)
        ) {
            let records: Vec<Record> = recs
                .iter()
                .map(|(is_block, ws)| if *is_block {
                    blocks(&ws.iter().map(|&(s, n)| (s, s + n)).collect::<Vec<_>>())
                } else {
                    txn(&ws.iter().map(|&(s, _)| s).collect::<Vec<_>>())
                })
                .collect();
            let sets = independent_sets(&records);
            let mut seen = vec![usize::MAX; records.len()];
            for (k, set) in sets.iter().enumerate() {
                prop_assert!(set.windows(2).all(|w| w[0] < w[1]));
                for &i in set {
                    prop_assert_eq!(seen[i], usize::MAX, "record {} twice", i);
                    seen[i] = k;
                }
            }
            prop_assert!(seen.iter().all(|&k| k != usize::MAX));
            let writes = |r: &Record, x: u64, block: bool| match &r.declared {
                Declared::Blocks(rs) => block && rs.iter().any(|b| b.start <= x && x < b.end),
                Declared::Txn { write_set, .. } => !block && write_set.contains(&x),
            };
            for i in 0..records.len() {
                for j in i + 1..records.len() {
                    if seen[i] == seen[j] {
                        continue;
                    }
                    for x in 0..50u64 {
                        for block in [true, false] {
                            prop_assert!(
                                !(writes(&records[i], x, block) && writes(&records[j], x, block)),
                                "records {} and {} both write {} but are in different sets", i, j, x
                            );
                        }
                    }
                }
            }
        }

        /// Pieces: at most `n`, non-empty, ascending, every place once, each set whole in
        /// one piece, and no piece more than the largest set above a fair share.
        #[test]
        fn pieces_hold_whole_sets_balanced(
            sizes in proptest::collection::vec(1usize..6, 0..40),
            n in 0usize..10,
        ) {
            let mut at = 0;
            let sets: Vec<Vec<usize>> = sizes
                .iter()
                .map(|&k| {
                    at += k;
                    (at - k..at).collect()
                })
                .collect();
            let got = pieces(sets.clone(), n);
            prop_assert!(got.len() <= n.max(1));
            prop_assert_eq!(got.len(), n.max(1).min(sets.len()));
            let mut all: Vec<usize> = got.iter().flatten().copied().collect();
            all.sort_unstable();
            prop_assert_eq!(all, (0..at).collect::<Vec<_>>());
            for p in &got {
                prop_assert!(!p.is_empty() && p.windows(2).all(|w| w[0] < w[1]));
            }
            for set in &sets {
                prop_assert!(got.iter().any(|p| set.iter().all(|i| p.contains(i))));
            }
            let largest = sizes.iter().copied().max().unwrap_or(0);
            let share = at.div_ceil(n.max(1));
            for p in &got {
                prop_assert!(p.len() <= share + largest, "{} > {} + {}", p.len(), share, largest);
            }
        }

        /// Groups keep the records' order, hold every record once and respect both bounds.
        #[test]
        fn split_respects_both_bounds(sizes in proptest::collection::vec(0usize..70_000, 0..700)) {
            let groups = split(sizes.iter().copied());
            prop_assert_eq!(groups.iter().sum::<usize>(), sizes.len());
            let mut at = 0;
            for n in groups {
                prop_assert!((1..=MAX_GROUP_RECORDS).contains(&n));
                let bytes: usize = sizes[at..at + n].iter().sum();
                prop_assert!(n == 1 || bytes <= MAX_GROUP_BYTES);
                at += n;
            }
        }
    }
}
