//! Whether the user commands run as can reach what they need, checked at start rather than
//! learnt from every call failing with `Permission denied`.
//!
//! A root daemon runs commands and stdio MCP servers as another user (`nobody` unless
//! `[tools.terminal] run_as` says otherwise). That user must be able to enter the working
//! directory (search permission on it and on every directory above it) and to run the program
//! (search on the directories above it, execute on the file, and read on a script, which its
//! interpreter reads). [`problem`] reads the mode bits, owner and group of each path the way the
//! kernel would for that user (owner bits if it owns the file, else group bits if the file's group
//! is its primary group, since children run with no supplementary groups, else the others' bits)
//! and names the first path that stops it, and the fix. POSIX ACLs and mandatory access control
//! (AppArmor, SELinux) are not read: they can only refuse more.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use crate::terminal::Identity;

/// What the user must be able to do to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Make it the working directory.
    Enter,
    /// Run it as a program.
    Execute,
}

/// Why `identity` (named `user` in the message) cannot `access` `path`, as a sentence naming
/// the path that stops it, the user and the fix; `None` when it can, and when the path cannot
/// be read at all (a missing path is reported where it is used, not as a permission problem).
pub fn problem(path: &Path, identity: Identity, user: &str, access: Access) -> Option<String> {
    if identity.uid == 0 {
        return None;
    }
    let real = std::fs::canonicalize(path).ok()?;
    let who = format!("{user} (uid {}, gid {})", identity.uid, identity.gid);
    let ancestors: Vec<&Path> = real.ancestors().skip(1).collect();
    for dir in ancestors.into_iter().rev() {
        let metadata = std::fs::metadata(dir).ok()?;
        if let Some(fix) = missing(&metadata, identity, 0o1, dir) {
            return Some(format!(
                "{who} cannot {} {}: it cannot pass through {} ({}); fix: {fix}",
                verb(access),
                path.display(),
                dir.display(),
                describe(&metadata),
            ));
        }
    }
    let metadata = std::fs::metadata(&real).ok()?;
    let (need, what) = match access {
        Access::Enter if !metadata.is_dir() => return None,
        Access::Enter => (0o1, "search (x)"),
        // A script is read by its interpreter, running as the same user.
        Access::Execute if is_script(&real) => (0o5, "read and execute (r-x)"),
        Access::Execute => (0o1, "execute (x)"),
    };
    let fix = missing(&metadata, identity, need, &real)?;
    Some(format!(
        "{who} cannot {} {}: it lacks {what} permission on it ({}); fix: {fix}",
        verb(access),
        path.display(),
        describe(&metadata),
    ))
}

/// The program a `[[commands]]` `argv[0]` or an MCP server's `command` names: itself when it
/// holds a `/`, else the first executable file of that name in `path_var`'s directories.
pub fn program_on_path(program: &str, path_var: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    path_var.split(':').filter(|dir| !dir.is_empty()).map(|dir| Path::new(dir).join(program)).find(
        |candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        },
    )
}

fn verb(access: Access) -> &'static str {
    match access {
        Access::Enter => "enter",
        Access::Execute => "run",
    }
}

/// The fix when `identity` lacks any of the `need` bits (`0o1` x, `0o4` r) on a path with
/// `metadata`; `None` when it has them all.
fn missing(metadata: &std::fs::Metadata, identity: Identity, need: u32, path: &Path) -> Option<String> {
    let mode = metadata.mode();
    let (shift, class) = if metadata.uid() == identity.uid {
        (6, "u")
    } else if metadata.gid() == identity.gid {
        (3, "g")
    } else {
        (0, "o")
    };
    if (mode >> shift) & need == need {
        return None;
    }
    let bits = if need & 0o4 != 0 { "rx" } else { "x" };
    let path = path.display();
    Some(match class {
        "o" => format!(
            "`chmod o+{bits} {path}`, or give it to that user's group (`chgrp {gid} {path}` and `chmod g+{bits} \
             {path}`), or set [tools.terminal] run_as to a user that may",
            gid = identity.gid
        ),
        _ => format!("`chmod {class}+{bits} {path}`"),
    })
}

/// Mode, owner and group, for the message.
fn describe(metadata: &std::fs::Metadata) -> String {
    format!("mode {:o}, owner uid {} gid {}", metadata.mode() & 0o7777, metadata.uid(), metadata.gid())
}

/// Whether the file starts with `#!`.
fn is_script(path: &Path) -> bool {
    use std::io::Read as _;
    let mut head = [0u8; 2];
    std::fs::File::open(path).and_then(|mut file| file.read_exact(&mut head)).is_ok() && head == *b"#!"
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A failed unwrap is a failed test, which is what we want.
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// A user who owns nothing here and is in none of its groups.
    fn stranger() -> Identity {
        Identity { uid: 4_000_123, gid: 4_000_123 }
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn temp() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("toolhost-access-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        chmod(&dir, 0o755);
        dir
    }

    #[test]
    fn a_closed_directory_above_the_path_is_named_with_its_fix() {
        let root = temp();
        let closed = root.join("closed");
        let inner = closed.join("work");
        std::fs::create_dir_all(&inner).unwrap();
        chmod(&inner, 0o755);
        chmod(&closed, 0o700);
        let message = problem(&inner, stranger(), "nobody", Access::Enter).unwrap();
        assert!(message.starts_with("nobody (uid 4000123, gid 4000123) cannot enter "), "{message}");
        assert!(message.contains(&format!("cannot pass through {}", closed.display())), "{message}");
        assert!(message.contains(&format!("`chmod o+x {}`", closed.display())), "{message}");
        chmod(&closed, 0o711);
        assert_eq!(problem(&inner, stranger(), "nobody", Access::Enter), None);
        // The owner's bits count for the owner, even when the others' would let it in.
        chmod(&inner, 0o055);
        let me = std::fs::metadata(&inner).unwrap();
        let owner = Identity { uid: me.uid(), gid: 4_000_123 };
        if owner.uid != 0 {
            let message = problem(&inner, owner, "me", Access::Enter).unwrap();
            assert!(message.contains(&format!("`chmod u+x {}`", inner.display())), "{message}");
        }
        assert_eq!(problem(&inner, Identity { uid: 0, gid: 0 }, "root", Access::Enter), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_program_needs_execute_and_a_script_read_too() {
        let root = temp();
        let binary = root.join("tool");
        std::fs::write(&binary, b"\x7fELF").unwrap();
        chmod(&binary, 0o700);
        let message = problem(&binary, stranger(), "nobody", Access::Execute).unwrap();
        assert!(
            message.contains("lacks execute (x) permission") && message.contains("chmod o+x"),
            "{message}"
        );
        chmod(&binary, 0o711);
        assert_eq!(problem(&binary, stranger(), "nobody", Access::Execute), None);
        let script = root.join("tool.sh");
        std::fs::write(&script, b"#!/bin/sh\necho hi\n").unwrap();
        chmod(&script, 0o711);
        let message = problem(&script, stranger(), "nobody", Access::Execute).unwrap();
        assert!(message.contains("read and execute") && message.contains("chmod o+rx"), "{message}");
        chmod(&script, 0o755);
        assert_eq!(problem(&script, stranger(), "nobody", Access::Execute), None);
        // Missing paths are not permission problems.
        assert_eq!(problem(&root.join("absent"), stranger(), "nobody", Access::Execute), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn programs_are_found_on_the_given_path() {
        assert_eq!(program_on_path("/opt/x/run", ""), Some(PathBuf::from("/opt/x/run")));
        assert_eq!(program_on_path("sh", "/nonexistent:/bin").as_deref(), Some(Path::new("/bin/sh")));
        assert_eq!(program_on_path("toolhost-no-such-program", "/bin:/usr/bin"), None);
    }
}
