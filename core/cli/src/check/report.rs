//! Results of a `cclkit check` run: one row per check and version, the text table and
//! the JSON report.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::{Class, Family};

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
    /// A robustness probe failed: the plugin mishandles a call NCCL never makes. Does
    /// not change the verdict (`--strict` turns it into FAIL).
    Warn,
}

impl Status {
    /// "PASS" / "FAIL" / "SKIP".
    pub fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
            Status::Warn => "WARN",
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
    /// Contract check or robustness probe.
    #[serde(default = "contract")]
    pub class: Class,
    /// The NCCL behaviour the check rests on.
    #[serde(default)]
    pub nccl: String,
    /// Outcome.
    pub status: Status,
    /// What was proven, or why it failed / was skipped.
    pub message: String,
    /// Wall time of the child process, in seconds.
    pub seconds: f64,
}

impl CheckResult {
    /// One row of the text table: `PASS  net v12   sendrecv             …`; probes are
    /// marked `[probe]`, and a row that did not pass names the NCCL behaviour it rests on.
    pub fn line(&self) -> String {
        let mut l = format!(
            "{}  {:<9} {:<20} {}{}",
            self.status.label(),
            format!("{} v{}", self.family, self.version),
            self.check,
            if self.class == Class::Probe {
                "[probe] "
            } else {
                ""
            },
            self.message
        );
        if matches!(self.status, Status::Fail | Status::Warn) && !self.nccl.is_empty() {
            let _ = write!(l, " [{}: {}]", self.class.label(), self.nccl);
        }
        l
    }
}

fn contract() -> Class {
    Class::Contract
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
    /// Every plugin kind NCCL 2.31 loads that the library exports (net, CollNet,
    /// tuner, profiler, env, GIN, RMA), by kind then newest version.
    pub kinds: Vec<cclkit_host::kinds::Found>,
}

impl Exports {
    /// The report's second line: every kind with its versions, newest first ("-"
    /// for none); net, CollNet, tuner, profiler and env always, GIN and RMA when
    /// exported. `exports: net v12 | collnet - | tuner v6 | profiler - | env -   (seed 7)`
    pub fn line(&self, seed: u64) -> String {
        use cclkit_host::kinds::Kind;
        let versions = |v: &mut dyn Iterator<Item = u32>| {
            let list: Vec<String> = v.map(|n| format!("v{n}")).collect();
            if list.is_empty() {
                "-".to_owned()
            } else {
                list.join(" ")
            }
        };
        let mut parts = vec![
            format!("net {}", versions(&mut self.net.iter().copied())),
            format!("collnet {}", versions(&mut self.collnet.iter().copied())),
            format!("tuner {}", versions(&mut self.tuner.iter().copied())),
        ];
        for kind in [Kind::Profiler, Kind::Env, Kind::Gin, Kind::Rma] {
            let mut of_kind = self
                .kinds
                .iter()
                .filter(|f| f.kind == kind)
                .map(|f| f.version)
                .peekable();
            if of_kind.peek().is_none() && matches!(kind, Kind::Gin | Kind::Rma) {
                continue;
            }
            parts.push(format!(
                "{} {}",
                kind.label().to_ascii_lowercase(),
                versions(&mut of_kind)
            ));
        }
        format!("exports: {}   (seed {seed})", parts.join(" | "))
    }
}

/// The outcome of a whole run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// No check failed and at least one contract check exercised the plugin.
    /// Exit status 0.
    Passed,
    /// At least one check failed (a contract check, or a probe under `--strict`).
    /// Exit status 1.
    Failed,
    /// Nothing failed, but nothing beyond the exported symbols could be exercised
    /// (init failed or zero devices on this machine). Exit status 3.
    NothingTested,
}

impl Verdict {
    /// "passed" / "failed" / "nothing tested".
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Passed => "passed",
            Verdict::Failed => "failed",
            Verdict::NothingTested => "nothing tested",
        }
    }

    /// The process exit status of `cclkit check` (2 is a usage error).
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Passed => 0,
            Verdict::Failed => 1,
            Verdict::NothingTested => 3,
        }
    }
}

/// Checks that read the file or the table only: a PASS of theirs does not mean the
/// plugin was exercised.
const STATIC_CHECKS: &[&str] = &["symbol", "table"];

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
    /// Number of WARN results (failed robustness probes).
    pub warned: usize,
    /// Whether probes counted as failures (`--strict`).
    pub strict: bool,
    /// Passed, failed or nothing tested.
    pub verdict: Verdict,
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
        let failed = count(Status::Fail);
        let exercised = results.iter().any(|r| {
            r.status == Status::Pass
                && r.class == Class::Contract
                && !STATIC_CHECKS.contains(&r.check.as_str())
        });
        let verdict = if failed > 0 {
            Verdict::Failed
        } else if exercised {
            Verdict::Passed
        } else {
            Verdict::NothingTested
        };
        Self {
            passed: count(Status::Pass),
            failed,
            skipped: count(Status::Skip),
            warned: count(Status::Warn),
            strict: false,
            verdict,
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

    /// The final line: `N passed, M failed, K skipped, W probe warnings (…): verdict`.
    pub fn summary(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped, {} probe warning{} ({:.1} s): {}",
            self.passed,
            self.failed,
            self.skipped,
            self.warned,
            if self.warned == 1 { "" } else { "s" },
            self.seconds,
            self.verdict.label()
        )
    }

    /// The text table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "cclkit check {}", self.path);
        let _ = writeln!(out, "{}", self.exports.line(self.seed));
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
            class: Class::Contract,
            nccl: "NCCL does it".into(),
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
        assert_eq!(r.verdict, Verdict::Failed);
        let text = r.render();
        assert!(text.contains(
            "exports: net v12 v11 | collnet - | tuner - | profiler - | env -   (seed 5)"
        ));
        assert!(
            text.contains("FAIL  net v12   sendrecv             sendrecv message"),
            "{text}"
        );
        assert!(
            text.ends_with("1 passed, 1 failed, 1 skipped, 0 probe warnings (1.2 s): failed\n"),
            "{text}"
        );
        assert_eq!(
            r.get(Family::Net, 12, "grouped").map(|r| r.status),
            Some(Status::Skip)
        );
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["results"][1]["status"], "FAIL");
        assert_eq!(json["results"][1]["family"], "net");
        assert_eq!(json["results"][1]["class"], "contract");
        assert_eq!(json["verdict"], "failed");
    }

    #[test]
    fn exports_line_names_profiler_env_and_gin_tables() {
        let kinds = cclkit_host::kinds::classify_names([
            "ncclTunerPlugin_v6",
            "ncclProfiler_v6",
            "ncclProfiler_v5",
            "ncclEnvPlugin_v2",
            "ncclGinPlugin_v13",
        ]);
        let e = Exports {
            tuner: vec![6],
            kinds,
            ..Exports::default()
        };
        assert_eq!(
            e.line(9),
            "exports: net - | collnet - | tuner v6 | profiler v6 v5 | env v2 | gin v13   (seed 9)"
        );
    }

    #[test]
    fn verdict_tells_passed_failed_and_nothing_tested_apart() {
        let run = |rows: Vec<CheckResult>| {
            Report::new("x".into(), "x".into(), Exports::default(), 1, rows, 0.0).verdict
        };
        let mut warn = row("sizes", Status::Warn);
        warn.class = Class::Probe;
        assert_eq!(
            run(vec![row("symbol", Status::Pass), row("init", Status::Skip)]),
            Verdict::NothingTested
        );
        assert_eq!(
            run(vec![row("init", Status::Pass), warn.clone()]),
            Verdict::Passed
        );
        assert_eq!(
            run(vec![row("init", Status::Pass), row("x", Status::Fail)]),
            Verdict::Failed
        );
        let mut probe_pass = row("sizes", Status::Pass);
        probe_pass.class = Class::Probe;
        assert_eq!(run(vec![probe_pass]), Verdict::NothingTested);
        assert_eq!(Verdict::NothingTested.exit_code(), 3);
        assert!(
            warn.line()
                .starts_with("WARN  net v12   sizes                [probe] ")
        );
    }
}
