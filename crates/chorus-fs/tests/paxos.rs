//! Disk Paxos under a deterministic harness: several hosts propose for the same
//! instances, their single I/O steps interleaved by a seeded scheduler, hosts crashing
//! between steps and starting over from what their block holds on the volume. Never are
//! two different values chosen for one instance; every instance ends chosen; a broken
//! variant (phase 1 ignoring values others accepted) is caught.

use chorus_fs::device::MemDevice;
use chorus_fs::journal::{Anchor, At};
use chorus_fs::paxos::{ballot, Outcome, Pages, Proposer, Value};

mod common;
use common::Rng;

const HOSTS: u32 = 3;

fn proposal(host: u32, instance: u64) -> Value {
    Value {
        owner: host,
        anchor: Anchor {
            generation: 1,
            seq: instance,
            last: At {
                host,
                offset: instance * 4096,
            },
            base_seq: instance / 2,
            base_last: At { host: 1, offset: 0 },
        },
    }
}

/// Runs instances 1..=3 with every host proposing; returns the values each host saw
/// chosen, per instance, or an error naming a disagreement.
fn run(seed: u64, broken: bool) -> Result<Vec<Value>, String> {
    let dev = MemDevice::new(64 * 4096);
    let pages = Pages {
        start: 4096,
        hosts: HOSTS,
        uuid: 77,
    };
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut decided = Vec::new();
    for instance in 1..=3u64 {
        let mut chosen: Option<Value> = None;
        let mut rounds = vec![1u64; HOSTS as usize + 1];
        let mut props: Vec<Option<Proposer>> = (0..=HOSTS).map(|_| None).collect();
        let mut steps = 0;
        let mut ended = vec![false; HOSTS as usize + 1];
        while ended[1..].iter().any(|e| !e) {
            steps += 1;
            if steps > 20_000 {
                return Err(format!("seed {seed}: instance {instance} never ended"));
            }
            let h = 1 + rng.below(HOSTS as u64) as u32;
            if ended[h as usize] {
                continue;
            }
            // A crash between steps: the host starts over from its block on the volume.
            if rng.below(40) == 0 {
                props[h as usize] = None;
                continue;
            }
            let p = props[h as usize].get_or_insert_with(|| {
                let own = pages.read_blocks(&dev).unwrap()[h as usize - 1];
                let b = ballot(rounds[h as usize], h);
                let known = pages.read_leader(&dev).unwrap().value;
                #[cfg_attr(not(feature = "broken"), allow(unused_mut))]
                let mut p = Proposer::new(h, instance, b, proposal(h, instance), own, known);
                #[cfg(feature = "broken")]
                {
                    p.broken_ignore_accepted = broken;
                }
                let _ = broken;
                p
            });
            match p.step(&dev, &pages).unwrap() {
                None => {}
                Some(Outcome::Chosen(v)) => {
                    if let Some(c) = chosen {
                        if c != v {
                            return Err(format!(
                                "seed {seed}: instance {instance}: {c:?} and {v:?} both chosen"
                            ));
                        }
                    }
                    chosen = Some(v);
                    pages.write_leader(&dev, instance, v).unwrap();
                    ended[h as usize] = true;
                }
                Some(Outcome::Preempted { mbal, later }) => {
                    assert!(!later, "no host is past this instance yet");
                    // Try again past the highest ballot seen, after a seeded pause.
                    rounds[h as usize] = (mbal >> 16) + 1 + rng.below(2);
                    props[h as usize] = None;
                }
            }
        }
        let c = chosen.ok_or(format!("seed {seed}: instance {instance}: nothing chosen"))?;
        let leader = pages.read_leader(&dev).unwrap();
        assert_eq!((leader.instance, leader.value), (instance, c));
        decided.push(c);
    }
    Ok(decided)
}

#[test]
fn one_value_is_chosen_per_instance_under_any_interleaving() {
    let mut winners = std::collections::BTreeSet::new();
    for seed in 0..3000 {
        let d = run(seed, false).unwrap();
        winners.insert(d[0].owner);
    }
    // The harness lets every host win sometimes.
    assert_eq!(winners.len(), HOSTS as usize, "{winners:?}");
}

#[cfg(feature = "broken")]
#[test]
fn ignoring_accepted_values_is_caught() {
    let caught = (0..3000).filter(|&s| run(s, true).is_err()).count();
    assert!(caught > 0, "no seed caught two values chosen");
}

#[test]
fn pages_round_trip_and_damage_is_refused() {
    use chorus_fs::paxos::Block;
    let pages = Pages {
        start: 4096,
        hosts: 4,
        uuid: 9,
    };
    let b = Block {
        instance: 7,
        mbal: ballot(3, 2),
        bal: ballot(2, 2),
        value: proposal(2, 7),
        known: (6, proposal(3, 6)),
    };
    let p = pages.encode(2, &b);
    assert_eq!(pages.decode(2, &p).unwrap(), b);
    // Another host's page, the leader record, another file system: refused by name.
    assert!(pages
        .decode(3, &p)
        .unwrap_err()
        .to_string()
        .contains("host 2"));
    assert!(pages
        .decode(0, &p)
        .unwrap_err()
        .to_string()
        .contains("leader record"));
    let other = Pages { uuid: 10, ..pages };
    assert!(other.decode(2, &p).is_err());
    let mut d = p.clone();
    d[30] ^= 4;
    assert!(pages
        .decode(2, &d)
        .unwrap_err()
        .to_string()
        .contains("checksum"));
    // Never written: an empty block.
    assert_eq!(pages.decode(2, &[0u8; 4096]).unwrap(), Block::default());
}
