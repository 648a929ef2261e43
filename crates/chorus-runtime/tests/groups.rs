//! One environment hosting several groups: create, list, append to each, remove one
//! (its directory goes, its handle stops, others keep working), create it again, and
//! reopen the environment to find the survivors.

use std::net::SocketAddr;
use std::time::Duration;

use chorus_runtime::{Env, EnvConfig, Error, Outcome};

fn leader_append(env: &Env, g: u64, data: &[u8]) -> u64 {
    let log = env.group(g).unwrap();
    for _ in 0..500 {
        if let Ok(a) = log.append(data, 0) {
            assert_eq!(a.result.wait().unwrap().outcome, Outcome::Committed);
            return a.lsn;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("group {g} never accepted an append");
}

#[test]
fn many_groups_in_one_env_and_removal() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || EnvConfig::new(1, dir.path(), "127.0.0.1:0".parse::<SocketAddr>().unwrap());
    let env = Env::open(cfg()).unwrap();
    for g in [3, 1, 2] {
        env.create_group(g, &[1], &[]).unwrap();
    }
    assert!(matches!(
        env.create_group(2, &[1], &[]),
        Err(Error::GroupExists(2))
    ));
    assert_eq!(env.groups(), vec![1, 2, 3]);
    for g in 1..=3 {
        let lsn = leader_append(&env, g, format!("in {g}").as_bytes());
        assert_eq!(
            env.group(g).unwrap().read(lsn).unwrap().data,
            format!("in {g}").as_bytes()
        );
    }
    let old = env.group(2).unwrap();
    env.remove_group(2).unwrap();
    assert!(!chorus_runtime::env::group_dir(dir.path(), 2).exists());
    assert!(matches!(env.group(2), Err(Error::NoSuchGroup(2))));
    assert!(matches!(env.remove_group(2), Err(Error::NoSuchGroup(2))));
    assert_eq!(env.groups(), vec![1, 3]);
    let _ = old.append(b"after removal", 0); // refused or unresolved, never a panic
    leader_append(&env, 1, b"group 1 still serves");
    // Created again from nothing.
    env.create_group(2, &[1], &[]).unwrap();
    leader_append(&env, 2, b"new 2");
    env.shutdown();
    let env = Env::open(cfg()).unwrap();
    assert_eq!(env.groups(), vec![1, 2, 3]);
    // After a restart the log's tail past the last piggybacked commit point is decided by
    // reconfirmation (piggyback paper section 5): once the replica serves again, it is
    // committed and readable.
    leader_append(&env, 1, b"after reopen");
    let recs: Vec<_> = env
        .group(1)
        .unwrap()
        .reader(0)
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(recs.iter().any(|r| r.data == b"group 1 still serves"));
    env.shutdown();
}
