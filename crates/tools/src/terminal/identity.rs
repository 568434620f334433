//! Who the engine's children run as: a user resolved once, at start, from a user name or a
//! numeric uid (`[tools.terminal] run_as`).
//!
//! A process can only switch to another user when it is root, so the rules are:
//!
//! - nothing configured: a root host process runs children as `nobody` (uid and gid 65534 when
//!   the user database has no `nobody`); any other host process runs them as itself;
//! - a configured user that is the host process's own: children run as the host process, with
//!   nothing to switch (this is how a root daemon opts out, with `run_as = "root"`);
//! - another configured user: only a root host process may switch; for any other it is a
//!   configuration error, as is a user name the user database does not know. A numeric uid with
//!   no entry in the user database runs with the same number as its group id.

/// A user id and the group id its children run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The user id (`setuid`).
    pub uid: u32,
    /// The primary group id (`setgid`); supplementary groups are cleared.
    pub gid: u32,
}

/// The user a root host process runs children as when `run_as` is not set.
pub const DEFAULT_RUN_AS: &str = "nobody";

/// The ids used for [`DEFAULT_RUN_AS`] when the user database has no such user.
const NOBODY_ID: u32 = 65534;

/// Resolves `run_as` for this process: the identity children must switch to, or `None` when
/// they run as the host process itself.
///
/// # Errors
///
/// A sentence for the operator when the user is unknown, or when switching to it needs root.
pub fn resolve_run_as(run_as: Option<&str>) -> Result<Option<Identity>, String> {
    resolve_for(run_as, effective_uid(), &lookup)
}

/// [`resolve_run_as`] for a process with effective uid `euid`, reading the user database
/// through `lookup`.
fn resolve_for(
    run_as: Option<&str>,
    euid: u32,
    lookup: &dyn Fn(&User<'_>) -> Option<Identity>,
) -> Result<Option<Identity>, String> {
    let run_as = run_as.map(str::trim).filter(|name| !name.is_empty());
    let Some(name) = run_as else {
        if euid != 0 {
            return Ok(None);
        }
        let nobody =
            lookup(&User::Name(DEFAULT_RUN_AS)).unwrap_or(Identity { uid: NOBODY_ID, gid: NOBODY_ID });
        return Ok(Some(nobody));
    };
    let identity = match name.parse::<u32>() {
        Ok(uid) => lookup(&User::Id(uid)).unwrap_or(Identity { uid, gid: uid }),
        Err(_) => lookup(&User::Name(name)).ok_or_else(|| format!("no user named '{name}' on this host"))?,
    };
    if identity.uid == euid {
        return Ok(None);
    }
    if euid != 0 {
        return Err(format!(
            "running commands as '{name}' needs a daemon started as root; this one runs as uid {euid} \
             (leave run_as unset to run them as the daemon's own user)"
        ));
    }
    Ok(Some(identity))
}

/// A user as `run_as` names it.
#[derive(Debug, Clone, Copy)]
enum User<'a> {
    /// By user name.
    Name(&'a str),
    /// By numeric uid.
    Id(u32),
}

/// The effective uid of this process.
fn effective_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Looks `user` up in the user database (files, or whatever NSS is configured to use), with
/// getpwnam_r or getpwuid_r; a failed lookup counts as an unknown user.
fn lookup(user: &User<'_>) -> Option<Identity> {
    let entry = match user {
        User::Name(name) => nix::unistd::User::from_name(name),
        User::Id(uid) => nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(*uid)),
    };
    let entry = entry.ok().flatten()?;
    Some(Identity { uid: entry.uid.as_raw(), gid: entry.gid.as_raw() })
}

#[cfg(test)]
// A failed unwrap is a test failure with a clear message; that is what tests want.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A user database with `nobody` (65534) and `app` (1000, group 1001).
    fn database(user: &User<'_>) -> Option<Identity> {
        match user {
            User::Name("nobody") | User::Id(65534) => Some(Identity { uid: 65534, gid: 65534 }),
            User::Name("app") | User::Id(1000) => Some(Identity { uid: 1000, gid: 1001 }),
            _ => None,
        }
    }

    #[test]
    fn root_runs_children_as_nobody_unless_told_otherwise() {
        assert_eq!(resolve_for(None, 0, &database), Ok(Some(Identity { uid: 65534, gid: 65534 })));
        assert_eq!(resolve_for(Some(" "), 0, &database), Ok(Some(Identity { uid: 65534, gid: 65534 })));
        assert_eq!(resolve_for(None, 0, &|_| None), Ok(Some(Identity { uid: 65534, gid: 65534 })));
        assert_eq!(resolve_for(Some("app"), 0, &database), Ok(Some(Identity { uid: 1000, gid: 1001 })));
        assert_eq!(resolve_for(Some("1000"), 0, &database), Ok(Some(Identity { uid: 1000, gid: 1001 })));
        assert_eq!(resolve_for(Some("4321"), 0, &database), Ok(Some(Identity { uid: 4321, gid: 4321 })));
        assert_eq!(resolve_for(Some("0"), 0, &database), Ok(None));
    }

    #[test]
    fn other_users_run_children_as_themselves() {
        assert_eq!(resolve_for(None, 1000, &database), Ok(None));
        assert_eq!(resolve_for(Some("app"), 1000, &database), Ok(None));
        let err = resolve_for(Some("nobody"), 1000, &database).unwrap_err();
        assert!(err.contains("needs a daemon started as root"), "{err}");
    }

    #[test]
    fn unknown_user_names_are_refused() {
        let err = resolve_for(Some("no-such-user"), 0, &database).unwrap_err();
        assert_eq!(err, "no user named 'no-such-user' on this host");
    }

    #[test]
    fn the_user_database_is_read() {
        // Every Linux user database has root.
        assert_eq!(lookup(&User::Name("root")), Some(Identity { uid: 0, gid: 0 }));
        assert_eq!(lookup(&User::Id(0)), Some(Identity { uid: 0, gid: 0 }));
        assert_eq!(lookup(&User::Name("toolhost-no-such-user")), None);
        assert_eq!(lookup(&User::Name("nul\0byte")), None);
    }
}
