//! Opening one plugin setting: try its candidate names in order, keep every attempt.

use super::config::{Flavor, PluginKind};
use super::error::{Cause, LoadError, OpenAttempt, OpenOutcome};
use super::library::Library;
use super::resolve::{self, Candidate, Rule};

/// A library opened for a setting entry, with the attempts that led to it.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The library.
    pub library: Library,
    /// Every `dlopen` tried, the last one being the success.
    pub opens: Vec<OpenAttempt>,
    /// The rule of the name that loaded.
    pub rule: Rule,
}

/// The label of an entry in reports: its value, or the default name when unset.
pub fn entry_label(kind: PluginKind, flavor: Flavor, value: Option<&str>) -> String {
    match value.filter(|v| !v.is_empty()) {
        Some(v) => v.to_owned(),
        None => resolve::default_name(kind, flavor),
    }
}

/// Tries the names NCCL would try for `value` (plugin_open.cc `openPluginLib`) and
/// returns the first library that opens, or a [`LoadError`] listing every attempt.
pub fn open_entry(
    kind: PluginKind,
    flavor: Flavor,
    value: Option<&str>,
) -> Result<Opened, LoadError> {
    open_candidates(
        kind,
        entry_label(kind, flavor, value),
        &resolve::candidates(kind, flavor, value),
    )
}

/// Tries `candidates` in order (see [`open_entry`]).
pub fn open_candidates(
    kind: PluginKind,
    entry: String,
    candidates: &[Candidate],
) -> Result<Opened, LoadError> {
    let mut opens = Vec::new();
    for c in candidates {
        match Library::open(c.name.as_deref()) {
            Ok(library) => {
                opens.push(OpenAttempt {
                    name: c.name.clone(),
                    rule: c.rule,
                    outcome: OpenOutcome::Loaded {
                        path: library.path().map(|p| p.display().to_string()),
                    },
                });
                return Ok(Opened {
                    library,
                    opens,
                    rule: c.rule,
                });
            }
            Err(e) => opens.push(OpenAttempt {
                name: c.name.clone(),
                rule: c.rule,
                outcome: if e.not_found {
                    OpenOutcome::NotFound { error: e.message }
                } else {
                    OpenOutcome::Failed { error: e.message }
                },
            }),
        }
    }
    let mut err = LoadError::new(kind, entry, Cause::NotLoaded);
    err.opens = opens;
    Err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failed_name_is_recorded() {
        let e = open_entry(PluginKind::Net, Flavor::Nccl, Some("cclkit-nope")).unwrap_err();
        assert_eq!(e.entry, "cclkit-nope");
        let names: Vec<_> = e.opens.iter().map(|a| a.shown_name().to_owned()).collect();
        assert_eq!(names, ["cclkit-nope", "libnccl-net-cclkit-nope.so"]);
        assert!(
            e.opens
                .iter()
                .all(|a| matches!(a.outcome, OpenOutcome::NotFound { .. }))
        );
        assert!(!e.is_default_absent());
        assert!(
            e.to_string()
                .contains("libnccl-net-cclkit-nope.so (cannot open shared object file: No such file or directory)"),
            "{e}"
        );
    }

    #[test]
    fn a_verbatim_name_that_opens_stops_the_search() {
        let o = open_entry(PluginKind::Tuner, Flavor::Nccl, Some("libc.so.6")).expect("libc");
        assert_eq!(o.rule, Rule::Verbatim);
        assert_eq!(o.opens.len(), 1);
    }
}
