//! `docs/configuration.md` against the binaries: every setting `spool-api` (`serve`, `migrate`,
//! `token`), `spool-worker run` and `spool` read from the environment has one row under
//! "Settings" with its flag and default as the binaries' `--help` prints them, and every row
//! there is such a setting. A new flag without a row, or a row left behind, fails here.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use spool_tests::process::binary;

/// What `--help` says of one setting.
#[derive(Debug, Default, PartialEq, Eq)]
struct Setting {
    flag: String,
    default: Option<String>,
}

/// The settings `binary args... --help` prints, by variable.
fn help(name: &str, args: &[&str]) -> BTreeMap<String, Setting> {
    let output = Command::new(binary(name))
        .args(args)
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(output.status.success(), "{name} {args:?} --help failed");
    let text = String::from_utf8(output.stdout).expect("utf-8");
    let mut settings = BTreeMap::new();
    let mut flag = String::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        // A flag's line (a value list's `- json: ...` lines are not).
        if line.starts_with("--") || line.starts_with("-h") || line.contains(", --") {
            let long = line
                .split_whitespace()
                .find(|word| word.starts_with("--"))
                .unwrap_or_default();
            flag = long.trim_end_matches(',').to_owned();
            current = None;
        }
        // `[env: X=]`, or `[env: X]` for a hidden value; long help puts it on a line of its
        // own, short help at the end of the flag's line.
        if let Some(at) = line.find("[env: ") {
            let rest = &line[at + "[env: ".len()..];
            let variable: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let setting = Setting {
                flag: flag.clone(),
                default: None,
            };
            settings.insert(variable.clone(), setting);
            current = Some(variable);
        }
        if let (Some(at), Some(variable)) = (line.find("[default: "), &current)
            && let Some(setting) = settings.get_mut(variable)
        {
            let rest = &line[at + "[default: ".len()..];
            let end = rest.find(']').unwrap_or(rest.len());
            // Clap quotes a default with spaces.
            setting.default = Some(rest[..end].trim_matches('"').to_owned());
        }
    }
    settings
}

/// The rows of the "Settings" part of the reference: variable → (flag, default) cells.
fn documented() -> BTreeMap<String, (String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let text = std::fs::read_to_string(&path).expect("docs/configuration.md");
    let start = text.find("\n## Settings").expect("a Settings section");
    let section = &text[start + 1..];
    let end = section[1..].find("\n## ").map_or(section.len(), |i| i + 1);
    let mut rows = BTreeMap::new();
    for line in section[..end].lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // `| var | flag | default | ... |`: the leading pipe makes cells[0] empty.
        if cells.len() < 5 || !cells[1].starts_with('`') {
            continue;
        }
        let unquote = |cell: &str| cell.trim_matches('`').to_owned();
        let previous = rows.insert(unquote(cells[1]), (unquote(cells[2]), cells[3].to_owned()));
        assert!(previous.is_none(), "{} has two rows", cells[1]);
    }
    rows
}

#[test]
fn the_configuration_reference_lists_every_setting_the_binaries_read_as_they_print_it() {
    let mut settings = BTreeMap::new();
    for (name, args) in [
        ("spool-api", &["serve"][..]),
        ("spool-api", &["migrate"][..]),
        ("spool-api", &["token"][..]),
        ("spool-worker", &["run"][..]),
        ("spool", &[][..]),
    ] {
        for (variable, setting) in help(name, args) {
            if let Some(seen) = settings.get(&variable) {
                assert_eq!(seen, &setting, "{variable} differs between commands");
            }
            settings.insert(variable, setting);
        }
    }
    assert!(settings.len() > 30, "the help was read: {settings:?}");
    let rows = documented();
    let read: Vec<&String> = settings.keys().collect();
    let listed: Vec<&String> = rows.keys().collect();
    assert_eq!(
        read, listed,
        "the binaries' variables vs. the rows of docs/configuration.md"
    );
    for (variable, setting) in &settings {
        let (flag, default) = &rows[variable];
        assert_eq!(flag, &setting.flag, "{variable}'s flag");
        if let Some(expected) = &setting.default {
            let shown = default.trim_matches('`');
            let empty = expected.is_empty() && (shown == "none" || shown.contains("empty"));
            assert!(
                shown == expected || empty,
                "{variable}'s default: the reference says {default}, --help says {expected:?}"
            );
        }
    }
}
