//! What the client commands print on stdout. A reader that goes away early
//! (`toolhost tools | head -c1`) ends the command quietly with exit 0: the reader has what it
//! wanted, and `println!` would panic (exit 101) on the closed pipe.

use std::fmt::Display;
use std::io::Write;

/// Prints `text` and a newline.
pub fn line(text: impl Display) {
    write(format!("{text}\n").as_bytes());
}

/// Prints `text` as it is.
pub fn text(text: &str) {
    write(text.as_bytes());
}

fn write(bytes: &[u8]) {
    let mut stdout = std::io::stdout().lock();
    let Err(err) = stdout.write_all(bytes).and_then(|()| stdout.flush()) else { return };
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("toolhost: cannot write to stdout: {err}");
    std::process::exit(1);
}
