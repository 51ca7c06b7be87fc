//! The one check of an `extraArgs` list, whichever binary it is for (`kv-store leader`,
//! `kv-store member`, `kv-router`): each entry is one flag token, `--flag` or `--flag=value`,
//! given once, a flag the binary really has and not one the server renders from the spec, and
//! parsed as the binary parses it, so a value the process would refuse is refused at admission.
//! The callers (`backend/passthrough.rs`, `model_deployment/router.rs`) say which binary and
//! which flags the server owns.

use crate::field::{ErrorList, Path};

/// One binary's flags as an `extraArgs` list may give them.
pub struct Flags<'a> {
    /// how messages name the binary, e.g. `kv-store member`
    pub binary: &'a str,
    /// how an entry is written, e.g. `--flag or --flag=value`
    pub form: &'a str,
    /// every long flag the binary has
    pub known: Vec<String>,
    /// the flags the server renders from the spec
    pub owned: &'a [&'a str],
    /// what renders them, said when one is given, e.g. ` (listen address, model)`
    pub owned_by: &'a str,
    /// parses one entry as the binary would (and runs its own checks): the first line of its
    /// complaint
    pub parse: &'a dyn Fn(&str) -> Result<(), String>,
}

/// Checks `entries` (the field at `field`) against `flags`.
pub fn check(flags: &Flags, entries: &[String], field: &Path, errs: &mut ErrorList) {
    let binary = flags.binary;
    let mut seen: Vec<&str> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let p = field.index(i);
        let Some(flag) = entry.strip_prefix("--") else {
            errs.invalid(
                &p,
                entry,
                format!(
                    "each entry is one flag of {binary}, written {} (a value goes after '=' in the same entry)",
                    flags.form
                ),
            );
            continue;
        };
        let key = flag.split_once('=').map_or(flag, |(k, _)| k);
        if key.is_empty() || key.chars().any(char::is_whitespace) {
            errs.invalid(&p, entry, "the flag name must be non-empty and contain no whitespace");
            continue;
        }
        if seen.contains(&key) {
            errs.duplicate(
                &p,
                entry,
                format!("the flag --{key} is already given by an earlier entry"),
            );
            continue;
        }
        seen.push(key);
        if flags.owned.contains(&key) {
            errs.forbidden(
                &p,
                format!(
                    "the flag --{key} is set by the server from this spec{}; change the spec field that renders it instead",
                    flags.owned_by
                ),
            );
            continue;
        }
        if !flags.known.iter().any(|k| k == key) {
            let settable: Vec<String> = flags
                .known
                .iter()
                .filter(|k| !flags.owned.contains(&k.as_str()))
                .map(|k| format!("--{k}"))
                .collect();
            errs.invalid(
                &p,
                entry,
                format!(
                    "{binary} has no flag --{key}; the flags you may set are {}",
                    settable.join(", ")
                ),
            );
            continue;
        }
        if let Err(why) = (flags.parse)(entry) {
            errs.invalid(&p, entry, why);
        }
    }
}

/// The first line of a clap complaint, without its `error: `.
pub fn first_line(e: clap::Error) -> String {
    let text = e.to_string();
    text.lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_owned()
}
