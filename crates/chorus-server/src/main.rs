//! The `chorus` command line. Subcommands arrive with the storage and runtime work; until
//! then it says so plainly and exits non-zero rather than pretending.

fn main() {
    eprintln!("chorus: no subcommands are available in this build yet (see README.md)");
    std::process::exit(2);
}
