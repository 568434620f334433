//! House rules checked over the whole workspace: every Rust file says what it is for; the
//! daemon's doors, sources, call lifecycle and auth never see the whole configuration, no door
//! imports a command-line module, and every door folder has its own settings.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|name| name != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_rust_file_opens_with_a_module_doc() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    rust_files(&crates, &mut files);
    assert!(files.len() > 20, "found only {} files under {}", files.len(), crates.display());
    let missing: Vec<String> = files
        .iter()
        .filter(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            !text.trim_start().starts_with("//!")
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(missing.is_empty(), "files without a `//!` module doc:\n{}", missing.join("\n"));
}

/// The daemon's `src/`.
fn daemon_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The Rust files of `paths` (folders or files) under the daemon's `src/`.
fn daemon_files(paths: &[&str]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for path in paths.iter().map(|path| daemon_src().join(path)) {
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else {
            files.push(path);
        }
    }
    files
}

/// The lines of `text` that name `word` as a whole word, outside comments.
fn naming(text: &str, word: &str) -> Vec<String> {
    text.lines()
        .filter(|line| {
            let code = line.split("//").next().unwrap_or_default();
            code.match_indices(word).any(|(at, _)| {
                let before = code[..at].chars().next_back();
                let after = code[at + word.len()..].chars().next();
                let is_ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                !is_ident(before) && !is_ident(after)
            })
        })
        .map(|line| line.trim().to_owned())
        .collect()
}

#[test]
fn doors_sources_the_lifecycle_and_auth_never_see_the_whole_configuration() {
    let files = daemon_files(&["doors", "sources", "sources.rs", "call", "auth"]);
    assert!(files.len() > 20, "found only {} files", files.len());
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for word in ["Config", "RawConfig", "crate::config"] {
            for line in naming(&text, word) {
                found.push(format!("{}: {line}", file.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "these name the configuration; hand them their own settings and a context instead \
         (ARCHITECTURE.md, the door rule):\n{}",
        found.join("\n")
    );
}

#[test]
fn no_door_imports_a_command_line_module() {
    let mut found = Vec::new();
    for file in daemon_files(&["doors"]) {
        let text = std::fs::read_to_string(&file).unwrap();
        for module in ["crate::cli", "crate::client", "crate::dlq", "crate::serve"] {
            for line in naming(&text, module) {
                found.push(format!("{}: {line}", file.display()));
            }
        }
    }
    assert!(found.is_empty(), "doors import command-line or serve modules:\n{}", found.join("\n"));
}

#[test]
fn every_door_folder_has_its_own_settings() {
    let doors = daemon_src().join("doors");
    let mut folders = 0;
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&doors).unwrap() {
        let path = entry.unwrap().path();
        if !path.is_dir() {
            continue;
        }
        folders += 1;
        let settings = path.join("settings.rs");
        let defines = std::fs::read_to_string(&settings).is_ok_and(|text| text.contains("struct Settings"));
        if !defines {
            missing.push(path.display().to_string());
        }
    }
    assert!(folders >= 5, "found only {folders} door folders under {}", doors.display());
    assert!(
        missing.is_empty(),
        "door folders without a settings.rs defining `Settings`:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_tidy_rules_see_what_they_look_for() {
    assert_eq!(naming("fn f(config: &Config) {}", "Config"), ["fn f(config: &Config) {}"]);
    assert!(naming("use rmcp::model::ServerConfig; // Config", "Config").is_empty());
    assert_eq!(naming("use crate::config::Config;", "crate::config").len(), 1);
    assert!(naming("use crate::configs;", "crate::config").is_empty());
}
