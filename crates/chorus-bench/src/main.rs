//! `chorus-bench`: benchmarks. None is implemented in this build yet; it says so and exits
//! non-zero rather than printing made-up figures.

fn main() {
    eprintln!("chorus-bench: no benchmark is available in this build yet");
    std::process::exit(2);
}
