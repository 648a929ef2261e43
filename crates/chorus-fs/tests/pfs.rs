//! The file-system API against a model file system in memory: any sequence of
//! operations gives the same results (or the same errno), the same tree and the same
//! bytes — on the writing host, after a remount, and on a reading host that replays the
//! journal.

use std::collections::BTreeMap;
use std::sync::Arc;

use chorus_fs::device::MemDevice;
use chorus_fs::layout::Geometry;
use chorus_fs::meta::FileKind;
use chorus_fs::mkfs::mkfs;
use chorus_fs::pfs::{Access, FsOpError, OpenFlags, Pfs};
use proptest::prelude::*;

fn geometry() -> Geometry {
    with_journal(2 << 20)
}

fn with_journal(journal_bytes: u64) -> Geometry {
    Geometry {
        volume_bytes: 8 << 20,
        chunk_bytes: 4 << 20,
        block_bytes: 16 << 10,
        inodes_per_chunk: 60,
        dirents_per_chunk: 60,
        max_hosts: 4,
        journal_bytes,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Mkdir(String),
    Rmdir(String),
    Creat(String),
    Write(String, u64, usize, u8),
    Truncate(String, u64),
    Fallocate(String, u64, u64),
    Unlink(String),
    Rename(String, String),
}

/// Six paths (two names, one or two deep), so that operations meet each other often.
fn path() -> impl Strategy<Value = String> {
    proptest::collection::vec(prop_oneof![Just("a"), Just("b")], 1..=2)
        .prop_map(|v| format!("/{}", v.join("/")))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => path().prop_map(Op::Mkdir),
        1 => path().prop_map(Op::Rmdir),
        3 => path().prop_map(Op::Creat),
        5 => (path(), 0u64..50_000, 1usize..20_000, 1u8..255)
            .prop_map(|(p, o, l, b)| Op::Write(p, o, l, b)),
        2 => (path(), 0u64..60_000).prop_map(|(p, l)| Op::Truncate(p, l)),
        1 => (path(), 0u64..40_000, 1u64..30_000).prop_map(|(p, o, l)| Op::Fallocate(p, o, l)),
        1 => path().prop_map(Op::Unlink),
        2 => (path(), path()).prop_map(|(a, b)| Op::Rename(a, b)),
    ]
}

#[derive(Clone, Debug, PartialEq)]
enum M {
    Dir(BTreeMap<String, M>),
    File(Vec<u8>),
}

const ENOENT: i32 = 2;
const EEXIST: i32 = 17;
const ENOTDIR: i32 = 20;
const EISDIR: i32 = 21;
const EINVAL: i32 = 22;
const ENOTEMPTY: i32 = 39;

fn split(p: &str) -> Vec<String> {
    p.split('/')
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect()
}

/// The directory `parts` names, or the errno of walking there.
fn dir_mut<'a>(root: &'a mut M, parts: &[String]) -> Result<&'a mut BTreeMap<String, M>, i32> {
    let mut at = root;
    for c in parts {
        at = match at {
            M::Dir(m) => m.get_mut(c).ok_or(ENOENT)?,
            M::File(_) => return Err(ENOTDIR),
        };
    }
    match at {
        M::Dir(m) => Ok(m),
        M::File(_) => Err(ENOTDIR),
    }
}

fn get<'a>(root: &'a M, parts: &[String]) -> Result<&'a M, i32> {
    let mut at = root;
    for c in parts {
        at = match at {
            M::Dir(m) => m.get(c).ok_or(ENOENT)?,
            M::File(_) => return Err(ENOTDIR),
        };
    }
    Ok(at)
}

fn resize(b: &mut Vec<u8>, len: u64) {
    b.resize(len as usize, 0);
}

/// The model's answer to `op`.
fn model(root: &mut M, op: &Op) -> Result<(), i32> {
    match op {
        Op::Mkdir(p) => {
            let mut parts = split(p);
            let last = parts.pop().unwrap();
            let d = dir_mut(root, &parts)?;
            if d.contains_key(&last) {
                return Err(EEXIST);
            }
            d.insert(last, M::Dir(BTreeMap::new()));
            Ok(())
        }
        Op::Rmdir(p) => {
            let mut parts = split(p);
            let last = parts.pop().unwrap();
            let d = dir_mut(root, &parts)?;
            match d.get(&last) {
                None => Err(ENOENT),
                Some(M::File(_)) => Err(ENOTDIR),
                Some(M::Dir(m)) if !m.is_empty() => Err(ENOTEMPTY),
                Some(M::Dir(_)) => {
                    d.remove(&last);
                    Ok(())
                }
            }
        }
        Op::Creat(p) => {
            let mut parts = split(p);
            let last = parts.pop().unwrap();
            if let Ok(M::Dir(_)) = get(root, &split(p)) {
                return Err(EISDIR);
            }
            let d = dir_mut(root, &parts)?;
            d.insert(last, M::File(Vec::new()));
            Ok(())
        }
        Op::Write(p, off, len, byte) => {
            // Opened with O_CREAT: a missing file in an existing directory is created.
            if get(root, &split(p)) == Err(ENOENT) {
                let mut parts = split(p);
                let last = parts.pop().unwrap();
                dir_mut(root, &parts)?.insert(last, M::File(Vec::new()));
            }
            let b = get_file(root, p)?;
            let end = *off as usize + len;
            if b.len() < end {
                b.resize(end, 0);
            }
            b[*off as usize..end].fill(*byte);
            Ok(())
        }
        Op::Truncate(p, len) => {
            let b = get_file(root, p)?;
            resize(b, *len);
            Ok(())
        }
        Op::Fallocate(p, off, len) => {
            let b = get_file(root, p)?;
            if (b.len() as u64) < off + len {
                resize(b, off + len);
            }
            Ok(())
        }
        Op::Unlink(p) => {
            let mut parts = split(p);
            let last = parts.pop().unwrap();
            let d = dir_mut(root, &parts)?;
            match d.get(&last) {
                None => Err(ENOENT),
                Some(M::Dir(_)) => Err(EISDIR),
                Some(M::File(_)) => {
                    d.remove(&last);
                    Ok(())
                }
            }
        }
        Op::Rename(a, b) => {
            let (mut pa, mut pb) = (split(a), split(b));
            let (la, lb) = (pa.pop().unwrap(), pb.pop().unwrap());
            dir_mut(root, &pa)?;
            dir_mut(root, &pb)?;
            let src = dir_mut(root, &pa)?.get(&la).cloned().ok_or(ENOENT)?;
            let whole_a = split(a);
            let target_parent = split(b)[..split(b).len() - 1].to_vec();
            if matches!(src, M::Dir(_)) && target_parent.starts_with(&whole_a) {
                return Err(EINVAL);
            }
            if whole_a == split(b) {
                return Ok(());
            }
            match (&src, dir_mut(root, &pb)?.get(&lb)) {
                (M::File(_), Some(M::Dir(_))) => return Err(EISDIR),
                (M::Dir(_), Some(M::File(_))) => return Err(ENOTDIR),
                (M::Dir(_), Some(M::Dir(m))) if !m.is_empty() => return Err(ENOTEMPTY),
                _ => {}
            }
            dir_mut(root, &pa)?.remove(&la);
            dir_mut(root, &pb)?.insert(lb, src);
            Ok(())
        }
    }
}

fn get_file<'a>(root: &'a mut M, p: &str) -> Result<&'a mut Vec<u8>, i32> {
    let mut parts = split(p);
    let last = parts.pop().unwrap();
    let d = dir_mut(root, &parts)?;
    match d.get_mut(&last) {
        None => Err(ENOENT),
        Some(M::Dir(_)) => Err(EISDIR),
        Some(M::File(b)) => Ok(b),
    }
}

fn rw() -> OpenFlags {
    OpenFlags {
        read: true,
        write: true,
        ..OpenFlags::default()
    }
}

/// The file system's answer to `op`.
fn real(fs: &mut Pfs, op: &Op) -> Result<(), FsOpError> {
    match op {
        Op::Mkdir(p) => fs.mkdir(p, 0o755),
        Op::Rmdir(p) => fs.rmdir(p),
        Op::Creat(p) => fs.creat(p, 0o644).and_then(|fd| fs.close(fd)),
        Op::Write(p, off, len, byte) => {
            let create = OpenFlags {
                create: true,
                ..rw()
            };
            let fd = fs.open(p, create, 0o644)?;
            let r = fs.pwrite(fd, &vec![*byte; *len], *off).map(|_| ());
            fs.close(fd)?;
            r
        }
        Op::Truncate(p, len) => fs.truncate(p, *len),
        Op::Fallocate(p, off, len) => {
            let fd = fs.open(p, rw(), 0)?;
            let r = fs.fallocate(fd, *off, *len);
            fs.close(fd)?;
            r
        }
        Op::Unlink(p) => fs.unlink(p),
        Op::Rename(a, b) => fs.rename(a, b),
    }
}

/// The tree as the file system holds it.
fn tree(fs: &mut Pfs, path: &str) -> M {
    let mut m = BTreeMap::new();
    for e in fs.readdir(path).unwrap() {
        let name = String::from_utf8(e.name).unwrap();
        let child = format!("{}/{name}", path.trim_end_matches('/'));
        let node = match e.kind {
            FileKind::Dir => tree(fs, &child),
            FileKind::File => {
                let size = fs.stat(&child).unwrap().size;
                let flags = OpenFlags {
                    read: true,
                    ..OpenFlags::default()
                };
                let fd = fs.open(&child, flags, 0).unwrap();
                let mut buf = vec![0u8; size as usize];
                assert_eq!(fs.pread(fd, &mut buf, 0).unwrap(), size as usize);
                fs.close(fd).unwrap();
                M::File(buf)
            }
        };
        m.insert(name, node);
    }
    M::Dir(m)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    /// Half the cases with a journal of four sectors a host: a checkpoint (a new
    /// journal generation) every two transactions, which the reading host and the fresh
    /// mount replay across.
    fn the_file_system_behaves_like_the_model(
        ops in proptest::collection::vec(op(), 1..60),
        small_journal in any::<bool>(),
    ) {
        let dev = Arc::new(MemDevice::new(8 << 20));
        let g = if small_journal { with_journal(64 << 10) } else { geometry() };
        mkfs(dev.as_ref(), g, 99, 0).unwrap();
        let mut fs = Pfs::mount(dev.clone(), 1, Access::ReadWrite).unwrap();
        let mut reader = Pfs::mount(dev.clone(), 2, Access::ReadOnly).unwrap();
        let mut root = M::Dir(BTreeMap::new());
        let mut oks = 0;
        for op in &ops {
            let want = model(&mut root, op);
            oks += usize::from(want.is_ok());
            let got = real(&mut fs, op).map_err(|e| e.errno());
            prop_assert_eq!(got, want, "{:?}", op);
            if let Err(e) = fs.check_index() {
                prop_assert!(false, "after {:?}: {}", op, e);
            }
        }
        if std::env::var_os("PFS_STATS").is_some() {
            eprintln!("{} ops, {oks} ok", ops.len());
        }
        prop_assert_eq!(&tree(&mut fs, "/"), &root);
        let report = fs.fsck();
        prop_assert!(report.problems.is_empty(), "{:?}", report.problems);
        // A reading host replays the journal to the same tree and bytes.
        reader.refresh().unwrap();
        prop_assert_eq!(&tree(&mut reader, "/"), &root);
        if let Err(e) = reader.check_index() {
            prop_assert!(false, "reader: {}", e);
        }
        // So does a host mounting afresh.
        drop(fs);
        let mut again = Pfs::mount(dev.clone(), 3, Access::ReadOnly).unwrap();
        prop_assert_eq!(&tree(&mut again, "/"), &root);
    }
}

#[test]
fn a_read_only_mount_refuses_changes_and_errors_map_to_errno() {
    let dev = Arc::new(MemDevice::new(8 << 20));
    mkfs(dev.as_ref(), geometry(), 5, 0).unwrap();
    let mut w = Pfs::mount(dev.clone(), 1, Access::ReadWrite).unwrap();
    w.mkdir("/d", 0o755).unwrap();
    let fd = w.creat("/d/f", 0o600).unwrap();
    assert_eq!(w.write(fd, b"hello").unwrap(), 5);
    assert_eq!(w.lseek(fd, 0, chorus_fs::pfs::Whence::Cur).unwrap(), 5);
    w.fallocate(fd, 0, 1 << 20).unwrap();
    let st = w.fstat(fd).unwrap();
    assert_eq!((st.size, st.blocks), (1 << 20, 64));
    // Within preallocated space, a write needs no transaction.
    let before = w.node().stats().journal_appends;
    w.pwrite(fd, &[7u8; 4096], 100_000).unwrap();
    assert_eq!(w.node().stats().journal_appends, before);
    w.chdir("/d").unwrap();
    assert_eq!(w.getcwd().unwrap(), "/d");
    assert_eq!(w.stat("f").unwrap().ino, st.ino);
    assert_eq!(w.stat("../d/f").unwrap().ino, st.ino);

    let mut r = Pfs::mount(dev.clone(), 2, Access::ReadOnly).unwrap();
    assert_eq!(r.mkdir("/x", 0o755).unwrap_err().errno(), 30);
    assert_eq!(r.creat("/x", 0o644).unwrap_err().errno(), 30);
    let fd2 = r
        .open(
            "/d/f",
            OpenFlags {
                read: true,
                ..OpenFlags::default()
            },
            0,
        )
        .unwrap();
    let mut b = [0u8; 5];
    r.pread(fd2, &mut b, 0).unwrap();
    assert_eq!(&b, b"hello");
    assert_eq!(r.pwrite(fd2, b"x", 0).unwrap_err().errno(), 9);
    assert_eq!(r.stat("/nope").unwrap_err().errno(), ENOENT);
    assert_eq!(r.stat("/d/f/x").unwrap_err().errno(), ENOTDIR);
    assert_eq!(r.readdir("/d/f").unwrap_err().errno(), ENOTDIR);
    assert_eq!(r.close(999).unwrap_err().errno(), 9);
    assert_eq!(r.access("/d/f", 1).unwrap_err().errno(), 13);
    r.access("/d/f", 4).unwrap();
    let long = format!("/{}", "n".repeat(300));
    assert_eq!(w.mkdir(&long, 0o755).unwrap_err().errno(), 36);
    // The volume did not grow: nothing to add. A reading host may not grow it.
    assert_eq!(w.growfs().unwrap(), 0);
    assert_eq!(r.growfs().unwrap_err().errno(), 30);
    // Unlinked under an open descriptor: the descriptor is stale.
    w.unlink("/d/f").unwrap();
    assert_eq!(w.pwrite(fd, b"x", 0).unwrap_err().errno(), 116);
    r.refresh().unwrap();
    assert_eq!(r.stat("/d/f").unwrap_err().errno(), ENOENT);
}

#[test]
fn fsck_names_metadata_that_disagrees() {
    use chorus_fs::meta::{Kind, Meta, MetaId, Tag};
    use chorus_fs::store::MetaStore;
    let dev = Arc::new(MemDevice::new(8 << 20));
    let sb = mkfs(dev.as_ref(), geometry(), 5, 0).unwrap();
    let mut w = Pfs::mount(dev.clone(), 1, Access::ReadWrite).unwrap();
    w.mkdir("/d", 0o755).unwrap();
    let fd = w.creat("/d/f", 0o600).unwrap();
    w.pwrite(fd, &[1u8; 40_000], 0).unwrap();
    let clean = w.fsck();
    assert!(clean.problems.is_empty(), "{:?}", clean.problems);
    assert_eq!((clean.files, clean.dirs, clean.blocks), (1, 2, 3));
    // A tag owned by a free inode, written straight into the metaobjects.
    let mut s = MetaStore::load(dev.as_ref(), sb).unwrap();
    let bad = Meta::Tag(Tag {
        owner: MetaId::new(1, 9),
        file_block: 0,
        dirty: true,
    });
    let op = s.op(Kind::Tag, MetaId::new(1, 0), &bad).unwrap();
    s.apply(&op).unwrap();
    let r = chorus_fs::fsck::fsck(&s);
    assert!(
        r.problems.iter().any(|p| p.contains("not a file in use")),
        "{:?}",
        r.problems
    );
}

/// Found by the model test (CI run of 664c4fd): a truncate keeps the block holding the new
/// end with what was written past it; a fallocate that grows the file over those bytes
/// must show zeros there.
#[test]
fn fallocate_over_bytes_a_truncate_left_in_a_block_shows_zeros() {
    let dev = Arc::new(MemDevice::new(8 << 20));
    mkfs(dev.as_ref(), geometry(), 7, 0).unwrap();
    let mut fs = Pfs::mount(dev.clone(), 1, Access::ReadWrite).unwrap();
    let mut root = M::Dir(BTreeMap::new());
    for op in [
        Op::Write("/b".into(), 26505, 6295, 1),
        Op::Truncate("/b".into(), 16385),
        Op::Fallocate("/b".into(), 0, 26506),
    ] {
        assert_eq!(
            real(&mut fs, &op).map_err(|e| e.errno()),
            model(&mut root, &op)
        );
    }
    assert_eq!(tree(&mut fs, "/"), root);
}

/// `growfs` (Fig. 3): a file system made on part of a volume fills up, grows over the
/// rest, and takes more files; a host that mounted before the growth, a host that
/// replays the journal, and a fresh mount all see the larger geometry and the same tree.
#[test]
fn growfs_adds_the_volumes_new_chunks_and_every_host_takes_them_in() {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let g = geometry(); // 8 MiB of the 16: two chunks of four
    mkfs(dev.as_ref(), g, 11, 0).unwrap();
    let mut w = Pfs::mount(dev.clone(), 1, Access::ReadWrite).unwrap();
    let mut r = Pfs::mount(dev.clone(), 2, Access::ReadOnly).unwrap();
    let before = w.usage();
    // Fill the data blocks.
    let fd = w.creat("/big", 0o644).unwrap();
    let room = before.free_blocks * before.block_bytes;
    w.fallocate(fd, 0, room).unwrap();
    assert_eq!(w.usage().free_blocks, 0);
    assert_eq!(w.fallocate(fd, room, 4096).unwrap_err().errno(), 28); // ENOSPC
    assert_eq!(w.growfs().unwrap(), 2);
    let after = w.usage();
    assert!(
        after.blocks > before.blocks && after.free_blocks > 0,
        "{after:?}"
    );
    assert_eq!(after.inodes, before.inodes * 2 + 1);
    w.check_index().unwrap();
    // The new blocks and inodes are used.
    w.fallocate(fd, room, 40 * after.block_bytes).unwrap();
    w.pwrite(fd, b"past the old end", room + 10).unwrap();
    for i in 0..70 {
        w.mkdir(&format!("/d{i}"), 0o755).unwrap();
    }
    assert!(w.fsck().problems.is_empty(), "{:?}", w.fsck().problems);
    // The reader mounted before the growth takes it in when it replays.
    r.refresh().unwrap();
    r.check_index().unwrap();
    assert_eq!(r.usage(), w.usage());
    assert_eq!(tree(&mut r, "/"), tree(&mut w, "/"));
    let mut again = Pfs::mount(dev.clone(), 3, Access::ReadOnly).unwrap();
    assert_eq!(tree(&mut again, "/"), tree(&mut w, "/"));
    assert!(again.fsck().problems.is_empty());
    assert_eq!(w.growfs().unwrap(), 0);
}

/// A write past a file's end into blocks it owns needs no transaction: its bytes are on
/// the volume when it returns and the size is journaled at the next `fsync` or close
/// (or transaction). Reading hosts see the size once journaled; a host that takes the
/// journal over meanwhile never sees it, and the writer drops it.
#[test]
fn growth_into_owned_blocks_is_journaled_at_fsync_or_close() {
    let dev = Arc::new(MemDevice::new(8 << 20));
    mkfs(dev.as_ref(), geometry(), 13, 0).unwrap();
    let mut w = Pfs::mount(dev.clone(), 1, Access::ReadWrite).unwrap();
    let mut r = Pfs::mount(dev.clone(), 2, Access::ReadOnly).unwrap();
    let fd = w.creat("/log", 0o644).unwrap();
    w.fallocate_keep_size(fd, 0, 64 << 10).unwrap();
    assert_eq!(w.fstat(fd).unwrap().size, 0);
    let appends = w.node().stats().journal_appends;
    w.pwrite(fd, &[1u8; 8192], 0).unwrap();
    w.pwrite(fd, &[2u8; 1000], 20_000).unwrap(); // a gap: zeros between
    assert_eq!(w.node().stats().journal_appends, appends, "no transaction");
    assert_eq!(w.fstat(fd).unwrap().size, 21_000);
    r.refresh().unwrap();
    assert_eq!(r.stat("/log").unwrap().size, 0, "not journaled yet");
    w.fsync(fd).unwrap();
    assert_eq!(w.node().stats().journal_appends, appends + 1);
    w.fsync(fd).unwrap();
    assert_eq!(
        w.node().stats().journal_appends,
        appends + 1,
        "nothing left"
    );
    r.refresh().unwrap();
    assert_eq!(r.stat("/log").unwrap().size, 21_000);
    let ro = OpenFlags {
        read: true,
        ..OpenFlags::default()
    };
    let rfd = r.open("/log", ro, 0).unwrap();
    let mut b = vec![9u8; 21_000];
    assert_eq!(r.pread(rfd, &mut b, 0).unwrap(), 21_000);
    assert!(b[..8192].iter().all(|&x| x == 1));
    assert!(b[8192..20_000].iter().all(|&x| x == 0));
    assert!(b[20_000..].iter().all(|&x| x == 2));
    // Close journals it too.
    w.pwrite(fd, &[3u8; 100], 21_000).unwrap();
    w.close(fd).unwrap();
    r.refresh().unwrap();
    assert_eq!(r.stat("/log").unwrap().size, 21_100);
    // Another host takes the journal over before the size is journaled: it is gone.
    let fd = w
        .open(
            "/log",
            OpenFlags {
                write: true,
                ..OpenFlags::default()
            },
            0,
        )
        .unwrap();
    w.pwrite(fd, &[4u8; 100], 21_100).unwrap();
    assert_eq!(w.fstat(fd).unwrap().size, 21_200);
    let mut other = Pfs::mount(dev.clone(), 3, Access::ReadWrite).unwrap();
    other.mkdir("/other", 0o755).unwrap();
    assert_eq!(other.stat("/log").unwrap().size, 21_100);
    w.refresh().unwrap();
    assert_eq!(w.fstat(fd).unwrap().size, 21_100);
    w.fsync(fd).unwrap();
    assert_eq!(w.stat("/log").unwrap().size, 21_100);
    w.check_index().unwrap();
    let report = w.fsck();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// Blocks that held another file's bytes are given to writes without zeroing all of
/// them: what the write covers is written before the transaction commits, and only
/// the rest below the new size is zeroed. Every block here has held 0xFF bytes, so a
/// byte the write path forgot to zero shows.
#[test]
fn reused_blocks_show_only_zeros_and_the_bytes_written() {
    let dev = Arc::new(MemDevice::new(8 << 20));
    mkfs(dev.as_ref(), geometry(), 17, 0).unwrap();
    let mut w = Pfs::mount(dev.clone(), 1, Access::ReadWrite).unwrap();
    // Every data block written with 0xFF, then freed.
    let u = w.usage();
    let all = u.free_blocks * u.block_bytes;
    let fd = w.creat("/fill", 0o644).unwrap();
    for part in 0..4 {
        w.fallocate(fd, part * all / 4, all / 4).unwrap();
    }
    let ff = vec![0xFFu8; u.block_bytes as usize];
    for b in 0..u.free_blocks {
        w.pwrite(fd, &ff, b * u.block_bytes).unwrap();
    }
    w.close(fd).unwrap();
    w.unlink("/fill").unwrap();
    let rw = OpenFlags {
        read: true,
        write: true,
        create: true,
        ..OpenFlags::default()
    };
    let check = |w: &mut Pfs, path: &str, written: &[(u64, &[u8])]| {
        let size = w.stat(path).unwrap().size;
        let fd = w.open(path, rw, 0).unwrap();
        let mut got = vec![7u8; size as usize];
        assert_eq!(w.pread(fd, &mut got, 0).unwrap(), size as usize);
        let mut want = vec![0u8; size as usize];
        for (at, b) in written {
            want[*at as usize..*at as usize + b.len()].copy_from_slice(b);
        }
        let bad = got.iter().zip(&want).position(|(g, w)| g != w);
        assert!(bad.is_none(), "{path}: byte {bad:?} differs");
        w.close(fd).unwrap();
    };
    // A write into the middle of a new block (the bytes before it zeroed), then one
    // past a gap (the gap's part in the next new block zeroed).
    let fd = w.open("/a", rw, 0o644).unwrap();
    w.pwrite(fd, &[1u8; 100], 20_000).unwrap();
    w.pwrite(fd, &[2u8; 10], 40_000).unwrap();
    w.close(fd).unwrap();
    check(&mut w, "/a", &[(20_000, &[1u8; 100]), (40_000, &[2u8; 10])]);
    // A hole filled below the size: the bytes after the write, up to the block's end,
    // zeroed too.
    let fd = w.open("/b", rw, 0o644).unwrap();
    w.ftruncate(fd, 100_000).unwrap();
    w.pwrite(fd, &[3u8; 10], 50_000).unwrap();
    w.close(fd).unwrap();
    check(&mut w, "/b", &[(50_000, &[3u8; 10])]);
    assert!(w.fsck().problems.is_empty());
}
