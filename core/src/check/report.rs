//! Results of a `cclkit check` run: one row per check and version, the text table and
//! the JSON report.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::Family;

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// The plugin did what the ABI requires.
    Pass,
    /// The plugin broke a rule (or crashed, hung, aborted).
    Fail,
    /// The check could not run here; the message says why.
    Skip,
}

impl Status {
    /// "PASS" / "FAIL" / "SKIP".
    pub fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        }
    }
}

/// One check of one ABI version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    /// Plugin family.
    pub family: Family,
    /// ABI version checked.
    pub version: u32,
    /// Check name (`sendrecv`).
    pub check: String,
    /// Outcome.
    pub status: Status,
    /// What was proven, or why it failed / was skipped.
    pub message: String,
    /// Wall time of the child process, in seconds.
    pub seconds: f64,
}

impl CheckResult {
    /// One row of the text table: `PASS  net v12   sendrecv             …`.
    pub fn line(&self) -> String {
        format!(
            "{}  {:<9} {:<20} {}",
            self.status.label(),
            format!("{} v{}", self.family, self.version),
            self.check,
            self.message
        )
    }
}

/// What the library exports (from its ELF dynamic symbols, without loading it).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Exports {
    /// `ncclNetPlugin_vN` versions, newest first.
    pub net: Vec<u32>,
    /// `ncclCollNetPlugin_vN` versions (reported, not checked).
    pub collnet: Vec<u32>,
    /// `ncclTunerPlugin_vN` versions, newest first.
    pub tuner: Vec<u32>,
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The library as given on the command line.
    pub library: String,
    /// The file checked.
    pub path: String,
    /// Exported versions.
    pub exports: Exports,
    /// The seed of the random data (`--seed` replays it).
    pub seed: u64,
    /// Every result, net first, newest version first, in check order.
    pub results: Vec<CheckResult>,
    /// Number of PASS results.
    pub passed: usize,
    /// Number of FAIL results.
    pub failed: usize,
    /// Number of SKIP results.
    pub skipped: usize,
    /// Wall time of the run, in seconds.
    pub seconds: f64,
}

impl Report {
    /// Builds the report and its counts.
    pub fn new(
        library: String,
        path: String,
        exports: Exports,
        seed: u64,
        results: Vec<CheckResult>,
        seconds: f64,
    ) -> Self {
        let count = |s| results.iter().filter(|r| r.status == s).count();
        Self {
            passed: count(Status::Pass),
            failed: count(Status::Fail),
            skipped: count(Status::Skip),
            library,
            path,
            exports,
            seed,
            results,
            seconds,
        }
    }

    /// The result of one check, if it ran.
    pub fn get(&self, family: Family, version: u32, check: &str) -> Option<&CheckResult> {
        self.results
            .iter()
            .find(|r| r.family == family && r.version == version && r.check == check)
    }

    /// The final line: `N passed, M failed, K skipped`.
    pub fn summary(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped ({:.1} s)",
            self.passed, self.failed, self.skipped, self.seconds
        )
    }

    /// The text table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "cclkit check {}", self.path);
        let list = |v: &[u32]| {
            v.iter()
                .map(|n| format!("v{n}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let none = |v: &[u32]| {
            if v.is_empty() {
                "-".to_owned()
            } else {
                list(v)
            }
        };
        let _ = writeln!(
            out,
            "exports: net {} | collnet {} | tuner {}   (seed {})",
            none(&self.exports.net),
            none(&self.exports.collnet),
            none(&self.exports.tuner),
            self.seed
        );
        for r in &self.results {
            let _ = writeln!(out, "{}", r.line());
        }
        let _ = writeln!(out, "{}", self.summary());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(check: &str, status: Status) -> CheckResult {
        CheckResult {
            family: Family::Net,
            version: 12,
            check: check.into(),
            status,
            message: format!("{check} message"),
            seconds: 0.1,
        }
    }

    #[test]
    fn counts_and_table() {
        let r = Report::new(
            "x.so".into(),
            "/p/x.so".into(),
            Exports {
                net: vec![12, 11],
                ..Exports::default()
            },
            5,
            vec![
                row("symbol", Status::Pass),
                row("sendrecv", Status::Fail),
                row("grouped", Status::Skip),
            ],
            1.25,
        );
        assert_eq!((r.passed, r.failed, r.skipped), (1, 1, 1));
        let text = r.render();
        assert!(text.contains("exports: net v12 v11 | collnet - | tuner -   (seed 5)"));
        assert!(
            text.contains("FAIL  net v12   sendrecv             sendrecv message"),
            "{text}"
        );
        assert!(
            text.ends_with("1 passed, 1 failed, 1 skipped (1.2 s)\n"),
            "{text}"
        );
        assert_eq!(
            r.get(Family::Net, 12, "grouped").map(|r| r.status),
            Some(Status::Skip)
        );
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["results"][1]["status"], "FAIL");
        assert_eq!(json["results"][1]["family"], "net");
    }
}
