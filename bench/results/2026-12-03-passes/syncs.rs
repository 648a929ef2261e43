use io_uring::{opcode, types, IoUring};
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Instant;
fn main() {
    let n: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let mode = std::env::args().nth(2).unwrap();
    let dir = "/tmp/iou-files";
    std::fs::create_dir_all(dir).unwrap();
    let files: Vec<_> = (0..n).map(|i| {
        let f = OpenOptions::new().create(true).read(true).write(true).custom_flags(libc::O_DIRECT).open(format!("{dir}/f{i}")).unwrap();
        f.set_len(64 << 20).unwrap(); f.sync_all().unwrap(); f }).collect();
    let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
    let buf = unsafe { std::slice::from_raw_parts_mut(std::alloc::alloc_zeroed(layout), 4096) };
    let mut ring = IoUring::new(256).unwrap();
    let t0 = Instant::now(); let mut rounds = 0u64; let mut off = 0u64;
    while t0.elapsed().as_secs_f64() < 3.0 {
        for f in &files { f.write_all_at(buf, off).unwrap(); }
        off = (off + 4096) % (60 << 20);
        if mode == "syncfs" { unsafe { assert_eq!(libc::syncfs(files[0].as_raw_fd()), 0); } }
        else if mode == "threads" { std::thread::scope(|sc| { for f in &files { sc.spawn(move || f.sync_data().unwrap()); } }); }
        else if mode == "seq" { for f in &files { f.sync_data().unwrap(); } }
        else {
            for (i, f) in files.iter().enumerate() {
                let e = opcode::Fsync::new(types::Fd(f.as_raw_fd())).flags(types::FsyncFlags::DATASYNC).build().user_data(i as u64);
                unsafe { ring.submission().push(&e).unwrap(); }
            }
            ring.submit_and_wait(n).unwrap();
            let c: Vec<_> = ring.completion().map(|c| c.result()).collect();
            assert_eq!(c.len(), n); assert!(c.iter().all(|r| *r == 0));
        }
        rounds += 1;
    }
    let s = t0.elapsed().as_secs_f64();
    println!("{n} files {mode}: {:.0} rounds/s, {:.0} syncs/s", rounds as f64 / s, (rounds * n as u64) as f64 / s);
}
