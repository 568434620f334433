//! Turning a model's `command` and `cwd` into something safe to run: shell-style
//! word splitting (never a shell), the allow/deny check on the program's
//! basename, resolution of the program through the fixed `PATH`, and working
//! directory resolution inside the sandbox.

use std::io;
use std::path::{Component, Path, PathBuf};

use super::Refusal;
use super::policy::TerminalSettings;

/// The only `PATH` a command sees, and the only one programs are looked up in.
pub const FIXED_PATH: &str = "/usr/bin:/bin:/usr/local/bin";

/// A command that passed the policy: what to execute and with which arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCommand {
    /// The basename the policy checked; also passed to the program as `argv[0]`.
    pub name: String,
    /// The arguments after the first word.
    pub args: Vec<String>,
}

/// Splits `command` into words and checks its program against the policy.
///
/// Deny is checked before allow. A first word that is a path is reduced to
/// its basename (see the module doc of `terminal` for why this is safe).
pub fn parse_command(settings: &TerminalSettings, command: &str) -> Result<ParsedCommand, Refusal> {
    if command.trim().is_empty() {
        return Err(Refusal::Empty);
    }
    if command.contains('\0') {
        return Err(Refusal::Unparsable("it contains a NUL byte".to_owned()));
    }
    let mut words = shlex::split(command)
        .ok_or_else(|| Refusal::Unparsable("unbalanced quotes or a trailing backslash".to_owned()))?
        .into_iter();
    let Some(first_word) = words.next() else {
        return Err(Refusal::Empty);
    };
    let name = match Path::new(&first_word).file_name().and_then(|n| n.to_str()) {
        Some(name) => name.to_owned(),
        // `/`, `..` and `dir/..` name no program at all.
        None => return Err(Refusal::NotAllowed(first_word)),
    };
    if settings.deny_commands.contains(&name) {
        return Err(Refusal::Denied(name));
    }
    if !settings.allowed_commands.contains(&name) {
        return Err(Refusal::NotAllowed(name));
    }
    Ok(ParsedCommand { name, args: words.collect() })
}

/// Finds the executable `name` in [`FIXED_PATH`], the first match winning.
///
/// # Errors
///
/// [`Refusal::SpawnFailed`] if no directory holds an executable file of that name.
pub fn resolve_program(name: &str) -> Result<PathBuf, Refusal> {
    use std::os::unix::fs::PermissionsExt;
    for dir in FIXED_PATH.split(':') {
        let candidate = Path::new(dir).join(name);
        if let Ok(metadata) = std::fs::metadata(&candidate)
            && metadata.is_file()
            && metadata.permissions().mode() & 0o111 != 0
        {
            return Ok(candidate);
        }
    }
    // The answer names no host directory; the log says where it was looked for.
    tracing::info!(program = name, path = FIXED_PATH, "terminal program not found");
    Err(Refusal::SpawnFailed(format!("program '{name}' is not installed on this host")))
}

/// Resolves the working directory for a command.
///
/// With a sandbox, `cwd` is relative to the sandbox root (an absolute `cwd`
/// must still lie inside it), defaults to the root, and must resolve inside the
/// root after following symlinks. Without a sandbox, `cwd` is used as given and
/// `None` means the daemon's own working directory.
///
/// # Errors
///
/// [`Refusal::CwdEscapes`] for a directory outside the sandbox and
/// [`Refusal::CwdInvalid`] for one that does not exist or is not a directory.
pub fn resolve_cwd(settings: &TerminalSettings, cwd: Option<&str>) -> Result<Option<PathBuf>, Refusal> {
    let cwd = cwd.filter(|cwd| !cwd.is_empty());
    let Some(root) = &settings.sandbox_cwd else {
        return match cwd {
            None => Ok(None),
            Some(cwd) => usable_dir(Path::new(cwd)).map(Some),
        };
    };
    let root = std::fs::canonicalize(root).map_err(|err| {
        // An operator's mistake: the log names the directory, the caller learns only that the
        // sandbox is unusable.
        tracing::warn!(sandbox_cwd = %root.display(), error = %err, "terminal sandbox root is unusable");
        Refusal::CwdInvalid("the sandbox root is not available".to_owned())
    })?;
    let Some(cwd) = cwd else {
        return Ok(Some(root));
    };
    let joined = root.join(cwd);
    // Refuse `..` escapes before touching the file system, so a model cannot
    // probe which directories exist outside the sandbox.
    if !lexically_normalize(&joined).starts_with(&root) {
        return Err(Refusal::CwdEscapes);
    }
    let resolved = usable_dir(&joined)?;
    if !resolved.starts_with(&root) {
        return Err(Refusal::CwdEscapes);
    }
    Ok(Some(resolved))
}

/// Canonicalizes `path` and checks that it is a directory.
///
/// The refusal says what is wrong, never where: `path` may lie under the sandbox root, which
/// the caller must not learn. The log names it.
fn usable_dir(path: &Path) -> Result<PathBuf, Refusal> {
    let refuse = |reason: String| {
        tracing::info!(cwd = %path.display(), reason = %reason, "terminal working directory refused");
        Refusal::CwdInvalid(reason)
    };
    let resolved = std::fs::canonicalize(path).map_err(|err: io::Error| refuse(err.to_string()))?;
    if !resolved.is_dir() {
        return Err(refuse("not a directory".to_owned()));
    }
    Ok(resolved)
}

/// Resolves `.` and `..` without following symlinks.
fn lexically_normalize(path: &Path) -> PathBuf {
    let mut res = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                res.pop();
            }
            Component::CurDir => {}
            other => res.push(other),
        }
    }
    res
}

#[cfg(test)]
// A failed unwrap is a test failure with a clear message; that is what tests want.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn settings(allowed: &[&str], denied: &[&str]) -> TerminalSettings {
        TerminalSettings {
            allowed_commands: allowed.iter().map(|s| (*s).to_owned()).collect(),
            deny_commands: denied.iter().map(|s| (*s).to_owned()).collect(),
            ..TerminalSettings::default()
        }
    }

    fn check(command: &str, expected: Result<(&str, &[&str]), Refusal>) {
        let settings = settings(&["echo", "ls", "rm"], &["rm"]);
        let expected = expected.map(|(name, args)| ParsedCommand {
            name: name.to_owned(),
            args: args.iter().map(|s| (*s).to_owned()).collect(),
        });
        assert_eq!(parse_command(&settings, command), expected, "command: {command:?}");
    }

    #[test]
    fn words_are_split_like_a_shell_without_one() {
        check("echo \"a b\" 'c d' e\\ f", Ok(("echo", &["a b", "c d", "e f"])));
        check("echo $HOME; ls | rm", Ok(("echo", &["$HOME;", "ls", "|", "rm"])));
        check("  ls  ", Ok(("ls", &[])));
    }

    #[test]
    fn empty_and_unparsable() {
        check("", Err(Refusal::Empty));
        check(" \t\n", Err(Refusal::Empty));
        check("''", Err(Refusal::NotAllowed(String::new())));
        let unbalanced = Refusal::Unparsable("unbalanced quotes or a trailing backslash".to_owned());
        check("echo \"a b", Err(unbalanced.clone()));
        check("echo 'a", Err(unbalanced));
        assert!(matches!(parse_command(&settings(&["echo"], &[]), "echo a\0b"), Err(Refusal::Unparsable(_))));
    }

    #[test]
    fn allow_deny_and_basename() {
        check("cat /etc/passwd", Err(Refusal::NotAllowed("cat".to_owned())));
        check("rm -rf /", Err(Refusal::Denied("rm".to_owned())));
        check("/bin/../usr/bin/rm x", Err(Refusal::Denied("rm".to_owned())));
        check("/tmp/evil/ls -l", Ok(("ls", &["-l"])));
        check("./echo hi", Ok(("echo", &["hi"])));
        check("/", Err(Refusal::NotAllowed("/".to_owned())));
        check("..", Err(Refusal::NotAllowed("..".to_owned())));
        check("ECHO", Err(Refusal::NotAllowed("ECHO".to_owned())));
        assert_eq!(parse_command(&settings(&[], &[]), "ls"), Err(Refusal::NotAllowed("ls".to_owned())));
    }

    #[test]
    fn programs_resolve_through_the_fixed_path() {
        let path = resolve_program("sh").unwrap();
        assert!(path.is_absolute() && path.ends_with("sh"), "{path:?}");
        assert!(matches!(resolve_program("no-such-program-toolhost"), Err(Refusal::SpawnFailed(_))));
    }

    #[test]
    fn lexical_normalization() {
        assert_eq!(lexically_normalize(Path::new("/a/b/../c/./d")), PathBuf::from("/a/c/d"));
        assert_eq!(lexically_normalize(Path::new("/a/../../..")), PathBuf::from("/"));
    }
}
