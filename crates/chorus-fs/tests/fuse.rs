//! The file system through the real kernel (FUSE): a writing mount and a reading mount
//! of the same volume, used with `std::fs` and with SQLite from Debian (`sqlite3`).
//!
//! Needs `/dev/fuse` and the right to mount (root). Where either is missing the test
//! says so and passes, unless `CHORUS_REQUIRE_FUSE` is set (CI sets it: there the mount
//! must work).

use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_fs::device::MemDevice;
use chorus_fs::fuse::{mount, MountOptions};
use chorus_fs::layout::Geometry;
use chorus_fs::mkfs::mkfs;
use chorus_fs::pfs::{Access, Pfs};

/// Whether this machine can run FUSE mounts; panics if CI requires it and it cannot.
pub fn fuse_available() -> bool {
    let ok = Path::new("/dev/fuse").exists() && unsafe_is_root();
    if !ok {
        assert!(
            std::env::var_os("CHORUS_REQUIRE_FUSE").is_none(),
            "CHORUS_REQUIRE_FUSE is set, but /dev/fuse is missing or this is not root"
        );
        eprintln!("skipped: FUSE mounts need /dev/fuse and root here");
    }
    ok
}

fn unsafe_is_root() -> bool {
    // The owner of this process's /proc entry is its effective user.
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn geometry() -> Geometry {
    Geometry {
        volume_bytes: 64 << 20,
        chunk_bytes: 16 << 20,
        block_bytes: 64 << 10,
        inodes_per_chunk: 120,
        dirents_per_chunk: 120,
        max_hosts: 4,
        journal_bytes: 2 << 20,
    }
}

fn opts(dir: &Path) -> MountOptions {
    MountOptions {
        ttl: Duration::from_millis(200),
        poll: Duration::from_millis(50),
        ..MountOptions::for_dir(dir).unwrap()
    }
}

/// Waits (bounded) until `f` holds.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < end, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn programs_use_a_writing_mount_and_a_reading_mount_sees_what_they_did() {
    if !fuse_available() {
        return;
    }
    let dev = Arc::new(MemDevice::new(64 << 20));
    mkfs(dev.as_ref(), geometry(), 7, 0).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (w, r) = (tmp.path().join("w"), tmp.path().join("r"));
    std::fs::create_dir(&w).unwrap();
    std::fs::create_dir(&r).unwrap();
    let writer = mount(
        Pfs::mount(dev.clone(), 1, Access::ReadWrite).unwrap(),
        &w,
        opts(&w),
    )
    .unwrap();
    let reader = mount(
        Pfs::mount(dev.clone(), 2, Access::ReadOnly).unwrap(),
        &r,
        opts(&r),
    )
    .unwrap();

    // Ordinary file calls.
    std::fs::create_dir_all(w.join("db/sub")).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 253) as u8).collect();
    std::fs::write(w.join("db/data"), &data).unwrap();
    assert_eq!(std::fs::read(w.join("db/data")).unwrap(), data);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(w.join("db/data"))
        .unwrap();
    f.seek(SeekFrom::Start(70_000)).unwrap();
    f.write_all(b"in place").unwrap();
    f.set_len(200_000).unwrap();
    f.seek(SeekFrom::Start(69_998)).unwrap();
    let mut got = [0u8; 12];
    f.read_exact(&mut got).unwrap();
    assert_eq!(&got[2..10], b"in place");
    drop(f);
    assert_eq!(std::fs::metadata(w.join("db/data")).unwrap().len(), 200_000);
    std::fs::rename(w.join("db/data"), w.join("db/sub/moved")).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(w.join("db"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["sub"]);
    std::fs::write(w.join("gone"), b"x").unwrap();
    std::fs::remove_file(w.join("gone")).unwrap();
    assert_eq!(
        std::fs::read(w.join("gone")).unwrap_err().kind(),
        ErrorKind::NotFound
    );

    // What the file system does not offer is a clear errno.
    let e = std::fs::hard_link(w.join("db/sub/moved"), w.join("hard")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc_eperm()), "{e}");
    let e = std::os::unix::fs::symlink("db", w.join("link")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc_eperm()), "{e}");
    assert_eq!(xattr(&w.join("db/sub/moved")), libc::EOPNOTSUPP);
    assert_eq!(shared_mmap(&w.join("db/sub/moved")), libc::ENODEV);

    // The reading mount sees the tree and the bytes, and refuses changes.
    eventually("the reader sees the moved file", || {
        std::fs::metadata(r.join("db/sub/moved")).is_ok_and(|m| m.len() == 200_000)
    });
    let mut want = data[..200_000].to_vec();
    want[70_000..70_008].copy_from_slice(b"in place");
    assert_eq!(std::fs::read(r.join("db/sub/moved")).unwrap(), want);
    let e = std::fs::write(r.join("nope"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(30), "{e}"); // EROFS

    // A real database engine's files.
    if which("sqlite3") {
        let db = w.join("db/app.sqlite");
        let mut sql = String::from(
            "PRAGMA journal_mode=DELETE; CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT);",
        );
        for b in 0..20 {
            sql.push_str("BEGIN;");
            for i in 0..50 {
                sql.push_str(&format!(
                    "INSERT INTO t(v) VALUES ('row {b} {i} {}');",
                    "x".repeat(100)
                ));
            }
            sql.push_str("COMMIT;");
        }
        sql.push_str("PRAGMA integrity_check; SELECT count(*) FROM t;");
        let out = sqlite(&db, &sql);
        assert!(out.ends_with("ok\n1000\n"), "{out}");
        let ro = format!("file:{}?immutable=1", r.join("db/app.sqlite").display());
        eventually("the reader's SQLite sees every row", || {
            let o = Command::new("sqlite3")
                .arg(&ro)
                .arg("PRAGMA integrity_check; SELECT count(*) FROM t;")
                .output()
                .unwrap();
            String::from_utf8_lossy(&o.stdout) == "ok\n1000\n"
        });
    } else {
        assert!(
            std::env::var_os("CHORUS_REQUIRE_FUSE").is_none(),
            "CI must have sqlite3 (apt-get install sqlite3)"
        );
        eprintln!("sqlite3 is not installed: its part skipped");
    }

    let fsck = writer.fs().lock().unwrap().fsck();
    assert!(fsck.problems.is_empty(), "{:?}", fsck.problems);
    reader.unmount().unwrap();
    writer.unmount().unwrap();
    // Unmounted: the directory is an empty local one again.
    assert_eq!(std::fs::read_dir(&w).unwrap().count(), 0);
}

fn libc_eperm() -> i32 {
    libc::EPERM
}

/// The errno of `getxattr` on `path`.
fn xattr(path: &Path) -> i32 {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let name = c"user.test";
    // SAFETY: valid NUL-terminated strings; a null buffer of size 0 asks only the size.
    let r = unsafe { libc::getxattr(p.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(r, -1, "getxattr answered");
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

/// The errno of a shared writable `mmap` of `path`.
fn shared_mmap(path: &Path) -> i32 {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    // SAFETY: a fresh mapping of an open descriptor; unmapped below if it succeeds.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if m != libc::MAP_FAILED {
        // SAFETY: the mapping just made.
        unsafe { libc::munmap(m, 4096) };
        panic!("a shared writable mmap was allowed");
    }
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

fn which(bin: &str) -> bool {
    Command::new(bin).arg("--version").output().is_ok()
}

/// Runs `sql` (on standard input) against `db` with the `sqlite3` shell.
fn sqlite(db: &Path, sql: &str) -> String {
    use std::process::Stdio;
    let mut c = Command::new("sqlite3")
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(sql.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "sqlite3: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}
